"""The reader stage: cache samples -> token ids, labels, uint8 frames and the VGGT feature.

Three sources yield the same :class:`TrainItem`:

* :class:`CachedSamples`: map-style over a zarr cache's reader (random access, O(1) resume);
* :class:`StreamedSamples`: iterable over a webdataset cache's reader (streaming);
* :class:`LiveSamples`: decodes the source images and has no feature (the model runs VGGT
  itself): the reference path the cache replaces, used for the live baseline and checks. Like
  precompute it makes each frame as the base sees it and, for a base whose patches are not VGGT's
  (Qwen3-VL), VGGT's own frame of the same source too (:class:`LiveFrames`).

The cached sources take the reader of a cache opened with :func:`janus_cache.store.open_cache`
(so they read exactly the profile's resolution and window variant). How data is split over
ranks and loader workers is decided in :mod:`janus_cache.store.split` only.

Workers do no image processing on the cached paths: ``pixel_values`` are built from the uint8
frames on the training device by the model.

Damaged cache data (a chunk or tar member failing its checksum, a missing shard file) never
reaches the model: the cached sources return a :class:`DamagedItem` in the sample's place instead
of raising, so the one-line :class:`~janus_cache.store.DamagedData` crosses DataLoader workers as a
value (a worker's exception would arrive as a traceback text); :func:`collate` sets those aside
under ``"damaged"`` and the trainer stops or skips them (``train.damaged_samples``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from janus_cache.store import CacheSample, DamagedData, WdsCacheReader, ZarrCacheReader
from janus_core.bases import DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase
from janus_core.imaging import load_frame, load_qwen_frame
from janus_core.index import DatasetIndex
from janus_core.resolution import Resolution
from janus_train.data.damaged import StalledItem
from janus_train.data.prompt import EncodedPrompt, PromptBuilder, PromptFields
from janus_train.data.rope import RopeIndex


@dataclass(frozen=True)
class TrainItem:
    """One training sample: its key, encoded prompt, uint8 frames ``[S, H, W, 3]`` and the cached
    feature ``[N, 2C]`` (None on the live path, where the model computes it)."""

    key: str
    prompt: EncodedPrompt
    frames: torch.Tensor
    features: torch.Tensor | None
    vit_features: torch.Tensor | None = None
    """The frames' cached ViT output ``[S, T, D]`` (a DeepStack base's ``[S, levels, T, D]``; ``cache.vit_features``);
    None: the model runs the ViT."""
    vggt_frames: torch.Tensor | None = None
    """Live only, for a base whose frames are not VGGT's: VGGT's uint8 frames ``[S, h, w, 3]`` of the
    same sources, which the model's VGGT runs on; None: VGGT runs on ``frames``."""


@dataclass(frozen=True)
class DamagedItem:
    """A sample (or, for a tar shard that cannot be read on, ``error.samples`` samples) whose stored
    data failed its check: what the cached sources return in its place."""

    error: DamagedData

    @property
    def key(self) -> str:
        return self.error.key or self.error.file


def cached_item(builder: PromptBuilder, sample: CacheSample) -> TrainItem:
    """The training item of a cached sample (the cache's typed record, straight into the prompt)."""
    frames = torch.from_numpy(np.ascontiguousarray(sample.frames))
    prompt = builder.build(PromptFields.of(sample.meta), n_images=frames.shape[0], key=sample.key)
    return TrainItem(key=sample.key, prompt=prompt, frames=frames, features=sample.feature,
                     vit_features=sample.vit_features)


class CachedSamples(Dataset[TrainItem]):
    """Samples of a zarr cache, by sample row; the DataLoader gives each worker its rows."""

    def __init__(self, reader: ZarrCacheReader, builder: PromptBuilder) -> None:
        self.reader = reader
        self.builder = builder

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, row: int) -> TrainItem | DamagedItem:
        try:
            sample = self.reader.sample(int(row))
        except DamagedData as err:
            return DamagedItem(err)
        return cached_item(self.builder, sample)


class StreamedSamples(IterableDataset[TrainItem]):
    """Samples of a webdataset cache for rank ``rank`` of ``world``; the reader's pipeline splits
    the shards over ranks and loader workers (once, in :mod:`janus_cache.store.split`). ``rows``:
    only these sample rows (e.g. the episodes not held out for validation); None: all of them."""

    def __init__(self, reader: WdsCacheReader, builder: PromptBuilder, rank: int = 0, world: int = 1,
                 rows: AbstractSet[int] | None = None) -> None:
        self.reader = reader
        self.builder = builder
        self.rank, self.world = rank, world
        self.rows = None if rows is None else frozenset(rows)

    def __len__(self) -> int:
        return len(self.reader) if self.rows is None else len(self.rows)

    def rank_rows(self, rank: int) -> list[int]:
        """The rows rank ``rank`` (of this stream's world) reads, without reading them."""
        return self.reader.rank_rows(rank, self.world, self.rows)

    def __iter__(self) -> Iterator[TrainItem | DamagedItem]:
        for sample in self.reader.dataset(self.rank, self.world, damaged="yield", rows=self.rows):
            yield DamagedItem(sample) if isinstance(sample, DamagedData) else cached_item(self.builder, sample)


