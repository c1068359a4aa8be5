"""One optimizer step's logged record: the step's loss parts and counts summed over all ranks, its
phase times, throughput and (on GPUs) MFU and memory. The trainer sums; this module divides. The
nominal (datasheet) figures of the GPUs janus reports against are here: the MFU and the benchmark's
projections read them."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from janus_train.data.prompt import SEGMENT_NAMES
from janus_train.model.loss import LossDenominators


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


@dataclass
class StepTimes:
    """Seconds of one optimizer step on this rank; compute = forward + backward + optimizer."""

    data_wait: float = 0.0
    compute: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0

    def lap(self, since: float, device: torch.device) -> float:
        """Seconds since ``since`` (after the GPU's queued work, so phases are not blurred)."""
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - since


def step_record(sums: dict[str, torch.Tensor], denominators: LossDenominators, times: StepTimes,
                counts: tuple[int, int, int], *, step: int, epoch: int, lr: float, grad_norm: float,
                distill: float, world: int, device: torch.device, llm_params: int) -> dict[str, Any]:
    """The record of a step from this rank's loss sums, times and (tokens, images, visual tokens):
    every rank calls it (one all-reduce); ``distill``: the action-head weight the step used."""
    tokens, images, visual = counts
    packed = torch.cat([v.reshape(-1).double() for v in sums.values()] + [
        torch.tensor([tokens, images, visual, times.data_wait, times.compute, times.forward, times.backward,
                      times.optimizer], dtype=torch.float64, device=device)
    ])
    dist.all_reduce(packed)
    values = packed.tolist()
    by_name, at = {}, 0
    for name, v in sums.items():
        size = v.numel()
        by_name[name] = values[at : at + size] if size > 1 else values[at]
        at += size
    segment_ce, segment_tokens = by_name["segment_ce_sum"], by_name["segment_tokens"]
    action_ce, action_correct, samples = by_name["action_ce_sum"], by_name["action_correct"], by_name["samples"]
    tokens_all, images_all, visual_all, wait_sum, compute_sum, forward_sum, backward_sum, optim_sum = values[at:]
    token_loss = by_name["weighted_ce_sum"] / max(denominators.weight_sum, 1e-12)
    step_time = (wait_sum + compute_sum) / world
    record: dict[str, Any] = {
        "step": step,
        "epoch": epoch,
        "loss": token_loss + distill * action_ce / max(samples, 1.0),
        "token_loss": token_loss,
        "action_loss": action_ce / max(samples, 1.0),
        "distill_loss_weight": distill,
        "action_accuracy": action_correct / max(samples, 1.0),
        "grad_norm": grad_norm,
        "lr": lr,
        "samples_per_s": samples / max(step_time, 1e-9),
        "tokens_per_s": tokens_all / max(step_time, 1e-9),
        "images_per_sample": images_all / max(samples, 1.0),
        "visual_tokens_per_sample": visual_all / max(samples, 1.0),
        "data_wait_s": wait_sum / world,
        "compute_s": compute_sum / world,
        "forward_s": forward_sum / world,
        "backward_s": backward_sum / world,
        "optimizer_s": optim_sum / world,
        "step_s": step_time,
        "data_wait_share": wait_sum / max(wait_sum + compute_sum, 1e-12),
    }
    for name, ce, n in zip(SEGMENT_NAMES, segment_ce, segment_tokens):
        record[f"loss_{name}"] = ce / n if n else None
    peak = peak_flops(device)
    if peak is not None:
        # Training FLOPs ~ 6 x LLM parameters per token (forward + backward).
        record["mfu"] = 6 * llm_params * tokens_all / (step_time * peak * world)
        record["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        record["alloc_retries"] = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    return record
