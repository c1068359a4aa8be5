"""Benchmark the cache store: compression of frames and features, bytes per sample, throughput.

Frames are the sample dataset's rendered 640x480 PNG episodes (``janus_core.sample_data``)
loaded at each resolution with ``janus_core.imaging.load_frame``; windows and texts come from
the real index (``janus_core.index.build_index``). Features:

* ``pad224``: the tiny profile's aggregator (``configs/models/tiny-vggt.json``, seeded random
  weights) run on the real windows: bf16 ``[256, 128]``;
* ``pad644``: VGGT-1B-shaped bf16 ``[2116, 2048]`` drawn from N(0, 1) (no checkpoint here);
  random mantissas make this close to the worst case for feature compression.

Measured:

1. blosc-zstd on single frames and single features: shuffle filter x level -> ratio, encode and
   decode MB/s (one core of blosc per ``--threads``);
2. both cache formats written through the store's writers: stored bytes per sample (frames,
   features, tables) and compression ratios, against the naive layout (float32 Qwen
   ``pixel_values`` of every window frame plus an fp32 feature, saved per sample);
3. write time, zarr random-access reads (samples/s) and webdataset streaming (samples/s).

Run: ``python benchmarks/bench_store.py`` (prints tables, writes benchmarks/results/store.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch

from benchmarks.measure import RESULTS_DIR
from janus_cache.store import (
    FORMATS,
    WdsCacheReader,
    WindowVariant,
    ZarrCacheReader,
    open_writer,
)
from janus_cache.store.compression import (
    FEATURES_COMPRESSION,
    FRAMES_COMPRESSION,
    Compression,
)
from janus_core.bases import QWEN2_5_VL
from janus_core.imaging import load_frame, vggt_input
from janus_core.index import ACTIONS, build_index
from janus_core.resolution import Resolution
from janus_core.sample_data import write_sample_data
from janus_core.vggt import VGGTAggregator

TINY_VGGT = Path(__file__).resolve().parent.parent / "configs" / "models" / "tiny-vggt.json"
FRAMES_PER_SHARD = 16
SAMPLES_PER_SHARD = 8


def codec_table(items: np.ndarray) -> list[dict[str, object]]:
    """blosc-zstd on each item (frame or feature) as zarr stores them: one chunk per item."""
    rows = []
    for shuffle in ("noshuffle", "shuffle", "bitshuffle"):
        for clevel in (1, 3, 5):
            codec = Compression("zstd", clevel, shuffle)  # type: ignore[arg-type]
            t0 = time.perf_counter()
            encoded = [codec.encode(item) for item in items]
            t_enc = time.perf_counter() - t0
            t0 = time.perf_counter()
            for e in encoded:
                numcodecs.blosc.decompress(e)
            t_dec = time.perf_counter() - t0
            stored = sum(len(e) for e in encoded)
            rows.append({
                "shuffle": shuffle, "clevel": clevel, "ratio": items.nbytes / stored,
                "encode_MBps": items.nbytes / t_enc / 1e6, "decode_MBps": items.nbytes / t_dec / 1e6,
            })
    return rows


def tiny_features(frames: np.ndarray, window_rows: np.ndarray, variant: WindowVariant) -> torch.Tensor:
    config = json.loads(TINY_VGGT.read_text())
    torch.manual_seed(0)
    model = VGGTAggregator.from_config(config).eval()
    out = []
    for rows in window_rows:
        images = vggt_input(frames[rows]).unsqueeze(0)
        out.append(model.window_features(images, variant.reference_frame, variant.layer)[0])
    return torch.stack(out).to(torch.bfloat16)


def dir_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--resolutions", default="pad224,pad644")
    parser.add_argument("--threads", type=int, default=2, help="torch and blosc threads")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "store.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numcodecs.blosc.set_nthreads(args.threads)

    work = Path(tempfile.mkdtemp(prefix="bench_store_"))
    results: dict[str, object] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "threads": args.threads},
        "defaults": {"frames": FRAMES_COMPRESSION.to_dict(), "features": FEATURES_COMPRESSION.to_dict()},
        "resolutions": {},
    }
    try:
        data = write_sample_data(work / "data", episodes=args.episodes, steps=args.steps, seed=0)
        index = build_index(data)
        variant = WindowVariant(history=index.history, sampling="linspace", reference_frame="first", layer=-2,
                                attention="causal")
        window_rows = np.asarray([s.window_rows for s in index.samples], dtype=np.int32)
        samples = {
            "key": [s.key for s in index.samples],
            "window_rows": window_rows,
            "action": np.asarray([ACTIONS.index(s.action) for s in index.samples], dtype=np.int8),
            "instruction": [s.instruction for s in index.samples],
            "subinstruction": [s.subinstruction for s in index.samples],
            "description_2d": [s.description_2d for s in index.samples],
            "description_3d": [s.description_3d for s in index.samples],
        }
        frames_table = {"key": [f.key for f in index.frames], "relpath": [f.relpath for f in index.frames]}
        n_samples = len(index.samples)
        print(f"sample data: {len(index.episodes)} episodes, {len(index.frames)} frames, {n_samples} samples, "
              f"{variant.frames} frames per window")

        for name in args.resolutions.split(","):
            resolution = Resolution.parse(name)
            t0 = time.perf_counter()
            frames = np.stack([load_frame(f.path, resolution) for f in index.frames])
            load_s = time.perf_counter() - t0
            height, width = frames.shape[1:3]
            if name == "pad224":
                features, feature_source = tiny_features(frames, window_rows, variant), "tiny VGGT (seeded random)"
            else:
                grid = resolution.patch_grid()
                generator = torch.Generator().manual_seed(0)
                features = torch.randn(n_samples, grid[0] * grid[1], 2048, generator=generator).to(torch.bfloat16)
                feature_source = "N(0,1) bf16, VGGT-1B shape"
            entry: dict[str, object] = {
                "frame_shape": [int(height), int(width), 3], "feature_shape": list(features.shape[1:]),
                "feature_source": feature_source, "frames_per_s_load": len(frames) / load_s,
                "frame_codecs": codec_table(frames[:16]),
                "feature_codecs": codec_table(features[:8].view(torch.int16).numpy().view(np.uint16)),
            }
            raw_frame = frames[0].nbytes
            raw_feature = features[0].numel() * 2
            naive = variant.frames * height * width * 3 * QWEN2_5_VL.temporal_patch * 4 + features[0].numel() * 4
            for fmt in FORMATS:
                root = work / f"cache_{fmt}_{name}"
                writer = open_writer(fmt, root, variant.name)
                t0 = time.perf_counter()
                writer.write_table("frames", frames_table)
                writer.write_table("samples", samples)
                writer.prepare_frames(name, (height, width), FRAMES_PER_SHARD)
                writer.prepare_samples(name, tuple(features.shape[1:]), "bfloat16", SAMPLES_PER_SHARD)
                for i, rows in enumerate(writer.frame_shard_plan(name)):
                    writer.write_frame_shard(name, i, frames[rows.start:rows.stop])
                t_frames = time.perf_counter() - t0
                t0 = time.perf_counter()
                for i, rows in enumerate(writer.sample_shard_plan(name)):
                    writer.write_samples_shard(name, i, features[rows.start:rows.stop],
                                               frames[window_rows[rows.start:rows.stop]])
                t_samples = time.perf_counter() - t0
                frames_bytes = dir_bytes(root / "frames" / name)
                tables_bytes = dir_bytes(root / "tables")
                if fmt == "zarr":
                    feature_bytes = dir_bytes(root / "vggt")
                    total = frames_bytes + feature_bytes + tables_bytes
                    reader = ZarrCacheReader(root, name, variant.name)
                    order = np.random.default_rng(0).permutation(n_samples)
                    t0 = time.perf_counter()
                    for row in order:
                        reader[int(row)]
                    read_rate = n_samples / (time.perf_counter() - t0)
                    extra = {"frames_bytes": frames_bytes, "feature_bytes": feature_bytes,
                             "frames_ratio": frames.nbytes / frames_bytes,
                             "feature_ratio": features.numel() * 2 / feature_bytes,
                             "random_read_samples_per_s": read_rate}
                else:
                    tar_bytes = dir_bytes(root / "wds", "*.tar")
                    total = tar_bytes
                    t0 = time.perf_counter()
                    count = sum(1 for _ in WdsCacheReader(root, name, variant.name))
                    read_rate = count / (time.perf_counter() - t0)
                    extra = {"tar_bytes": tar_bytes, "stream_samples_per_s": read_rate,
                             "zarr_frames_and_tables_bytes": frames_bytes + tables_bytes,
                             "sample_ratio": (variant.frames * raw_frame + raw_feature) * n_samples / tar_bytes}
                entry[fmt] = {
                    "bytes_per_sample": total / n_samples, "naive_bytes_per_sample": naive,
                    "vs_naive": naive * n_samples / total, "tables_bytes": tables_bytes,
                    "write_frames_s": t_frames, "write_samples_s": t_samples, **extra,
                }
            results["resolutions"][name] = entry  # type: ignore[index]
            print_resolution(name, entry, n_samples)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")


def print_resolution(name: str, entry: dict[str, object], n_samples: int) -> None:
    print(f"\n== {name}: frame {entry['frame_shape']}, feature {entry['feature_shape']} ({entry['feature_source']})")
    for what in ("frame", "feature"):
        print(f"blosc-zstd per {what:<8} shuffle     level  ratio  enc MB/s  dec MB/s")
        for row in entry[f"{what}_codecs"]:  # type: ignore[union-attr]
            print(f"                        {row['shuffle']:<11} {row['clevel']:>5}  {row['ratio']:5.2f}  "
                  f"{row['encode_MBps']:8.0f}  {row['decode_MBps']:8.0f}")
    z, w = entry["zarr"], entry["wds"]  # type: ignore[index]
    print("format  bytes/sample   naive/sample   x smaller  write s (frames+samples)  read samples/s")
    print(f"zarr    {z['bytes_per_sample']:12,.0f}   {z['naive_bytes_per_sample']:12,.0f}   {z['vs_naive']:9.1f}  "
          f"{z['write_frames_s']:8.2f} + {z['write_samples_s']:6.2f}        {z['random_read_samples_per_s']:8.1f} (random)")
    print(f"wds     {w['bytes_per_sample']:12,.0f}   {w['naive_bytes_per_sample']:12,.0f}   {w['vs_naive']:9.1f}  "
          f"{w['write_frames_s']:8.2f} + {w['write_samples_s']:6.2f}        {w['stream_samples_per_s']:8.1f} (stream)")
    print(f"zarr compression: frames x{z['frames_ratio']:.2f}, features x{z['feature_ratio']:.3f}; "
          f"wds samples x{w['sample_ratio']:.2f}; tables {z['tables_bytes']:,} B for {n_samples} samples")


if __name__ == "__main__":
    main()
