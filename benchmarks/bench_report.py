"""Tables and plots of the benchmarks: the FLOP table, the GPU table, step-time breakdowns.

Plots use matplotlib's non-interactive backend; each has labelled axes with units and names the
machine and date in its title.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from benchmarks.flops import COMPONENTS  # noqa: E402

COMPONENT_LABELS = {
    "vggt": "VGGT (in the step)",
    "vit": "Qwen ViT blocks (frozen)",
    "vit_backward": "Qwen ViT blocks in the backward",
    "merger": "ViT patch merger (+ DeepStack mergers) + VGGT merger + fusion",
    "llm_forward": "LLM forward",
    "logits": "logits + losses",
    "backward": "backward",
    "recompute": "recompute (checkpointing)",
}
PHASE_ORDER = ("vggt", "pixel_values", "vit", "merger", "llm_forward", "logits", "backward")


def _st(x: dict[str, float], fmt: str = ".3g") -> str:
    return f"{x['median']:{fmt}} ({x['min']:{fmt}}–{x['max']:{fmt}})"


def _frames(flops: dict[str, Any]) -> str:
    """The sample's images: VGGT's side, and the base's own where it differs (janus's grid rule)."""
    shape = flops["shape"]
    qwen_side = shape.get("qwen_side", shape["side"])
    sides = f"{shape['side']}²" if qwen_side == shape["side"] else f"{qwen_side}² (VGGT at {shape['side']}²)"
    return f"{shape['images']} images of {sides}, {shape['sequence_length']} tokens"


def flops_markdown(flops: dict[str, Any]) -> str:
    """The per-component FLOP table of one janus and one reference step (TFLOP per sample); without
    a ViT-cache column for results that hold none (Qwen3-VL results saved before the ViT cache
    covered that base)."""
    vit_cache = flops.get("janus_vit_cache") is not None
    columns = ("janus", *(("janus_vit_cache",) if vit_cache else ()), "reference")
    lines = [
        f"FLOPs per training sample, counted with PyTorch's FLOP counter on the meta device "
        f"({flops['models'].get('qwen', '')} + {flops['models'].get('vggt', '')}; {_frames(flops)}, "
        f"activation checkpointing {flops['checkpointing']}):",
        "",
        "| component (TFLOP per sample) | " + " | ".join(c.replace("janus_vit_cache", "janus + ViT cache")
                                                     for c in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name in COMPONENTS:
        lines.append(f"| {COMPONENT_LABELS[name]} | " + " | ".join(f"{flops[c][name] / 1e12:.2f}" for c in columns) + " |")
    lines += [
        "| **total** | " + " | ".join(f"**{flops[f'{c}_total'] / 1e12:.1f}**" for c in columns) + " |",
        "",
        f"Reference / janus FLOPs per step: **{flops['ratio']:.2f}×**. The frozen ViT runs outside autograd "
        "(nothing of it in the backward); with the ViT cache (cache.vit_features) its blocks do not run in the step "
        "at all, only its trainable mergers on the cached output"
        + ("" if vit_cache else " (these results hold no ViT-cache figures)") + ". janus pays its VGGT window once per "
        f"sample in precompute ({flops['precompute_vggt_per_sample'] / 1e12:.1f} TFLOP, reused every epoch); the "
        "reference runs VGGT frame by frame through all block pairs in every step and computes full-vocabulary "
        "float32 logits at every position. Attention is counted dense; non-reentrant recomputation stops once the "
        "saved tensors are rebuilt, so it skips each layer's last projection.",
    ]
    return "\n".join(lines) + "\n"


def flops_by_base_markdown(tables: dict[str, dict[str, Any]]) -> str:
    """The FLOP tables of several bases side by side (TFLOP per sample of the janus and the reference
    step): ``tables`` maps a model name (e.g. qwen2_5_vl_7b) to :meth:`FlopTable.to_dict`."""
    names = list(tables)
    header = " | ".join(f"{name} janus | {name} reference" for name in names)
    lines = [
        "FLOPs per training sample by base model, counted on the meta device (same VGGT-1B window and visual "
        "tokens; " + "; ".join(f"{name}: {_frames(t)}" for name, t in tables.items()) + "):",
        "",
        f"| component (TFLOP per sample) | {header} |",
        "|---|" + "---|---|" * len(names),
    ]
    for component in COMPONENTS:
        cells = " | ".join(f"{t['janus'][component] / 1e12:.2f} | {t['reference'][component] / 1e12:.2f}"
                           for t in tables.values())
        lines.append(f"| {COMPONENT_LABELS[component]} | {cells} |")
    totals = " | ".join(f"**{t['janus_total'] / 1e12:.1f}** | **{t['reference_total'] / 1e12:.1f}**"
                        for t in tables.values())
    lines += [f"| **total** | {totals} |", "",
              "Reference / janus FLOPs per step: " + ", ".join(f"{n} **{t['ratio']:.2f}×**" for n, t in tables.items())
              + ". A Qwen3-VL merger row holds its DeepStack mergers too (trainable, the projector's learning rate)."]
    return "\n".join(lines) + "\n"


def _lever_lines(levers: dict[str, Any] | None) -> list[str]:
    """VGGT speed levers, each alone against today's path (B = windows per call, overlapping)."""
    if not levers:
        return []
    lines = [f"| VGGT lever, B={levers['batch']} overlapping windows "
             f"({levers['distinct_frames_per_window']:.1f} distinct frames/window) | windows/s | TFLOP/s | kernel |",
             "|---|---|---|---|"]
    for name, row in levers["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | |")
        else:
            lines.append(f"| {name} | {_st(row['windows_per_s'])} | {row['tflop_per_s']:.1f} | {row['kernel']} |")
    return [*lines, ""]


