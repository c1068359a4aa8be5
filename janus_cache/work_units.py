"""Stage 1 work units: what a cache should hold, and the computation of one shard.

Plain single-process code. The job that runs these units in order and owns the cache's contract
(refusals, free space, final manifest, report) is :mod:`janus_cache.job`; which
process runs which shard, barriers and progress across processes live in
``pipelines/precompute_run.py``. Every unit here is a pure function of the index, the profile and
the shard number, so any split of the shards over processes gives the same cache.

Order of work (per resolution):

1. tables: the frames table (every indexed frame) is written first;
2. frames phase: each frame shard decodes its source images (worker processes) and is written
   and committed; frames that fail to decode are recorded next to the shard before its commit;
   with ``cache.vit_features``, each frame shard's frozen-ViT output is then computed from the
   stored frames and committed as the same rows of ``vit/<resolution>`` (once per frame);
3. the samples table: every indexed sample whose window frames all decoded;
4. features phase: each sample shard reads its windows back from the frames just written (so the
   stored pixels and the stored features come from the same bytes), runs the frozen encoder in
   batches and is written and committed, reading the next shard while this one computes and
   writing the previous one in the background.

For a base whose frame is not VGGT's (Qwen3-VL, :mod:`janus_cache.keys`), the frames phase stores
the base's frames (:func:`~janus_core.imaging.load_qwen_frame`) and the features phase decodes
each window's VGGT frames from the same source files (:func:`~janus_core.imaging.load_frame`, the
deterministic decode of the frames phase), as VGGT's frame cannot be made from the stored one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import compress
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import numpy as np
import torch

from janus_cache.keys import frame_shape, stored_frame_shape
from janus_cache.store import CacheWriter, TextColumn
from janus_cache.store.layout import KEY_COLUMN, WINDOW_ROWS_COLUMN, CacheLayout
from janus_cache.store.records import ACTION_COLUMN, EPISODE_COLUMN, SOURCE_COLUMN, TEXT_COLUMNS
from janus_core.bases import BASES, DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase
from janus_core.imaging import FrameError, load_frame, load_qwen_frame
from janus_core.index import ACTION_IDS, DatasetIndex, Frame
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution
from janus_core.system.files import atomic_write_bytes
from janus_core.vggt.encoder import WindowEncoder

# ------------------------------------------------------------------------------------ tables


def frame_table(index: DatasetIndex) -> dict[str, Any]:
    """The frames table of ``index``. Built from the index's columns, text straight into its stored
    form (repeated texts as codes): a stored index answers without making 612k frame objects or
    lists of strings."""
    numbers = index.int_column("frames", "index")
    return {
        "key": TextColumn.encode(f"{episode}/{number}" for episode, number
                                 in zip(index.iter_text("frames", "episode_id"), numbers.tolist(), strict=True)),
        "episode_id": TextColumn.encode_repeated(index.iter_text("frames", "episode_id")),
        "frame_index": numbers.astype(np.int32),
        "source": TextColumn.encode(index.iter_text("frames", "relpath")),
        "source_width": index.int_column("frames", "width").astype(np.int32),
        "source_height": index.int_column("frames", "height").astype(np.int32),
        "source_sha256": TextColumn.encode(sha or "" for sha in index.iter_text("frames", "sha256")),
    }


def window_matrix(index: DatasetIndex) -> np.ndarray:
    """Window rows of every sample, [samples, history + 1] (after :func:`check_windows`)."""
    windows = index.int_column("samples", WINDOW_ROWS_COLUMN)
    return windows.reshape(len(index.samples), index.history + 1)


def sample_table(index: DatasetIndex, rows: np.ndarray | None = None) -> dict[str, Any]:
    """The samples table of ``index``'s samples at ``rows`` (default: all; increasing), in row
    order; text straight into its stored form, as in :func:`frame_table`."""
    keep = None
    if rows is not None:
        keep = np.zeros(len(index.samples), dtype=bool)
        keep[rows] = True

    def pick(name: str) -> Iterator[Any]:
        values = index.iter_text("samples", name)
        return values if keep is None else compress(values, keep.tolist())

    window_rows = window_matrix(index)
    return {
        KEY_COLUMN: TextColumn.encode(pick("key")),
        EPISODE_COLUMN: TextColumn.encode_repeated(pick("episode_id")),
        SOURCE_COLUMN: TextColumn.encode_repeated(pick("source")),
        "step": index.int_column("samples", "step")[rows if rows is not None else slice(None)].astype(np.int32),
        WINDOW_ROWS_COLUMN: (window_rows if rows is None else window_rows[rows]).astype(np.int32),
        ACTION_COLUMN: np.fromiter((ACTION_IDS[a] for a in pick("action")), dtype=np.int8),
        # The sample record's text columns are the index's Sample fields of the same names.
        **{name: TextColumn.encode_repeated(pick(name)) for name in TEXT_COLUMNS},
    }


def check_windows(index: DatasetIndex) -> None:
    """Every sample needs history + 1 frames: the cache stores windows as a rectangular array."""
    try:
        windows = index.int_column("samples", WINDOW_ROWS_COLUMN)
        if len(windows) == 0 or (windows.ndim == 2 and windows.shape[1] == index.history + 1):
            return
    except ValueError:  # windows of several lengths: named below
        pass
    for sample in index.samples:
        if len(sample.window_rows) != index.history + 1:
            raise ValueError(
                f"{index.source}: sample {sample.key} has {len(sample.window_rows)} images; "
                f"the cache needs exactly history + 1 = {index.history + 1}"
            )


# ------------------------------------------------------------------------------ frames phase


@dataclass(frozen=True)
class FrameJob:
    """One source image to turn into a stored frame (picklable for worker processes)."""

    row: int
    path: str
    resolution: str
    shape: tuple[int, int]
    base: str = DEFAULT_BASE.model_type
    """``model_type`` of the base whose frame is made (VGGT's own for Qwen2.5-VL)."""


def decode_frame(job: FrameJob) -> tuple[int, np.ndarray | None, str | None]:
    """(row, uint8 frame, None) or (row, None, reason): a bad image never stops the shard."""
    try:
        frame = load_qwen_frame(job.path, Resolution.parse(job.resolution), BASES[job.base])
    except (FrameError, OSError) as err:
        return job.row, None, str(err)
    if frame.shape[:2] != job.shape:
        return job.row, None, f"{job.path}: frame is {frame.shape[:2]} at {job.resolution}, the cache holds {job.shape}"
    return job.row, frame, None


def failures_path(root: Path, resolution: str, shard: int) -> Path:
    return CacheLayout(root).frame_failures(resolution, shard)


def read_frame_failures(root: Path, resolution: str) -> dict[int, str]:
    """Frame row -> reason, for every committed frame shard that had failures."""
    failures: dict[int, str] = {}
    directory = CacheLayout(root).frame_failures_dir(resolution)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        failures.update({int(row): reason for row, reason in json.loads(path.read_text()).items()})
    return failures


def compute_frame_shard(
    frames: Sequence[Frame], rows: range, resolution: Resolution, shape: tuple[int, int], pool: Pool | None,
    base: QwenBase = DEFAULT_BASE,
) -> tuple[np.ndarray, dict[int, str]]:
    """Decode the ``base``'s frames of ``rows`` (``shape``: their (H, W)): uint8 [len(rows), H, W, 3]
    and {row: reason} of failures."""
    jobs = [FrameJob(r, str(frames[r].path), resolution.name, shape, base.model_type) for r in rows]
    results = pool.map(decode_frame, jobs, chunksize=4) if pool is not None else map(decode_frame, jobs)
    out = np.zeros((len(rows), *shape, 3), dtype=np.uint8)  # a failed frame's row is never referenced
    failures: dict[int, str] = {}
    for row, frame, reason in results:
        if frame is None:
            failures[row] = reason or "unknown error"
        else:
            out[row - rows.start] = frame
    return out, failures


def write_frame_shard(
    writer: CacheWriter, index: DatasetIndex, resolution: Resolution, shard: int, pool: Pool | None,
    base: QwenBase = DEFAULT_BASE,
) -> dict[int, str]:
    """Decode, write and commit one frame shard of ``base``'s frames; returns its failures
    (recorded before the commit)."""
    rows = writer.frame_shard_plan(resolution.name)[shard]
    shape = stored_frame_shape(frame_shape(index, resolution), base)
    frames, failures = compute_frame_shard(index.frames, rows, resolution, shape, pool, base)
    path = failures_path(writer.root, resolution.name, shard)
    if failures:
        atomic_write_bytes(path, json.dumps({str(r): m for r, m in sorted(failures.items())}, indent=1).encode())
    else:
        path.unlink(missing_ok=True)
    writer.write_frame_shard(resolution.name, shard, frames)
    return failures


def usable_samples(index: DatasetIndex, failed_frames: Iterable[int]) -> tuple[np.ndarray, dict[str, str]]:
    """Rows of the samples whose window frames all decoded, and {sample key: reason} for the others."""
    windows = window_matrix(index)
    bad = np.isin(windows, np.fromiter(set(failed_frames), dtype=np.int64))
    dropped: dict[str, str] = {}
    for row in np.flatnonzero(bad.any(axis=1)).tolist():
        first = int(windows[row][bad[row]][0])
        dropped[index.samples[row].key] = f"window frame {index.frames[first].relpath} could not be decoded"
    return np.flatnonzero(~bad.any(axis=1)), dropped


# ------------------------------------------------------------------------------ ViT phase


def write_vit_shard(writer: CacheWriter, vit: ViTEncoder, resolution: str, shard: int) -> None:
    """Compute and commit one ViT-features shard from the frames stored for its rows (so cached ViT
    features and stored frames come from the same bytes). A frame that failed to decode is a zero
    frame no sample refers to; its row is computed like the others."""
    rows = writer.vit_shard_plan(resolution)[shard]
    frames = writer.frames(resolution, rows)
    writer.write_vit_shard(resolution, shard, vit.encode(torch.from_numpy(frames)))


# ---------------------------------------------------------------------------- features phase


def read_windows(writer: CacheWriter, resolution: str, window_rows: np.ndarray) -> np.ndarray:
    """uint8 windows [n, S, H, W, 3] for window rows [n, S], each distinct frame read once."""
    unique, inverse = np.unique(window_rows, return_inverse=True)
    frames = writer.frames(resolution, unique)
    return frames[inverse.reshape(window_rows.shape)]


FrameSource = Callable[[np.ndarray], np.ndarray]
"""``frames(rows)``: uint8 frames [len(rows), H, W, 3] of frame rows ``rows``."""


def vggt_frame_source(index: DatasetIndex, resolution: Resolution, base: QwenBase) -> FrameSource | None:
    """Where the features phase gets VGGT's frames: None when they are the stored frames (a base
    with VGGT's patches), else a decode of the rows' source files at ``resolution``. A file that
    decoded in the frames phase and no longer does was changed or removed meanwhile: an error
    naming it (the samples using it were kept, so the features cannot be left out)."""
    if base.patch_size == VGGT_PATCH_SIZE:
        return None

    def frames(rows: np.ndarray) -> np.ndarray:
        out = []
        for row in rows.tolist():
            path = index.frames[row].path
            try:
                out.append(load_frame(path, resolution))
            except (FrameError, OSError) as err:
                raise FrameError(f"{path} decoded when its {base.name} frame was stored but not now ({err}); "
                                 "restore it, or rebuild the cache with --overwrite") from None
        return np.stack(out) if out else np.zeros((0, *frame_shape(index, resolution), 3), np.uint8)

    return frames


def read_vggt_windows(frames: FrameSource, window_rows: np.ndarray) -> np.ndarray:
    """VGGT's uint8 windows [n, S, H, W, 3] for window rows [n, S], each distinct frame made once."""
    unique, inverse = np.unique(window_rows, return_inverse=True)
    return frames(unique)[inverse.reshape(window_rows.shape)]


def encode_windows(encoder: WindowEncoder, windows: np.ndarray, batch: int) -> torch.Tensor:
    """Features [n, N, 2C] of windows [n, S, H, W, 3], ``batch`` windows per encoder call."""
    parts = [encoder.encode(torch.from_numpy(windows[i : i + batch])) for i in range(0, len(windows), batch)]
    return torch.cat(parts)


def write_feature_shards(
    writer: CacheWriter,
    encoder: WindowEncoder,
    resolution: str,
    shards: Sequence[int],
    window_rows: np.ndarray,
    batch: int,
    on_done: Callable[[int, int], None] = lambda shard, n: None,
    vggt_frames: FrameSource | None = None,
) -> None:
    """Compute and commit the given sample shards, overlapping reads and writes with compute.
    ``vggt_frames``: VGGT's frames when they are not the stored ones (:func:`vggt_frame_source`)."""
    plan = writer.sample_shard_plan(resolution)

    def load(shard: int) -> tuple[np.ndarray, np.ndarray]:
        rows = window_rows[plan[shard].start : plan[shard].stop]
        stored = read_windows(writer, resolution, rows)
        return stored, stored if vggt_frames is None else read_vggt_windows(vggt_frames, rows)

    # ``on_done`` runs in this thread once a write is committed (never in the saver's: a progress
    # callback that stops the run, e.g. on a lost lock, must raise here).
    with ThreadPoolExecutor(max_workers=1) as reader, ThreadPoolExecutor(max_workers=1) as saver:
        pending: tuple[Future[Any], int, int] | None = None  # the write in flight, its shard and samples
        next_windows = reader.submit(load, shards[0]) if shards else None
        for position, shard in enumerate(shards):
            assert next_windows is not None
            windows, encoded = next_windows.result()  # the stored frames (written with wds), VGGT's
            if position + 1 < len(shards):
                next_windows = reader.submit(load, shards[position + 1])
            features = encode_windows(encoder, encoded, batch)
            if pending is not None:
                pending[0].result()  # surfaces a failed write before more work piles up
                on_done(pending[1], pending[2])
            pending = (saver.submit(writer.write_samples_shard, resolution, shard, features, windows), shard,
                       len(windows))
        if pending is not None:
            pending[0].result()
            on_done(pending[1], pending[2])

