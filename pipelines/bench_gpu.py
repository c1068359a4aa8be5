"""`make bench-gpu`: what a janus step costs against the reference step, on one GPU, in one process.

Models are built from the architecture configs in ``configs/models`` with random weights, directly
on the device (no downloads, no checkpoints). Measured, median and min–max over repeats after
warm-up:

* **precompute**: VGGT window features, janus's one-pass batched window (B = 1, 2, 4, 8) vs the
  reference's per-frame loop with a key/value cache (B = 1): windows/s, TFLOP/s, peak memory;
* **training compute per sample**: forward + backward of :mod:`janus_train.workload`'s janus and
  reference steps (no optimizer state: ZeRO-3 shards it over 8 GPUs, its per-GPU share is given
  analytically), per activation-checkpointing policy; s/sample, tokens/s, MFU, peak memory;
  optionally with Liger's fused Qwen2.5-VL kernels when installed;
* FLOPs per component from :mod:`janus_train.flops` (meta device) and the projection to an
  epoch on 8 GPUs (:mod:`pipelines.bench_projection`);
* the data path at the real shape on the host's cores (``--no-data-path`` skips it).

``--smoke`` runs every code path at tiny shapes on the CPU in float32 (the test suite does).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import torch
import typer

from janus_cache.encoder import LEVER_BATCH, WindowEncoder, distinct_frames, lever_batches, lever_settings
from janus_cache.vggt import VGGTAggregator, window_flops
from janus_cache.vggt.attention import BENCH_KERNELS
from janus_train.activation_checkpointing import ActivationCheckpointing
from janus_train.flops import FlopTable, build_model, build_vggt, count_flops, load_vggt_config
from janus_train.model import attention_implementation
from janus_train.vision_attention import describe_attention
from janus_train.workload import VGGT_LAYER, SampleShape, StepRunner, make_batch, stream_window_features
from pipelines.bench import Stat
from pipelines.bench_projection import (
    TARGET_GPU_S_PER_SAMPLE,
    TARGET_VGGT_WINDOWS_PER_S,
    ZeroShare,
    device_spec,
    project,
)

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


REAL = GpuBenchSettings(MODELS / "qwen2_5_vl_7b", MODELS / "vggt_1b.json", SampleShape(), "cuda", torch.bfloat16)
SMOKE = GpuBenchSettings(MODELS / "tiny-qwen2_5_vl", MODELS / "tiny-vggt.json", SampleShape(side=56), "cpu",
                         torch.float32, merger_hidden=96, repeats=1, warmup=1, vggt_batches=(1, 2),
                         checkpointing=("full", "none", "every_2"), threads=1)


# ------------------------------------------------------------------------------ measuring


class Device:
    """Synchronisation and peak memory of the bench's device (CUDA allocator; none on the CPU)."""

    def __init__(self, name: str) -> None:
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated(self.device) / 2**30 if self.cuda else None

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


# ------------------------------------------------------------------------------- sections


def precompute(settings: GpuBenchSettings, device: Device) -> dict[str, Any]:
    """VGGT windows/s: janus's batched one-pass window vs the reference's per-frame KV-cache loop."""
    config = load_vggt_config(settings.vggt_config)
    vggt = build_vggt(config, device.device)
    side, frames = settings.shape.side, settings.shape.images
    rows: dict[str, Any] = {}
    janus_flops = window_flops(config, side, side, frames, last_layer=VGGT_LAYER)
    for batch in settings.vggt_batches:
        images = torch.rand(batch, frames, 3, side, side, device=device.device)
        device.reset_peak()
        try:
            times = timed(device, lambda: vggt.window_features(images), settings.repeats, settings.warmup)
        except RuntimeError as exc:
            if not out_of_memory(exc):
                raise
            rows[f"janus_b{batch}"] = {"batch": batch, "error": "out of memory"}
            continue
        rows[f"janus_b{batch}"] = _window_row(batch, times, janus_flops, device)
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


def vggt_levers(vggt: VGGTAggregator, settings: GpuBenchSettings, device: Device) -> dict[str, Any]:
    """Each VGGT speed lever on its own (janus_cache.encoder.lever_settings): the encoder on uint8
    windows of consecutive samples of one episode, B = 4; compile only on CUDA (minutes on a CPU)."""
    side, frames = settings.shape.side, settings.shape.images
    batches = lever_batches(side)
    flops = window_flops(vggt.config, side, side, frames, last_layer=VGGT_LAYER)
    encoder = WindowEncoder(vggt, "last", VGGT_LAYER, settings.dtype)
    rows: dict[str, Any] = {}
    for name, levers in lever_settings(BENCH_KERNELS[device.device.type]).items():
        if levers.compile and not device.cuda:
            continue
        try:
            run = levers.apply(encoder)
            kernel = vggt.attention_kernel(device.device).describe()
            device.reset_peak()
            times = timed(device, lambda: [run.encode(w) for w in batches], settings.repeats, settings.warmup)
        except (RuntimeError, ValueError) as exc:  # a kernel that does not run here, out of memory
            rows[name] = {"error": (str(exc).strip() or type(exc).__name__).splitlines()[0]}
            continue
        finally:
            vggt.use_attention_kernel(None)
            vggt.fuse(False)
        rows[name] = {**_window_row(LEVER_BATCH * len(batches), times, flops, device), "kernel": kernel}
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


