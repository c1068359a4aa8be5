"""zarr v3 cache format: frames once per frame row, one feature per sample, tables; sharded, committed.

Layout of a cache directory (one zarr v3 group; ``<variant>`` is ``WindowVariant.name``; every
path is named in :mod:`janus_cache.store.layout`):

``frames/<resolution>``
    uint8 ``[n_frames, H, W, 3]``; one chunk per frame, ``frames_per_shard`` frames per shard.
``vggt/<variant>/<resolution>``
    ``[n_samples, N, 2C]`` features; one chunk per sample, ``samples_per_shard`` per shard.
    bf16 is stored as its uint16 bits; attribute ``logical_dtype`` says which (see
    :mod:`janus_cache.store.features`).
``vit/<resolution>`` (optional, ``cache.vit_features``)
    ``[n_frames, grid tokens, D]``: the frozen Qwen ViT's output per frame, sharded like the frames
    (both formats keep it here, once per frame; see :mod:`janus_core.qwen_vit`).
``tables/frames/<column>``, ``tables/samples/<column>``
    The frame and sample tables, row-aligned with the arrays above. Required columns: ``key``
    (str) in both, ``window_rows`` (int ``[n_samples, history + 1]``, rows of ``frames/*``) in
    samples, and for reading, the columns of :class:`janus_cache.store.records.SampleMeta`; any
    other numeric or text column is stored as given and comes back in the meta's ``extra``.
``commits/...``
    One commit record per shard (:mod:`janus_cache.store.commit`).

The frames and tables (the zarr group both formats share) are :mod:`janus_cache.store.zarr_group`
and :mod:`janus_cache.store.zarr_group_writer`; this module adds the features.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from janus_cache.store.commit import CommitRecord, ShardCheck, StoreError
from janus_cache.store.compression import FEATURES_COMPRESSION
from janus_cache.store.damage import DamagedData
from janus_cache.store.features import from_stored, stored_dtype, to_stored
from janus_cache.store.layout import SAMPLES_TABLE, ZARR_ROOT_NAME, features_array, frames_array, vit_array
from janus_cache.store.records import CacheSample, SampleMeta
from janus_cache.store.zarr_group import ColumnData, PlannedShard, ZarrGroup, _check_name
from janus_cache.store.zarr_group_writer import VariantWriter, ZarrGroupWriter, _row_spec

__all__ = ["ColumnData", "PlannedShard", "VariantWriter", "ZarrCacheReader", "ZarrCacheWriter", "ZarrGroup",
           "ZarrGroupWriter"]


class ZarrCacheWriter(VariantWriter):
    """Writes a zarr cache for the window variant named ``variant``: frames, tables, features.

    Implements :class:`janus_cache.store.CacheWriter`.
    """

    format = "zarr"

    def samples_array_path(self, resolution: str) -> str:
        return features_array(self.variant, resolution)

    def prepare_samples(self, resolution: str, feature_shape: tuple[int, int], feature_dtype: str,
                        samples_per_shard: int, grow: bool = False) -> None:
        """Create ``vggt/<variant>/<resolution>`` with one row per sample of the samples table
        (``grow``: an existing one with fewer rows is extended, as ``prepare_frames`` does)."""
        _check_name("resolution", resolution)
        n_samples = self._sample_rows_checked()
        shape = (n_samples, *(int(x) for x in feature_shape))
        spec = _row_spec(shape, stored_dtype(feature_dtype), 1, samples_per_shard, FEATURES_COMPRESSION,
                         {"logical_dtype": feature_dtype, "resolution": resolution, "variant": self.variant})
        self._prepare_array(self.samples_array_path(resolution), spec, grow)

    def sample_shard_plan(self, resolution: str) -> list[range]:
        return self.array_shard_plan(self.samples_array_path(resolution))

    def committed_sample_shards(self, resolution: str, verify: bool = True) -> set[int]:
        return self.committed_shards(self.samples_array_path(resolution), verify)

    def write_feature_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray) -> CommitRecord:
        """Write feature shard ``shard``: ``[rows in shard, N, 2C]`` of the cache's feature dtype."""
        path = self.samples_array_path(resolution)
        logical = str(self._array(path).attrs["logical_dtype"])
        return self._write_shard(path, shard, to_stored(features, logical))

    def write_samples_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray,
                            window_frames: np.ndarray | None = None) -> CommitRecord:
        """The format-independent call: zarr stores frames once per frame row (``write_frame_shard``),
        so only the features are written here; ``window_frames`` is accepted and ignored."""
        return self.write_feature_shard(resolution, shard, features)


class ZarrCacheReader(ZarrGroup):
    """Random access to one resolution and window variant of a zarr cache; ``reader[row]`` is the
    :class:`~janus_cache.store.records.CacheSample` of sample row ``row``.

    The reader reads exactly the ``resolution`` and ``variant`` it is given; open it through
    :func:`janus_cache.store.open_cache`, which checks them against the cache's manifest.
    """

    format = "zarr"

    def __init__(self, root: Path | str, resolution: str, variant: str, vit_features: bool = False) -> None:
        super().__init__(root, read_only=True)
        if not (self.root / ZARR_ROOT_NAME).is_file():
            raise StoreError(f"{self.root} is not a zarr cache (no {ZARR_ROOT_NAME})")
        _check_name("resolution", resolution)
        _check_name("variant", variant)
        self.resolution, self.variant = resolution, variant
        self.frames_array = frames_array(resolution)
        self.features_array = features_array(variant, resolution)
        self.vit_array = vit_array(resolution) if vit_features else None
        for array in (self.frames_array, self.features_array, *([self.vit_array] if self.vit_array else [])):
            if not self.has_array(array):
                raise StoreError(f"cache {self.root} has no array {array!r}")

    def feature(self, row: int) -> torch.Tensor:
        """Feature ``[N, 2C]`` of sample row ``row`` in its logical dtype (bf16 viewed from uint16)."""
        array = self._array(self.features_array)
        if not 0 <= row < array.shape[0]:
            raise IndexError(f"sample row {row} out of range for {array.shape[0]} samples in {self.root}")
        return from_stored(self.read_rows(self.features_array, row, row + 1)[0], str(array.attrs["logical_dtype"]))

    def sample_shard_plan(self) -> list[range]:
        """Sample rows of each feature shard."""
        return self.array_shard_plan(self.features_array)

    def check(self, verify: bool = True) -> list[ShardCheck]:
        """One check per planned shard of this resolution's frames and this variant's features."""
        vit = self.check_array(self.vit_array, verify) if self.vit_array else []
        return self.check_array(self.frames_array, verify) + vit + self.check_array(self.features_array, verify)

    def __len__(self) -> int:
        return self.table_rows(SAMPLES_TABLE)

    def sample(self, row: int) -> CacheSample:
        """Sample row ``row``; every chunk it reads is checked, damage is a :class:`DamagedData`
        naming the file and the sample (its row when the key itself is unreadable)."""
        try:
            key, values = self.sample_meta_row(row)
        except DamagedData as err:
            raise err.for_sample(f"row {row}") from None
        try:
            meta = SampleMeta.from_row(values, f"sample row {row} of {self.root}")
            return CacheSample(
                key=key,
                row=row,
                frames=self.frames(self.resolution, meta.window_rows),
                feature=self.feature(row),
                meta=meta,
                vit_features=self.vit_features(self.resolution, meta.window_rows) if self.vit_array else None,
            )
        except DamagedData as err:
            raise err.for_sample(key) from None

    def __getitem__(self, row: int) -> CacheSample:
        return self.sample(row)
