"""The JanusVLN model (a Qwen base plus the VGGT merger and action head), its loss, position ids and speed levers, and the formats it is exported in."""
