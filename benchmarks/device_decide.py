"""The decisions of the prepared GPU run (:mod:`benchmarks.device_run`), taken from its measured rows:
the fastest training configuration that fits an 80 GB H800/H100 with 10 % to spare under ZeRO-3
over 8 GPUs, the h800 profile settings that follow from it and from the VGGT rows, and the
targets' verdicts (with the gap and the phase that holds the time where one is missed).

Nothing here measures: every figure comes from a row with status ``ok``, and a setting whose rows
were not measured stays as the profile has it, named under ``waiting``.

Memory per GPU under ZeRO-3 (``Fit``): a one-GPU row holds every weight and, by the end of its
backward, every gradient; ZeRO-3 holds an eighth of each. The estimate is the row's peak minus
what its model held before the step (the weights; so the step's activations, gradients and
workspace remain), plus the analytic ZeRO-3 state per GPU (weights, gradients and Adam state over 8
GPUs, :class:`benchmarks.bench_projection.ZeroShare`), plus what ``configs/deepspeed/zero3.json``
lets DeepSpeed gather and bucket at once. It still counts every gradient, so it is an upper bound;
``bound_gib`` adds the state to the whole peak (weights counted twice), the most cautious reading.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.bench_projection import (
    BF16_BYTES,
    GPUS,
    TARGET_GPU_S_PER_SAMPLE,
    TARGET_VGGT_WINDOWS_PER_S,
    ZeroShare,
    zero3_bytes_per_sample,
)
from janus_core.bases import DEFAULT_BASE, QWEN3_VL
from janus_core.profile import PROFILES_DIR, CacheSettings, EncoderSettings
from janus_train.config import TrainSettings
from janus_train.loop.step_metrics import device_spec

REPO = Path(__file__).resolve().parent.parent
ZERO3_CONFIG = REPO / "configs" / "deepspeed" / "zero3.json"
H800_PROFILE = PROFILES_DIR / "h800.yaml"

H800_MEMORY_GIB = 79.2
"""What torch reports as the memory of an 80 GB H100/H800 (``total_memory``, 85.0 GB)."""
SPARE = 0.10
"""Memory left free on each GPU by a chosen configuration."""
MIN_GAIN = 0.02
"""A lever, a larger micro-batch or a slower-to-start setting is chosen only where it saves at
least this share per sample (repeats of one row differ by about 1 %)."""
STRETCH_GPU_S_PER_SAMPLE = 0.45
STRETCH_VGGT_WINDOWS_PER_S = 8.0
H800_NVLINK = device_spec("H800")
PROFILE_BASE = DEFAULT_BASE.model_type
"""The h800 profile's base (Qwen2.5-VL-7B): its rows decide the profile."""

# The rows the decisions read (benchmarks.device_run names them).
VIT_NUMERICS = "vit_cache_numerics"
BEST_ROW = "7b_best"
VGGT_BASELINE, VGGT_COMPILE, VGGT_ALL, VGGT_ALL_BEST_B = "vggt_baseline", "vggt_compile", "vggt_all", "vggt_all_best_b"


def zero3_working_gib(config: Path = ZERO3_CONFIG) -> float:
    """GiB DeepSpeed may hold gathered or bucketed at once under ``config``: the live parameters and
    the prefetch bucket (bf16 weights) and the reduce bucket (bf16 gradients)."""
    zero = json.loads(config.read_text())["zero_optimization"]
    elements = zero["stage3_max_live_parameters"] + zero["stage3_prefetch_bucket_size"] + zero["reduce_bucket_size"]
    return elements * BF16_BYTES / 2**30


@dataclass(frozen=True)
class Fit:
    """One training row's memory per GPU under ZeRO-3 over 8 GPUs (see the module doc)."""

    activations_gib: float
    state_gib: float
    working_gib: float
    estimate_gib: float
    bound_gib: float
    limit_gib: float
    fits: bool


def fit(row: Mapping[str, Any]) -> Fit | None:
    """The row's :class:`Fit`, or None where it has no CUDA memory figures (a CPU run)."""
    if row.get("peak_gib") is None or row.get("resident_gib") is None:
        return None
    state = ZeroShare.of(row["params"], row["trainable_params"], GPUS).total_bytes / 2**30
    working = zero3_working_gib()
    activations = row["peak_gib"] - row["resident_gib"]
    estimate = activations + state + working
    limit = H800_MEMORY_GIB * (1 - SPARE)
    return Fit(activations, state, working, estimate, row["peak_gib"] + state, limit, estimate <= limit)


def comm_s_per_sample(row: Mapping[str, Any]) -> float:
    """ZeRO-3's traffic per sample on 8 H800s at nominal NVLink: the gathers and the gradients'
    reduce-scatter happen once per micro-batch, so they spread over its samples."""
    moved = zero3_bytes_per_sample(row["params"], row["trainable_params"], GPUS)
    return moved / row["micro_batch"] / (H800_NVLINK.nvlink_gb_per_s * 1e9)


