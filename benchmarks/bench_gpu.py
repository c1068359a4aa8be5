"""`make bench-gpu`: what a janus step costs against the reference step, on one GPU, in one process.

Models are built from the architecture configs in ``configs/models`` with random weights, directly
on the device (no downloads, no checkpoints). Measured, median and min–max over repeats after
warm-up:

* **precompute**: VGGT window features, janus's one-pass batched window (B = 1, 2, 4, 8) vs the
  reference's per-frame loop with a key/value cache (B = 1): windows/s, TFLOP/s, peak memory;
* **training compute per sample**: forward + backward of :mod:`benchmarks.workload`'s janus and
  reference steps (no optimizer state: ZeRO-3 shards it over 8 GPUs, its per-GPU share is given
  analytically), per activation-checkpointing policy, then each lever on its own and all together
  on the fastest policy: the ViT cache, regional ``torch.compile`` of the decoder layers, Liger's
  fused Qwen2.5-VL kernels (:mod:`janus_train.model.kernels`; a row says why when not installed); every
  row on a freshly built model; s/sample, tokens/s, MFU, peak memory;
* FLOPs per component from :mod:`benchmarks.flops` (meta device) and the projection to an
  epoch on 8 GPUs (:mod:`benchmarks.bench_projection`);
* the data path at the real shape on the host's cores (``--no-data-path`` skips it).

``--smoke`` runs every code path at tiny shapes on the CPU in float32 (the test suite does).
``--base qwen3_vl`` measures Qwen3-VL-8B (``configs/models/qwen3_vl_8b``) instead of Qwen2.5-VL-7B,
at the same VGGT-1B window and visual tokens (its frames at 736 px, janus's grid rule): its ViT
with DeepStack, its LLM; the ViT-cache row says it does not apply (Qwen3-VL's DeepStack inputs are
not cached), the Liger row that janus applies Liger's Qwen2.5-VL kernels only.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import importlib
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from benchmarks.bench_projection import (
    TARGET_GPU_S_PER_SAMPLE,
    TARGET_VGGT_WINDOWS_PER_S,
    ZeroShare,
    device_spec,
    project,
    zero_options,
)
from benchmarks.flops import FlopTable, build_model, build_vggt, count_flops, load_vggt_config
from benchmarks.measure import RESULTS_DIR, Stat
from benchmarks.workload import VGGT_LAYER, SampleShape, StepRunner, make_batch, stream_window_features
from janus_core.bases import BASES, DEFAULT_BASE, QWEN2_5_VL, QWEN3_VL, QwenBase, base_of_qwen_dir
from janus_core.vggt import VGGTAggregator, window_flops
from janus_core.vggt.attention import BENCH_KERNELS, SDPA, candidate
from janus_core.vggt.encoder import (
    LEVER_BATCH,
    EncoderLevers,
    WindowEncoder,
    distinct_frames,
    lever_batches,
    lever_settings,
)
from janus_train.model.activation_checkpointing import ActivationCheckpointing
from janus_train.model.janus_model import JanusVLNModel, attention_implementation
from janus_train.model.kernels import apply_liger, compile_decoder_layers, liger_missing
from janus_train.model.vision_attention import describe_attention
from pipelines.command_line import run as run_command

MODELS = Path(__file__).resolve().parent.parent / "configs" / "models"


@dataclass(frozen=True)
class GpuBenchSettings:
    qwen_dir: Path
    vggt_config: Path
    shape: SampleShape
    device: str
    dtype: torch.dtype
    merger_hidden: int = 4096
    repeats: int = 3
    warmup: int = 1
    vggt_batches: tuple[int, ...] = (1, 2, 4, 8)
    checkpointing: tuple[str, ...] = ("full", "none", "every_2", "every_4")
    reference_checkpointing: str = "full"
    """The reference run used gradient checkpointing on every layer."""
    threads: int = 0
    """CPU threads for torch (0: leave as is); the smoke run uses one, steady on a shared machine."""
    compile: bool = True
    """Measure the regional torch.compile rows (minutes of compilation on a CPU: not in the smoke run)."""
    compile_backend: str = "inductor"
    """torch.compile's backend for the decoder layers; the device run's CPU smoke traces with aot_eager
    (no code generation, seconds)."""


REAL = GpuBenchSettings(MODELS / "qwen2_5_vl_7b", MODELS / "vggt_1b.json", SampleShape(), "cuda", torch.bfloat16)
SMOKE = GpuBenchSettings(MODELS / "tiny-qwen2_5_vl", MODELS / "tiny-vggt.json", SampleShape(side=56), "cpu",
                         torch.float32, merger_hidden=96, repeats=1, warmup=1, vggt_batches=(1, 2),
                         checkpointing=("full", "none", "every_2"), threads=1, compile=False)
REAL_BY_BASE: dict[str, GpuBenchSettings] = {
    QWEN2_5_VL.model_type: REAL,
    QWEN3_VL.model_type: replace(REAL, qwen_dir=MODELS / "qwen3_vl_8b"),
}
"""The real architectures per base (``--base``): Qwen2.5-VL-7B, Qwen3-VL-8B, each with VGGT-1B."""
SMOKE_BY_BASE: dict[str, GpuBenchSettings] = {
    QWEN2_5_VL.model_type: SMOKE,
    QWEN3_VL.model_type: replace(SMOKE, qwen_dir=MODELS / "tiny-qwen3_vl"),
}


# ------------------------------------------------------------------------------ measuring


class Device:
    """Synchronisation and memory of the bench's device (the CUDA allocator; none on the CPU)."""

    def __init__(self, name: str) -> None:
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def free(self) -> None:
        """Gives back what an earlier row left: its tensors once unreferenced, the allocator's cached blocks."""
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def allocated_gib(self) -> float | None:
        return torch.cuda.memory_allocated(self.device) / 2**30 if self.cuda else None

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.cuda else None

    def peak_reserved_gib(self) -> float | None:
        return torch.cuda.max_memory_reserved(self.device) / 2**30 if self.cuda else None

    def total_gib(self) -> float | None:
        return torch.cuda.get_device_properties(self.device).total_memory / 2**30 if self.cuda else None

    def name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else "cpu"


