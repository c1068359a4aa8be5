"""Cache storage: zarr v3 and webdataset writers and readers, manifests, commit records.

The store knows shapes, dtypes, keys and checksums; nothing of models, ranks or launchers.

Writing a cache (either format) goes through one interface, :class:`CacheWriter`::

    writer = open_writer("zarr", cache_dir, variant.name)      # or "wds"
    # single process (rank 0), before any shard is written:
    writer.write_table("frames", {"key": TextColumn.encode(keys), ...})   # or a list of str
    writer.write_table("samples", {"key": [...], "window_rows": int32 [n, history + 1], "action": [...],
                                   "instruction": [...], ...})   # columns of records.SampleMeta
    writer.prepare_frames(resolution, (H, W), frames_per_shard)
    writer.prepare_samples(resolution, (N, 2C), "bfloat16", samples_per_shard)
    # any process, one writer per shard, skipping writer.committed_*_shards(resolution):
    for i, rows in enumerate(writer.frame_shard_plan(resolution)):
        writer.write_frame_shard(resolution, i, frames_uint8)                  # [len(rows), H, W, 3]
    for i, rows in enumerate(writer.sample_shard_plan(resolution)):
        writer.write_samples_shard(resolution, i, features, window_frames)     # [len(rows), N, 2C]

Every ``write_*_shard`` call writes one whole shard as one file, fsyncs it and commits it with a
checksummed record (:mod:`janus_cache.store.commit`); a shard without a valid record is rewritten
on resume. The manifest (:mod:`janus_cache.store.manifest`) is written by one process only.
Every path of a cache is named in :mod:`janus_cache.store.layout`.

Every chunk read is checked (crc32c in zarr chunks and shard indexes, crc32c per tar member, a
missing chunk file is never zarr's fill value) and every metadata file against ``checksums.json``
when a cache is opened; damage is a one-line :class:`DamagedData` naming the file
(:mod:`janus_cache.store.damage`, :mod:`janus_cache.store.checksums`).

Reading goes through :func:`open_cache` (:mod:`janus_cache.store.open`)::

    cache = open_cache(cache_dir, resolution="pad644", variant=variant.name)
    cache.manifest, cache.layout, cache.reader

which reads the manifest once and returns the reader of the cache's format for exactly that
resolution and variant: :class:`ZarrCacheReader` (random access) or :class:`WdsCacheReader`
(streaming). Both yield the same typed record, :class:`CacheSample`
(:mod:`janus_cache.store.records`). How samples are split over ranks and DataLoader workers is
decided in one place, :mod:`janus_cache.store.split`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from janus_cache.store.commit import (
    CommitRecord,
    ShardCheck,
    StoreError,
    shard_plan,
    verify_shard,
)
from janus_cache.store.damage import DamagedData, MissingChunk
from janus_cache.store.formats import FORMATS, cache_format
from janus_cache.store.layout import CacheLayout
from janus_cache.store.manifest import (
    DatasetIdentity,
    FieldDiff,
    Manifest,
    ManifestError,
    ManifestMismatch,
    ResolutionEntry,
    ShardEntry,
    ShardSizes,
    WindowVariant,
    check_compatible,
    keyed_differences,
    read_manifest,
    write_manifest,
)
from janus_cache.store.open import CacheOpenError, CacheReader, OpenedCache, load_manifest, open_cache
from janus_cache.store.records import CacheSample, SampleMeta
from janus_core.text_column import TextColumn

if TYPE_CHECKING:
    import torch

    from janus_cache.store.wds_store import WdsCacheReader, WdsCacheWriter
    from janus_cache.store.zarr_store import ColumnData, ZarrCacheReader, ZarrCacheWriter, ZarrGroup

_TORCH_MODULES: dict[str, tuple[str, ...]] = {
    "wds_store": ("WdsCacheReader", "WdsCacheWriter"),
    "zarr_store": ("ColumnData", "ZarrCacheReader", "ZarrCacheWriter", "ZarrGroup"),
}
"""The names of the modules that read and write arrays as tensors (and so import torch), imported on
first use: the manifest, layout, commit records and opening a cache load without torch."""
_MODULE_OF = {name: module for module, names in _TORCH_MODULES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # imported once
    return value


@runtime_checkable
class CacheWriter(Protocol):
    """What precompute needs from a cache format. Implemented by ZarrCacheWriter and WdsCacheWriter.

    Single-process calls: ``write_table``, ``prepare_frames``, ``prepare_samples``. Per-shard
    calls (any process, one writer per shard): ``write_frame_shard``, ``write_samples_shard``.
    Plans and commit state may be queried from any process.
    """

    format: str
    root: Path
    variant: str

    def write_table(self, table: str, columns: dict[str, ColumnData], append: bool = False) -> None:
        """(Re)write the ``frames`` or ``samples`` table (text ``key`` column; samples: ``window_rows``);
        ``append``: the stored table may be the first rows of the new one."""

    def prepare_frames(self, resolution: str, frame_shape: tuple[int, int], frames_per_shard: int,
                       grow: bool = False) -> None:
        """Create (or keep, when equal) the frames array of ``resolution``, one row per frame;
        ``grow``: extend an existing one with fewer rows (its partial last shard is rewritten)."""

    def prepare_samples(self, resolution: str, feature_shape: tuple[int, int], feature_dtype: str,
                        samples_per_shard: int, grow: bool = False) -> None:
        """Create (or keep, when equal) the per-sample storage of ``resolution``; ``grow`` as above."""

    def prepare_vit(self, resolution: str, feature_shape: tuple[int, int], dtype: str, frames_per_shard: int,
                    grow: bool = False) -> None:
        """Create (or keep, or ``grow``) ``vit/<resolution>``, the frozen ViT's output per frame row."""

    def vit_shard_plan(self, resolution: str) -> list[range]:
        """Frame rows of each ViT-features shard (those of the frame shards)."""

    def write_vit_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray) -> CommitRecord:
        """Write and commit ViT-features shard ``shard``: ``[len(rows), grid tokens, D]``."""

    def frame_shard_plan(self, resolution: str) -> list[range]:
        """Frame rows of each frame shard."""

    def sample_shard_plan(self, resolution: str) -> list[range]:
        """Sample rows of each sample shard."""

    def committed_frame_shards(self, resolution: str, verify: bool = True) -> set[int]:
        """Frame shards with a valid commit record (checksums checked with ``verify``)."""

    def committed_sample_shards(self, resolution: str, verify: bool = True) -> set[int]:
        """Sample shards with a valid commit record (checksums checked with ``verify``)."""

    def write_frame_shard(self, resolution: str, shard: int, frames: np.ndarray) -> CommitRecord:
        """Write and commit frame shard ``shard``: uint8 ``[len(rows), H, W, 3]``."""

    def write_samples_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray,
                            window_frames: np.ndarray | None = None) -> CommitRecord:
        """Write and commit sample shard ``shard``: features ``[len(rows), N, 2C]`` and, where the
        format stores them per sample (wds), the uint8 windows ``[len(rows), history + 1, H, W, 3]``
        (read back from the frames array when omitted)."""

    def frames(self, resolution: str, rows: np.ndarray | list[int] | range) -> np.ndarray:
        """Read stored frames back (precompute's feature phase reads its windows from here)."""

    def audit(self, verify: bool = True) -> list[ShardCheck]:
        """A check of every planned shard of the cache."""

    def shard_table(self, verify: bool = True) -> dict[str, tuple[ShardEntry, ...]]:
        """Per array, every planned shard and its commit state (for the manifest)."""


def open_writer(format: str, root: Path | str, variant: str) -> CacheWriter:
    """The writer of cache format ``format`` (one of :data:`FORMATS`) for the cache directory ``root``."""
    writer: type[ZarrCacheWriter | WdsCacheWriter] = cache_format(format).writer_class()
    return writer(root, variant)


__all__ = [
    "FORMATS",
    "CacheLayout",
    "CacheOpenError",
    "CacheReader",
    "CacheSample",
    "CacheWriter",
    "CommitRecord",
    "DamagedData",
    "DatasetIdentity",
    "FieldDiff",
    "Manifest",
    "ManifestError",
    "ManifestMismatch",
    "MissingChunk",
    "OpenedCache",
    "ResolutionEntry",
    "SampleMeta",
    "ShardCheck",
    "ShardEntry",
    "ShardSizes",
    "StoreError",
    "TextColumn",
    "WdsCacheReader",
    "WdsCacheWriter",
    "WindowVariant",
    "ZarrCacheReader",
    "ZarrCacheWriter",
    "ZarrGroup",
    "check_compatible",
    "keyed_differences",
    "load_manifest",
    "open_cache",
    "open_writer",
    "read_manifest",
    "shard_plan",
    "verify_shard",
    "write_manifest",
]