def per_sample(row: Mapping[str, Any]) -> float:
    return float(row["s_per_sample"]["median"])


def projected(row: Mapping[str, Any]) -> float:
    """GPU-seconds per sample on 8 H800s without overlap: measured compute + ZeRO-3 traffic (an upper bound)."""
    return per_sample(row) + comm_s_per_sample(row)


def ok(rows: Mapping[str, Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    row = rows.get(name)
    return row if row is not None and row.get("status") == "ok" else None


def training_candidates(rows: Mapping[str, Mapping[str, Any]], base: str = PROFILE_BASE) -> dict[str, Mapping[str, Any]]:
    """The measured janus training rows of ``base``."""
    return {name: row for name, row in rows.items() if row.get("status") == "ok" and row.get("section") == "training"
            and row.get("base") == base and row.get("path") == "janus"}


def choose_training(rows: Mapping[str, Mapping[str, Any]], base: str = PROFILE_BASE) -> dict[str, Any] | None:
    """The fastest measured configuration of ``base`` (per sample on 8 H800s, ZeRO-3 traffic
    included) that fits with the spare; among those within MIN_GAIN of it, the one with fewer levers,
    then the smaller micro-batch. ViT-cache rows are left out when the CUDA numerics row found the
    cached ViT output outside verify's tolerance. None when no row qualifies."""
    numerics = ok(rows, VIT_NUMERICS)
    vit_cache_bad = numerics is not None and not numerics["within_tolerance"]
    fitting = {}
    for name, row in training_candidates(rows, base).items():
        if vit_cache_bad and "vit_cache" in row["levers"]:
            continue
        row_fit = fit(row)
        if row_fit is None or row_fit.fits:
            fitting[name] = row
    if not fitting:
        return None
    fastest = min(projected(row) for row in fitting.values())
    near = [name for name, row in fitting.items() if projected(row) <= fastest * (1 + MIN_GAIN)]
    name = min(near, key=lambda n: (len(fitting[n]["levers"]), fitting[n]["micro_batch"], projected(fitting[n])))
    row = fitting[name]
    row_fit = fit(row)
    return {
        "row": name,
        "checkpointing": row["checkpointing"],
        "levers": list(row["levers"]),
        "micro_batch": row["micro_batch"],
        "s_per_sample": per_sample(row),
        "projected_8xh800_s_per_sample": projected(row),
        "fit": None if row_fit is None else dataclasses.asdict(row_fit),
        "vit_cache_excluded": vit_cache_bad,
    }


def choose_vggt(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """vggt.compile and cache.vggt_batch from the VGGT lever rows (each decided only where its rows were measured)."""
    out: dict[str, Any] = {}
    baseline, compiled = ok(rows, VGGT_BASELINE), ok(rows, VGGT_COMPILE)
    if baseline and compiled:
        gain = compiled["windows_per_s"]["median"] / baseline["windows_per_s"]["median"] - 1
        numerics = compiled.get("vs_baseline", {})
        within = bool(numerics.get("within_tolerance"))
        out["compile"] = {"value": gain >= MIN_GAIN and within, "gain": gain, "within_tolerance": within,
                          "why": f"compile alone {gain:+.1%} windows/s against eager; features "
                                 f"{'within' if within else 'OUTSIDE'} verify's tolerance of eager"}
    every, bigger = ok(rows, VGGT_ALL), ok(rows, VGGT_ALL_BEST_B)
    if every and bigger:
        gain = bigger["windows_per_s"]["median"] / every["windows_per_s"]["median"] - 1
        batch = bigger["windows_per_call"] if gain >= MIN_GAIN else every["windows_per_call"]
        out["batch"] = {"value": batch, "gain": gain,
                        "why": f"all levers at B={bigger['windows_per_call']}: {gain:+.1%} windows/s against "
                               f"B={every['windows_per_call']}"}
    return out


def _defaults() -> dict[str, Any]:
    """Each decided setting's default where the profile does not set it."""
    fields = {("cache", f.name): f.default for f in dataclasses.fields(CacheSettings)}
    fields |= {("vggt", f.name): f.default for f in dataclasses.fields(EncoderSettings)}
    fields |= {("train", f.name): f.default for f in dataclasses.fields(TrainSettings)}
    return {f"{section}.{name}": value for (section, name), value in fields.items()}


def profile_values(text: str) -> dict[str, Any]:
    """The profile's value of every setting it names, dotted, with the defaults of the decided ones."""
    data = yaml.safe_load(text)
    values = _defaults()
    for section, entries in data.items():
        if isinstance(entries, dict):
            values |= {f"{section}.{key}": value for key, value in entries.items()}
    return values


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def with_settings(text: str, settings: Mapping[str, Any]) -> str:
    """``text`` (a profile) with each dotted setting set: its line replaced, or added at the end of
    its section; comments and every other line kept."""
    lines = text.splitlines()
    for dotted, value in settings.items():
        section, key = dotted.split(".", 1)
        start = lines.index(f"{section}:")
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end].startswith((" ", "#"))):
            end += 1
        while end - 1 > start and not lines[end - 1].strip():
            end -= 1
        line = f"  {key}: {_yaml(value)}"
        found = next((i for i in range(start + 1, end) if lines[i].startswith(f"  {key}:")), None)
        if found is None:
            lines.insert(end, line)
        else:
            lines[found] = line
    return "\n".join(lines) + "\n"


POLICIES = ("full", "every_2", "every_4", "none")
LEVER_ROWS = {"vit_cache": "7b_vit_cache", "compile": "7b_compile", "liger": "7b_liger"}
"""The row of each training lever alone (on the fastest fitting policy)."""


def _evidence(rows: Mapping[str, Mapping[str, Any]], names: list[str], figure: Any = per_sample) -> str:
    """``name figure`` of each measured row among ``names`` (noting those that do not fit), else "none measured"."""
    parts = []
    for name in names:
        row = ok(rows, name)
        if row is not None:
            row_fit = fit(row)
            parts.append(f"{name} {figure(row):.3g}" + ("" if row_fit is None or row_fit.fits else " (does not fit)"))
    return ", ".join(parts) or "none measured"


def _lever_evidence(rows: Mapping[str, Mapping[str, Any]], lever: str) -> str:
    """The lever alone against its policy without it, per sample."""
    alone = ok(rows, LEVER_ROWS[lever])
    if alone is None:
        return f"{LEVER_ROWS[lever]} not measured ({rows.get(LEVER_ROWS[lever], {}).get('status', 'not run')})"
    without = ok(rows, f"7b_{alone['checkpointing']}")
    if without is None:
        return f"{LEVER_ROWS[lever]} {per_sample(alone):.3g} s/sample"
    gain = per_sample(alone) / per_sample(without) - 1
    return f"alone {per_sample(alone):.3g} vs {per_sample(without):.3g} s/sample without ({gain:+.1%})"


def recommended_settings(rows: Mapping[str, Mapping[str, Any]], profile_text: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The h800 settings the rows decide (dotted name -> value), why each, and what waits on rows
    that were not measured."""
    current = profile_values(profile_text)
    settings: dict[str, Any] = {}
    why: dict[str, str] = {}
    waiting: list[str] = []
    chosen = choose_training(rows)
    if chosen is None:
        waiting.append("train.gradient_checkpointing, train.micro_batch, cache.vit_features, train.compile_layers, "
                       "train.liger_kernels: no Qwen2.5-VL-7B training row was measured and fits")
    else:
        levers = chosen["levers"]
        settings["train.gradient_checkpointing"] = chosen["checkpointing"]
        settings["train.micro_batch"] = chosen["micro_batch"]
        global_per_gpu = current["train.micro_batch"] * current["train.grad_accum"]
        if global_per_gpu % chosen["micro_batch"] == 0:
            settings["train.grad_accum"] = global_per_gpu // chosen["micro_batch"]
        settings["cache.vit_features"] = "vit_cache" in levers
        settings["train.compile_layers"] = "compile" in levers
        settings["train.liger_kernels"] = "liger" in levers
        source = f"chosen row {chosen['row']} ({chosen['s_per_sample']:.3g} s/sample)"
        why["train.gradient_checkpointing"] = f"{source}; each policy alone: " + _evidence(
            rows, [f"7b_{policy}" for policy in POLICIES])
        why["train.micro_batch"] = f"{source}; per sample with ZeRO-3 traffic on 8 H800s: " + _evidence(
            rows, [f"7b_{policy}" for policy in POLICIES] + [f"7b_mb{n}{s}" for s in ("", "_full") for n in (2, 4)],
            projected)
        if "train.grad_accum" in settings:
            why["train.grad_accum"] = f"keeps {global_per_gpu} samples per GPU per optimizer step (the global batch)"
        for key, lever in (("cache.vit_features", "vit_cache"), ("train.compile_layers", "compile"),
                           ("train.liger_kernels", "liger")):
            why[key] = f"{source}; {_lever_evidence(rows, lever)}"
        if "liger" in levers:
            why["train.liger_kernels"] += " (needs liger-kernel where it trains: pip install -e .[kernels])"
        numerics = ok(rows, VIT_NUMERICS)
        if "vit_cache" in levers and numerics is None:
            waiting.append(f"cache.vit_features: the CUDA cached-vs-live ViT difference ({VIT_NUMERICS}) was not measured")
    vggt = choose_vggt(rows)
    if "compile" in vggt:
        settings["vggt.compile"] = vggt["compile"]["value"]
        why["vggt.compile"] = vggt["compile"]["why"]
    else:
        waiting.append(f"vggt.compile: rows {VGGT_BASELINE} and {VGGT_COMPILE} not both measured")
    if "batch" in vggt:
        settings["cache.vggt_batch"] = vggt["batch"]["value"]
        why["cache.vggt_batch"] = vggt["batch"]["why"]
    return settings, why, waiting


def profile_diff(settings: Mapping[str, Any], profile: Path = H800_PROFILE) -> tuple[str, str]:
    """The unified diff of the profile with ``settings`` applied, and the same change as a make SET."""
    text = profile.read_text()
    current = profile_values(text)
    changed = {k: v for k, v in settings.items() if current.get(k) != v}
    new = with_settings(text, changed)
    rel = profile.relative_to(REPO) if profile.is_relative_to(REPO) else profile
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}"))
    set_line = " ".join(f"{k}={_yaml(v)}" for k, v in changed.items())
    return diff, (f'SET="{set_line}"' if set_line else "")


def top_phase(row: Mapping[str, Any]) -> tuple[str, float] | None:
    phases = row.get("phases_s") or {}
    return max(phases.items(), key=lambda item: item[1]) if phases else None


def verdicts(rows: Mapping[str, Mapping[str, Any]], chosen: Mapping[str, Any] | None) -> dict[str, Any]:
    """The two targets against the chosen configuration and the fastest VGGT row."""
    out: dict[str, Any] = {}
    if chosen is not None:
        row = rows[chosen["row"]]
        measured = chosen["s_per_sample"]
        phase = top_phase(row)
        best = ok(rows, BEST_ROW)
        profile = (best or {}).get("profile") or row.get("profile")
        out["gpu_s_per_sample"] = {
            "row": chosen["row"], "measured": measured, "target": TARGET_GPU_S_PER_SAMPLE,
            "stretch": STRETCH_GPU_S_PER_SAMPLE, "met": measured <= TARGET_GPU_S_PER_SAMPLE,
            "stretch_met": measured <= STRETCH_GPU_S_PER_SAMPLE, "gap": measured - TARGET_GPU_S_PER_SAMPLE,
            "projected_8xh800": chosen["projected_8xh800_s_per_sample"],
            "top_phase": None if phase is None else {"phase": phase[0], "s_per_sample": phase[1]},
            "top_ops": [] if not profile else profile["top_ops"][:5],
        }
    vggt = {name: row for name, row in rows.items() if row.get("status") == "ok" and "windows_per_s" in row}
    if vggt:
        name = max(vggt, key=lambda n: vggt[n]["windows_per_s"]["median"])
        measured = vggt[name]["windows_per_s"]["median"]
        out["vggt_windows_per_s"] = {
            "row": name, "measured": measured, "target": TARGET_VGGT_WINDOWS_PER_S, "stretch": STRETCH_VGGT_WINDOWS_PER_S,
            "met": measured >= TARGET_VGGT_WINDOWS_PER_S, "stretch_met": measured >= STRETCH_VGGT_WINDOWS_PER_S,
            "gap": TARGET_VGGT_WINDOWS_PER_S - measured, "tflop_per_s": vggt[name]["tflop_per_s"],
        }
    return out


def decide(rows: Mapping[str, Mapping[str, Any]], profile: Path = H800_PROFILE) -> dict[str, Any]:
    """Every decision of the run from ``rows`` (both parts' rows may be merged): JSON-ready."""
    settings, why, waiting = recommended_settings(rows, profile.read_text())
    diff, set_line = profile_diff(settings, profile)
    chosen = choose_training(rows)
    qwen3 = choose_training(rows, base=QWEN3_VL.model_type)
    fits = {name: dataclasses.asdict(f) for name, row in rows.items()
            if row.get("status") == "ok" and row.get("section") == "training" and (f := fit(row)) is not None}
    return {
        "rule": (f"fastest per sample on 8 H800s (measured compute + ZeRO-3 traffic per micro-batch at nominal NVLink) "
                 f"among rows whose estimate fits {H800_MEMORY_GIB:g} GiB with {SPARE:.0%} spare; within "
                 f"{MIN_GAIN:.0%} of the fastest, fewer levers, then the smaller micro-batch"),
        "training": chosen,
        "qwen3": qwen3,
        "fits": fits,
        "settings": settings,
        "why": why,
        "waiting": waiting,
        "profile_diff": diff,
        "set": set_line,
        "targets": verdicts(rows, chosen),
        "vggt": choose_vggt(rows),
    }
