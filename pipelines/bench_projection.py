"""From a measured per-sample time to hours per epoch on 8 GPUs: nominal device figures and the
analytic ZeRO-3 communication. Everything here is projected, never measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from janus_train.gpu_specs import DeviceSpec, device_spec

REAL_SAMPLES = 612_492
"""Samples (= frames with descriptions) of the real R2R-CE training set."""
REFERENCE_HOURS_PER_EPOCH = 146.0
"""The reference run's measured epoch on 8xH800 (ZeRO-3, 6.9 GPU-s per sample)."""
REFERENCE_GPU_S_PER_SAMPLE = 6.9
TARGET_GPU_S_PER_SAMPLE = 0.6
TARGET_VGGT_WINDOWS_PER_S = 6.0
GPUS = 8
BF16_BYTES = 2
ADAM_FP32_BYTES = 12
"""fp32 master weight + two Adam moments per trainable parameter."""


@dataclass(frozen=True)
class ZeroShare:
    """Per-GPU bytes of model state under ZeRO-3 over ``gpus`` GPUs (bf16 weights and grads,
    fp32 Adam state of the trainable parameters)."""

    gpus: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @classmethod
    def of(cls, params: int, trainable: int, gpus: int = GPUS) -> ZeroShare:
        return cls(gpus, params * BF16_BYTES / gpus, trainable * BF16_BYTES / gpus, trainable * ADAM_FP32_BYTES / gpus)


def zero3_bytes_per_sample(params: int, trainable: int, gpus: int = GPUS) -> float:
    """Bytes each GPU receives per micro-batch of one sample under ZeRO-3 (ring collectives):
    all-gather of every weight for the forward, of the trainable ones again for the backward, and
    the reduce-scatter of their gradients, each moving (g-1)/g of the bf16 tensor."""
    return (params + 2 * trainable) * BF16_BYTES * (gpus - 1) / gpus


@dataclass(frozen=True)
class Projection:
    device: str
    gpus: int
    compute_s_per_sample: float
    """Measured on one GPU (forward + backward of one sample)."""
    comm_s_per_sample: float
    gpu_s_per_sample_no_overlap: float
    gpu_s_per_sample_full_overlap: float
    hours_per_epoch_no_overlap: float
    hours_per_epoch_full_overlap: float
    reference_hours_per_epoch: float = REFERENCE_HOURS_PER_EPOCH

    def to_dict(self) -> dict[str, float | str]:
        return asdict(self)


def project(spec: DeviceSpec, compute_s: float, params: int, trainable: int,
            gpus: int = GPUS, samples: int = REAL_SAMPLES) -> Projection:
    """Hours per epoch on ``gpus`` GPUs of ``spec`` from one GPU's measured seconds per sample,
    without and with full overlap of the ZeRO-3 traffic (optimizer step and data wait not included)."""
    if spec.nvlink_gb_per_s <= 0:
        raise ValueError(f"{spec.name} has no NVLink figure to project ZeRO-3 traffic with")
    comm = zero3_bytes_per_sample(params, trainable, gpus) / (spec.nvlink_gb_per_s * 1e9)
    serial, overlapped = compute_s + comm, max(compute_s, comm)

    def hours(per_sample: float) -> float:
        return samples * per_sample / gpus / 3600

    return Projection(spec.name, gpus, compute_s, comm, serial, overlapped, hours(serial), hours(overlapped))
