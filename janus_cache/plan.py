"""`janus-cache plan`: how big a cache will be and how long it will take, measured on real samples.

A few samples spread over the dataset are decoded, compressed with the cache's own codecs and
run through the frozen encoder; sizes and times are extrapolated from those measurements.

The time is calibrated on what a precompute runs (before, it estimated 33 s for a run that
took 150 s): besides the per-frame and per-window rates (encoder timed with the compute threads
precompute gives each process, frames compressed as its writer does) it counts the run's fixed
costs, measured here too: this process's start and setup (imports, index, models), the plan's own
probe (precompute measures the same plan) and the start of the worker processes precompute spawns
(its index worker, its decode pool, torchrun's ranks).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from itertools import chain
from typing import Any

import numpy as np
import torch

from janus_cache.keys import frame_shape, stored_frame_shape
from janus_cache.store.compression import FEATURES_COMPRESSION, FRAMES_COMPRESSION
from janus_cache.store.features import to_stored
from janus_cache.work_units import encode_windows
from janus_core.bases import QWEN2_5_VL, QwenBase
from janus_core.imaging import FrameError, load_frame, load_qwen_frame
from janus_core.index import DatasetIndex
from janus_core.plural import plural
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution, grid_shape
from janus_core.system.disk_space import format_bytes
from janus_core.system.threads import PIPELINE_THREADS, usable_cores
from janus_core.vggt.encoder import WindowEncoder

TAR_BYTES_PER_MEMBER = 1024
"""A tar member's header block plus, on average, half a block of padding."""


