"""Benchmark the frame and pixel path on this machine.

* ``load_frame``: frames/s from 640x480 episode PNGs written by ``janus_core.sample_data``
  (decode + VGGT pad644 resize + pad).
* Qwen2.5-VL pixel values at 644x644: our lookup-table path versus transformers' Qwen2-VL image
  processor on the same frames (called as JanusVLN calls it: the [0, 1] float tensor with
  rescaling off, min_pixels = max_pixels = 644*644; and on the uint8 frame with default
  rescaling). Outputs are checked to be bit-identical before timing.
* ``vggt_input``: frames/s for the k/255 float tensor.

Run: ``python benchmarks/bench_imaging.py`` (prints a table, writes benchmarks/results/imaging.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from benchmarks.measure import RESULTS_DIR
from janus_core.imaging import load_frame, qwen_pixel_values, vggt_input
from janus_core.resolution import DEFAULT_RESOLUTION
from janus_core.sample_data import write_sample_data


def rate(fn: Callable[[], object], items: int, min_seconds: float) -> tuple[float, float]:
    """(best, median) items per second of ``fn``, which handles ``items`` items per call.

    Calls repeat for at least ``min_seconds`` (and 5 calls) after one warm-up call. The best call
    is the figure least disturbed by other processes on a shared machine; the median is kept too.
    """
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return items / min(times), items / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=9, help="frames per measurement (9 = one JanusVLN window)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--min-seconds", type=float, default=2.0, help="minimum time per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "imaging.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, resolution = args.frames, DEFAULT_RESOLUTION
    side = resolution.target

    with tempfile.TemporaryDirectory() as tmp:
        # Real 640x480 episode PNGs from the project's sample-data generator.
        root = write_sample_data(Path(tmp) / "data", episodes=1, steps=n, seed=0)
        paths = sorted(root.glob("*/step_*.png"))
        png_kib = sum(p.stat().st_size for p in paths) / n / 1024

        def decode_only() -> None:
            for path in paths:
                with Image.open(path) as img:
                    img.convert("RGB")

        decode_fps = rate(decode_only, n, args.min_seconds)
        load_fps = rate(lambda: [load_frame(p, resolution) for p in paths], n, args.min_seconds)
        frames_np = np.stack([load_frame(p, resolution) for p in paths])

    frames = torch.from_numpy(frames_np)
    processor = Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side)

    def processor_float_path() -> torch.Tensor:
        # JanusVLN: one [1, 3, H, W] tensor in [0, 1] per image, rescaling off.
        live = frames.permute(0, 3, 1, 2).float().div(255)
        outs = [processor(live[i : i + 1], do_rescale=False, return_tensors="pt")["pixel_values"] for i in range(n)]
        return torch.cat(outs)

    def processor_uint8_path() -> torch.Tensor:
        return processor(list(frames_np), return_tensors="pt")["pixel_values"]

    ours = qwen_pixel_values(frames)[0]
    identical = bool(torch.equal(ours, processor_float_path()) and torch.equal(ours, processor_uint8_path()))

    lut_batch_fps = rate(lambda: qwen_pixel_values(frames), n, args.min_seconds)
    lut_single_fps = rate(lambda: [qwen_pixel_values(frames[i : i + 1]) for i in range(n)], n, args.min_seconds)
    proc_float_fps = rate(processor_float_path, n, args.min_seconds)
    proc_uint8_fps = rate(processor_uint8_path, n, args.min_seconds)
    vggt_fps = rate(lambda: vggt_input(frames), n, args.min_seconds)

    rows = [
        ("png decode only (PIL, 640x480)", decode_fps),
        (f"load_frame {resolution.name} from PNG", load_fps),
        (f"qwen_pixel_values LUT, batch of {n}", lut_batch_fps),
        ("qwen_pixel_values LUT, one frame per call", lut_single_fps),
        ("transformers processor, float [0,1] input (JanusVLN)", proc_float_fps),
        ("transformers processor, uint8 input", proc_uint8_fps),
        (f"vggt_input, batch of {n}", vggt_fps),
    ]
    # Speed-ups from the best calls of each side (least disturbed by other load).
    speedup_float = lut_batch_fps[0] / proc_float_fps[0]
    speedup_uint8 = lut_batch_fps[0] / proc_uint8_fps[0]

    print(
        f"imaging benchmark: {n} frames, {side}x{side}, torch threads {args.threads}, "
        f"{os.cpu_count()} CPUs, mean PNG {png_kib:.0f} KiB"
    )
    print(f"{'measurement':<56}{'best f/s':>10}{'median f/s':>12}")
    for name, (best, median) in rows:
        print(f"{name:<56}{best:>10.1f}{median:>12.1f}")
    print(
        f"LUT pixel_values speed-up vs processor (best calls): {speedup_float:.1f}x (float input, JanusVLN), "
        f"{speedup_uint8:.1f}x (uint8 input); outputs bit-identical: {identical}"
    )

    report = {
        "benchmark": "imaging",
        "resolution": resolution.name,
        "frames": n,
        "torch_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "mean_png_kib": round(png_kib, 1),
        "frames_per_s_best": {name: round(best, 2) for name, (best, _) in rows},
        "frames_per_s_median": {name: round(median, 2) for name, (_, median) in rows},
        "speedup_lut_vs_processor_float_input": round(speedup_float, 2),
        "speedup_lut_vs_processor_uint8_input": round(speedup_uint8, 2),
        "bit_identical": identical,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "pillow": PIL.__version__,
            "numpy": np.__version__,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
