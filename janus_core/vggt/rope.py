"""2-D rotary position embedding of the aggregator blocks.

The head dim is split into a row half and a column half; inside each half, element ``i`` and
element ``i + half/2`` form a pair rotated by ``position * base**(-2i/half)`` (half-split, not
interleaved). Special tokens sit at position (0, 0), where the rotation is the identity.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grid_positions(rows: int, cols: int, num_special: int, device: torch.device | None = None) -> Tensor:
    """Integer (row, col) positions [num_special + rows*cols, 2] of one frame's tokens.

    Patch tokens are row-major and start at (1, 1) so that (0, 0) is free for the special tokens.
    """
    r = torch.arange(1, rows + 1, device=device).repeat_interleave(cols)
    c = torch.arange(1, cols + 1, device=device).repeat(rows)
    patches = torch.stack((r, c), dim=-1)
    special = torch.zeros(num_special, 2, dtype=patches.dtype, device=device)
    return torch.cat((special, patches), dim=0)


def rope_tables(positions: Tensor, head_dim: int, base: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables [P, head_dim] (float32) for integer positions [P, 2]."""
    half = head_dim // 2
    exponents = torch.arange(0, half, 2, device=positions.device, dtype=torch.float32) / half
    inv_freq = 1.0 / (base**exponents)
    cos_parts, sin_parts = [], []
    for axis in range(2):  # 0: row half, 1: column half
        angles = positions[:, axis].to(torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        cos_parts.append(angles.cos())
        sin_parts.append(angles.sin())
    return torch.cat(cos_parts, dim=-1), torch.cat(sin_parts, dim=-1)


def apply_rope(t: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``t`` [..., L, head_dim] where L is a whole number of frames of ``cos.shape[0]`` tokens.

    Every frame has the same positions, so the per-frame tables broadcast over the frames instead
    of being tiled.
    """
    frame_tokens, head_dim = cos.shape
    quarter = head_dim // 4
    pairs = t.unflatten(-1, (2, 2, quarter))  # (row|col half, first|second of each pair, quarter)
    rotated = torch.stack((-pairs[..., 1, :], pairs[..., 0, :]), dim=-2).flatten(-3)
    shape = t.shape
    framed = (-1, frame_tokens, head_dim)
    out = t.reshape(*shape[:-2], *framed) * cos.to(t.dtype) + rotated.reshape(*shape[:-2], *framed) * sin.to(t.dtype)
    return out.reshape(shape)