def process_age() -> float:
    """Seconds since this process started (Linux ``/proc``; 0.0 where that cannot be read)."""
    try:
        fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()  # after the command name
        with open("/proc/uptime") as uptime:
            return max(0.0, float(uptime.read().split()[0]) - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


IMPORT_SECONDS = process_age()
"""This process's age when this module was imported (after torch and the cache code): how long a
fresh worker process that imports them takes to start, measured without starting one."""


@dataclass(frozen=True)
class Plan:
    episodes: int
    frames: int
    samples: int
    frames_per_sample: int
    frame_shape: tuple[int, int]
    feature_shape: tuple[int, int]
    probe_samples: int
    frame_bytes_raw: int
    frame_bytes: float
    feature_bytes_raw: int
    feature_bytes: float
    text_bytes_per_sample: float
    decode_seconds_per_frame: float
    encode_seconds_per_window: float
    vit_shape: tuple[int, ...] | None = None
    """Per-frame shape of the cached ViT output (``cache.vit_features``), None without it."""
    vit_bytes_raw: int = 0
    vit_bytes: float = 0.0
    vit_seconds_per_frame: float = 0.0
    store_seconds_per_frame: float = 0.0
    """Compressing a decoded frame for its shard (the writing process, after the pool decodes)."""
    setup_seconds: float = 0.0
    """This process's age when the plan started (interpreter, imports, index, models) plus the
    probe itself: what a precompute spends before its first shard."""
    worker_start_seconds: float = 0.0
    """Starting one spawned worker process (a fresh interpreter importing the decode code)."""
    compute_threads: int = 0
    """torch threads the encoder was timed with (0: not recorded)."""
    cores: int = 0
    """Cores the plan's process may run on, shared by the node's precompute processes (0: not recorded)."""
    encoder_on_cpu: bool = True
    """The encoder ran on the CPU: then the processes share the cores for it too, not a device each."""
    stored_frame_shape: tuple[int, int] | None = None
    """The stored frame's (H, W) where it is not VGGT's ``frame_shape`` (a Qwen3-VL cache)."""

    def busy_at_once(self, processes: int) -> int:
        """How many of ``processes`` processes do their per-row CPU work at once: each keeps its
        compute threads and its shard reader/writer busy, so cores bound it (measured: 2 processes
        on 2 cores took as long as one, or longer, while the estimate halved their work)."""
        if not self.cores or not self.compute_threads:
            return max(1, processes)
        return max(1, min(processes, self.cores // (self.compute_threads + PIPELINE_THREADS)))

    def worker_starts(self, processes: int, decode_workers: int) -> int:
        """Worker-process starts a precompute waits for, one after another: its index worker, its
        decode pool (workers start side by side) and, with several processes, the launcher's start
        plus about one more for the ranks' rendezvous and the launcher's teardown (measured: without
        it three 2-process runs on a 2-core machine took 1.4-1.6x the estimate)."""
        return 1 + (decode_workers > 1) + 2 * (processes > 1)

    @property
    def vit_total_bytes(self) -> float:
        """The ViT features of every frame (stored once per frame in both formats)."""
        return self.frames * self.vit_bytes

    @property
    def zarr_bytes(self) -> float:
        tables = self.samples * (self.text_bytes_per_sample + 4 * self.frames_per_sample + 16) + self.frames * 96
        return self.frames * self.frame_bytes + self.samples * self.feature_bytes + tables + self.vit_total_bytes

    @property
    def wds_bytes(self) -> float:
        """Frames repeated per sample (streaming has no random access), plus the zarr frames it is built from."""
        per_sample = (
            self.frames_per_sample * self.frame_bytes
            + self.feature_bytes
            + self.text_bytes_per_sample
            + 3 * TAR_BYTES_PER_MEMBER
        )
        return self.samples * per_sample + self.frames * self.frame_bytes + self.vit_total_bytes

    @property
    def naive_bytes(self) -> float:
        """Float32 Qwen pixel_values of every window frame plus an fp32 feature, per sample."""
        gh, gw = grid_shape(*self.frame_shape)
        pixel_values = self.frames_per_sample * gh * gw * QWEN2_5_VL.patch_dim * 4
        return self.samples * (pixel_values + self.feature_shape[0] * self.feature_shape[1] * 4)

    def needed_bytes(self, cache_format: str) -> float:
        return self.zarr_bytes if cache_format == "zarr" else self.wds_bytes

    def fixed_seconds(self, processes: int, decode_workers: int) -> float:
        """A precompute's costs that do not grow with the dataset (measured, see the module doc)."""
        return self.setup_seconds + self.worker_starts(processes, decode_workers) * self.worker_start_seconds

    def seconds(self, processes: int, decode_workers: int) -> float:
        decode = self.frames * self.decode_seconds_per_frame / max(1, processes * decode_workers)
        cpu = self.busy_at_once(processes)
        device = cpu if self.encoder_on_cpu else max(1, processes)  # one accelerator per process
        store = self.frames * self.store_seconds_per_frame / cpu
        encode = self.samples * self.encode_seconds_per_window / device
        vit = self.frames * self.vit_seconds_per_frame / device
        return self.fixed_seconds(processes, decode_workers) + decode + store + encode + vit

    def to_dict(self, processes: int = 1, decode_workers: int = 1) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            zarr_bytes=round(self.zarr_bytes),
            wds_bytes=round(self.wds_bytes),
            vit_total_bytes=round(self.vit_total_bytes),
            naive_bytes=round(self.naive_bytes),
            estimated_seconds=round(self.seconds(processes, decode_workers), 1),
            fixed_seconds=round(self.fixed_seconds(processes, decode_workers), 1),
            processes=processes,
            decode_workers=decode_workers,
        )
        return data

    def format(self, processes: int = 1, decode_workers: int = 1) -> str:
        size = format_bytes
        seconds = self.seconds(processes, decode_workers)
        stored = self.stored_frame_shape or self.frame_shape
        lines = [
            f"  episodes {self.episodes}, unique frames {self.frames}, samples {self.samples} "
            f"({plural(self.frames_per_sample, 'frame')} each)",
            f"  frame {stored[0]}x{stored[1]}: {size(self.frame_bytes_raw)} raw, "
            f"{size(self.frame_bytes)} compressed ({self.frame_bytes_raw / self.frame_bytes:.1f}x)",
            f"  feature {self.feature_shape[0]}x{self.feature_shape[1]}: {size(self.feature_bytes_raw)} raw, "
            f"{size(self.feature_bytes)} compressed ({self.feature_bytes_raw / self.feature_bytes:.2f}x)",
            *([f"  ViT features {'x'.join(map(str, self.vit_shape))} per frame: {size(self.vit_bytes_raw)} raw, "
               f"{size(self.vit_bytes)} compressed; {size(self.vit_total_bytes)} for all frames, once per frame in "
               f"both formats ({self.vit_seconds_per_frame * 1e3:.1f} ms/frame)"] if self.vit_shape else []),
            f"  zarr cache   {size(self.zarr_bytes)} (frames {size(self.frames * self.frame_bytes)}, "
            f"features {size(self.samples * self.feature_bytes)}"
            + (f", ViT features {size(self.vit_total_bytes)})" if self.vit_shape else ")"),
            f"  wds cache    {size(self.wds_bytes)} (frames repeated per sample)",
            f"  naive layout {size(self.naive_bytes)} (float pixel_values + fp32 feature per sample)",
            f"  time         ~{seconds:.0f} s with {plural(processes, 'process')} x {plural(decode_workers, 'decode worker')} "
            f"(start-up {self.fixed_seconds(processes, decode_workers):.0f} s, "
            f"decode {self.decode_seconds_per_frame * 1e3:.1f} ms/frame, "
            f"encode {self.encode_seconds_per_window * 1e3:.1f} ms/window"
            + (f" with {plural(self.compute_threads, 'thread')}" if self.compute_threads else "")
            + f"; measured on {plural(self.probe_samples, 'sample')})",
        ]
        return "\n".join(lines)


def probe_rows(n_samples: int, probe: int) -> list[int]:
    """``probe`` sample rows spread evenly over the dataset (deterministic)."""
    if n_samples == 0:
        return []
    return sorted({int(r) for r in np.linspace(0, n_samples - 1, min(probe, n_samples))})


def _decodable_probe(
    index: DatasetIndex, resolution: Resolution, probe: int
) -> tuple[list[int], dict[int, np.ndarray], float]:
    """Up to ``probe`` sample rows whose window frames all decode, their frames and seconds per frame.

    A source that fails to decode is precompute's business (it records the sample as failed); the
    plan measures other samples instead, the evenly spread ones first.
    """
    n_samples = len(index.samples)
    spread = probe_rows(n_samples, probe)
    chosen = set(spread)
    candidates = chain(spread, (r for r in range(n_samples) if r not in chosen))
    decoded: dict[int, np.ndarray | None] = {}
    first_failure = ""
    rows: list[int] = []
    seconds = 0.0
    for row in candidates:
        for frame_row in index.samples[row].window_rows:
            if frame_row not in decoded:
                start = time.perf_counter()
                try:
                    decoded[frame_row] = load_frame(index.frames[frame_row].path, resolution)
                except (FrameError, OSError) as err:
                    decoded[frame_row] = None
                    first_failure = first_failure or str(err)
                seconds += time.perf_counter() - start
        if all(decoded[r] is not None for r in index.samples[row].window_rows):
            rows.append(row)
            if len(rows) == probe:
                break
    if not rows:
        raise ValueError(f"{index.source}: no sample has a window whose frames all decode ({first_failure})")
    frames = {r: f for r, f in decoded.items() if f is not None}
    return sorted(rows), frames, seconds / len(decoded)


def make_plan(
    index: DatasetIndex, encoder: WindowEncoder, resolution: Resolution, batch: int, probe: int = 4,
    vit: ViTEncoder | None = None, base: QwenBase = QWEN2_5_VL,
) -> Plan:
    """Measure ``probe`` samples of ``index`` and extrapolate to the whole dataset; with ``vit`` (the
    profile sets ``cache.vit_features``) the frozen ViT's per-frame output too. The encoder runs
    with the caller's torch threads (set them as precompute does: :mod:`janus_core.system.threads`).
    ``base``: whose frames the cache stores (a Qwen3-VL frame holds the VGGT frame's patches at
    16 px: its bytes are estimated from VGGT's frame by the area)."""
    started = time.perf_counter()
    age = process_age()
    shape = frame_shape(index, resolution)
    stored_shape = stored_frame_shape(shape, base)
    area = stored_shape[0] * stored_shape[1] / (shape[0] * shape[1])
    feature_shape = encoder.feature_shape(*shape)
    if not index.samples:
        raise ValueError(f"{index.source}: the dataset has no samples to plan for")
    rows, decoded, decode_seconds = _decodable_probe(index, resolution, probe)
    window_rows = np.array([index.samples[r].window_rows for r in rows], dtype=np.int64)
    start = time.perf_counter()
    frame_bytes = area * float(np.mean([len(FRAMES_COMPRESSION.encode(f)) for f in decoded.values()]))
    store_seconds = (time.perf_counter() - start) / len(decoded)

    windows = np.stack([np.stack([decoded[int(r)] for r in w]) for w in window_rows])
    encode_windows(encoder, windows[:1], 1)  # warm-up: first calls allocate and pick kernels
    start = time.perf_counter()
    features = encode_windows(encoder, windows, batch)
    encode_seconds = (time.perf_counter() - start) / len(windows)
    stored = [to_stored(f, encoder.feature_dtype_name) for f in features]
    feature_bytes = float(np.mean([len(FEATURES_COMPRESSION.encode(s)) for s in stored]))

    vit_measured: dict[str, Any] = {}
    if vit is not None:
        # One window (the ViT's batch shape) of the frames it runs on: the stored ones.
        probe_frames = torch.from_numpy(windows[0] if stored_shape == shape else np.stack(
            [load_qwen_frame(index.frames[int(r)].path, resolution, base) for r in window_rows[0]]))
        vit.encode(probe_frames[:1])  # warm-up
        start = time.perf_counter()
        vit_out = vit.encode(probe_frames)
        vit_stored = [to_stored(f, vit.stored_dtype) for f in vit_out]
        vit_measured = dict(
            vit_shape=vit.feature_shape(*stored_shape), vit_bytes_raw=vit_stored[0].nbytes,
            vit_seconds_per_frame=(time.perf_counter() - start) / len(probe_frames),
            vit_bytes=float(np.mean([len(FEATURES_COMPRESSION.encode(v)) for v in vit_stored])))

    texts = [index.samples[r] for r in rows]
    text_bytes = float(
        np.mean(
            [
                len((s.key + s.instruction + s.subinstruction + s.description_2d + s.description_3d).encode())
                for s in texts
            ]
        )
    )
    return Plan(
        episodes=len(index.episodes),
        frames=len(index.frames),
        samples=len(index.samples),
        frames_per_sample=index.history + 1,
        frame_shape=shape,
        stored_frame_shape=None if stored_shape == shape else stored_shape,
        feature_shape=feature_shape,
        probe_samples=len(rows),
        frame_bytes_raw=stored_shape[0] * stored_shape[1] * 3,
        frame_bytes=frame_bytes,
        feature_bytes_raw=stored[0].nbytes,
        feature_bytes=feature_bytes,
        text_bytes_per_sample=text_bytes,
        decode_seconds_per_frame=decode_seconds,
        encode_seconds_per_window=encode_seconds,
        store_seconds_per_frame=store_seconds,
        setup_seconds=age + time.perf_counter() - started,
        worker_start_seconds=IMPORT_SECONDS,
        compute_threads=torch.get_num_threads(),
        cores=usable_cores(),
        encoder_on_cpu=encoder.device.type == "cpu",
        **vit_measured,
    )
