"""The prepared GPU run: every measurement the speed decisions wait on, in rows, within the time
limits of at most two calls on a GPU machine without network (``benchmarks/device_run.sh``,
docs/benchmarks.md "The prepared GPU run").

The rows, most needed first: Qwen2.5-VL-7B's training step for each checkpointing policy; the
ViT-output cache, Liger, regional compile and all levers on the fastest policy that fits an 80 GB
GPU; micro-batches 2 and 4 at that policy; the CUDA bf16 difference of cached and live ViT output;
the best configuration once more with one step under torch.profiler; VGGT-1B's windows/s at 644²
(B = 4, 8, 16; today's path, compile and all levers, each lever's features against today's);
Qwen3-VL-8B at the chosen configuration; then each remaining VGGT lever alone, all levers on the
next faster policy, the micro-batches at full checkpointing where they did not fit, all VGGT
levers at the best B and Qwen3-VL-8B compiled. Each row's figures are a median and min–max over
repeats after warm-up, with peak memory; the row-measuring code is :mod:`benchmarks.bench_gpu`'s,
the decisions :mod:`benchmarks.device_decide`'s.

Part 1 runs the rows in that order until its budget is spent; part 2 (``--with`` part 1's JSON)
runs the rows part 1 left: skipped for time, timed out, interrupted, or failed (those last). The
run degrades per row: a row that fails, runs out of memory, cannot apply here or outlives twice
its budget is recorded as such (its memory freed) and the next row runs; a row whose condition
does not hold is recorded as not needed; a row whose budget no longer fits before the deadline is
recorded as skipped for time; SIGTERM (the script's timeout) records the row in progress as
interrupted, and a broken CUDA context stops the call the same way. After every row the JSON, the
Markdown and the plot of its section under ``--out`` are rewritten, so a call cut short returns
what it has. Budgets come from the H100 run of ``make bench-gpu`` (``benchmarks/results/gpu.json``):
``python -m benchmarks.device_run plan`` prints them.

    python -m benchmarks.device_run run --part 1 --out OUT --budget-s 480   # on the GPU (device_run.sh)
    python -m benchmarks.device_run run --part 2 --with part1.json ...      # the rows part 1 left
    python -m benchmarks.device_run run --smoke --out OUT                   # tiny models, CPU, seconds
    python -m benchmarks.device_run decide part1.json part2.json --out DIR  # decisions from both calls
    python -m benchmarks.device_run plan                                    # rows and budgets
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any

import typer

from benchmarks import device_decide
from benchmarks.device_env import project_requirements, wheels
from benchmarks.measure import RESULTS_DIR
from janus_core.bases import QWEN2_5_VL as BASE_2_5
from janus_core.bases import QWEN3_VL as BASE_3
from pipelines.command_line import command_app

H100_RESULTS = RESULTS_DIR / "gpu.json"
CPU_RESULTS = RESULTS_DIR / "results.json"
PARTS = ("1", "2")

OK, OOM, FAILED, UNAVAILABLE = "ok", "out of memory", "failed", "unavailable"
TIMED_OUT, SKIPPED_FOR_TIME, NOT_NEEDED, INTERRUPTED = "timed out", "skipped for time", "not needed", "interrupted"
STATUSES = (OK, OOM, FAILED, UNAVAILABLE, TIMED_OUT, SKIPPED_FOR_TIME, NOT_NEEDED, INTERRUPTED)
LEFT_FOR_PART_2 = (SKIPPED_FOR_TIME, TIMED_OUT, INTERRUPTED)
"""Statuses of part 1's rows that part 2 runs again (then its failed rows, last)."""

POLICIES = ("full", "every_2", "every_4", "none")
"""Checkpointing policies from the slowest (least memory) to the fastest (most memory)."""
MICRO_BATCHES = (2, 4)
QWEN2_5_VL, QWEN3_VL = BASE_2_5.model_type, BASE_3.model_type
VGGT_BATCHES = (4, 8, 16)
CONTEXT_LOST = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS_EXECUTION_FAILED")
"""Errors after which a CUDA context is unusable: the call stops and part 2 runs the rest."""

# What a row costs beyond its timed work (seconds on an H100-class GPU). The H100 run spent ~2 s
# per training row beyond its steps; the compile allowances are not measured yet.
BUILD_S = 6.0
"""A fresh 7B model on the GPU, its batch, its release."""
FLOPS_S = 15.0
"""FLOPs of one base on the meta device (5 s on the 2-core development VM)."""
COLD_COMPILE_S = 60.0
"""Regional torch.compile of a decoder layer, forward and backward, on cold caches (allowance)."""
WARM_COMPILE_S = 20.0
"""The same graph again (inductor's and AOTAutograd's caches hold it; dynamo traces anew)."""
VGGT_COMPILE_S = 40.0
"""torch.compile of VGGT's two block regions, static then dynamic sizes (allowance)."""
LIGER_S = 20.0
"""Triton's compilation of Liger's kernels on their first call (allowance)."""
PROFILE_S = 20.0
"""One step under torch.profiler and its trace written (gzip)."""
NUMERICS_S = 20.0
"""The 7B ViT built alone, four windows encoded as precompute and live."""
STEP_WARMUP, STEP_REPEATS, COMPILED_WARMUP = 1, 3, 2
WINDOW_WARMUP, WINDOW_REPEATS = 1, 3
LEVER_WARMUP, LEVER_REPEATS = 1, 2
SMOKE_ROW_S = 4.0
"""Every row's budget in the smoke mode (tiny models on the CPU take a second or a few)."""
WRITE_RESERVE_S = 5.0
"""Kept free before the deadline for the last write of the results."""
OVERRUN, OVERRUN_S = 2.0, 30.0
"""A row is stopped at OVERRUN times its budget plus OVERRUN_S, or at the deadline."""
MAX_RETURNED_BYTES = 15 * 2**20
"""The largest file kept under OUT (a call returns files of up to 16 MiB)."""
CALL_BUDGETS_S = (480.0, 180.0)
"""The rows' budgets of the two calls as docs/benchmarks.md runs them: device_run.sh's limits of 530 s
and 220 s less its reserve of 40 s for the start (wheels, imports) and the end, and the wheels' install."""