def training(settings: GpuBenchSettings, device: Device, flops: FlopTable) -> dict[str, Any]:
    """Forward + backward per sample of both paths, per checkpointing policy (no optimizer)."""
    config = load_vggt_config(settings.vggt_config)
    model = build_model(settings.qwen_dir, 2 * config.embed_dim, settings.merger_hidden, device.device,
                        settings.dtype, attention_implementation(device.device))
    runner = StepRunner(model, build_vggt(config, device.device))
    batch = make_batch(model, settings.shape)
    spec = device_spec(device.name())
    tokens = settings.shape.sequence_length
    rows: dict[str, Any] = {}

    def measure(name: str, path: str, policy: str) -> None:
        model.set_gradient_checkpointing(ActivationCheckpointing.parse(policy))
        model.train()
        phases: list[dict[str, float]] = []
        losses: list[float] = []

        def step() -> None:
            timer = PhaseTimer(device)
            losses.append(runner.step(path, batch, timer))
            phases.append(timer.seconds)

        device.reset_peak()
        try:
            times = timed(device, step, settings.repeats, settings.warmup)
        except RuntimeError as exc:
            if not out_of_memory(exc):
                raise
            model.zero_grad(set_to_none=True)
            rows[name] = {"path": path, "checkpointing": policy, "error": "out of memory"}
            return
        measured = phases[settings.warmup:]
        step_flops = (flops.janus if path == "janus" else flops.reference).model_flops
        median = statistics.median(times)
        rows[name] = {
            "path": path,
            "checkpointing": policy,
            "s_per_sample": Stat.of(times).__dict__,
            "tokens_per_s": tokens / median,
            "tflop_per_s": step_flops / median / 1e12,
            "mfu": step_flops / median / (spec.bf16_tflops * 1e12) if spec else None,
            "peak_gib": device.peak_gib(),
            "phases_s": {k: statistics.median(p.get(k, 0.0) for p in measured) for k in measured[0]},
            "loss": losses[-1],
        }

    for policy in settings.checkpointing:
        measure(f"janus_{policy}", "janus", policy)
    measure(f"reference_{settings.reference_checkpointing}", "reference", settings.reference_checkpointing)
    liger = _with_liger(model)
    if liger is None:
        measure("janus_full_liger", "janus", "full")
    rows_ok = {k: r for k, r in rows.items() if "s_per_sample" in r}
    best_name = min((k for k, r in rows_ok.items() if r["path"] == "janus"),
                    key=lambda k: rows_ok[k]["s_per_sample"]["median"], default=None)
    janus_best = rows_ok[best_name] if best_name else None
    reference = rows_ok.get(f"reference_{settings.reference_checkpointing}")
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result: dict[str, Any] = {
        "rows": rows,
        "sequence_length": tokens,
        "params": params,
        "trainable_params": trainable,
        "zero3_share_8_gpus": ZeroShare.of(params, trainable).__dict__,
        "liger": "applied" if liger is None else f"not used ({liger})",
        "best_janus": best_name,
        "target_gpu_s_per_sample": TARGET_GPU_S_PER_SAMPLE,
    }
    if janus_best and reference:
        result["ratio_best"] = reference["s_per_sample"]["median"] / janus_best["s_per_sample"]["median"]
        same = rows_ok.get(f"janus_{settings.reference_checkpointing}")
        result["ratio_same_checkpointing"] = same and reference["s_per_sample"]["median"] / same["s_per_sample"]["median"]
    if janus_best and spec and spec.nvlink_gb_per_s > 0:
        result["projection"] = project(spec, janus_best["s_per_sample"]["median"], params, trainable).to_dict()
    else:
        result["projection"] = None
    return result


def _with_liger(model: Any) -> str | None:
    """Apply Liger's Qwen2.5-VL kernels in place; ``None`` when applied, else why not."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed"
    try:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2_5_vl

        apply_liger_kernel_to_qwen2_5_vl(model=model.qwen, cross_entropy=False, fused_linear_cross_entropy=False)
    except Exception as exc:  # an optional accelerator: report, never fail the bench
        return f"{type(exc).__name__}: {exc}"
    return None


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
    out: Annotated[Path, typer.Option(help="Where gpu.json, gpu.md and the plots go.")] = Path("bench"),
    smoke: Annotated[bool, typer.Option(help="Tiny models on the CPU: checks the code paths, measures nothing real.")] = False,
    repeats: Annotated[int, typer.Option(min=1, help="Timed repeats per row (after warm-up).")] = 3,
    data: Annotated[bool, typer.Option("--data-path/--no-data-path",
                                       help="Also measure the data path on the host's cores (not in --smoke).")] = True,
    workers: Annotated[int, typer.Option(min=1, help="Loader workers for the data path.")] = 8,
) -> None:
    """Measure precompute and training compute of janus vs the reference on one GPU."""
    settings = SMOKE if smoke else REAL
    if not smoke and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device here; `make bench-gpu` needs a GPU (`--smoke` runs tiny shapes on the CPU)")
    settings = replace(settings, repeats=repeats if not smoke else settings.repeats)
    from pipelines.bench_report import gpu_markdown, plot_flops, plot_gpu_steps

    results = run(settings)
    out.mkdir(parents=True, exist_ok=True)
    if data and not smoke:
        from pipelines.bench import data_path

        print("[gpu 4/4] data path on the host's cores (pad644, live vs cached)...", flush=True)
        work = out / "work"
        shutil.rmtree(work, ignore_errors=True)
        results["data_path"] = data_path(work, repeats, workers)
        shutil.rmtree(work, ignore_errors=True)
    stem = "gpu_smoke" if smoke else "gpu"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = gpu_markdown(results)
    (out / f"{stem}.md").write_text(table)
    plot_gpu_steps(results, out / f"{stem}_step_breakdown.png")
    plot_flops(results["flops"], f"FLOPs per sample, {results['models']['qwen']} + {results['models']['vggt']}",
               out / f"{stem}_flops.png", results["device"], results["date"])
    print(table)
    print(f"wrote {out / stem}.json/.md and plots in {results['seconds']:.0f} s")


def main() -> None:
    typer.run(command)


if __name__ == "__main__":
    main()
