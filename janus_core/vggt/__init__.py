"""Frozen VGGT aggregator: our own checkpoint-compatible implementation (JanusVLN's block-causal variant)."""

from janus_core.vggt.aggregator import CUDA_AUTOCAST_DTYPE, KVCache, VGGTAggregator
from janus_core.vggt.checkpoint import CheckpointError, load_aggregator_state_dict, weights_fingerprint
from janus_core.vggt.config import ATTENTION_MODES, REFERENCE_FRAMES, AggregatorConfig, PatchEmbedConfig
from janus_core.vggt.cost import window_flops

__all__ = [
    "ATTENTION_MODES",
    "CUDA_AUTOCAST_DTYPE",
    "REFERENCE_FRAMES",
    "AggregatorConfig",
    "CheckpointError",
    "KVCache",
    "PatchEmbedConfig",
    "VGGTAggregator",
    "load_aggregator_state_dict",
    "weights_fingerprint",
    "window_flops",
]
