"""Nominal (datasheet) figures of the GPUs janus reports against: the trainer's MFU and the
benchmark's projections read them from here."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceSpec:
    """Dense bf16 peak and NVLink bandwidth per GPU and direction (0: no NVLink)."""

    name: str
    bf16_tflops: float
    nvlink_gb_per_s: float


# Matched by substring of torch.cuda.get_device_name(), most specific first.
GPU_SPECS: tuple[tuple[str, DeviceSpec], ...] = (
    ("H100 PCIe", DeviceSpec("H100 PCIe", 756.0, 0.0)),
    ("H100", DeviceSpec("H100 SXM", 989.0, 450.0)),
    ("H200", DeviceSpec("H200", 989.0, 450.0)),
    ("H800", DeviceSpec("H800", 989.0, 200.0)),
    ("A800", DeviceSpec("A800", 312.0, 200.0)),
    ("A100", DeviceSpec("A100 SXM", 312.0, 300.0)),
)


def device_spec(name: str) -> DeviceSpec | None:
    """The figures of the GPU named ``name`` (as torch names it), or None for an unknown one."""
    return next((spec for key, spec in GPU_SPECS if key in name), None)


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 FLOP/s of ``device`` (None on the CPU or an unknown GPU: no MFU is reported)."""
    if device.type != "cuda":
        return None
    spec = device_spec(torch.cuda.get_device_name(device))
    return None if spec is None else spec.bf16_tflops * 1e12
