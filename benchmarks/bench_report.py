"""Tables and plots of the benchmarks: the FLOP table, the GPU table, step-time breakdowns.

Plots use matplotlib's non-interactive backend; each has labelled axes with units and names the
machine and date in its title.
"""

from __future__ import annotations

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
