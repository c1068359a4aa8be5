"""The one place that splits a cache's data over ranks and DataLoader workers (both formats).

Ranks and workers are plain arguments here (the library knows no launcher): whoever starts the
ranks passes ``rank`` and ``world``; the worker is the current DataLoader worker process.

* **webdataset** (streaming): tar shards are dealt round-robin to ranks, then each rank's shards
  round-robin to its loader workers (:func:`shards_for`). :func:`rank_and_worker_splitter` is that
  split as a webdataset pipeline stage; the reader builds its pipeline with it and with neither
  of webdataset's own splitters, so shards are split exactly once.
* **zarr** (random access): an epoch is a seeded permutation of the sample rows dealt
  round-robin to ranks (:func:`epoch_rows`); the DataLoader hands a rank's rows to its workers
  itself (a map-style dataset is indexed, never split again).

Either way every sample is read exactly once per epoch across all ranks and workers; ranks'
shares differ by at most one shard (webdataset) or one sample (zarr).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

import torch
from torch.utils.data import get_worker_info

T = TypeVar("T")

_EPOCH_SEED_STRIDE = 100_003
"""Mixes seed and epoch into one generator seed (a prime, so nearby (seed, epoch) pairs differ)."""


def _check_slot(what: str, index: int, count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"the number of {what}s must be a positive int, got {count!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"{what} must be an int in [0, {count}), got {index!r}")


def share(items: Sequence[T], index: int, count: int, what: str = "rank") -> list[T]:
    """Items ``index, index + count, ...``: participant ``index`` of ``count``'s round-robin share."""
    _check_slot(what, index, count)
    return list(items[index::count])


def current_worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of this DataLoader worker; ``(0, 1)`` outside a worker."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def shards_for(n_shards: int, rank: int, world: int, worker: int = 0, workers: int = 1) -> list[int]:
    """Shard indices read by loader worker ``worker`` (of ``workers``) of rank ``rank`` (of ``world``)."""
    return share(share(range(n_shards), rank, world, "rank"), worker, workers, "worker")


def rank_and_worker_splitter(src: Iterable[T], rank: int, world: int) -> Iterator[T]:
    """webdataset shard-list stage: this rank's share of the shards, then this worker's share of it."""
    worker, workers = current_worker()
    yield from share(share(list(src), rank, world, "rank"), worker, workers, "worker")


def epoch_order(n_samples: int, seed: int, epoch: int) -> list[int]:
    """The epoch's permutation of sample rows; depends only on (seed, epoch), so a resume can
    start at any position in it directly."""
    generator = torch.Generator().manual_seed(seed * _EPOCH_SEED_STRIDE + epoch)
    return torch.randperm(n_samples, generator=generator).tolist()


def epoch_rows(n_samples: int, rank: int, world: int, seed: int, epoch: int) -> list[int]:
    """Rank ``rank``'s sample rows of an epoch, in order: its round-robin share of the permutation."""
    return share(epoch_order(n_samples, seed, epoch), rank, world, "rank")