@dataclass(frozen=True)
class LiveFrames:
    """A window's frames made from its source images exactly as precompute makes them: the base's
    frames (:func:`~janus_core.imaging.load_qwen_frame`, what a cache stores) and, for a base whose
    patches are not VGGT's, VGGT's frames at ``resolution`` (:func:`~janus_core.imaging.load_frame`,
    what the features come from; each source is decoded once per model). ``resolution`` is VGGT's
    (the profile's ``cache.resolution``)."""

    resolution: Resolution
    base: QwenBase = DEFAULT_BASE

    @property
    def separate(self) -> bool:
        """Whether VGGT's frames differ from the base's (and must be made and carried apart)."""
        return self.base.patch_size != VGGT_PATCH_SIZE

    def base_frames(self, paths: Sequence[Any]) -> np.ndarray:
        return np.stack([load_qwen_frame(path, self.resolution, self.base) for path in paths])

    def vggt_frames(self, paths: Sequence[Any]) -> np.ndarray:
        return np.stack([load_frame(path, self.resolution) for path in paths])


class LiveSamples(Dataset[TrainItem]):
    """Samples decoded from the source images, as the reference training does (no feature)."""

    def __init__(self, index: DatasetIndex, builder: PromptBuilder, resolution: Resolution,
                 base: QwenBase = DEFAULT_BASE) -> None:
        self.index, self.builder = index, builder
        self.frames = LiveFrames(resolution, base)

    def __len__(self) -> int:
        return len(self.index.samples)

    def __getitem__(self, row: int) -> TrainItem:
        sample = self.index.samples[int(row)]
        paths = [self.index.frames[r].path for r in sample.window_rows]
        vggt = torch.from_numpy(self.frames.vggt_frames(paths)) if self.frames.separate else None
        return TrainItem(key=sample.key, prompt=self.builder.build_sample(sample),
                         frames=torch.from_numpy(self.frames.base_frames(paths)), features=None, vggt_frames=vggt)


def collate(items: Sequence[TrainItem | DamagedItem], pad_token_id: int, rope: RopeIndex | None = None) -> dict[str, Any]:
    """A micro-batch: padded prompt tensors, frames [B, S, H, W, 3] uint8, features [B, N, 2C] or None,
    vit_features [B, S, T, D] (DeepStack: [B, S, levels, T, D]) or None, VGGT's own frames ``vggt_frames`` [B, S, h, w, 3] where the
    items carry them (live, Qwen3-VL); with ``rope``, the M-RoPE ``position_ids`` [3, B, L] too
    (built here, in the loader worker, not in the training process's forward).

    Damaged items are left out; their errors are listed under ``"damaged"`` (only when there are
    any: a micro-batch of damaged items only is ``{"damaged": [...]}``), those of items whose read
    stalled (:class:`~janus_train.data.damaged.StalledItem`) under ``"stalled"``."""
    from janus_train.data.prompt import collate_prompts

    damaged = [item.error for item in items if isinstance(item, DamagedItem)]
    stalled = [item.error for item in items if isinstance(item, StalledItem)]
    items = [item for item in items if not isinstance(item, (DamagedItem, StalledItem))]
    if not items:
        return {"damaged": damaged} | ({"stalled": stalled} if stalled else {})
    batch: dict[str, Any] = collate_prompts([item.prompt for item in items], pad_token_id)
    batch["keys"] = [item.key for item in items]
    batch["frames"] = torch.stack([item.frames for item in items])
    features = [item.features for item in items]
    batch["features"] = None if any(f is None for f in features) else torch.stack(features)
    vit = [item.vit_features for item in items]
    batch["vit_features"] = None if any(v is None for v in vit) else torch.stack(vit)
    vggt = [item.vggt_frames for item in items]
    if not any(v is None for v in vggt):  # live samples of a base whose frames are not VGGT's
        batch["vggt_frames"] = torch.stack(vggt)
    if rope is not None:
        _, images, height, width, _ = batch["frames"].shape
        batch["position_ids"] = rope(batch["input_ids"], batch["mm_token_type_ids"], batch["attention_mask"],
                                     rope.patch_grid(height, width), images)
    if damaged:
        batch["damaged"] = damaged
    if stalled:
        batch["stalled"] = stalled
    return batch