@dataclass
class PhaseTimer:
    """A ``phase(name)`` that times each phase of a step (synchronising the device around it)."""

    device: Device
    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.device.sync()
        start = time.perf_counter()
        yield
        self.device.sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def timed(device: Device, fn: Callable[[], Any], repeats: int, warmup: int) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        device.sync()
        start = time.perf_counter()
        fn()
        device.sync()
        times.append(time.perf_counter() - start)
    return times


def out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc)


class Unavailable(Exception):
    """A row's lever or kernel cannot run here (a package not installed, a lever its base does not take)."""


# ------------------------------------------------------------------------------- sections


def precompute(settings: GpuBenchSettings, device: Device) -> dict[str, Any]:
    """VGGT windows/s: janus's batched one-pass window vs the reference's per-frame KV-cache loop."""
    config = load_vggt_config(settings.vggt_config)
    vggt = build_vggt(config, device.device)
    side, frames = settings.shape.side, settings.shape.images
    rows: dict[str, Any] = {}
    for batch in settings.vggt_batches:
        try:
            rows[f"janus_b{batch}"] = measure_windows(vggt, settings, device, batch)
        except RuntimeError as exc:
            if not out_of_memory(exc):
                raise
            rows[f"janus_b{batch}"] = {"batch": batch, "error": "out of memory"}
            device.free()
    window = torch.randint(0, 256, (1, frames, side, side, 3), dtype=torch.uint8, device=device.device)
    device.reset_peak()
    times = timed(device, lambda: stream_window_features(vggt, window), settings.repeats, settings.warmup)
    # The reference computes every block pair per frame (its output list holds all of them).
    rows["reference_b1"] = _window_row(1, times, window_flops(config, side, side, frames), device)
    best = max((r for r in rows.values() if "windows_per_s" in r and r is not rows["reference_b1"]),
               key=lambda r: r["windows_per_s"]["median"])
    reference = rows["reference_b1"]["windows_per_s"]["median"]
    return {
        "rows": rows,
        "best_batch": best["batch"],
        "ratio_best": best["windows_per_s"]["median"] / reference,
        "ratio_b1": rows["janus_b1"]["windows_per_s"]["median"] / reference if "windows_per_s" in rows["janus_b1"] else None,
        "target_windows_per_s": TARGET_VGGT_WINDOWS_PER_S,
        "levers": vggt_levers(vggt, settings, device),
    }


