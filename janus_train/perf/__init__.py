"""Performance accounting: FLOPs of a step, GPU datasheet figures, and one sample's workload at a chosen shape."""
