"""Analytic compute cost of encoding a window (for throughput reporting and planning)."""

from __future__ import annotations

from janus_core.vggt.config import AggregatorConfig, AttentionMode


def _block_linear_macs(dim: int, mlp_ratio: float, tokens: int) -> int:
    """qkv (3C²) + proj (C²) + MLP (2·C·hidden) multiply-accumulates for ``tokens`` tokens."""
    return tokens * (4 * dim * dim + 2 * dim * int(dim * mlp_ratio))


def _attention_macs(dim: int, queries: int, keys: int) -> int:
    """Scores (q·k) and weighted values (p·v): 2·queries·keys·C."""
    return 2 * queries * keys * dim


def window_flops(
    config: AggregatorConfig,
    height: int,
    width: int,
    frames: int,
    *,
    attention: AttentionMode | None = None,
    last_layer: int = -1,
) -> float:
    """FLOPs (2 per multiply-accumulate) of one window through block pairs ``0 … last_layer``.

    Counts the matrix products (patch conv, linears, attention); norms, RoPE and softmax are
    negligible. VGGT-1B, 644×644, 9 frames: ≈ 62.5 TFLOP block-causal, ≈ 78.4 TFLOP full.
    """
    mode = config.attention if attention is None else attention
    p = config.patch_size
    patches = (height // p) * (width // p)
    pe = config.patch_embed
    dino_tokens = 1 + pe.num_register_tokens + patches
    dino = patches * pe.embed_dim * 3 * p * p + pe.depth * (
        _block_linear_macs(pe.embed_dim, pe.mlp_ratio, dino_tokens) + _attention_macs(pe.embed_dim, dino_tokens, dino_tokens)
    )

    c = config.embed_dim
    tokens = config.tokens_per_frame(height, width)
    pairs = last_layer % config.depth + 1
    frame_block = _block_linear_macs(c, config.mlp_ratio, tokens) + _attention_macs(c, tokens, tokens)
    global_linear = _block_linear_macs(c, config.mlp_ratio, tokens)
    # Block-causal: query frame t sees t+1 frames of keys; full: every frame sees all of them.
    key_frames = frames * (frames + 1) // 2 if mode == "causal" else frames * frames
    global_attention = _attention_macs(c, tokens, tokens) * key_frames

    macs = frames * dino + pairs * (frames * (frame_block + global_linear) + global_attention)
    return 2.0 * macs