def measure_windows(vggt: VGGTAggregator, settings: GpuBenchSettings, device: Device, batch: int,
                    repeats: int | None = None, warmup: int | None = None) -> dict[str, Any]:
    """Windows/s of janus's one-pass batched window on ``batch`` random windows per call (the
    aggregator's automatic kernel, no dedup, eager)."""
    side, frames = settings.shape.side, settings.shape.images
    images = torch.rand(batch, frames, 3, side, side, device=device.device)
    device.reset_peak()
    times = timed(device, lambda: vggt.window_features(images), settings.repeats if repeats is None else repeats,
                  settings.warmup if warmup is None else warmup)
    flops = window_flops(vggt.config, side, side, frames, last_layer=VGGT_LAYER)
    return {**_window_row(batch, times, flops, device), "kernel": vggt.attention_kernel(device.device).describe()}


def lever_encoder(vggt: VGGTAggregator, settings: GpuBenchSettings) -> WindowEncoder:
    """The precompute's encoder on ``vggt`` as the lever rows run it (reference frame last, layer -2)."""
    return WindowEncoder(vggt, "last", VGGT_LAYER, settings.dtype)


def measure_vggt_lever(encoder: WindowEncoder, levers: EncoderLevers, batches: list[torch.Tensor], device: Device,
                       repeats: int, warmup: int) -> tuple[dict[str, Any], torch.Tensor]:
    """Windows/s of the encoder with ``levers`` on the uint8 window ``batches`` (one timed call runs
    them all), and its features of the first batch (float32, on the CPU: to compare levers). Raises
    Unavailable for a kernel that is not installed; the aggregator is back to its automatic kernel
    and eager blocks afterwards."""
    vggt = encoder.model
    if levers.kernel not in (None, SDPA) and candidate(levers.kernel) is None:
        raise Unavailable(f"attention kernel {levers.kernel} is not installed")
    frames, side = batches[0].shape[1], batches[0].shape[2]
    flops = window_flops(vggt.config, side, side, frames, last_layer=VGGT_LAYER)
    first: list[torch.Tensor] = []
    try:
        run = levers.apply(encoder)
        kernel = vggt.attention_kernel(device.device).describe()
        device.reset_peak()

        def encode_all() -> None:
            first[:] = [run.encode(w) for w in batches][:1]

        times = timed(device, encode_all, repeats, warmup)
    finally:
        vggt.use_attention_kernel(None)
        vggt.fuse(False)
    windows = sum(int(w.shape[0]) for w in batches)
    distinct = sum(len(distinct_frames(w)[0]) for w in batches) / windows
    row = {**_window_row(windows, times, flops, device), "kernel": kernel, "windows_per_call": int(batches[0].shape[0]),
           "frames_per_window": float(distinct if levers.dedup else frames)}
    return row, first[0].float().cpu()


