"""From a measured per-sample time to hours per epoch on 8 GPUs: nominal device figures and the
analytic ZeRO communication, for ZeRO-3 (the default) and ZeRO-2 (``train.zero_stage``), on one
node and on several. Everything here is projected, never measured."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from janus_train.loop.step_metrics import DeviceSpec, device_spec

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
GPUS_PER_NODE = 8
INTER_NODE_GB_PER_S = 50.0
"""Nominal inter-node bandwidth per GPU and direction: one 400 Gb/s InfiniBand NIC per GPU (H100 /
H800 HGX clusters). A ring spanning nodes runs at its slowest link."""
NODES = (1, 2, 4)
GRAD_ACCUM = 8
"""Micro-batches of one sample per optimizer step (the reference launch): ZeRO-2 gathers the
updated weights once per step."""


@dataclass(frozen=True)
class ZeroShare:
    """Per-GPU bytes of model state under ZeRO-3 over ``gpus`` GPUs (bf16 weights and grads,
    fp32 Adam state of the trainable parameters)."""

    gpus: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @classmethod
    def of(cls, params: int, trainable: int, gpus: int = GPUS, stage: int = 3) -> ZeroShare:
        """ZeRO-3 shards the weights too; ZeRO-2 keeps all of them on every GPU."""
        weights = params * BF16_BYTES / (gpus if stage == 3 else 1)
        return cls(gpus, weights, trainable * BF16_BYTES / gpus, trainable * ADAM_FP32_BYTES / gpus)

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def zero3_bytes_per_sample(params: int, trainable: int, gpus: int = GPUS) -> float:
    """Bytes each GPU receives per micro-batch of one sample under ZeRO-3 (ring collectives):
    all-gather of every weight for the forward, of the trainable ones again for the backward, and
    the reduce-scatter of their gradients, each moving (g-1)/g of the bf16 tensor."""
    return (params + 2 * trainable) * BF16_BYTES * (gpus - 1) / gpus


def zero2_bytes_per_sample(trainable: int, gpus: int = GPUS, grad_accum: int = GRAD_ACCUM) -> float:
    """Bytes each GPU receives per sample under ZeRO-2: the reduce-scatter of the trainable
    gradients every micro-batch, and one all-gather of the updated trainable weights per optimizer
    step of ``grad_accum`` one-sample micro-batches, each moving (g-1)/g of the bf16 tensor."""
    return trainable * BF16_BYTES * (gpus - 1) / gpus * (1 + 1 / grad_accum)


def zero_bytes_per_sample(stage: int, params: int, trainable: int, gpus: int = GPUS,
                          grad_accum: int = GRAD_ACCUM) -> float:
    return (zero3_bytes_per_sample(params, trainable, gpus) if stage == 3
            else zero2_bytes_per_sample(trainable, gpus, grad_accum))


def link_gb_per_s(spec: DeviceSpec, nodes: int) -> float:
    """The bandwidth a ring over ``nodes`` nodes runs at: NVLink inside one node, else the NIC."""
    return spec.nvlink_gb_per_s if nodes == 1 else min(spec.nvlink_gb_per_s, INTER_NODE_GB_PER_S)


@dataclass(frozen=True)
class ZeroOption:
    """One ZeRO stage on ``nodes`` nodes of 8 GPUs: model state per GPU and traffic per sample."""

    stage: int
    nodes: int
    gpus: int
    state_gib_per_gpu: float
    """bf16 weights + gradients + fp32 Adam state per GPU (activations not included)."""
    comm_gb_per_sample: float
    comm_s_per_sample: float
    gpu_s_per_sample_no_overlap: float
    gpu_s_per_sample_full_overlap: float
    hours_per_epoch_no_overlap: float
    hours_per_epoch_full_overlap: float


def zero_options(spec: DeviceSpec, compute_s: float, params: int, trainable: int, nodes: tuple[int, ...] = NODES,
                 grad_accum: int = GRAD_ACCUM, samples: int = REAL_SAMPLES) -> list[ZeroOption]:
    """ZeRO-2 and ZeRO-3 side by side on 1, 2, 4 nodes, from one GPU's measured seconds per sample:
    ZeRO-2 moves about a third of ZeRO-3's bytes but holds every weight on every GPU, so it wins
    where the traffic is not hidden (across nodes) and the memory is there."""
    if spec.nvlink_gb_per_s <= 0:
        raise ValueError(f"{spec.name} has no NVLink figure to project ZeRO traffic with")
    options = []
    for n in nodes:
        gpus = n * GPUS_PER_NODE
        for stage in (3, 2):
            state = ZeroShare.of(params, trainable, gpus, stage).total_bytes
            moved = zero_bytes_per_sample(stage, params, trainable, gpus, grad_accum)
            comm = moved / (link_gb_per_s(spec, n) * 1e9)
            serial, overlapped = compute_s + comm, max(compute_s, comm)
            options.append(ZeroOption(stage, n, gpus, state / 2**30, moved / 1e9, comm, serial, overlapped,
                                      samples * serial / gpus / 3600, samples * overlapped / gpus / 3600))
    return options


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
