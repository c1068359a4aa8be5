"""The one place that splits a cache's data over ranks and DataLoader workers (both formats).

Ranks and workers are plain arguments here (the library knows no launcher): whoever starts the
ranks passes ``rank`` and ``world``; the worker is the current DataLoader worker process.

* **webdataset** (streaming): tar shards are dealt round-robin to ranks, then each rank's shards
  round-robin to its loader workers (:func:`shards_for`). :func:`rank_and_worker_splitter` is that
  split as a webdataset pipeline stage; the reader builds its pipeline with it and with neither
  of webdataset's own splitters, so shards are split exactly once.
* **zarr** (random access): an epoch is a seeded permutation of the sample rows, one global
  sequence for all ranks; rank ``r`` of ``world`` reads its items ``G + r, G + r + world, ...``
  from the global offset ``G`` on (:func:`epoch_order`, :func:`rank_share_from`); the DataLoader
  hands a rank's rows to its workers itself (a map-style dataset is indexed, never split again).
  Because the position is a global offset into a sequence that does not depend on the world, a
  run resumed on another number of ranks continues the same sequence (elastic resume).

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
_STREAM_SEED_STRIDE = 1_000_000_007
"""Separates the permutations of independent streams (e.g. the caches of a mixture) of one seed and
epoch; stream 0 is the plain epoch permutation."""


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


def rank_and_worker_share(shards: Sequence[T], rank: int, world: int, worker: int = 0, workers: int = 1) -> list[T]:
    """The shards (of the list ``shards``) read by loader worker ``worker`` (of ``workers``) of rank
    ``rank`` (of ``world``): the rank's round-robin share, then the worker's share of that."""
    return share(share(shards, rank, world, "rank"), worker, workers, "worker")


def shards_for(n_shards: int, rank: int, world: int, worker: int = 0, workers: int = 1) -> list[int]:
    """Shard indices read by loader worker ``worker`` (of ``workers``) of rank ``rank`` (of ``world``)."""
    return rank_and_worker_share(range(n_shards), rank, world, worker, workers)


def rank_and_worker_splitter(src: Iterable[T], rank: int, world: int) -> Iterator[T]:
    """webdataset shard-list stage: this rank's share of the shards, then this worker's share of it."""
    yield from rank_and_worker_share(list(src), rank, world, *current_worker())


def epoch_order(n_samples: int, seed: int, epoch: int, stream: int = 0) -> list[int]:
    """The epoch's permutation of sample rows; depends only on (seed, epoch, stream), never on the
    number of ranks, so a resume (on any world) can start at any position in it directly.
    ``stream`` tells independent permutations of one (seed, epoch) apart (0: the plain one)."""
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < 0:
        raise ValueError(f"stream must be a non-negative int, got {stream!r}")
    generator = torch.Generator().manual_seed(seed * _EPOCH_SEED_STRIDE + epoch + stream * _STREAM_SEED_STRIDE)
    return torch.randperm(n_samples, generator=generator).tolist()


def rank_share_from(sequence: Sequence[T], rank: int, world: int, start: int = 0, stop: int | None = None) -> list[T]:
    """Rank ``rank``'s items of a global sequence from global offset ``start`` up to ``stop``:
    ``sequence[start + rank : stop : world]`` (round-robin, so after every rank has read ``k``
    items the ranks together have read exactly ``sequence[start : start + k * world]``)."""
    _check_slot("rank", rank, world)
    stop = len(sequence) if stop is None else stop
    if not 0 <= start <= stop <= len(sequence):
        raise ValueError(f"need 0 <= start <= stop <= {len(sequence)}, got start {start}, stop {stop}")
    return list(sequence[start + rank : stop : world])


def merge_rank_shares(shares: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of :func:`rank_share_from` over equal shares: the ranks' items back in the
    global sequence's order (rank ``r``'s ``j``-th item is item ``r + j * world``)."""
    return [share_[j] for j in range(len(shares[0])) for share_ in shares] if shares else []