class RowTimeout(BaseException):
    """The row outlived its time (a BaseException, so no library's ``except Exception`` swallows it)."""


class Interrupted(BaseException):
    """SIGTERM: the script's time limit is near."""


class NotNeeded(Exception):
    """A conditional row whose condition does not hold (the message says why)."""


class SimulatedFailure(RuntimeError):
    """Raised by ``--simulate ROW=error`` (the tests' way to make a row fail)."""


@dataclass(frozen=True)
class Row:
    name: str
    section: str
    what: str
    budget_s: float
    measure: Callable[[Run], dict[str, Any]] = field(repr=False, compare=False)
    needed: Callable[[Run], None] | None = field(default=None, repr=False, compare=False)
    """Raises NotNeeded where the row's condition does not hold (checked before the budget)."""


# ----------------------------------------------------------------------------- budgets


@dataclass(frozen=True)
class Expected:
    """Seconds of the timed work of each kind of row, from the H100 run of ``make bench-gpu``."""

    step_s: dict[str, float]
    """One Qwen2.5-VL-7B sample per checkpointing policy (``none``: out of memory there, so every_4's)."""
    windows_per_s: float
    """VGGT-1B windows at B = 8."""
    qwen3_over_7b: float
    """Qwen3-VL-8B's FLOPs per sample over Qwen2.5-VL-7B's (``make bench``'s table by base)."""

    @classmethod
    def from_results(cls, gpu: Path = H100_RESULTS, cpu: Path = CPU_RESULTS) -> Expected:
        data = json.loads(gpu.read_text())
        training, windows = data["training"]["rows"], data["precompute"]["rows"]
        step = {p: training[f"janus_{p}"]["s_per_sample"]["median"] for p in POLICIES
                if "s_per_sample" in training.get(f"janus_{p}", {})}
        step.setdefault("none", min(step.values()))
        by_base = json.loads(cpu.read_text())["flops_by_base"]
        ratio = by_base["qwen3_vl_8b"]["janus_total"] / by_base["qwen2_5_vl_7b"]["janus_total"]
        return cls(step, windows["janus_b8"]["windows_per_s"]["median"], ratio)

    def step_row(self, policy: str, micro_batch: int = 1, compile_s: float = 0.0, liger: bool = False,
                 qwen3: bool = False, profile: bool = False) -> float:
        steps = (COMPILED_WARMUP if compile_s else STEP_WARMUP) + STEP_REPEATS + profile
        step = self.step_s[policy] * micro_batch * (self.qwen3_over_7b if qwen3 else 1)
        return BUILD_S + steps * step + compile_s + LIGER_S * liger + PROFILE_S * profile

    def windows_row(self, windows_per_call: int, calls: int, compile_s: float = 0.0) -> float:
        return windows_per_call * calls / self.windows_per_s + compile_s


# ----------------------------------------------------------------------------- the run