def vggt_levers(vggt: VGGTAggregator, settings: GpuBenchSettings, device: Device) -> dict[str, Any]:
    """Each VGGT speed lever on its own (janus_core.vggt.encoder.lever_settings): the encoder on uint8
    windows of consecutive samples of one episode, B = 4; compile only on CUDA (minutes on a CPU)."""
    batches = lever_batches(settings.shape.side)
    encoder = lever_encoder(vggt, settings)
    rows: dict[str, Any] = {}
    for name, levers in lever_settings(BENCH_KERNELS[device.device.type]).items():
        if levers.compile and not device.cuda:
            continue
        try:
            rows[name], _ = measure_vggt_lever(encoder, levers, batches, device, settings.repeats, settings.warmup)
        except (RuntimeError, ValueError, Unavailable) as exc:  # a kernel that does not run here, out of memory
            rows[name] = {"error": (str(exc).strip() or type(exc).__name__).splitlines()[0]}
            device.free()
    distinct = sum(len(distinct_frames(w)[0]) for w in batches) / (LEVER_BATCH * len(batches))
    return {"rows": rows, "batch": LEVER_BATCH, "distinct_frames_per_window": distinct}


def _window_row(batch: int, times: list[float], flops_per_window: float, device: Device) -> dict[str, Any]:
    return {
        "batch": batch,
        "windows_per_s": Stat.of([batch / t for t in times]).__dict__,
        "tflop_per_s": flops_per_window * batch / statistics.median(times) / 1e12,
        "tflop_per_window": flops_per_window / 1e12,
        "peak_gib": device.peak_gib(),
    }


@dataclass(frozen=True)
class Levers:
    """The training-step levers of one row (each a setting a run can choose)."""

    vit_cache: bool = False
    """The frames' ViT output comes with the batch (cache.vit_features): only the mergers run."""
    compile: bool = False
    """Regional torch.compile of the decoder layers (train.compile_layers)."""
    liger: bool = False
    """Liger's fused Qwen2.5-VL kernels (train.liger_kernels)."""

    NAMES = ("vit_cache", "compile", "liger")

    def suffix(self) -> str:
        return "".join(f"_{name}" for name in self.NAMES if getattr(self, name))

    def names(self) -> list[str]:
        return [name for name in self.NAMES if getattr(self, name)]


def lever_rows(compile_rows: bool, base: QwenBase = DEFAULT_BASE) -> list[Levers]:
    """Each lever on its own, then all that apply here together (the ViT cache and Liger where they
    apply to ``base``, Liger where installed; compile unless ``compile_rows`` is off), measured on
    the fastest checkpointing policy."""
    alone = [Levers(vit_cache=True), Levers(compile=True), Levers(liger=True)]
    return [levers for levers in (*alone, all_levers(compile_rows, base))
            if (compile_rows or not levers.compile) and levers != Levers()]


def all_levers(compile_rows: bool = True, base: QwenBase = DEFAULT_BASE) -> Levers:
    """Every lever that applies here together: the ViT cache, compile (unless ``compile_rows`` is
    off), Liger where installed and ``base`` takes it."""
    return Levers(vit_cache=True, compile=compile_rows, liger=liger_missing() is None and base is DEFAULT_BASE)


def lever_missing(levers: Levers, model: JanusVLNModel) -> str | None:
    """Why a lever does not apply to the model's base, or None (Qwen2.5-VL takes every lever)."""
    base = model.base
    if levers.liger and base is not DEFAULT_BASE:
        return f"janus applies Liger's {DEFAULT_BASE.name} kernels only, not {base.name}'s"
    return None


@dataclass(frozen=True)
class StepRow:
    """One training-step row: the path, the checkpointing policy, the levers and the micro-batch."""

    path: str = "janus"
    policy: str = "full"
    levers: Levers = Levers()
    micro_batch: int = 1

    @property
    def name(self) -> str:
        return f"{self.path}_{self.policy}{self.levers.suffix()}" + (f"_mb{self.micro_batch}" if self.micro_batch > 1 else "")