def gpu_markdown(results: dict[str, Any]) -> str:
    """The GPU bench's table: precompute rows, training rows, ratios, projection (labelled)."""
    pre, train = results["precompute"], results["training"]
    lines = [
        f"Measured {results['date']} on {results['device']} (torch {results['torch']}, {results['dtype']}, "
        f"attention {results['attention']}; models {results['models']['qwen']} + {results['models']['vggt']} "
        "with random weights; median, min–max over repeats after warm-up).",
        "",
        "| precompute (VGGT window) | windows/s | TFLOP/s | peak GiB |",
        "|---|---|---|---|",
    ]
    for name, row in pre["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | |")
            continue
        peak = "–" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
        lines.append(f"| {name} | {_st(row['windows_per_s'])} | {row['tflop_per_s']:.1f} | {peak} |")
    lines += [
        "",
        f"janus batched (best B={pre['best_batch']}) / reference per-frame loop: **{pre['ratio_best']:.2f}×** "
        f"(B=1: {_fmt(pre['ratio_b1'])}×); target ≥ {pre['target_windows_per_s']:g} windows/s per H100-class GPU.",
        "",
    ]
    lines += _lever_lines(pre.get("levers"))
    lines += [
        "| training step (forward + backward, 1 sample) | s/sample | tokens/s | TFLOP/s | MFU | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in train["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error']} | | | | |")
            continue
        mfu = "–" if row["mfu"] is None else f"{100 * row['mfu']:.0f}%"
        peak = "–" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
        lines.append(f"| {name} | {_st(row['s_per_sample'])} | {row['tokens_per_s']:,.0f} | "
                     f"{row['tflop_per_s']:.0f} | {mfu} | {peak} |")
    share = train["zero3_share_8_gpus"]
    lines += [
        "",
        f"Reference / janus seconds per sample: best janus ({train['best_janus']}) "
        f"**{_fmt(train.get('ratio_best'))}×**, same checkpointing {_fmt(train.get('ratio_same_checkpointing'))}×; "
        f"target ≤ {train['target_gpu_s_per_sample']} GPU-s per sample at 7B (reference measured 6.9). "
        f"Liger kernels: {train['liger']}.",
        f"Not measured, analytic: ZeRO-3 model state per GPU over 8 GPUs: weights {share['params_bytes'] / 2**30:.1f} GiB, "
        f"gradients {share['grads_bytes'] / 2**30:.1f} GiB, Adam state {share['optimizer_bytes'] / 2**30:.1f} GiB "
        f"({train['params'] / 1e9:.2f} B parameters, {train['trainable_params'] / 1e9:.2f} B trainable).",
    ]
    projection = train.get("projection")
    if projection:
        lines.append(
            f"Projected (measured compute {projection['compute_s_per_sample']:.2f} s/sample + analytic ZeRO-3 traffic "
            f"{projection['comm_s_per_sample']:.2f} s/sample at nominal {projection['device']} NVLink): "
            f"{projection['hours_per_epoch_full_overlap']:.1f}–{projection['hours_per_epoch_no_overlap']:.1f} h per "
            f"612,492-sample epoch on {projection['gpus']} GPUs (full overlap – none; optimizer step and data wait "
            f"excluded), against the reference's measured {projection['reference_hours_per_epoch']:g} h on 8×H800."
        )
    else:
        lines.append("Projection: not made (no nominal NVLink figure for this device).")
    data = results.get("data_path")
    if data:
        lines.append(
            f"Data path on the host's cores ({data['frames_per_sample']}×{data['resolution']} frames + tokens, samples/s): "
            f"per core live {_st(data['live_per_core'])} vs cached {_st(data['cached_per_core'])} "
            f"({data['speedup_per_core']:.1f}×); with {data['loader_workers']} loader workers live "
            f"{_st(data['live_with_workers'])} vs cached {_st(data['cached_with_workers'])} ({data['speedup_with_workers']:.1f}×)."
        )
    lines += _zero_lines(train.get("zero_stages"))
    lines += _profile_lines(results.get("profile"))
    return "\n".join(lines) + "\n\n" + flops_markdown(results["flops"])


def _zero_lines(options: list[dict[str, Any]] | None) -> list[str]:
    """ZeRO-3 against ZeRO-2 (train.zero_stage), projected from the best measured janus row."""
    if not options:
        return []
    lines = ["", "Projected, not measured: ZeRO stage by nodes of 8 GPUs (model state per GPU without activations; "
             "traffic per sample at nominal NVLink in a node, 50 GB/s per GPU across nodes; 8 micro-batches per step):",
             "", "| ZeRO | nodes × 8 GPUs | state GiB/GPU | GB moved/sample | comm s/sample | h/epoch (overlap – none) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {o['stage']} | {o['nodes']} | {o['state_gib_per_gpu']:.1f} | {o['comm_gb_per_sample']:.1f} | "
              f"{o['comm_s_per_sample']:.3f} | {o['hours_per_epoch_full_overlap']:.1f}–{o['hours_per_epoch_no_overlap']:.1f} |"
              for o in options]
    return lines


def _profile_lines(profile: dict[str, Any] | None) -> list[str]:
    """The top operators of the profiled janus step (``make bench-gpu BENCH_ARGS=--profile``)."""
    if not profile:
        return []
    lines = ["", f"Top operators of one janus step ({profile['checkpointing']} checkpointing; own {profile['time']} "
             f"time; trace: {profile['trace']}):", "", "| operator | calls | ms | share |", "|---|---|---|---|"]
    lines += [f"| `{op['op']}` | {op['calls']} | {op['self_ms']:.2f} | {100 * op['share']:.1f}% |"
              for op in profile["top_ops"]]
    return lines


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _title(ax: Any, what: str, machine: str, when: str) -> None:
    ax.set_title(f"{what}\n{machine}, {when}", fontsize=10)


def plot_flops(flops: dict[str, Any], what: str, path: Path, machine: str, when: str) -> None:
    """Stacked horizontal bars: TFLOP per sample of each component, janus vs reference."""
    fig, ax = plt.subplots(figsize=(9, 3.4))
    paths = ("janus", "janus_vit_cache", "reference") if flops.get("janus_vit_cache") else ("janus", "reference")
    left = [0.0] * len(paths)
    colours = plt.get_cmap("tab10")
    for i, name in enumerate(COMPONENTS):
        values = [flops[p][name] / 1e12 for p in paths]
        ax.barh([p.replace("janus_vit_cache", "janus + ViT cache") for p in paths], values, left=left, color=colours(i),
                label=COMPONENT_LABELS[name])
        left = [a + b for a, b in zip(left, values)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.3g}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("TFLOP per training sample")
    ax.set_xlim(0, max(left) * 1.12)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    _title(ax, f"{what} (reference/janus {flops['ratio']:.2f}×)", f"counted on the meta device of {machine}", when)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_gpu_steps(results: dict[str, Any], path: Path) -> None:
    """Stacked horizontal bars: median seconds per phase of each measured training row."""
    rows = {k: r for k, r in results["training"]["rows"].items() if "phases_s" in r}
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 2.2))
    names = list(rows)
    left = [0.0] * len(names)
    colours = plt.get_cmap("tab10")
    for i, phase in enumerate(PHASE_ORDER):
        values = [rows[n]["phases_s"].get(phase, 0.0) for n in names]
        ax.barh(names, values, left=left, color=colours(i), label=phase.replace("_", " "))
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("seconds per training sample (forward + backward, no optimizer)")
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    _title(ax, f"training step breakdown, {results['models']['qwen']} + {results['models']['vggt']}",
           results["device"], results["date"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_cpu_steps(training: dict[str, Any], machine: str, when: str, path: Path) -> None:
    """Stacked bars of the CPU training bench: data wait, forward, backward, optimizer per step."""
    parts = ("data_wait_s", "forward_s", "backward_s", "optimizer_s")
    runs = ("cached", "live")
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0, 0.0]
    for part in parts:
        values = [training[r].get(part, {"median": 0.0})["median"] for r in runs]
        ax.bar(runs, values, bottom=bottom, label=part.removesuffix("_s").replace("_", " "), width=0.5)
        bottom = [a + b for a, b in zip(bottom, values)]
    for x, run in enumerate(runs):
        ax.text(x, bottom[x], f"{training[run]['step_s']['median']:.2f} s/step", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("seconds per optimizer step (median)")
    ax.set_xlabel("data path")
    ax.set_ylim(0, max(bottom) * 1.15)
    ax.legend(fontsize=8)
    _title(ax, "training step breakdown, tiny profile, 2 processes (CPU)", machine, when)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ the prepared GPU run


def _device_header(data: dict[str, Any]) -> list[str]:
    run = data["run"]
    packages = run.get("packages", {})
    versions = ", ".join(f"{name} {version}" for name, version in packages.items() if version)
    memory = run.get("device_memory_gib")
    where = f"{run.get('device', '?')}" + (f" ({memory:.0f} GiB)" if memory else "")
    lines = [
        "# The prepared GPU run" + (": smoke mode (tiny models on the CPU; no figure here is real)" if run["smoke"] else ""),
        "",
        f"Part {run['part']}, {run['date']}, on {where}: {versions}; CUDA {run.get('cuda')}, Python {run.get('python')}, "
        f"attention {run.get('attention', '?')}, PYTORCH_CUDA_ALLOC_CONF={run.get('alloc_conf') or '(unset)'}. "
        f"Rows: median (min–max) over repeats after warm-up; peak memory of the CUDA allocator. "
        f"{run['seconds']:.0f} s of a {run['budget_s']:.0f} s budget.",
    ]
    if run.get("earlier_rows"):
        lines.append(f"The decisions also read {len(run['earlier_rows'])} rows of an earlier part.")
    return [*lines, ""]


def _gib(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _not_measured(row: dict[str, Any]) -> str:
    return f"{row['status']}: {row.get('error') or row.get('note') or ''}".rstrip(": ")


def _device_table(rows: dict[str, Any], section: str, header: list[str], cells: Any) -> list[str]:
    """A table of ``section``'s rows: ``cells(name, row)`` for a measured one, else its status and why."""
    names = [n for n, r in rows.items() if r.get("section") == section]
    if not names:
        return []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in names:
        row = rows[name]
        label = f"{name} ({row['note']})" if row.get("note") and row["status"] == "ok" else name
        values = cells(name, row) if row["status"] == "ok" else [_not_measured(row)] + [""] * (len(header) - 2)
        lines.append("| " + " | ".join([label, *values]) + " |")
    return [*lines, ""]


def _device_training_lines(rows: dict[str, Any], fits: dict[str, Any]) -> list[str]:
    def cells(name: str, row: dict[str, Any]) -> list[str]:
        fit = fits.get(name)
        return [row["model"], row["checkpointing"], ", ".join(row["levers"]) or "–", str(row["micro_batch"]),
                _st(row["s_per_sample"]), f"{row['tokens_per_s']:,.0f}",
                "–" if row.get("mfu") is None else f"{100 * row['mfu']:.0f}%", _gib(row["peak_gib"]),
                "–" if fit is None else f"{fit['estimate_gib']:.1f} (bound {fit['bound_gib']:.1f})",
                "–" if fit is None else ("yes" if fit["fits"] else "**no**")]

    return _device_table(rows, "training", ["training row", "model", "checkpointing", "levers", "micro-batch", "s/sample",
                                            "tokens/s", "MFU", "peak GiB", "8×ZeRO-3 estimate GiB/GPU",
                                            "fits 80 GB with 10 % spare"], cells)


def _device_vggt_lines(rows: dict[str, Any]) -> list[str]:
    def cells(name: str, row: dict[str, Any]) -> list[str]:
        versus, frames = row.get("vs_baseline"), row.get("frames_per_window")
        compared = "–" if versus is None else "identical" if versus["identical"] else (
            f"max abs {versus['max_abs']:.3g} (bound {versus['bound']:.3g}), cos {versus['cosine']:.6f}"
            + ("" if versus["within_tolerance"] else " **outside tolerance**"))
        return [str(row["windows_per_call"]), "9 (random)" if frames is None else f"{frames:.2f}",
                _st(row["windows_per_s"]), f"{row['tflop_per_s']:.1f}", _gib(row["peak_gib"]), row["kernel"], compared]

    return _device_table(rows, "vggt", ["VGGT-1B row", "windows/call", "frames/window", "windows/s", "TFLOP/s",
                                        "peak GiB", "kernel", "features vs today's path"], cells)


def _device_other_lines(rows: dict[str, Any]) -> list[str]:
    lines = []
    for name, row in rows.items():
        if row.get("section") == "flops":
            if row["status"] == "ok":
                flops = row["flops"]
                lines.append(f"* {name}: janus {flops['janus_total'] / 1e12:.1f} TFLOP per sample, with the ViT cache "
                             f"{flops['janus_vit_cache_total'] / 1e12:.1f} ({flops['models'].get('qwen', '')}).")
            else:
                lines.append(f"* {name}: {_not_measured(row)}.")
        elif row.get("section") == "numerics":
            if row["status"] == "ok":
                lines.append(
                    f"* {name}: cached vs live ViT output ({row['compute_dtype']} compute, {row['stored_dtype']} stored, "
                    f"{row['windows']} windows of {row['distinct_frames']} distinct frames): max abs {row['max_abs']:.3g} "
                    f"against verify's bound {row['bound']:.3g}, mean abs {row['mean_abs']:.3g}, min cosine "
                    f"{row['min_cosine']:.6f} (≥ {row['tolerance']['min_cosine']}): "
                    f"**{'within' if row['within_tolerance'] else 'OUTSIDE'} tolerance**.")
            else:
                lines.append(f"* {name}: {_not_measured(row)}.")
    return [*lines, ""] if lines else []


def _device_decision_lines(decisions: dict[str, Any]) -> list[str]:
    if not decisions or "error" in decisions:
        return [f"Decisions: not made ({decisions.get('error', 'no rows')})." if decisions else "", ""]
    lines = ["## Decisions", "", f"Rule: {decisions['rule']}.", ""]
    chosen = decisions.get("training")
    if chosen:
        fit = chosen.get("fit")
        lines.append(f"Chosen training configuration: row {chosen['row']} ({chosen['checkpointing']}, levers "
                     f"{', '.join(chosen['levers']) or 'none'}, micro-batch {chosen['micro_batch']}): "
                     f"{chosen['s_per_sample']:.3g} s/sample measured, {chosen['projected_8xh800_s_per_sample']:.3g} "
                     f"projected on 8 H800s with ZeRO-3 traffic (no overlap)"
                     + ("" if fit is None else f", {fit['estimate_gib']:.1f} GiB per GPU estimated (limit "
                        f"{fit['limit_gib']:.1f})") + ".")
    qwen3 = decisions.get("qwen3")
    if qwen3:
        lines.append(f"Qwen3-VL-8B's fastest fitting row: {qwen3['row']}, {qwen3['s_per_sample']:.3g} s/sample.")
    if decisions["settings"]:
        lines += ["", "| h800 setting | value | from |", "|---|---|---|"]
        lines += [f"| `{k}` | `{json.dumps(v)}` | {decisions['why'].get(k, '')} |" for k, v in decisions["settings"].items()]
    lines.append("")
    for line in decisions["waiting"]:
        lines.append(f"* waiting: {line}")
    if decisions["profile_diff"]:
        lines += ["", "Recommended change of the h800 profile (" + (decisions["set"] or "") + "):", "", "```diff",
                  decisions["profile_diff"].rstrip("\n"), "```"]
    else:
        lines += ["", "The h800 profile already holds every decided value."]
    targets = decisions.get("targets", {})
    lines.append("")
    step = targets.get("gpu_s_per_sample")
    if step:
        verdict = "met" if step["met"] else f"missed by {step['gap']:.3g} s"
        phase = step.get("top_phase")
        lines.append(f"* Target ≤ {step['target']:g} GPU-s per sample (stretch {step['stretch']:g}): {step['measured']:.3g} "
                     f"measured ({step['row']}), **{verdict}**" + ("; stretch met" if step["stretch_met"] else "")
                     + f"; {step['projected_8xh800']:.3g} projected on 8 H800s with ZeRO-3 traffic (no overlap)"
                     + ("" if phase is None else f"; the top phase: {phase['phase']} {phase['s_per_sample']:.3g} s/sample")
                     + ("; top operators: " + ", ".join(f"`{op['op']}` {100 * op['share']:.0f}%"
                                                        for op in step["top_ops"][:3]) if step["top_ops"] else "") + ".")
    windows = targets.get("vggt_windows_per_s")
    if windows:
        verdict = "met" if windows["met"] else f"missed by {windows['gap']:.3g} windows/s"
        lines.append(f"* Target ≥ {windows['target']:g} VGGT-1B windows/s (stretch {windows['stretch']:g}): "
                     f"{windows['measured']:.3g} ({windows['row']}, {windows['tflop_per_s']:.0f} TFLOP/s), **{verdict}**"
                     + ("; stretch met" if windows["stretch_met"] else "") + ".")
    return [*lines, ""]


def device_markdown(data: dict[str, Any]) -> str:
    """The prepared GPU run's report: every row with its status, the decisions, the profile's top operators."""
    rows = data["rows"]
    decisions = data.get("decisions") or {}
    lines = _device_header(data)
    lines += _device_training_lines(rows, decisions.get("fits", {}))
    lines += _device_vggt_lines(rows)
    lines += _device_other_lines(rows)
    missing = [entry["name"] for entry in data.get("plan", []) if entry["name"] not in rows]
    if missing:
        lines += [f"Not reached: {', '.join(missing)}.", ""]
    lines += _device_decision_lines(decisions)
    best = rows.get("7b_best", {})
    if best.get("profile"):
        lines += _profile_lines(best["profile"])
    return "\n".join(lines).rstrip("\n") + "\n"


def _device_bars(data: dict[str, Any], names: list[str], values: list[float], colours: list[str], target: float,
                 xlabel: str, what: str, path: Path, errors: list[list[float]] | None = None) -> None:
    """Horizontal bars of one figure per row, the target as a dashed line."""
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(names) + 2))
    ax.barh(names, values, xerr=errors, color=colours)
    ax.axvline(target, color="black", linestyle="--", linewidth=1, label="target")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    run = data["run"]
    _title(ax, what, run.get("device", "?") + (" (smoke)" if run["smoke"] else ""), run["date"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_device_training(data: dict[str, Any], path: Path) -> None:
    """Bars of the measured training rows' seconds per sample with their min–max (green: fits an 80 GB
    GPU under ZeRO-3, red: does not, grey: no memory figure); nothing without such rows."""
    from benchmarks.bench_projection import TARGET_GPU_S_PER_SAMPLE

    fits = (data.get("decisions") or {}).get("fits", {})
    rows = {n: r for n, r in data["rows"].items() if r.get("section") == "training" and r["status"] == "ok"}
    if not rows:
        return
    names = list(rows)
    values = [rows[n]["s_per_sample"]["median"] for n in names]
    errors = [[v - rows[n]["s_per_sample"]["min"] for n, v in zip(names, values)],
              [rows[n]["s_per_sample"]["max"] - v for n, v in zip(names, values)]]
    colours = ["grey" if n not in fits else ("tab:green" if fits[n]["fits"] else "tab:red") for n in names]
    _device_bars(data, names, values, colours, TARGET_GPU_S_PER_SAMPLE,
                 "GPU-seconds per training sample (forward + backward, one GPU; min–max as error bars)",
                 "training rows (green: fits 80 GB under ZeRO-3 with 10 % spare)", path, errors)


def plot_device_vggt(data: dict[str, Any], path: Path) -> None:
    """Bars of the measured VGGT rows' windows per second; nothing without such rows."""
    from benchmarks.bench_projection import TARGET_VGGT_WINDOWS_PER_S

    rows = {n: r for n, r in data["rows"].items() if r.get("section") == "vggt" and r["status"] == "ok"}
    if not rows:
        return
    names = list(rows)
    _device_bars(data, names, [rows[n]["windows_per_s"]["median"] for n in names], ["tab:blue"] * len(names),
                 TARGET_VGGT_WINDOWS_PER_S, "VGGT-1B windows per second (9 frames, 644², bf16)", "VGGT rows", path)
