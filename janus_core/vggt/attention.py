"""Which exact attention kernel the aggregator runs, chosen once per device.

Every candidate computes exact softmax attention (none approximates); they differ in speed and in
rounding. On CUDA the candidates are tried in a fixed order, fastest first at head dim 64 in bf16
(FlashAttention-3 where installed, then PyTorch's cuDNN, flash and memory-efficient SDPA backends,
then the math backend); the first one that runs on the device and agrees with a float64 reference
on a probe is used. A fixed order rather than a timing race keeps the choice, and so the bytes of
the cached features, the same in every process and run on the same hardware and software;
``make bench-gpu`` measures every candidate so the order can be checked. The CPU keeps PyTorch's
own SDPA dispatch.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from janus_core.vggt.layers import AttendFn, full_attention

FLASH3 = "flash3"
SDPA = "sdpa"  # PyTorch's default dispatch (what the CPU runs)
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa-math": SDPBackend.MATH,
}
CUDA_ORDER: tuple[str, ...] = (FLASH3, "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math")
"""CUDA candidates, fastest first (public H100 figures at head dim 64, bf16; bench-gpu re-measures)."""
# What the benches time on each device: today's default dispatch and every candidate, except the
# math backend on CUDA (its [queries, keys] score tensors take many GiB at 644²).
BENCH_KERNELS: dict[str, tuple[str, ...]] = {
    "cuda": (SDPA, *(name for name in CUDA_ORDER if name != "sdpa-math")),
    "cpu": (SDPA, "sdpa-flash", "sdpa-math"),
}

# Largest accepted |kernel - float64 reference| on the probe, relative to max |reference|, by the
# dtype the kernel computes in: a few units of that dtype's last place (bf16 2**-8, fp16 2**-11),
# so a kernel that is wrong for this head dim or sequence length is rejected.
PROBE_RTOL: dict[torch.dtype, float] = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-5}
# Probe lengths are odd and unequal, like the aggregator's (2121 tokens per frame, key prefixes of
# several frames), so kernels that need aligned lengths or equal q/k lengths show it here.
PROBE_QUERIES = 37
PROBE_KEYS = 111
PROBE_HEADS = 2


@dataclass(frozen=True)
class AttentionKernel:
    """One attention implementation: ``attend(q, k, v)`` on [batch, heads, tokens, head_dim]."""

    name: str
    attend: AttendFn = field(repr=False, compare=False)


@dataclass(frozen=True)
class KernelChoice:
    """The kernel chosen for a device, and why each earlier candidate was passed over."""

    kernel: AttentionKernel
    skipped: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        why = "; ".join(f"{name}: {reason}" for name, reason in self.skipped)
        return self.kernel.name + (f" (skipped {why})" if why else "")


def sdpa_backend(name: str) -> AttentionKernel:
    backend = SDPA_BACKENDS[name]

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v)

    return AttentionKernel(name, attend)


def flash3() -> AttentionKernel | None:
    """FlashAttention-3 (the ``flash_attn_interface`` package, Hopper GPUs) when installed."""
    if importlib.util.find_spec("flash_attn_interface") is None:
        return None
    from flash_attn_interface import flash_attn_func  # type: ignore[import-not-found]

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        # FA3 takes [batch, tokens, heads, head_dim]; the transposes are views.
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    return AttentionKernel(FLASH3, attend)


def candidate(name: str) -> AttentionKernel | None:
    """The kernel called ``name``, or None where its library is not installed."""
    if name == FLASH3:
        return flash3()
    if name == SDPA:
        return AttentionKernel(SDPA, full_attention)
    if name in SDPA_BACKENDS:
        return sdpa_backend(name)
    raise ValueError(f"unknown attention kernel {name!r}; known: {(*CUDA_ORDER, SDPA)}")


def probe_error(kernel: AttentionKernel, device: torch.device, dtype: torch.dtype, head_dim: int) -> float:
    """max |kernel - float64 reference| / max |reference| on random q, k, v of one head dim, laid
    out in memory as the blocks pass them: v a strided view of the fused qkv projection, k a new
    tensor (q/k norm and RoPE), the queries a slice of one (one query frame of block-causal attention)."""
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, PROBE_KEYS, 3, PROBE_HEADS, head_dim, generator=generator).to(device, dtype)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [1, heads, keys, head_dim] each
    q, k = q.contiguous()[:, :, -PROBE_QUERIES:], k.contiguous()
    reference = F.scaled_dot_product_attention(*(t.cpu().double() for t in (q, k, v)))
    out = kernel.attend(q, k, v).double().cpu()
    return float((out - reference).abs().max() / reference.abs().max())


def choose(
    names: Sequence[str],
    device: torch.device,
    dtype: torch.dtype,
    head_dims: Sequence[int],
    make: Callable[[str], AttentionKernel | None] = candidate,
) -> KernelChoice:
    """The first of ``names`` that ``make`` provides, runs on ``device`` and passes the probe at
    every head dim; why each earlier one did not is recorded."""
    skipped: list[tuple[str, str]] = []
    for name in names:
        kernel = make(name)
        if kernel is None:
            skipped.append((name, "not installed"))
            continue
        try:
            errors = [probe_error(kernel, device, dtype, d) for d in head_dims]
        except Exception as exc:  # "No available kernel", an unsupported device, GPU or head dim
            skipped.append((name, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__))
            continue
        worst = max(errors)
        if not worst <= PROBE_RTOL[dtype]:
            skipped.append((name, f"off by {worst:.2g} relative on the probe (allowed {PROBE_RTOL[dtype]:.2g})"))
            continue
        return KernelChoice(kernel, tuple(skipped))
    raise RuntimeError(f"no attention kernel passed on {device} ({dtype}): {skipped}")


@functools.cache
def kernel_for(device: torch.device, dtype: torch.dtype, head_dims: tuple[int, ...]) -> KernelChoice:
    """The aggregator's kernel on ``device`` computing in ``dtype``: chosen once per process and
    (device, dtype, head dims); the CPU keeps PyTorch's SDPA dispatch."""
    if device.type != "cuda":
        return KernelChoice(AttentionKernel(SDPA, full_attention))
    return choose(CUDA_ORDER, device, dtype, head_dims)
