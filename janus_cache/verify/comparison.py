"""How close a live tensor must be to its cached counterpart: tolerances per device and dtype,
and the comparison of one sample's tensors (docs/verify.md, "Tolerances")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from janus_core.vggt import CUDA_AUTOCAST_DTYPE


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted difference between a live and a cached tensor of one sample.

    ``max |live - cached| <= (storage_ulp + rtol) * scale`` and ``cosine(live, cached) >=
    min_cosine``, with ``scale = max |cached|`` and ``storage_ulp`` the relative spacing of the
    stored feature dtype (bf16 2**-7, float32 2**-23): both sides are rounded to the stored dtype
    from values a compute difference ``d`` apart, so they may differ by ``d`` plus one unit in the
    last place. ``rtol`` bounds the compute difference between the precompute's batch and the
    live one (batch composition changes the kernels' summation order).
    """

    rtol: float
    min_cosine: float

    def bound(self, scale: float, feature_dtype: str) -> float:
        return (STORAGE_ULP[feature_dtype] + self.rtol) * scale


STORAGE_ULP: Mapping[str, float] = {"bfloat16": 2.0**-7, "float32": 2.0**-23}
"""Relative spacing of neighbouring values of each stored feature dtype (upper bound)."""

FEATURE_TOLERANCES: Mapping[str, Tolerance] = {
    # CPU: float32 throughout. On the tiny profile batch sizes 1, 2 and 4 and 1 or 2 threads give
    # the same float32 bits; 1e-4 leaves room for kernels that block sums differently by shape.
    "cpu": Tolerance(rtol=1e-4, min_cosine=0.9999),
    # CUDA: the encoder runs under bf16 autocast (janus_core.vggt.CUDA_AUTOCAST_DTYPE); another
    # batch size selects other kernels, whose bf16 rounding differs by a few bf16 ulps per layer.
    "cuda": Tolerance(rtol=3e-2, min_cosine=0.999),
}
"""Live vs cached VGGT features, by the device type the encoder runs on."""

EMBEDDING_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    ("cpu", "float32"): Tolerance(rtol=1e-4, min_cosine=0.9999),
    ("cpu", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
    ("cuda", "float32"): Tolerance(rtol=1e-3, min_cosine=0.9999),
    ("cuda", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
}
"""Live vs cached fused image embeddings, by (device type, model compute dtype). The pixel values
are identical, so the difference comes from the feature's difference through the merger."""


VIT_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    # The same frames in the same batch shape (one window) through the same kernels: float32 on the
    # CPU gives the same bits; the bound leaves room for thread-count-dependent blocking.
    ("cpu", "float32"): Tolerance(rtol=1e-4, min_cosine=0.9999),
    ("cpu", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
    ("cuda", "float32"): Tolerance(rtol=1e-3, min_cosine=0.9999),
    # bf16 through 32 blocks: another kernel choice (a window of other frames, another GPU) moves
    # values by a few bf16 ulps per block.
    ("cuda", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
}
"""Live vs cached frozen-ViT output (``cache.vit_features``), by (device type, ViT compute dtype)."""


def feature_tolerance(device: torch.device | str) -> Tolerance:
    return FEATURE_TOLERANCES[torch.device(device).type]


def encoder_compute_dtype(device: torch.device | str) -> str:
    """The dtype the encoder computes in on ``device`` (what the tolerance depends on)."""
    return str(CUDA_AUTOCAST_DTYPE).removeprefix("torch.") if torch.device(device).type == "cuda" else "float32"


@dataclass(frozen=True)
class Comparison:
    """Differences between a live and a cached tensor of one sample."""

    max_abs: float
    sum_abs: float
    count: int
    cosine: float
    scale: float
    bound: float
    min_cosine: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.bound and self.cosine >= self.min_cosine

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / max(self.count, 1)


def compare(live: torch.Tensor, cached: torch.Tensor, tolerance: Tolerance, feature_dtype: str) -> Comparison:
    live64, cached64 = live.detach().double().cpu().reshape(-1), cached.detach().double().cpu().reshape(-1)
    diff = (live64 - cached64).abs()
    scale = float(cached64.abs().max()) if cached64.numel() else 0.0
    norms = float(live64.norm() * cached64.norm())
    cosine = float(live64 @ cached64) / norms if norms > 0 else float(torch.equal(live64, cached64))
    return Comparison(float(diff.max()) if diff.numel() else 0.0, float(diff.sum()), diff.numel(), cosine, scale,
                      tolerance.bound(scale, feature_dtype), tolerance.min_cosine)