def micro_batch(model: JanusVLNModel, shape: SampleShape, samples: int, vit_cache: bool = False) -> dict[str, torch.Tensor]:
    """``samples`` synthetic samples (:func:`make_batch`, seeds 0, 1, ...) in one micro-batch, stacked
    on the batch dimension as the loader's collate stacks them (they have one layout: no padding)."""
    parts = [make_batch(model, shape, seed=seed, vit_cache=vit_cache) for seed in range(samples)]
    if samples == 1:
        return parts[0]
    # M-RoPE positions are [3, B, L]; every other tensor has the batch first.
    return {key: torch.cat([p[key] for p in parts], dim=1 if key == "position_ids" else 0) for key in parts[0]}


@contextlib.contextmanager
def module_globals_kept(module: ModuleType) -> Iterator[None]:
    """Puts ``module``'s globals back as they were: Liger patches transformers' Qwen2.5-VL module (its
    RoPE function, RMSNorm and MLP classes) for every model built after it, and the row after a
    Liger row builds a plain model."""
    saved = dict(vars(module))
    try:
        yield
    finally:
        for name in [name for name in vars(module) if name not in saved]:
            delattr(module, name)
        for name, value in saved.items():
            if vars(module).get(name) is not value:
                setattr(module, name, value)


def liger_patched_module() -> ModuleType:
    """The transformers module whose globals Liger's Qwen2.5-VL patch replaces (its modeling module)."""
    return importlib.import_module(DEFAULT_BASE.transformers_class().__module__)


def model_sizes(settings: GpuBenchSettings) -> tuple[int, int]:
    """Parameters and trainable parameters of the bench's model (counted on the meta device)."""
    model = build_model(settings.qwen_dir, 2 * load_vggt_config(settings.vggt_config).embed_dim, settings.merger_hidden)
    return sum(p.numel() for p in model.parameters()), sum(p.numel() for p in model.parameters() if p.requires_grad)


def fresh_model(settings: GpuBenchSettings, device: Device, levers: Levers) -> JanusVLNModel:
    """A newly built model (seed 0) with ``levers`` applied; Unavailable where one cannot apply here."""
    torch.manual_seed(0)
    model = build_model(settings.qwen_dir, 2 * load_vggt_config(settings.vggt_config).embed_dim, settings.merger_hidden,
                        device.device, settings.dtype, attention_implementation(device.device))
    missing = lever_missing(levers, model) or (liger_missing() if levers.liger else None)
    if missing is not None:
        raise Unavailable(missing)
    if levers.liger:
        apply_liger(model.qwen)
    if levers.compile:
        compile_decoder_layers(model.qwen.model.language_model.layers, backend=settings.compile_backend)
    return model


