"""The reader stage: cache samples -> token ids, labels, uint8 frames and the VGGT feature.

Three sources yield the same item dict ``{"key", "prompt", "frames", "features"}``:

* :class:`CachedSamples`: map-style over a zarr cache (random access, O(1) resume);
* :class:`StreamedSamples`: iterable over a webdataset cache's tar shards (streaming);
* :class:`LiveSamples`: decodes the source images and has no feature (the model runs VGGT
  itself): the reference path the cache replaces, used for the live baseline and checks.

Workers do no image processing on the cached paths: ``pixel_values`` are built from the uint8
frames on the training device by the model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from janus_cache.index import ACTIONS, DatasetIndex
from janus_cache.imaging import load_frame
from janus_cache.resolution import Resolution
from janus_cache.store import WdsCacheReader, ZarrCacheReader
from janus_train.prompt import EncodedPrompt, PromptBuilder

Item = dict[str, Any]


def _prompt(builder: PromptBuilder, key: str, meta: dict[str, Any], n_images: int) -> EncodedPrompt:
    action = meta["action"]
    return builder.build(
        meta["instruction"],
        meta["subinstruction"],
        meta["description_2d"],
        meta["description_3d"],
        ACTIONS[int(action)] if not isinstance(action, str) else action,
        n_images=n_images,
        key=key,
    )


def _item(builder: PromptBuilder, sample: dict[str, Any]) -> Item:
    frames = torch.from_numpy(np.ascontiguousarray(sample["frames"]))
    return {
        "key": sample["key"],
        "prompt": _prompt(builder, sample["key"], sample["meta"], frames.shape[0]),
        "frames": frames,
        "features": sample["feature"],
    }


class CachedSamples(Dataset[Item]):
    """Samples of a zarr cache, by sample row."""

    def __init__(self, cache: Path | str, builder: PromptBuilder, resolution: str | None = None,
                 variant: str | None = None) -> None:
        self.reader = ZarrCacheReader(cache, resolution=resolution, variant=variant)
        self.builder = builder

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, row: int) -> Item:
        return _item(self.builder, self.reader.sample(int(row)))


class StreamedSamples(IterableDataset[Item]):
    """Samples of a webdataset cache; shards are split over ranks, then over loader workers."""

    def __init__(self, cache: Path | str, builder: PromptBuilder, rank: int = 0, world: int = 1,
                 resolution: str | None = None, variant: str | None = None) -> None:
        self.reader = WdsCacheReader(cache, resolution=resolution, variant=variant)
        self.builder = builder
        self.rank, self.world = rank, world

    def __len__(self) -> int:
        return len(self.reader)

    def shards_of_this_worker(self) -> list[int]:
        n_shards = len(self.reader.shard_paths())
        mine = list(range(self.rank, n_shards, self.world))
        info = get_worker_info()
        return mine if info is None else mine[info.id :: info.num_workers]

    def __iter__(self) -> Iterator[Item]:
        shards = self.shards_of_this_worker()
        if not shards:
            return
        for sample in self.reader.dataset(shards):
            yield _item(self.builder, sample)


class LiveSamples(Dataset[Item]):
    """Samples decoded from the source images, as the reference training does (no feature)."""

    def __init__(self, index: DatasetIndex, builder: PromptBuilder, resolution: Resolution) -> None:
        self.index, self.builder, self.resolution = index, builder, resolution

    def __len__(self) -> int:
        return len(self.index.samples)

    def __getitem__(self, row: int) -> Item:
        sample = self.index.samples[int(row)]
        frames = np.stack([load_frame(self.index.frames[r].path, self.resolution) for r in sample.window_rows])
        return {
            "key": sample.key,
            "prompt": self.builder.build_sample(sample),
            "frames": torch.from_numpy(frames),
            "features": None,
        }


def collate(items: Sequence[Item], pad_token_id: int) -> dict[str, Any]:
    """A micro-batch: padded prompt tensors, frames [B, S, H, W, 3] uint8, features [B, N, 2C] or None."""
    from janus_train.prompt import collate_prompts

    batch: dict[str, Any] = collate_prompts([item["prompt"] for item in items], pad_token_id)
    batch["keys"] = [item["key"] for item in items]
    batch["frames"] = torch.stack([item["frames"] for item in items])
    features = [item["features"] for item in items]
    batch["features"] = None if any(f is None for f in features) else torch.stack(features)
    return batch


class EpochSampler(Sampler[int]):
    """This rank's sample rows of one epoch: a seeded permutation, split over ranks, from ``start``.

    The permutation depends only on (seed, epoch), so resuming at position ``start`` continues
    with the next unseen sample at once, without iterating over the ones already trained on.
    Positions count micro-batch samples of this rank; the tail that does not fill a sample for
    every rank is dropped so that all ranks take the same number of steps.
    """

    def __init__(self, n_samples: int, rank: int, world: int, seed: int, epoch: int, start: int = 0) -> None:
        self.n_samples, self.rank, self.world = n_samples, rank, world
        self.seed, self.epoch, self.start = seed, epoch, start

    def rows(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.n_samples, generator=generator).tolist()
        per_rank = self.n_samples // self.world
        return order[self.rank * per_rank : (self.rank + 1) * per_rank]

    def __len__(self) -> int:
        return max(0, self.n_samples // self.world - self.start)

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows()[self.start :])
