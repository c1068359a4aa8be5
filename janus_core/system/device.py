"""The device a process computes on: the one definition used by precompute, verify and training."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a device is made: reading a profile's ``device`` needs no torch
    import torch

DEVICES: tuple[str, ...] = ("cpu", "cuda")
"""Values of a profile's ``device`` setting."""


def process_device(kind: str, local_rank: int = 0) -> torch.device:
    """The CPU, or for ``cuda`` the GPU of this process's node-local rank (one GPU per process)."""
    import torch

    if kind not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {kind!r}")
    return torch.device(f"cuda:{local_rank}") if kind == "cuda" else torch.device("cpu")
