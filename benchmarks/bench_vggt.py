"""Throughput of the frozen VGGT aggregator on 9-frame windows (the precompute encode path).

CPU: the tiny profile's aggregator (configs/models/tiny-vggt.json) at a small resolution,
2 threads. CUDA (when available): the VGGT-1B architecture with random weights at 644×644 in
bf16 autocast for B = 1, 2, 4 windows per call, with achieved TFLOP/s from the analytic cost.

    python benchmarks/bench_vggt.py [--cpu-size 224] [--repeats 10] [--compile] [--skip-cuda]

Prints a table and writes bench/out/vggt.json.
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

from janus_cache.vggt import AggregatorConfig, VGGTAggregator, window_flops

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "configs" / "models" / "tiny-vggt.json"
OUT = REPO / "bench" / "out" / "vggt.json"
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


def bench_cpu(size: int, repeats: int) -> list[Row]:
    torch.set_num_threads(CPU_THREADS)
    torch.manual_seed(0)
    model = VGGTAggregator.from_config(AggregatorConfig.from_dict(json.loads(TINY_CONFIG.read_text())))
    return bench("tiny", model, model.window_features, size, CPU_BATCHES, repeats)


def bench_cuda(repeats: int, compile_model: bool) -> list[Row]:
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = VGGTAggregator()  # VGGT-1B architecture, random weights
    encode = torch.compile(model.window_features) if compile_model else model.window_features
    name = "vggt-1b" + ("+compile" if compile_model else "")
    return bench(name, model, encode, CUDA_SIZE, CUDA_BATCHES, repeats)


def print_table(rows: list[Row]) -> None:
    header = f"{'device':6} {'model':16} {'size':>9} {'B':>2} {'s/call':>9} {'win/s':>9} {'peak MiB':>9} {'TFLOP/win':>10} {'TFLOP/s':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.device:6} {r.model:16} {f'{r.height}x{r.width}':>9} {r.batch:>2} {r.seconds_per_call:9.4f} "
            f"{r.windows_per_s:9.2f} {r.peak_memory_mib:9.1f} {r.tflop_per_window:10.4f} {r.tflop_per_s:9.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-size", type=int, default=224, help="square CPU input size (multiple of 14)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per row (after 2 warm-up calls)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the CUDA encode path")
    parser.add_argument("--skip-cuda", action="store_true", help="only run the CPU part")
    args = parser.parse_args()

    rows = bench_cpu(args.cpu_size, args.repeats)
    cuda = torch.cuda.is_available() and not args.skip_cuda
    if cuda:
        rows += bench_cuda(args.repeats, args.compile)
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
        "compiled": bool(cuda and args.compile),
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
