"""Throughput of the frozen VGGT aggregator on 9-frame windows (the precompute encode path).

CPU: the tiny profile's aggregator (configs/models/tiny-vggt.json) at a small resolution,
2 threads. CUDA (when available): the VGGT-1B architecture with random weights at 644×644 in
bf16 autocast for B = 1, 2, 4 windows per call, with achieved TFLOP/s from the analytic cost.

Then each speed lever on its own (janus_core.vggt.encoder.lever_settings): the encoder on uint8
windows of consecutive samples of one 64-frame episode (B = 4, the frame sharing of a real
precompute batch), today's path (no dedup, PyTorch's SDPA dispatch, eager) against dedup alone,
each attention kernel alone, compile alone, and all levers together. TFLOP/s there counts a whole
window's FLOPs (dedup skips some of them). The CPU runs the compile row only with --compile
(compiling takes minutes there).

    python benchmarks/bench_vggt.py [--cpu-size 224] [--repeats 10] [--compile] [--skip-cuda | --skip-cpu]

Prints a table and writes benchmarks/results/vggt.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from benchmarks.measure import RESULTS_DIR
from janus_core.vggt import AggregatorConfig, VGGTAggregator, window_flops
from janus_core.vggt.attention import BENCH_KERNELS
from janus_core.vggt.encoder import (
    LEVER_BATCH,
    LEVER_EPISODE_FRAMES,
    LEVER_FIRST_STEPS,
    WindowEncoder,
    distinct_frames,
    lever_batches,
    lever_settings,
)

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "configs" / "models" / "tiny-vggt.json"
OUT = RESULTS_DIR / "vggt.json"
FRAMES = 9  # 8 history frames + the current one
LAYER = -2  # the layer JanusVLN consumes
CPU_THREADS = 2
CPU_BATCHES = (1, 2)
CUDA_SIZE = 644
CUDA_BATCHES = (1, 2, 4)


@dataclass
class Row:
    device: str
    model: str
    height: int
    width: int
    batch: int
    seconds_per_call: float
    windows_per_s: float
    peak_memory_mib: float
    peak_memory_kind: str
    tflop_per_window: float
    tflop_per_s: float
    lever: str = ""
    kernel: str = ""
    distinct_frames_per_window: float | None = None
    error: str = ""


class Memory:
    """Per-row peak memory: the CUDA allocator's peak, or the process's peak RSS on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.kind = "cuda max_memory_allocated" if self.cuda else "process peak RSS (VmHWM)"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            return
        # Linux resets VmHWM to the current RSS when "5" is written to clear_refs.
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            self.kind = "process peak RSS since start (ru_maxrss)"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def peak_mib(self) -> float:
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(
    name: str,
    model: VGGTAggregator,
    encode: Callable[..., torch.Tensor],
    size: int,
    batches: tuple[int, ...],
    repeats: int,
) -> list[Row]:
    """Time ``encode(windows, layer=LAYER)`` on random 9-frame windows for each batch size."""
    device = next(model.parameters()).device
    memory = Memory(device)
    flop = window_flops(model.config, size, size, FRAMES, last_layer=LAYER)
    rows = []
    for batch in batches:
        windows = torch.rand(batch, FRAMES, 3, size, size, device=device)
        memory.reset()
        for _ in range(2):  # warm-up: allocator, kernel selection, compilation
            encode(windows, layer=LAYER)
        memory.sync()
        start = time.perf_counter()
        for _ in range(repeats):
            encode(windows, layer=LAYER)
        memory.sync()
        seconds = (time.perf_counter() - start) / repeats
        rows.append(
            Row(
                device=device.type,
                model=name,
                height=size,
                width=size,
                batch=batch,
                seconds_per_call=seconds,
                windows_per_s=batch / seconds,
                peak_memory_mib=memory.peak_mib(),
                peak_memory_kind=memory.kind,
                tflop_per_window=flop / 1e12,
                tflop_per_s=flop * batch / seconds / 1e12,
            )
        )
    return rows