def measure_step(settings: GpuBenchSettings, device: Device, flops: FlopTable | None, row: StepRow,
                 vggt: VGGTAggregator | None = None, *, repeats: int | None = None, warmup: int | None = None,
                 profile_trace: Path | None = None) -> dict[str, Any]:
    """Forward + backward of ``row`` (no optimizer) on a freshly built model: seconds per sample (a
    step of ``row.micro_batch`` samples over their number), its phases per sample, the peak memory
    and the memory the model held before its first step (``resident_gib``); with
    ``profile_trace``, one more step under torch.profiler (:func:`profiled_step`). Raises
    Unavailable when a lever cannot apply here and the device's error when out of memory; what the
    row built is released either way (a compiled row's graphs too), and a Liger row puts
    transformers' Qwen2.5-VL module back as it found it."""
    repeats = settings.repeats if repeats is None else repeats
    warmup = settings.warmup if warmup is None else warmup
    held: dict[str, Any] = {}  # the row's model, runner and batch: dropped in one place, whatever happens
    phases: list[dict[str, float]] = []
    losses: list[float] = []
    try:
        with module_globals_kept(liger_patched_module()) if row.levers.liger else contextlib.nullcontext():
            model = held["model"] = fresh_model(settings, device, row.levers)
            model.set_gradient_checkpointing(ActivationCheckpointing.parse(row.policy))
            model.train()
            runner = held["runner"] = StepRunner(model, vggt)
            batch = held["batch"] = micro_batch(model, settings.shape, row.micro_batch, vit_cache=row.levers.vit_cache)
            base = model.base
            del model

            def step() -> None:
                timer = PhaseTimer(device)
                losses.append(runner.step(row.path, batch, timer))
                phases.append(timer.seconds)

            device.reset_peak()
            resident = device.allocated_gib()
            times = timed(device, step, repeats, warmup)
            peak, reserved = device.peak_gib(), device.peak_reserved_gib()
            profile = None
            if profile_trace is not None:
                profile = {"checkpointing": row.policy, "levers": row.levers.names(), "micro_batch": row.micro_batch,
                           **profiled_step(runner, row.path, batch, device, profile_trace)}
    finally:
        held.clear()
        runner = batch = None  # noqa: F841  (the closure's references)
        if row.levers.compile:
            torch.compiler.reset()
        device.free()
        device.reset_peak()
    samples = row.micro_batch
    per_sample = [t / samples for t in times]
    median = statistics.median(per_sample)
    step_flops = None if flops is None else (
        flops.janus_vit_cache if row.levers.vit_cache else flops.janus if row.path == "janus" else flops.reference
    ).model_flops
    spec = device_spec(device.name())
    measured = phases[warmup:]
    result: dict[str, Any] = {
        "path": row.path,
        "checkpointing": row.policy,
        "levers": row.levers.names(),
        "micro_batch": samples,
        "base": base.model_type,
        "model": settings.qwen_dir.name,
        "s_per_sample": Stat.of(per_sample).__dict__,
        "tokens_per_s": settings.shape.sequence_length / median,
        "tflop_per_s": None if step_flops is None else step_flops / median / 1e12,
        "mfu": step_flops / median / (spec.bf16_tflops * 1e12) if step_flops is not None and spec else None,
        "peak_gib": peak,
        "peak_reserved_gib": reserved,
        "resident_gib": resident,
        "phases_s": {k: statistics.median(p.get(k, 0.0) for p in measured) / samples for k in measured[0]},
        "loss": losses[-1],
    }
    if profile is not None:
        result["profile"] = profile
    return result


def training(settings: GpuBenchSettings, device: Device, flops: FlopTable) -> dict[str, Any]:
    """Forward + backward per sample of both paths (no optimizer): each checkpointing policy, then
    each lever on the fastest janus policy, every row on a freshly built model (a setting, a hook or
    a compiled layer of one row never leaks into the next)."""
    config = load_vggt_config(settings.vggt_config)
    vggt = build_vggt(config, device.device)
    spec = device_spec(device.name())
    rows: dict[str, Any] = {}

    def measure(row: StepRow) -> None:
        try:
            rows[row.name] = measure_step(settings, device, flops, row, vggt)
        except Unavailable as exc:
            rows[row.name] = {"path": row.path, "checkpointing": row.policy, "error": f"not measured: {exc}"}
        except RuntimeError as exc:
            if not out_of_memory(exc):
                raise
            rows[row.name] = {"path": row.path, "checkpointing": row.policy, "error": "out of memory"}
        device.free()

    def fastest(names: list[str]) -> str | None:
        ok = [n for n in names if "s_per_sample" in rows.get(n, {})]
        return min(ok, key=lambda n: rows[n]["s_per_sample"]["median"], default=None)

    for policy in settings.checkpointing:
        measure(StepRow("janus", policy))
    measure(StepRow("reference", settings.reference_checkpointing))
    best_policy_row = fastest([f"janus_{policy}" for policy in settings.checkpointing])
    lever_policy = rows[best_policy_row]["checkpointing"] if best_policy_row else settings.reference_checkpointing
    for levers in lever_rows(settings.compile, base_of_qwen_dir(settings.qwen_dir)):
        row = StepRow("janus", lever_policy, levers)
        if row.name not in rows:
            measure(row)
    janus_rows = [name for name, row in rows.items() if row["path"] == "janus"]
    best_name = fastest(janus_rows)
    janus_best = rows[best_name] if best_name else None
    reference = rows.get(f"reference_{settings.reference_checkpointing}")
    reference = reference if reference and "s_per_sample" in reference else None
    params, trainable = model_sizes(settings)
    result: dict[str, Any] = {
        "rows": rows,
        "sequence_length": settings.shape.sequence_length,
        "params": params,
        "trainable_params": trainable,
        "zero3_share_8_gpus": ZeroShare.of(params, trainable).__dict__,
        "liger": liger_missing() or "applied in the *_liger rows",
        "lever_checkpointing": lever_policy,
        "best_janus": best_name,
        "target_gpu_s_per_sample": TARGET_GPU_S_PER_SAMPLE,
    }
    if janus_best and reference:
        result["ratio_best"] = reference["s_per_sample"]["median"] / janus_best["s_per_sample"]["median"]
        same = rows.get(f"janus_{settings.reference_checkpointing}")
        result["ratio_same_checkpointing"] = (reference["s_per_sample"]["median"] / same["s_per_sample"]["median"]
                                              if same and "s_per_sample" in same else None)
    if janus_best and spec and spec.nvlink_gb_per_s > 0:
        compute_s = janus_best["s_per_sample"]["median"]
        result["projection"] = project(spec, compute_s, params, trainable).to_dict()
        result["zero_stages"] = [option.__dict__ for option in zero_options(spec, compute_s, params, trainable)]
    else:
        result["projection"] = result["zero_stages"] = None
    return result


