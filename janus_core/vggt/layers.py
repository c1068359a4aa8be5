"""Transformer building blocks shared by the DINOv2 patch embed and the aggregator.

Module and parameter names follow the VGGT checkpoint (``attn.qkv``, ``attn.q_norm``, ``ls1.gamma``,
``mlp.fc1`` …) so that state dicts load without renaming.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from janus_core.vggt.rope import apply_rope

# attend(q, k, v) -> o, all [batch, heads, tokens, head_dim]; lets the aggregator swap in
# block-causal or cached global attention without the block knowing about frames.
AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]
RopeTables = tuple[Tensor, Tensor]


def full_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def _attention_dtype(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cast q, k, v to the autocast dtype once, as SDPA would.

    Doing it here rather than inside SDPA keeps the block-causal loop (which slices growing key
    prefixes) and the KV cache from re-casting or storing float32 keys.
    """
    device_type = q.device.type
    if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        return q.to(dtype), k.to(dtype), v.to(dtype)
    return q, k, v


class LayerScale(nn.Module):
    def __init__(self, dim: int, init_value: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init_value)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=bias)
        self.act = nn.GELU()  # exact (erf) GELU, as the checkpoint was trained with
        self.fc2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Multi-head attention projections with optional per-head LayerNorm on q and k."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool,
        proj_bias: bool,
        qk_norm: bool,
        qk_norm_eps: float,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        # Registration order = checkpoint key order: qkv, q_norm, k_norm, proj.
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.q_norm: nn.Module = nn.LayerNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = nn.LayerNorm(self.head_dim, eps=qk_norm_eps) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v as [batch, heads, tokens, head_dim], q and k normalised."""
        n, length, _ = x.shape
        qkv = self.qkv(x).reshape(n, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def merge(self, o: Tensor) -> Tensor:
        n, _, length, _ = o.shape
        return self.proj(o.transpose(1, 2).reshape(n, length, self.num_heads * self.head_dim))


class Block(nn.Module):
    """Pre-norm transformer block with LayerScale on both residual branches."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        *,
        qkv_bias: bool,
        proj_bias: bool,
        ffn_bias: bool,
        qk_norm: bool,
        norm_eps: float,
        qk_norm_eps: float,
        layerscale_init: float,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias, proj_bias, qk_norm, qk_norm_eps)
        self.ls1 = LayerScale(dim, layerscale_init)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), ffn_bias)
        self.ls2 = LayerScale(dim, layerscale_init)

    def forward(self, x: Tensor, rope: RopeTables | None = None, attend: AttendFn = full_attention) -> Tensor:
        """x [batch, tokens, dim]; ``rope`` tables are per frame and broadcast over the frames in x."""
        q, k, v = self._attention_inputs(x, rope)
        return self._residuals(x, attend(q, k, v))

    # The block is two fusable regions around the attention kernel (which stays a separate call:
    # block-causal prefixes, cached keys, FlashAttention-3). fuse() compiles them.

    def _attention_inputs(self, x: Tensor, rope: RopeTables | None) -> tuple[Tensor, Tensor, Tensor]:
        """LayerNorm, qkv projection, q/k norm and RoPE: q, k, v in the attention dtype."""
        q, k, v = self.attn.heads(self.norm1(x))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return _attention_dtype(q, k, v)

    def _residuals(self, x: Tensor, o: Tensor) -> Tensor:
        """Output projection, LayerScale and residual, then the MLP branch likewise."""
        x = x + self.ls1(self.attn.merge(o))
        return x + self.ls2(self.mlp(self.norm2(x)))

    def fuse(self, enabled: bool = True) -> None:
        """Compile both regions with torch.compile: LayerNorm, q/k norm, RoPE, LayerScale and the
        residual adds become fused kernels around the matmuls. Idempotent; ``enabled=False``
        returns to the eager regions."""
        if not enabled:
            vars(self).pop("_attention_inputs", None)
            vars(self).pop("_residuals", None)
            return
        inputs, residuals = _compiled_regions()
        self._attention_inputs = functools.partial(inputs, self)  # type: ignore[method-assign]
        self._residuals = functools.partial(residuals, self)  # type: ignore[method-assign]

    @property
    def fused(self) -> bool:
        return "_attention_inputs" in vars(self)


@functools.cache
def _compiled_regions() -> tuple[Callable[..., tuple[Tensor, Tensor, Tensor]], Callable[..., Tensor]]:
    """The two block regions compiled once for all blocks: the block is an argument and its
    parameters graph inputs, so one graph serves every block of the same kind. dynamic=None: the
    first shape compiles static, a second one (another batch size, another count of distinct
    frames) recompiles once with dynamic sizes rather than once per shape."""
    return (
        torch.compile(Block._attention_inputs, dynamic=None),
        torch.compile(Block._residuals, dynamic=None),
    )
