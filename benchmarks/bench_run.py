"""The run of `make bench` / `janus-cache bench` (its command: :mod:`benchmarks.bench`): the
side-by-side numbers that show what the cache buys.

Every figure is measured in this run: a median over repeats with min and max, and every
comparison is a ratio of two figures of the same run. Writes ``results.json``, ``results.md``,
``step_breakdown.png`` and ``flops_per_component.png`` to ``--out`` (``benchmarks/results``), and
prints the table.

Sections: (1) data path at the real shape (:mod:`benchmarks.data_path`); (2) storage per sample and
extrapolated to the real set; (3) precompute throughput per phase; (4) training step cached vs
live (tiny profile, 2 processes); (5) FLOPs per sample of a janus and a reference step at the real
shapes of each base, Qwen2.5-VL-7B and Qwen3-VL-8B with VGGT-1B, counted on the meta device
(:mod:`benchmarks.flops`); (6) the training reader from disk vs from a bucket of an S3 server
on this machine (:mod:`benchmarks.bench_object_storage`); (7) the GPU bench
(:mod:`benchmarks.bench_gpu`) where CUDA is available.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.bench_object_storage import markdown_rows as object_storage_rows
from benchmarks.bench_object_storage import reader_from_bucket
from benchmarks.bench_projection import REAL_SAMPLES
from benchmarks.data_path import data_path
from benchmarks.flops import count_flops
from benchmarks.measure import Stat
from janus_cache.keys import frame_shape
from janus_cache.store import CacheLayout, load_manifest, open_writer
from janus_cache.store.layout import FEATURES_GROUP, FRAMES_GROUP, WDS_DIR
from janus_cache.work_units import compute_frame_shard, encode_windows, read_windows
from janus_core.bases import QWEN2_5_VL
from janus_core.index import build_index
from janus_core.profile import load_profile
from janus_core.resolution import grid_shape
from janus_core.sample_data import write_sample_data
from janus_core.vggt.encoder import WindowEncoder
from pipelines.precompute_run import Options
from pipelines.precompute_run import run as run_precompute

REAL_FEATURE_SHAPE = (2116, 2048)
"""VGGT-1B layer -2 patch tokens at 644x644."""
REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------- sections


def storage(work: Path, cache644: Path) -> dict[str, Any]:
    """Bytes per sample of each layout, measured at pad644, and extrapolated to the real set."""
    wds = work / "cache644-wds"
    profile_path = work / "bench-pad644.yaml"
    if run_precompute(Options(work / "data644", wds, str(profile_path), cache_format="wds", workers=1)) != 0:
        raise RuntimeError("precompute of the webdataset benchmark cache failed")
    manifest = load_manifest(cache644)
    n_samples = manifest.counts["samples"]
    n_frames = manifest.counts["frames"]
    entry = next(iter(manifest.resolutions.values()))
    h, w, _ = entry.frame_shape
    n_tokens, width = entry.feature_shape
    history = manifest.window.history
    zarr_paths, wds_paths = CacheLayout(cache644), CacheLayout(wds)

    def size(paths: list[Path]) -> int:
        return sum(p.stat().st_size for root in paths for p in root.rglob("*") if p.is_file())

    frames_bytes = size([zarr_paths.path(FRAMES_GROUP)])
    features_bytes = size([zarr_paths.path(FEATURES_GROUP)])
    zarr_total = size([zarr_paths.root])
    wds_tars = size([wds_paths.path(WDS_DIR)])
    gh, gw = grid_shape(h, w)
    naive_per_sample = (history + 1) * gh * gw * QWEN2_5_VL.patch_dim * 4 + n_tokens * width * 4
    frame_ratio = n_frames * h * w * 3 / frames_bytes
    feature_ratio = n_samples * n_tokens * width * 2 / features_bytes  # bf16 raw bytes / stored
    real_feature_raw = REAL_FEATURE_SHAPE[0] * REAL_FEATURE_SHAPE[1] * 2
    real_naive = (history + 1) * gh * gw * QWEN2_5_VL.patch_dim * 4 + REAL_FEATURE_SHAPE[0] * REAL_FEATURE_SHAPE[1] * 4
    # Every real sample is one frame, so frames and samples are equally many.
    real_zarr = REAL_SAMPLES * (h * w * 3 / frame_ratio + real_feature_raw / feature_ratio)
    real_wds = REAL_SAMPLES * ((history + 1) * h * w * 3 / frame_ratio + real_feature_raw / feature_ratio)
    return {
        "measured_at": f"pad644, tiny-VGGT features {n_tokens}x{width} bf16, {n_samples} samples",
        "naive_bytes_per_sample": naive_per_sample,
        "zarr_bytes_per_sample": zarr_total / n_samples,
        "wds_bytes_per_sample": wds_tars / n_samples,
        "frame_compression": frame_ratio,
        "feature_compression": feature_ratio,
        "real_set": {
            "samples": REAL_SAMPLES,
            "feature_shape": list(REAL_FEATURE_SHAPE),
            "naive_bytes": REAL_SAMPLES * real_naive,
            "zarr_bytes": real_zarr,
            "wds_bytes": real_wds,
            "note": "frame ratio measured on rendered sample frames, feature ratio on tiny-VGGT features; "
                    "real VGGT-1B features may compress differently",
        },
    }


def precompute_phases(work: Path, repeats: int) -> dict[str, Any]:
    """Samples/s of each precompute phase on the tiny profile (one process, in-process timing)."""
    data = work / "data224"
    write_sample_data(data, episodes=3, steps=16, seed=2)
    profile = load_profile("tiny")
    res = profile.cache.resolution
    index = build_index(data, history=profile.cache.history, subinstruction_rule=profile.cache.subinstruction_rule)
    encoder = WindowEncoder.from_settings(profile.vggt, profile.cache)
    shape = frame_shape(index, res)
    rows = range(len(index.frames))
    window_rows = np.array([s.window_rows for s in index.samples], dtype=np.int64)
    out = work / "phases"
    timings: dict[str, list[float]] = {"decode": [], "frame_write": [], "encode": [], "feature_write": []}
    for _ in range(repeats):
        shutil.rmtree(out, ignore_errors=True)
        writer = open_writer("zarr", out, "bench")
        from janus_cache.work_units import frame_table, sample_table

        writer.write_table("frames", frame_table(index))
        writer.prepare_frames(res.name, shape, len(index.frames))
        writer.write_table("samples", sample_table(index))
        writer.prepare_samples(res.name, encoder.feature_shape(*shape), "bfloat16", len(index.samples))
        t0 = time.perf_counter()
        frames, _ = compute_frame_shard(index.frames, rows, res, shape, None)
        t1 = time.perf_counter()
        writer.write_frame_shard(res.name, 0, frames)
        t2 = time.perf_counter()
        windows = read_windows(writer, res.name, window_rows)
        features = encode_windows(encoder, windows, profile.cache.vggt_batch)
        t3 = time.perf_counter()
        writer.write_samples_shard(res.name, 0, features, windows)
        t4 = time.perf_counter()
        timings["decode"].append(len(rows) / (t1 - t0))
        timings["frame_write"].append(len(rows) / (t2 - t1))
        timings["encode"].append(len(index.samples) / (t3 - t2))
        timings["feature_write"].append(len(index.samples) / (t4 - t3))
    shutil.rmtree(out, ignore_errors=True)
    return {
        "resolution": res.name,
        "frames": len(index.frames),
        "samples": len(index.samples),
        "frames_per_s_decode": asdict(Stat.of(timings["decode"])),
        "frames_per_s_write": asdict(Stat.of(timings["frame_write"])),
        "samples_per_s_encode": asdict(Stat.of(timings["encode"])),
        "samples_per_s_write": asdict(Stat.of(timings["feature_write"])),
    }


def training(work: Path, steps: int) -> dict[str, Any]:
    """Step time and its breakdown, cached vs live, tiny profile, 2 processes (real torchrun)."""
    data = work / "data224"
    cache = work / "cache224"
    if run_precompute(Options(data, cache, "tiny", workers=1)) != 0:
        raise RuntimeError("precompute of the training benchmark cache failed")
    results: dict[str, Any] = {}
    for name, source in (("cached", ["--cache", str(cache)]), ("live", ["--live-data", str(data)])):
        run_dir = work / f"train-{name}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "pipelines.train", "--out", str(run_dir), "--profile", "tiny", "--max-steps", str(steps),
               "--no-export", *source]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"training benchmark ({name}) failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
        keys = ("step_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s", "data_wait_share", "samples_per_s")
        results[name] = {k: asdict(Stat.of([r[k] for r in records])) for k in keys if k in records[0]}
    results["speedup_step_time"] = results["live"]["step_s"]["median"] / results["cached"]["step_s"]["median"]
    results["steps_measured"] = steps - 1
    return results


def flops_section() -> dict[str, dict[str, Any]]:
    """FLOPs per sample of one janus and one reference step at the real shapes of each base (meta
    device), by model directory name (qwen2_5_vl_7b, qwen3_vl_8b)."""
    from benchmarks.bench_gpu import REAL_BY_BASE

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # meta tensors do no arithmetic; one thread avoids contention
    try:
        return {real.qwen_dir.name: count_flops(real.qwen_dir, real.vggt_config, real.shape,
                                                merger_hidden=real.merger_hidden).to_dict()
                for real in REAL_BY_BASE.values()}
    finally:
        torch.set_num_threads(threads)


def gpu_section() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine; run `make bench-gpu` on a GPU machine for this section"}
    from benchmarks.bench_gpu import REAL, run

    return run(REAL)


# ------------------------------------------------------------------------------------ output


def markdown(results: dict[str, Any]) -> str:
    d, s, p, t = results["data_path"], results["storage"], results["precompute"], results["training"]

    def st(x: dict[str, float], fmt: str = ".3g") -> str:
        return f"{x['median']:{fmt}} ({x['min']:{fmt}}–{x['max']:{fmt}})"

    def gb(n: float) -> str:
        return f"{n / 1e9:,.1f} GB" if n < 1e12 else f"{n / 1e12:,.2f} TB"

    lines = [
        f"Measured {results['date']} on {results['machine']} (median, min–max over repeats).",
        "",
        "| what | live / naive | cached | ratio |",
        "|---|---|---|---|",
        f"| data path, samples/s per core (9×pad644 frames + tokens) | {st(d['live_per_core'])} | "
        f"{st(d['cached_per_core'])} | {d['speedup_per_core']:.1f}× |",
        f"| data path, samples/s with {d['loader_workers']} loader workers | {st(d['live_with_workers'])} | "
        f"{st(d['cached_with_workers'])} | {d['speedup_with_workers']:.1f}× |",
        f"| bytes per sample at pad644 (zarr / wds) | {s['naive_bytes_per_sample'] / 1e6:.1f} MB | "
        f"{s['zarr_bytes_per_sample'] / 1e6:.2f} / {s['wds_bytes_per_sample'] / 1e6:.2f} MB | "
        f"{s['naive_bytes_per_sample'] / s['zarr_bytes_per_sample']:.0f}× (zarr) |",
        f"| real set, {s['real_set']['samples']:,} samples, VGGT-1B features (zarr / wds) | "
        f"{gb(s['real_set']['naive_bytes'])} | {gb(s['real_set']['zarr_bytes'])} / {gb(s['real_set']['wds_bytes'])} | "
        f"{s['real_set']['naive_bytes'] / s['real_set']['zarr_bytes']:.1f}× |",
        f"| training step time, tiny profile, 2 processes (s) | {st(t['live']['step_s'])} | "
        f"{st(t['cached']['step_s'])} | {t['speedup_step_time']:.1f}× |",
        f"| data-wait share of the step | {100 * t['live']['data_wait_share']['median']:.0f}% | "
        f"{100 * t['cached']['data_wait_share']['median']:.0f}% | |",
        *(object_storage_rows(results["object_storage"]) if "object_storage" in results else []),
        "",
        f"Compression: frames {s['frame_compression']:.1f}×, features {s['feature_compression']:.2f}× "
        f"({s['measured_at']}).",
        f"Precompute ({p['resolution']}, tiny profile, one process): decode {st(p['frames_per_s_decode'])} frames/s, "
        f"frame writes {st(p['frames_per_s_write'])} frames/s, encode {st(p['samples_per_s_encode'])} samples/s, "
        f"feature writes {st(p['samples_per_s_write'])} samples/s.",
    ]
    from benchmarks.bench_report import flops_by_base_markdown, flops_markdown, gpu_markdown

    gpu = results["gpu"]
    tail = [flops_markdown(results["flops"]), flops_by_base_markdown(results["flops_by_base"])]
    if "skipped" in gpu:
        tail.append(f"GPU section: skipped ({gpu['skipped']}).")
    else:
        tail.append(gpu_markdown(gpu))
    return "\n".join(lines) + "\n\n" + "\n".join(tail) + "\n"
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(out: Path, repeats: int, steps: int, workers: int) -> None:
    """Measure every section and write the results to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": date.today().isoformat(),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}",
    }
    print("[1/7] data path (pad644, live vs cached)...", flush=True)
    results["data_path"] = data_path(work, repeats, workers)
    print("[2/7] storage...", flush=True)
    results["storage"] = storage(work, Path(results["data_path"]["cache"]))
    print("[3/7] precompute phases...", flush=True)
    results["precompute"] = precompute_phases(work, repeats)
    print("[4/7] training step, cached vs live...", flush=True)
    results["training"] = training(work, steps)
    print("[5/7] FLOPs per sample at the real shapes of each base (meta device)...", flush=True)
    results["flops_by_base"] = flops_section()
    # Qwen2.5-VL-7B's table, JanusVLN's own base, stays where earlier results have it.
    from benchmarks.bench_gpu import REAL

    results["flops"] = results["flops_by_base"][REAL.qwen_dir.name]
    print("[6/7] training reader, local disk vs an S3 server on this machine...", flush=True)
    results["object_storage"] = reader_from_bucket(work, Path(results["data_path"]["cache"]), work / "bench-pad644.yaml",
                                                   repeats, workers)
    print("[7/7] GPU section...", flush=True)
    results["gpu"] = gpu_section()
    results["seconds"] = time.perf_counter() - started
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    table = markdown(results)
    (out / "results.md").write_text(table)
    from benchmarks.bench_report import plot_cpu_steps, plot_flops, plot_gpu_steps

    when = results["date"]
    plot_cpu_steps(results["training"], results["machine"], when, out / "step_breakdown.png")
    plot_flops(results["flops"], "FLOPs per training sample, Qwen2.5-VL-7B + VGGT-1B architectures",
               out / "flops_per_component.png", results["machine"], when)
    if "skipped" not in results["gpu"]:
        plot_gpu_steps(results["gpu"], out / "gpu_step_breakdown.png")
    shutil.rmtree(work, ignore_errors=True)
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'step_breakdown.png'}, {out / 'flops_per_component.png'} "
          f"in {results['seconds']:.0f} s")