@dataclass
class Run:
    """One call's run: its device, settings, deadline and the rows measured so far."""

    part: str
    out: Path
    smoke: bool
    budget_s: float
    earlier: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Part 1's rows (``--with``): part 2's configurations and the decisions read them."""
    simulate: dict[str, str] = field(default_factory=dict)
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    plan: list[Row] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    env: dict[str, Any] = field(default_factory=dict)
    broken: str = ""
    """The row whose failure left the CUDA context unusable (the call stops there)."""
    _cache: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return f"part{self.part}"

    def left(self) -> float:
        return self.started + self.budget_s - time.monotonic() - WRITE_RESERVE_S

    def all_rows(self) -> dict[str, dict[str, Any]]:
        return {**self.earlier, **self.rows}

    def row(self, name: str) -> dict[str, Any]:
        return self.all_rows().get(name, {})

    # -- state the rows share (built once per call)

    @property
    def device(self) -> Any:
        from benchmarks.bench_gpu import Device

        if "device" not in self._cache:
            self._cache["device"] = Device("cpu" if self.smoke else "cuda")
        return self._cache["device"]

    def settings(self, base: str) -> Any:
        from benchmarks.bench_gpu import REAL_BY_BASE, SMOKE_BY_BASE

        if self.smoke:  # compile rows trace with aot_eager: no C++ code generation on the CPU
            return replace(SMOKE_BY_BASE[base], compile=True, compile_backend="aot_eager")
        return REAL_BY_BASE[base]

    def flops(self, base: str) -> Any:
        """The FLOP table of ``base`` (counted once per call, on the meta device: seconds)."""
        if f"flops_{base}" not in self._cache:
            from benchmarks.flops import count_flops

            settings = self.settings(base)
            self._cache[f"flops_{base}"] = count_flops(settings.qwen_dir, settings.vggt_config, settings.shape,
                                                       merger_hidden=settings.merger_hidden)
        return self._cache[f"flops_{base}"]

    def sizes(self, base: str) -> tuple[int, int]:
        from benchmarks.bench_gpu import model_sizes

        if f"sizes_{base}" not in self._cache:
            self._cache[f"sizes_{base}"] = model_sizes(self.settings(base))
        return self._cache[f"sizes_{base}"]

    def vggt(self) -> Any:
        if "vggt" not in self._cache:
            from benchmarks.flops import build_vggt, load_vggt_config

            config = load_vggt_config(self.settings(QWEN2_5_VL).vggt_config)
            self._cache["vggt"] = build_vggt(config, self.device.device)
        return self._cache["vggt"]

    # -- the configuration the measured rows point at

    def best_policy(self) -> str:
        """The fastest measured checkpointing policy (one sample, no lever) that fits; ``full`` if none."""
        fitting = [self.row(f"7b_{p}") for p in POLICIES if fits(self.row(f"7b_{p}"))]
        return min(fitting, key=device_decide.per_sample)["checkpointing"] if fitting else "full"


def fits(row: dict[str, Any]) -> bool:
    """Measured, and within the 80 GB estimate (a CPU row has no memory figures: it counts as fitting)."""
    if row.get("status") != OK:
        return False
    fit = device_decide.fit(row)
    return fit is None or fit.fits


def faster_policy(policy: str) -> str | None:
    index = POLICIES.index(policy)
    return POLICIES[index + 1] if index + 1 < len(POLICIES) else None


# ----------------------------------------------------------------------------- the rows


def _step(run: Run, base: str, row: Any, profile: bool = False) -> dict[str, Any]:
    """A training row through :func:`benchmarks.bench_gpu.measure_step`, with the model's size (for
    the ZeRO-3 memory estimate)."""
    from benchmarks.bench_gpu import measure_step

    warmup = 1 if run.smoke else COMPILED_WARMUP if row.levers.compile else STEP_WARMUP
    trace = run.out / f"{run.prefix}_profile_trace.json.gz" if profile else None
    measured = measure_step(run.settings(base), run.device, run.flops(base), row, repeats=1 if run.smoke else STEP_REPEATS,
                            warmup=warmup, profile_trace=trace)
    params, trainable = run.sizes(base)
    return {**measured, "params": params, "trainable_params": trainable}


def flops_row(base: str) -> Callable[[Run], dict[str, Any]]:
    def measure(run: Run) -> dict[str, Any]:
        return {"flops": run.flops(base).to_dict()}

    return measure


def policy_row(policy: str) -> Callable[[Run], dict[str, Any]]:
    def measure(run: Run) -> dict[str, Any]:
        from benchmarks.bench_gpu import StepRow

        return _step(run, QWEN2_5_VL, StepRow("janus", policy))

    return measure


def lever_row(kind: str) -> Callable[[Run], dict[str, Any]]:
    """One lever (``vit_cache``, ``liger``, ``compile``) or ``all`` of them on the fastest fitting
    policy; ``all_faster``: all of them on the next faster policy. All levers leave Liger out where
    its own row did not run here (so a Liger that fails does not cost the others' row)."""

    def measure(run: Run) -> dict[str, Any]:
        from benchmarks.bench_gpu import Levers, StepRow, all_levers

        policy = run.best_policy()
        if kind == "all_faster":
            policy = faster_policy(policy) or policy
        if not kind.startswith("all"):
            return _step(run, QWEN2_5_VL, StepRow("janus", policy, Levers(**{kind: True})))
        levers, note = all_levers(), {}
        liger = run.row("7b_liger")
        if levers.liger and liger.get("status") != OK:
            levers = replace(levers, liger=False)
            note = {"note": f"without Liger (7b_liger: {liger.get('status', 'not run')})"}
        return {**_step(run, QWEN2_5_VL, StepRow("janus", policy, levers)), **note}

    return measure


def needs_faster_policy(run: Run) -> None:
    if faster_policy(run.best_policy()) is None:
        raise NotNeeded(f"the fastest fitting policy is {run.best_policy()} already")


def micro_batch_row(samples: int, policy: str | None = None) -> Callable[[Run], dict[str, Any]]:
    """``samples`` per micro-batch at ``policy`` (None: the fastest fitting one), no lever."""

    def measure(run: Run) -> dict[str, Any]:
        from benchmarks.bench_gpu import StepRow

        return _step(run, QWEN2_5_VL, StepRow("janus", policy or run.best_policy(), micro_batch=samples))

    return measure


def needs_full_micro_batch(samples: int) -> Callable[[Run], None]:
    """The micro-batch at full checkpointing is needed where the fastest fitting policy's did not fit."""

    def needed(run: Run) -> None:
        first = run.row(f"7b_mb{samples}")
        if run.best_policy() == "full":
            raise NotNeeded("the fastest fitting policy is full already")
        if first.get("status") not in (OK, OOM):
            raise NotNeeded(f"7b_mb{samples} was not measured")
        if fits(first):
            raise NotNeeded(f"7b_mb{samples} fits")

    return needed


def best_config(run: Run) -> Any:
    """The best configuration the rows point at: the policy and levers of the fastest fitting
    one-sample row, the micro-batch of the fastest fitting lever-less row (each chosen as the
    decisions choose: within MIN_GAIN, the simpler)."""
    from benchmarks.bench_gpu import Levers, StepRow

    rows = run.all_rows()
    one = device_decide.choose_training({n: r for n, r in rows.items() if r.get("micro_batch") == 1})
    if one is None:
        raise NotNeeded("no one-sample Qwen2.5-VL-7B row was measured and fits")
    by_batch = device_decide.choose_training({n: r for n, r in rows.items() if not r.get("levers")})
    samples = by_batch["micro_batch"] if by_batch else 1
    return StepRow("janus", one["checkpointing"], Levers(**{lever: True for lever in one["levers"]}), samples)


def best_row(run: Run) -> dict[str, Any]:
    """The best configuration measured once more, then one step profiled; a trace too large to come
    back from the GPU machine is removed (its top operators stay in the row)."""
    row = _step(run, QWEN2_5_VL, best_config(run), profile=True)
    trace = run.out / row["profile"]["trace"]
    if trace.exists() and trace.stat().st_size > MAX_RETURNED_BYTES:
        row["profile"]["trace"] = f"removed: {trace.stat().st_size / 2**20:.0f} MiB gzip-compressed"
        trace.unlink()
    return row


def vit_numerics(run: Run) -> dict[str, Any]:
    """The 7B ViT's output for the frames of four overlapping windows, computed as precompute caches
    it (the distinct frames, nine per call) and as verify's live check does (each window's frames),
    compared against verify's tolerance for this device and dtype."""
    import torch
    from transformers import AutoConfig

    from janus_cache.verify.comparison import VIT_TOLERANCES, compare
    from janus_core.bases import base_of_config
    from janus_core.dtypes import dtype_name
    from janus_core.vggt.encoder import distinct_frames, lever_batches
    from janus_core.qwen_vit import ViTEncoder, vit_stored_dtype

    settings, device = run.settings(QWEN2_5_VL), run.device
    config = AutoConfig.from_pretrained(settings.qwen_dir, local_files_only=True)
    base = base_of_config(config)
    compute = dtype_name(settings.dtype)
    torch.manual_seed(0)
    with torch.device(device.device):
        visual = base.transformers_class("vision")._from_config(config.vision_config, dtype=settings.dtype,
                                                                attn_implementation="sdpa")
    visual.requires_grad_(False).eval()
    encoder = ViTEncoder(visual, vit_stored_dtype(compute), settings.shape.images, "", settings.qwen_dir.name, base)
    windows = lever_batches(settings.shape.frame_side(base))[0]
    frames, index = distinct_frames(windows)
    tolerance = VIT_TOLERANCES[(device.device.type, compute)]
    try:
        cached = encoder.encode(frames)
        comparisons = [compare(encoder.encode(windows[b]), cached[index[b].to(cached.device)], tolerance,
                               encoder.stored_dtype) for b in range(windows.shape[0])]
    finally:
        visual = encoder = cached = None
        device.free()
    worst = max(comparisons, key=lambda c: c.max_abs / c.bound if c.bound else float("inf"))
    return {"windows": int(windows.shape[0]), "distinct_frames": int(frames.shape[0]), "compute_dtype": compute,
            "stored_dtype": vit_stored_dtype(compute), "tolerance": {"rtol": tolerance.rtol, "min_cosine": tolerance.min_cosine},
            "max_abs": worst.max_abs, "bound": worst.bound, "mean_abs": statistics.mean(c.mean_abs for c in comparisons),
            "min_cosine": min(c.cosine for c in comparisons), "within_tolerance": all(c.ok for c in comparisons)}


def windows_row(batch: int) -> Callable[[Run], dict[str, Any]]:
    def measure(run: Run) -> dict[str, Any]:
        from benchmarks.bench_gpu import measure_windows

        warmup, repeats = (WINDOW_WARMUP, WINDOW_REPEATS) if not run.smoke else (1, 1)
        row = measure_windows(run.vggt(), run.settings(QWEN2_5_VL), run.device, batch, repeats=repeats, warmup=warmup)
        return {**row, "windows_per_call": batch}

    return measure


def best_batch(run: Run) -> int | None:
    """The B of the fastest measured random-window row (vggt_b*), None if none was measured."""
    measured = {b: run.row(f"vggt_b{b}") for b in VGGT_BATCHES}
    measured = {b: r["windows_per_s"]["median"] for b, r in measured.items() if r.get("status") == OK}
    return max(measured, key=measured.get) if measured else None


def needs_bigger_batch(run: Run) -> None:
    from janus_core.vggt.encoder import LEVER_BATCH

    batch = best_batch(run)
    if batch is None:
        raise NotNeeded("no random-window row (vggt_b*) was measured")
    if batch == LEVER_BATCH:
        raise NotNeeded(f"B={LEVER_BATCH} is the fastest batch already (vggt_all)")


def vggt_lever_row(kind: str) -> Callable[[Run], dict[str, Any]]:
    """One VGGT lever setting (``kind``: a name of janus_core.vggt.encoder.lever_settings, or
    ``all_best_b``: all levers at the best B of the random-window rows) on episode windows, its
    features compared with today's path (the baseline row's). The smoke mode runs the levers
    eager (inductor takes minutes on a CPU; tests/e2e/test_vggt_compile.py covers it)."""

    def measure(run: Run) -> dict[str, Any]:
        from benchmarks.bench_gpu import lever_encoder, measure_vggt_lever
        from janus_cache.verify.comparison import FEATURE_TOLERANCES, compare
        from janus_core.dtypes import dtype_name
        from janus_core.vggt.encoder import LEVER_BATCH, lever_batches, lever_settings
        from janus_core.vggt.attention import BENCH_KERNELS

        settings, device = run.settings(QWEN2_5_VL), run.device
        setting = lever_settings(BENCH_KERNELS[device.device.type])["all" if kind == "all_best_b" else kind]
        batch = (best_batch(run) or LEVER_BATCH) if kind == "all_best_b" else LEVER_BATCH
        note = {}
        if setting.compile and run.smoke:
            setting, note = replace(setting, compile=False), {"note": "smoke mode: without compile"}
        warmup, repeats = (LEVER_WARMUP, LEVER_REPEATS) if not run.smoke else (1, 1)
        row, features = measure_vggt_lever(lever_encoder(run.vggt(), settings), setting,
                                           lever_batches(settings.shape.side, batch), device, repeats, warmup)
        if kind == "baseline":
            run._cache["vggt_baseline_features"] = features
        baseline = run._cache.get("vggt_baseline_features")
        if baseline is not None and kind != "baseline":
            n = min(len(baseline), len(features))  # every lever batch starts with the same samples
            c = compare(features[:n], baseline[:n], FEATURE_TOLERANCES[device.device.type], dtype_name(settings.dtype))
            row["vs_baseline"] = {"max_abs": c.max_abs, "bound": c.bound, "mean_abs": c.mean_abs, "cosine": c.cosine,
                                  "within_tolerance": c.ok, "identical": c.max_abs == 0}
        return {**row, **note}

    return measure


def needs_compile_in_smoke(run: Run) -> None:
    if run.smoke:
        raise NotNeeded("the smoke mode does not compile VGGT (inductor takes minutes on a CPU; "
                        "tests/e2e/test_vggt_compile.py covers it)")


def qwen3_config(run: Run) -> Any:
    """The configuration Qwen3-VL-8B runs at: the 7B's chosen one without Liger (janus applies
    Liger's Qwen2.5-VL kernels only), else the H100 run's fastest policy with the ViT cache."""
    from benchmarks.bench_gpu import Levers, StepRow

    chosen = device_decide.choose_training(run.all_rows())
    if chosen is None:
        h100 = json.loads(H100_RESULTS.read_text())["training"]
        return StepRow("janus", h100["rows"][h100["best_janus"]]["checkpointing"], Levers(vit_cache=True))
    levers = Levers(**{lever: True for lever in chosen["levers"] if lever != "liger"})
    return StepRow("janus", chosen["checkpointing"], levers, chosen["micro_batch"])


def qwen3_row(kind: str) -> Callable[[Run], dict[str, Any]]:
    """``eager``: the configuration without compile; ``full``: one sample at full checkpointing
    (where ``eager`` did not fit); ``best``: with compile, at whichever of the two fitted."""

    def measure(run: Run) -> dict[str, Any]:
        config = qwen3_config(run)
        if kind == "eager":
            config = replace(config, levers=replace(config.levers, compile=False))
        elif kind == "full" or not fits(run.row("q3_eager")):
            config = replace(config, policy="full", micro_batch=1,
                             levers=replace(config.levers, compile=kind == "best"))
        return _step(run, QWEN3_VL, config)

    return measure


def needs_qwen3_full(run: Run) -> None:
    first = run.row("q3_eager")
    if first.get("status") not in (OK, OOM):
        raise NotNeeded("q3_eager was not measured")
    if fits(first):
        raise NotNeeded("q3_eager fits")
    if qwen3_config(run).policy == "full":
        raise NotNeeded("q3_eager is at full checkpointing already")


def needs_qwen3_compiled(run: Run) -> None:
    if not qwen3_config(run).levers.compile:
        raise NotNeeded("the chosen configuration does not compile layers (q3_eager is it)")
    if not fits(run.row("q3_eager")) and not fits(run.row("q3_full")):
        raise NotNeeded("neither q3_eager nor q3_full was measured and fits")


def build_plan(device_type: str, smoke: bool, expected: Expected | None = None) -> list[Row]:
    """Every row, most needed first, with its budget (``SMOKE_ROW_S`` each in the smoke mode)."""
    from benchmarks.bench_gpu import all_levers
    from janus_core.vggt.encoder import LEVER_BATCH, lever_settings
    from janus_core.vggt.attention import BENCH_KERNELS

    e = expected or Expected.from_results()
    best = min(e.step_s, key=e.step_s.get)  # the H100 run's fastest policy stands for "the fastest that fits"
    faster = faster_policy(best) or best
    liger = all_levers().liger or device_type == "cuda"  # installed from the carried wheel on the GPU machine
    all_compile = COLD_COMPILE_S if liger else WARM_COMPILE_S  # Liger changes the layer's graph
    lever_calls = 2 * (LEVER_WARMUP + LEVER_REPEATS)  # two batches of episode windows per call
    window_calls = WINDOW_WARMUP + WINDOW_REPEATS
    levers = lever_settings(BENCH_KERNELS[device_type])
    alone = [name for name in levers if name not in ("baseline", "compile", "all")]

    def vggt_lever(name: str, needed: Callable[[Run], None] | None = None) -> Row:
        compile_s = VGGT_COMPILE_S if name == "compile" else WARM_COMPILE_S if levers[name].compile else 0.0
        return Row(f"vggt_{name}", "vggt", f"VGGT-1B windows/s, B={LEVER_BATCH} episode windows, {name}",
                   e.windows_row(LEVER_BATCH, lever_calls, compile_s), vggt_lever_row(name), needed)

    rows = [
        Row("flops_qwen2_5_vl", "flops", "FLOPs per sample of Qwen2.5-VL-7B (meta device)", FLOPS_S, flops_row(QWEN2_5_VL)),
        *(Row(f"7b_{p}", "training", f"7B step, checkpointing {p}", e.step_row(p), policy_row(p)) for p in POLICIES),
        Row("7b_vit_cache", "training", "7B step, ViT-output cache, fastest fitting policy", e.step_row(best),
            lever_row("vit_cache")),
        Row("7b_liger", "training", "7B step, Liger kernels, fastest fitting policy", e.step_row(best, liger=True),
            lever_row("liger")),
        Row("7b_compile", "training", "7B step, regional compile of the decoder layers, fastest fitting policy",
            e.step_row(best, compile_s=COLD_COMPILE_S), lever_row("compile")),
        Row("7b_all", "training", "7B step, all levers, fastest fitting policy",
            e.step_row(best, compile_s=all_compile, liger=liger), lever_row("all")),
        *(Row(f"7b_mb{n}", "training", f"7B step, micro-batch {n}, fastest fitting policy", e.step_row(best, n),
              micro_batch_row(n)) for n in MICRO_BATCHES),
        Row("vit_cache_numerics", "numerics", "cached vs live 7B ViT output against verify's tolerance", NUMERICS_S,
            vit_numerics),
        Row("7b_best", "training", "7B step, the best configuration, then one step profiled",
            e.step_row(best, MICRO_BATCHES[0], compile_s=WARM_COMPILE_S, profile=True), best_row),
        *(Row(f"vggt_b{b}", "vggt", f"VGGT-1B windows/s, B={b} random windows (automatic kernel, eager)",
              BUILD_S * (b == VGGT_BATCHES[0]) + e.windows_row(b, window_calls), windows_row(b)) for b in VGGT_BATCHES),
        vggt_lever("baseline"),
        vggt_lever("compile", needs_compile_in_smoke),
        vggt_lever("all"),
        Row("flops_qwen3_vl", "flops", "FLOPs per sample of Qwen3-VL-8B (meta device)", FLOPS_S, flops_row(QWEN3_VL)),
        Row("q3_eager", "training", "Qwen3-VL-8B step, the chosen configuration without compile",
            e.step_row(best, qwen3=True), qwen3_row("eager")),
        Row("q3_full", "training", "Qwen3-VL-8B step, full checkpointing (where q3_eager did not fit)",
            e.step_row("full", qwen3=True), qwen3_row("full"), needs_qwen3_full),
        *(vggt_lever(name) for name in alone),
        Row("7b_all_faster", "training", "7B step, all levers, the next faster policy",
            e.step_row(faster, compile_s=WARM_COMPILE_S, liger=liger), lever_row("all_faster"), needs_faster_policy),
        *(Row(f"7b_mb{n}_full", "training", f"7B step, micro-batch {n}, full checkpointing (where 7b_mb{n} did not fit)",
              e.step_row("full", n), micro_batch_row(n, "full"), needs_full_micro_batch(n)) for n in MICRO_BATCHES),
        Row("vggt_all_best_b", "vggt", "VGGT-1B windows/s, all levers at the best B of vggt_b*",
            e.windows_row(max(VGGT_BATCHES), lever_calls, WARM_COMPILE_S), vggt_lever_row("all_best_b"),
            needs_bigger_batch),
        Row("q3_best", "training", "Qwen3-VL-8B step, the chosen configuration with compile",
            e.step_row(best, compile_s=COLD_COMPILE_S, qwen3=True), qwen3_row("best"), needs_qwen3_compiled),
    ]
    return [replace(row, budget_s=SMOKE_ROW_S) for row in rows] if smoke else rows


# ----------------------------------------------------------------------------- running


@contextlib.contextmanager
def alarm(seconds: float) -> Iterator[None]:
    """Raises RowTimeout in this (the main) thread after ``seconds``."""

    def ring(signum: int, frame: Any) -> None:
        raise RowTimeout

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def simulate(kind: str) -> None:
    """``--simulate ROW=KIND``: the row fails as KIND (the tests of the runner use it)."""
    import torch

    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory (simulated by --simulate)")
    if kind == "error":
        raise SimulatedFailure("a simulated failure (--simulate)")
    if kind == "hang":
        while True:
            time.sleep(0.05)
    raise ValueError(f"--simulate kinds are oom, error and hang, got {kind!r}")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def run_row(run: Run, row: Row, number: int, total: int) -> dict[str, Any]:
    """One row, whatever happens in it: its record (status, seconds, figures or the reason)."""
    from benchmarks.bench_gpu import Unavailable, out_of_memory

    record: dict[str, Any] = {"section": row.section, "what": row.what, "budget_s": round(row.budget_s, 1)}
    head = f"[{run.prefix} {number}/{total}] {row.name}"
    start = time.monotonic()
    try:
        if run.broken:
            raise Interrupted
        if row.needed is not None:
            row.needed(run)
        left = run.left()
        if row.budget_s > left:
            record |= {"status": SKIPPED_FOR_TIME, "note": f"budget {row.budget_s:.0f} s, {max(left, 0):.0f} s left"}
            return record
        limit = min(left, OVERRUN * row.budget_s + OVERRUN_S)
        print(f"{head}: {row.what} (budget {row.budget_s:.0f} s, stopped after {limit:.0f} s; {left:.0f} s left)",
              flush=True)
        with alarm(limit):
            if row.name in run.simulate:
                simulate(run.simulate[row.name])
            figures = row.measure(run)
        record |= {"status": OK, **figures}
    except NotNeeded as exc:
        record |= {"status": NOT_NEEDED, "note": str(exc)}
    except Unavailable as exc:
        record |= {"status": UNAVAILABLE, "note": str(exc)}
    except RowTimeout:
        record |= {"status": TIMED_OUT, "note": f"stopped after {time.monotonic() - start:.0f} s"}
    except Interrupted:
        why = f"not run: the CUDA context broke in {run.broken}" if run.broken else "SIGTERM: the call's time limit"
        record |= {"status": INTERRUPTED, "note": why}
        if not run.broken:
            raise
    except Exception as exc:  # noqa: BLE001 - every failure of a row is recorded and the next row runs
        oom = out_of_memory(exc)
        record |= {"status": OOM if oom else FAILED, "error": first_line(exc)}
        if not oom:
            traceback.print_exc()
            if run.device.cuda and any(text in str(exc) for text in CONTEXT_LOST):
                run.broken = row.name
    finally:
        record["seconds"] = round(time.monotonic() - start, 2)
        run.rows[row.name] = record
        print(f"{head}: {record['status']} in {record['seconds']:.1f} s{summary(record)}", flush=True)
        run.device.free()
    return record


def summary(record: dict[str, Any]) -> str:
    if record["status"] != OK:
        return f": {record.get('error') or record.get('note') or ''}"
    if "s_per_sample" in record:
        peak = record.get("peak_gib")
        return f": {record['s_per_sample']['median']:.3g} s/sample" + ("" if peak is None else f", peak {peak:.1f} GiB")
    if "windows_per_s" in record:
        return f": {record['windows_per_s']['median']:.3g} windows/s"
    if "within_tolerance" in record:
        return f": max abs {record['max_abs']:.3g} (bound {record['bound']:.3g})"
    return ""


def execute(run: Run) -> None:
    """Every row of the plan in order, the results written after each."""

    def term(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGTERM, term)
    run.started = time.monotonic()
    try:
        write(run, ())
        for number, row in enumerate(run.plan, 1):
            try:
                run_row(run, row, number, len(run.plan))
            finally:
                write(run, (row.section,))
        run.env["imported"] = imported_distributions()
        write(run, ())
    except Interrupted:
        for row in run.plan:
            run.rows.setdefault(row.name, {"section": row.section, "what": row.what, "budget_s": round(row.budget_s, 1),
                                           "status": INTERRUPTED, "note": "not started: SIGTERM"})
        write(run, ())
        raise SystemExit(124) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def results(run: Run) -> dict[str, Any]:
    """Everything measured so far, JSON-ready, with the decisions from it and part 1's rows."""
    out: dict[str, Any] = {
        "run": {"part": run.part, "date": run.date, "smoke": run.smoke, "budget_s": run.budget_s,
                "seconds": round(time.monotonic() - run.started, 1), "earlier_rows": sorted(run.earlier),
                **run.env},
        "plan": [{"name": r.name, "section": r.section, "what": r.what, "budget_s": round(r.budget_s, 1)}
                 for r in run.plan],
        "rows": run.rows,
    }
    try:
        out["decisions"] = device_decide.decide(run.all_rows())
    except Exception as exc:  # noqa: BLE001 - the figures are written whatever the decisions do
        out["decisions"] = {"error": first_line(exc)}
    return out


def write(run: Run, plots: tuple[str, ...]) -> None:
    write_outputs(results(run), run.out, run.prefix, plots)


PLOTTED = ("training", "vggt")


def write_outputs(data: dict[str, Any], out: Path, prefix: str, plots: tuple[str, ...] = PLOTTED) -> None:
    """``prefix``.json and ``prefix``.md under ``out``, and the plots of ``plots`` (sections) where
    their rows have figures; each file replaced whole (a reader never sees half of one)."""
    from benchmarks.bench_report import device_markdown, plot_device_training, plot_device_vggt

    out.mkdir(parents=True, exist_ok=True)

    def replace_file(name: str, text: str) -> None:
        part = out / f".{name}.part"
        part.write_text(text)
        os.replace(part, out / name)

    replace_file(f"{prefix}.json", json.dumps(data, indent=1, default=str) + "\n")
    replace_file(f"{prefix}.md", device_markdown(data))
    for section in set(plots) & set(PLOTTED):
        plot = {"training": plot_device_training, "vggt": plot_device_vggt}[section]
        try:
            plot(data, out / f"{prefix}_{section}.png")
        except Exception as exc:  # noqa: BLE001 - a plot never costs the figures
            print(f"warning: plot {prefix}_{section}.png not written: {first_line(exc)}", file=sys.stderr)


def imported_distributions() -> dict[str, str]:
    """Every installed distribution this process imported from, with its version (the run's
    software, and what the GPU machine must have: benchmarks/device_env.py)."""
    by_module = metadata.packages_distributions()
    names = {d for module in list(sys.modules) if "." not in module and module not in sys.stdlib_module_names
             for d in by_module.get(module, ())}
    return {name: metadata.version(name) for name in sorted(names)}


def environment(run: Run) -> dict[str, Any]:
    """Where and with what the run measures (versions as installed, the device, its memory)."""
    import torch

    from janus_train.model.janus_model import attention_implementation
    from janus_train.model.vision_attention import describe_attention

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    device = run.device
    return {
        "device": device.name(),
        "device_memory_gib": device.total_gib(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.cuda else None,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "packages": {name: version(name) for name in ("torch", "transformers", "triton", "liger-kernel", "numpy",
                                                      "tokenizers", "huggingface-hub", "flash-attn")},
        "attention": describe_attention(attention_implementation(device.device), device.device,
                                        run.settings(QWEN2_5_VL).dtype),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def unmet_requirements() -> list[str]:
    """pyproject.toml's dependencies this interpreter does not meet, each starting with its name (an
    unmet carried one means the wheels were not installed; the call stops then, and only warns for the
    image's own packages, whose versions were not all read)."""
    problems = []
    for name, requirement in project_requirements(extras=()).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{name} {installed} does not satisfy {requirement}")
    return problems


def part_2_rows(plan: list[Row], earlier: dict[str, dict[str, Any]]) -> list[Row]:
    """The rows part 1 left, in plan order: never reached, skipped for time, timed out or interrupted;
    then those that failed (once more, last: a broken CUDA context fails every later row)."""
    left = [row for row in plan if row.name not in earlier or earlier[row.name]["status"] in LEFT_FOR_PART_2]
    return left + [row for row in plan if earlier.get(row.name, {}).get("status") == FAILED]


# ----------------------------------------------------------------------------- commands

app = command_app(help="The prepared GPU run (docs/benchmarks.md).")


def load_rows(path: Path) -> dict[str, dict[str, Any]]:
    try:
        return json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError) as exc:
        raise typer.BadParameter(f"{path}: not the JSON of a device run ({first_line(exc)})") from None


@app.command("run")
def run_command(
    part: Annotated[str, typer.Option(help="1: every row, most needed first; 2: the rows part 1 left (--with).")] = "1",
    out: Annotated[Path, typer.Option(help="Where the JSON, Markdown, plots and profile trace go.")] = Path("device_out"),
    budget_s: Annotated[float, typer.Option(min=1, help="Seconds the rows may take in all (the deadline).")] = CALL_BUDGETS_S[0],
    smoke: Annotated[bool, typer.Option(help="Tiny models on the CPU: every row's code in seconds, nothing real.")] = False,
    earlier: Annotated[list[Path] | None, typer.Option("--with", help="Part 1's JSON: part 2 runs what it left, "
                                                       "and its rows join the decisions.")] = None,
    only: Annotated[list[str] | None, typer.Option(help="Run only these rows (repeatable).")] = None,
    fail: Annotated[list[str] | None, typer.Option("--simulate", hidden=True,
                                                   help="ROW=oom|error|hang: make a row fail (the tests).")] = None,
) -> None:
    """Measure the rows within the budget; the results under OUT after every row."""
    if part not in PARTS:
        raise typer.BadParameter(f"--part must be 1 or 2, got {part!r}")
    if part == "2" and not earlier:
        raise typer.BadParameter("part 2 runs the rows part 1 left: give part 1's JSON with --with")
    problems = unmet_requirements()
    carried = [p for p in problems if p.split()[0] in wheels()]
    for problem in problems:
        print(f"{'error' if problem in carried else 'warning'}: {problem}", file=sys.stderr)
    if carried and not smoke:
        print("error: the carried wheels are not installed (make device-wheels here, carry .whl; "
              "benchmarks/device_run.sh installs them)", file=sys.stderr)
        raise SystemExit(2)
    import torch

    if not smoke and not torch.cuda.is_available():
        raise typer.BadParameter("no CUDA device here; --smoke runs tiny models on the CPU")
    run = Run(part, out, smoke, budget_s, simulate=dict(item.split("=", 1) for item in fail or ()))
    for path in earlier or ():
        run.earlier |= load_rows(path)
    plan = build_plan(run.device.device.type, smoke)
    unknown = set(only or ()) - {row.name for row in plan}
    if unknown:
        raise typer.BadParameter(f"--only: no row named {', '.join(sorted(unknown))} (`plan` lists them)")
    selected = part_2_rows(plan, run.earlier) if part == "2" else plan
    run.plan = [row for row in selected if not only or row.name in only]
    if smoke:
        torch.set_num_threads(1)  # steady on a shared machine
    run.env = environment(run)
    print(f"device run part {part} on {run.env['device']}: {len(run.plan)} rows, budget {budget_s:.0f} s, "
          f"results in {out}", flush=True)
    execute(run)
    counts: dict[str, int] = {}
    for record in run.rows.values():
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    print(f"done in {time.monotonic() - run.started:.0f} s: " + ", ".join(f"{n} {s}" for s, n in counts.items())
          + f"; {out / run.prefix}.json, .md", flush=True)


@app.command("decide")
def decide_command(
    files: Annotated[list[Path], typer.Argument(help="The calls' JSON files (a later file's rows win).")],
    out: Annotated[Path, typer.Option(help="Where device_run.json, device_run.md and the plots go.")] = RESULTS_DIR,
) -> None:
    """The decisions from the calls' rows together: the h800 profile diff and the targets' verdicts."""
    rows: dict[str, Any] = {}
    calls = []
    for path in files:
        rows |= {name: row for name, row in load_rows(path).items()
                 if name not in rows or row["status"] not in (NOT_NEEDED, SKIPPED_FOR_TIME, INTERRUPTED)}
        calls.append(json.loads(path.read_text())["run"])
    data = {"run": {**calls[-1], "calls": calls, "earlier_rows": []}, "plan": [], "rows": rows,
            "decisions": device_decide.decide(rows)}
    write_outputs(data, out, "device_run")
    decisions = data["decisions"]
    print(decisions["profile_diff"] or "h800 profile: no change")
    if decisions["set"]:
        print(decisions["set"])
    for line in decisions["waiting"]:
        print(f"waiting: {line}")
    for name, row in rows.items():
        if row["status"] not in (OK, NOT_NEEDED, UNAVAILABLE):
            print(f"not measured: {name} ({row['status']})")
    print(f"wrote {out / 'device_run'}.json, .md")


@app.command("plan")
def plan_command(
    smoke: Annotated[bool, typer.Option(help="The smoke mode's plan (CPU kernels, fixed budgets).")] = False,
) -> None:
    """Every row in order with its budget, and the call it falls in when every row takes its budget."""
    rows = build_plan("cpu" if smoke else "cuda", smoke)
    print("| # | row | what | budget s | by then s | call |\n|---|---|---|---|---|---|")
    total, call, spent = 0.0, 0, 0.0
    for number, row in enumerate(rows, 1):
        total += row.budget_s
        while call < len(CALL_BUDGETS_S) and spent + row.budget_s > CALL_BUDGETS_S[call]:
            call, spent = call + 1, 0.0
        spent += row.budget_s
        where = str(call + 1) if call < len(CALL_BUDGETS_S) else "later"
        print(f"| {number} | {row.name} | {row.what} | {row.budget_s:.0f} | {total:.0f} | {where} |")
    print(f"\n{len(rows)} rows, {total:.0f} s of budgets; the calls' budgets: "
          + " + ".join(f"{b:.0f}" for b in CALL_BUDGETS_S) + " s")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