PROFILE_TOP_OPS = 25


def profiled_step(runner: StepRunner, path: str, batch: dict[str, torch.Tensor], device: Device,
                  trace: Path) -> dict[str, Any]:
    """One step of ``path`` under ``torch.profiler`` (after the caller's warm-up): the trace for
    chrome://tracing / Perfetto at ``trace`` (gzip-compressed where its name ends in .gz: a 7B
    step's trace is tens of MB), and the top operators by their own device time (CPU time without
    CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.cuda else [])
    with profile(activities=activities) as prof:
        runner.step(path, batch)
        device.sync()
    trace.parent.mkdir(parents=True, exist_ok=True)
    if trace.suffix == ".gz":
        plain = trace.with_suffix("")
        prof.export_chrome_trace(str(plain))
        with plain.open("rb") as source, gzip.open(trace, "wb", compresslevel=6) as target:
            shutil.copyfileobj(source, target)
        plain.unlink()
    else:
        prof.export_chrome_trace(str(trace))
    key = "self_device_time_total" if device.cuda else "self_cpu_time_total"
    averages = prof.key_averages()
    events = sorted(averages, key=lambda e: getattr(e, key), reverse=True)[:PROFILE_TOP_OPS]
    total = sum(getattr(e, key) for e in averages) or 1.0
    top = [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3, "share": getattr(e, key) / total}
           for e in events]
    return {"trace": trace.name, "time": "device" if device.cuda else "cpu", "top_ops": top}


def profile_step(settings: GpuBenchSettings, device: Device, policy: str, trace: Path) -> dict[str, Any]:
    """One janus step (after a warm-up step) under ``torch.profiler`` on a fresh model at ``policy``
    (:func:`profiled_step`)."""
    return measure_step(settings, device, None, StepRow("janus", policy), repeats=1, warmup=0,
                        profile_trace=trace)["profile"]


def run(settings: GpuBenchSettings) -> dict[str, Any]:
    """Every section of the GPU bench; returns the results (JSON-ready)."""
    device = Device(settings.device)
    started = time.perf_counter()
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    try:
        return _run(settings, device, started)
    finally:
        torch.set_num_threads(threads)


def _run(settings: GpuBenchSettings, device: Device, started: float) -> dict[str, Any]:
    print("[gpu 1/4] FLOPs per sample (meta device)...", flush=True)
    flops = count_flops(settings.qwen_dir, settings.vggt_config, settings.shape, merger_hidden=settings.merger_hidden)
    results: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": device.name(),
        "torch": torch.__version__,
        "attention": describe_attention(attention_implementation(device.device), device.device, settings.dtype),
        "dtype": str(settings.dtype).removeprefix("torch."),
        "models": {"qwen": settings.qwen_dir.name, "vggt": settings.vggt_config.name},
        "flops": flops.to_dict(),
    }
    print("[gpu 2/4] precompute: VGGT windows, batched vs per-frame loop...", flush=True)
    results["precompute"] = precompute(settings, device)
    print("[gpu 3/4] training compute per sample, janus vs reference...", flush=True)
    results["training"] = training(settings, device, flops)
    results["seconds"] = time.perf_counter() - started
    return results


def command(
    out: Annotated[Path, typer.Option(help="Where gpu.json, gpu.md and the plots go.")] = RESULTS_DIR,
    smoke: Annotated[bool, typer.Option(help="Tiny models on the CPU: checks the code paths, measures nothing real.")] = False,
    base: Annotated[str, typer.Option(help="The Qwen base: qwen2_5_vl (Qwen2.5-VL-7B) or qwen3_vl (Qwen3-VL-8B; "
                                      "--smoke: the tiny Qwen3-VL).")] = DEFAULT_BASE.model_type,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats per row (after warm-up).")] = 3,
    data: Annotated[bool, typer.Option("--data-path/--no-data-path",
                                       help="Also measure the data path on the host's cores (not in --smoke).")] = True,
    workers: Annotated[int, typer.Option(min=1, help="Loader workers for the data path.")] = 8,
    profile: Annotated[bool, typer.Option(help="Also profile one janus step (fastest policy) with torch.profiler: "
                                          "a trace (<stem>_profile_trace.json) and a top-ops table.")] = False,
) -> None:
    """Measure precompute and training compute of janus vs the reference on one GPU."""
    if base not in BASES:
        raise typer.BadParameter(f"--base must be one of {', '.join(BASES)}, got {base!r}")
    settings = (SMOKE_BY_BASE if smoke else REAL_BY_BASE)[base]
    if not smoke and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device here; `make bench-gpu` needs a GPU (`--smoke` runs tiny shapes on the CPU)")
    settings = replace(settings, repeats=repeats if not smoke else settings.repeats)
    from benchmarks.bench_report import gpu_markdown, plot_flops, plot_gpu_steps

    results = run(settings)
    out.mkdir(parents=True, exist_ok=True)
    if data and not smoke:
        from benchmarks.data_path import data_path

        print("[gpu 4/4] data path on the host's cores (pad644, live vs cached)...", flush=True)
        work = out / "work"
        shutil.rmtree(work, ignore_errors=True)
        results["data_path"] = data_path(work, repeats, workers)
        shutil.rmtree(work, ignore_errors=True)
    # Qwen2.5-VL keeps its file names; another base's results sit beside them.
    stem = ("gpu_smoke" if smoke else "gpu") + ("" if base == DEFAULT_BASE.model_type else f"_{base}")
    if profile:
        print("[gpu] profiling one janus step...", flush=True)
        results["profile"] = profile_step(settings, Device(settings.device), results["training"]["lever_checkpointing"],
                                          out / f"{stem}_profile_trace.json")
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = gpu_markdown(results)
    (out / f"{stem}.md").write_text(table)
    plot_gpu_steps(results, out / f"{stem}_step_breakdown.png")
    plot_flops(results["flops"], f"FLOPs per sample, {results['models']['qwen']} + {results['models']['vggt']}",
               out / f"{stem}_flops.png", results["device"], results["date"])
    print(table)
    print(f"wrote {out / stem}.json/.md and plots in {results['seconds']:.0f} s")


def main() -> None:
    run_command(command)


if __name__ == "__main__":
    main()
