"""Qwen2.5-VL's windowed ViT attention as one variable-length kernel call per layer.

The ViT attends inside windows (and, in four layers, inside whole images). transformers runs that
as one flash-attn varlen call when flash-attn is installed, and otherwise as one SDPA call per
window: for 9 images of 644² that is ~900 small kernel launches per layer, and the ViT alone took
1.85 s of a 7B training step on an H100 (0.16 s as one varlen call). PyTorch ships the same
FlashAttention varlen kernel (``torch.nn.attention.varlen.varlen_attn``), so janus registers it
with transformers' :class:`~transformers.AttentionInterface` under :data:`VARLEN_ATTENTION` and
points the vision config at it whenever the model would otherwise use ``sdpa``. Where the kernel
cannot run (the CPU, float32, the meta device) the function does exactly what transformers' sdpa
path does, window by window, so CPU results and FLOP counts do not change.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

try:
    from torch.nn.attention.varlen import varlen_attn  # PyTorch >= 2.10
except ImportError:
    varlen_attn = None

VARLEN_ATTENTION = "flash_varlen_torch"
"""The registered name. It contains "flash" because that is how Qwen's vision attention decides to
pass the window boundaries (``cu_seqlens``) in one call instead of splitting the windows itself."""

_KERNEL_DTYPES = (torch.float16, torch.bfloat16)
_KERNEL_MIN_CAPABILITY = (8, 0)


def varlen_kernel_applies(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether PyTorch's varlen FlashAttention kernel runs for tensors on ``device`` in ``dtype``
    (asked in every ViT layer: only a dict lookup after the first call per device)."""
    device = torch.device(device)
    if device.type != "cuda" or dtype not in _KERNEL_DTYPES or varlen_attn is None:
        return False
    return _kernel_runs_on(device.index if device.index is not None else torch.cuda.current_device())


@cache
def _kernel_runs_on(gpu: int) -> bool:
    # FlashAttention kernels need Ampere or newer (A100, H100/H800); older GPUs keep per-window SDPA.
    return torch.cuda.get_device_capability(gpu) >= _KERNEL_MIN_CAPABILITY


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Non-causal attention inside each ``cu_seq_lens`` segment of one packed sequence.

    ``query``/``key``/``value`` [1, heads, T, head_dim] -> ([1, T, heads, head_dim], None), the
    shape transformers' attention functions return."""
    if query.shape[0] != 1 or cu_seq_lens_q is None:
        raise ValueError(f"{VARLEN_ATTENTION} takes one packed sequence with cu_seq_lens_q "
                         f"(got batch {query.shape[0]}, cu_seq_lens_q {'set' if cu_seq_lens_q is not None else 'None'})")
    if dropout:
        raise ValueError(f"{VARLEN_ATTENTION} has no attention dropout (got {dropout})")
    cu_k = cu_seq_lens_q if cu_seq_lens_k is None else cu_seq_lens_k
    if varlen_kernel_applies(query.device, query.dtype):
        # Qwen passes the longest segment as a Python int; computing it here would sync the GPU.
        max_q = max_length_q if max_length_q is not None else int((cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).max())
        max_k = max_length_k if max_length_k is not None else max_q
        q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))  # [T, heads, head_dim]
        out = varlen_attn(q, k, v, cu_seq_lens_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k, scale=scaling)
        return out.unsqueeze(0), None
    # transformers' own sdpa path for Qwen's vision attention: one call per segment.
    lengths = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
    pieces = zip(*(torch.split(t, lengths, dim=2) for t in (query, key, value)))
    outputs = [
        sdpa_attention_forward(module, q, k, v, attention_mask=None, scaling=scaling, dropout=0.0, is_causal=False)[0]
        for q, k, v in pieces
    ]
    return torch.cat(outputs, dim=1), None


AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)


def vision_attention(implementation: str | None) -> str | None:
    """The ViT attention janus runs for a model built with ``implementation``: ``sdpa`` becomes
    :data:`VARLEN_ATTENTION`, other choices (flash_attention_2, eager) stay."""
    return VARLEN_ATTENTION if implementation == "sdpa" else implementation


def use_varlen_vision_attention(model: PreTrainedModel) -> bool:
    """Point a Qwen2.5-VL model's ViT at :func:`vision_attention` of its own choice; True if that
    is :data:`VARLEN_ATTENTION`. The name is a runtime setting of the config: ``save_pretrained``
    does not write it, so saved checkpoints load anywhere."""
    vision = model.config.vision_config
    vision._attn_implementation = vision_attention(vision._attn_implementation)
    return vision._attn_implementation == VARLEN_ATTENTION


def describe_attention(implementation: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The attention a model of ``implementation`` runs on ``device`` in ``dtype``, in words."""
    if vision_attention(implementation) == VARLEN_ATTENTION and varlen_kernel_applies(device, dtype):
        return f"{implementation} (ViT: torch varlen FlashAttention)"
    return implementation