def bench_levers(name: str, model: VGGTAggregator, size: int, kernels: tuple[str, ...], repeats: int,
                 with_compile: bool = True) -> list[Row]:
    """Windows/s of the encoder on overlapping uint8 windows, for each lever on its own."""
    device = next(model.parameters()).device
    memory = Memory(device)
    flop = window_flops(model.config, size, size, FRAMES, last_layer=LAYER)
    batches = lever_batches(size)
    distinct = sum(len(distinct_frames(w)[0]) for w in batches) / (LEVER_BATCH * len(batches))
    windows = LEVER_BATCH * len(batches)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    encoder = WindowEncoder(model, "last", LAYER, dtype)
    rows = []
    for lever, levers in lever_settings(kernels).items():
        if levers.compile and not with_compile:
            continue
        row = Row(device.type, name, size, size, LEVER_BATCH, 0.0, 0.0, 0.0, memory.kind, flop / 1e12, 0.0, lever=lever,
                  distinct_frames_per_window=distinct if levers.dedup else float(FRAMES))
        try:
            run = levers.apply(encoder)
            row.kernel = model.attention_kernel(device).describe()
            memory.reset()
            # Warm-up: kernel choice and compilation; the batches differ in distinct frames, so one
            # pass over them also makes the recompile with dynamic sizes.
            for w in batches:
                run.encode(w)
            memory.sync()
            start = time.perf_counter()
            for _ in range(repeats):
                for w in batches:
                    run.encode(w)
            memory.sync()
            seconds = time.perf_counter() - start
        except (RuntimeError, ValueError) as exc:  # a kernel that does not run here, out of memory
            row.error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            rows.append(row)
            continue
        finally:
            model.use_attention_kernel(None)
            model.fuse(False)
        row.seconds_per_call = seconds / (repeats * len(batches))
        row.windows_per_s = windows * repeats / seconds
        row.tflop_per_s = flop * row.windows_per_s / 1e12
        row.peak_memory_mib = memory.peak_mib()
        rows.append(row)
    return rows


def bench_cpu(size: int, repeats: int, compile_model: bool) -> list[Row]:
    torch.set_num_threads(CPU_THREADS)
    torch.manual_seed(0)
    model = VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(TINY_CONFIG.read_text())))
    rows = bench("tiny", model, model.window_features, size, CPU_BATCHES, repeats)
    for row in rows:
        row.kernel = model.attention_kernel(torch.device("cpu")).describe()
    return rows + bench_levers("tiny", model, size, BENCH_KERNELS["cpu"], max(1, repeats // 5), compile_model)


def bench_cuda(repeats: int) -> list[Row]:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = VGGTAggregator()  # VGGT-1B architecture, random weights
    rows = bench("vggt-1b", model, model.window_features, CUDA_SIZE, CUDA_BATCHES, repeats)
    for row in rows:
        row.kernel = model.attention_kernel(torch.device("cuda", torch.cuda.current_device())).describe()
    return rows + bench_levers("vggt-1b", model, CUDA_SIZE, BENCH_KERNELS["cuda"], max(1, repeats // 4))


def print_table(rows: list[Row]) -> None:
    header = (f"{'device':6} {'model':8} {'lever':20} {'size':>9} {'B':>2} {'frames/win':>10} {'s/call':>9} "
              f"{'win/s':>9} {'peak MiB':>9} {'TFLOP/win':>10} {'TFLOP/s':>9}  kernel")
    print(header)
    print("-" * len(header))
    for r in rows:
        frames = f"{r.distinct_frames_per_window:10.2f}" if r.distinct_frames_per_window is not None else f"{'':>10}"
        measured = (f"{r.seconds_per_call:9.4f} {r.windows_per_s:9.2f} {r.peak_memory_mib:9.1f} "
                    f"{r.tflop_per_window:10.4f} {r.tflop_per_s:9.3f}  {r.kernel}")
        print(f"{r.device:6} {r.model:8} {r.lever or 'random windows':20} {f'{r.height}x{r.width}':>9} {r.batch:>2} "
              f"{frames} " + (f"error: {r.error}" if r.error else measured))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-size", type=int, default=224, help="square CPU input size (multiple of 14)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per row (after 2 warm-up calls)")
    parser.add_argument("--compile", action="store_true", help="also the compile row on the CPU (minutes)")
    parser.add_argument("--skip-cuda", action="store_true", help="only run the CPU part")
    parser.add_argument("--skip-cpu", action="store_true", help="only run the CUDA part (a short GPU session)")
    args = parser.parse_args()

    rows = [] if args.skip_cpu else bench_cpu(args.cpu_size, args.repeats, args.compile)
    cuda = torch.cuda.is_available() and not args.skip_cuda
    if cuda:
        rows += bench_cuda(args.repeats)
    print_table(rows)
    vggt1b = AggregatorConfig()
    report = {
        "benchmark": "vggt_window_features",
        "frames": FRAMES,
        "layer": LAYER,
        "reference_frame": "first",
        "cpu_threads": CPU_THREADS,
        "cuda_available": torch.cuda.is_available(),
        "cuda_device": torch.cuda.get_device_name() if cuda else None,
        "cuda_autocast": "bfloat16" if cuda else None,
        "levers": {"batch": LEVER_BATCH, "episode_frames": LEVER_EPISODE_FRAMES, "first_steps": LEVER_FIRST_STEPS},
        "vggt1b_644_tflop_per_window": {
            "causal_all_layers": window_flops(vggt1b, CUDA_SIZE, CUDA_SIZE, FRAMES) / 1e12,
            "causal_to_layer_-2": window_flops(vggt1b, CUDA_SIZE, CUDA_SIZE, FRAMES, last_layer=LAYER) / 1e12,
            "full_all_layers": window_flops(vggt1b, CUDA_SIZE, CUDA_SIZE, FRAMES, attention="full") / 1e12,
        },
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rows": [asdict(r) for r in rows],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
