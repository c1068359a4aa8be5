"""The one split of a cache over ranks x DataLoader workers: every sample exactly once per epoch.

Ranks are simulated by ``rank``/``world`` arguments (what a launcher passes); workers are real
DataLoader worker processes. Both formats, up to as many workers as the h800 profile uses (16).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from helpers.store_cases import RESOLUTION, VARIANT, assert_sample_equal, make_content, write_cache
from janus_cache.store import WdsCacheReader, ZarrCacheReader
from janus_cache.store.split import epoch_order, shards_for
from janus_train.data.mixture import Mixture

WORLD = 2

# 8 and 16 workers on a 2-core test machine: torch warns, the split must still be exact.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def content():
    """27 samples (an odd count) in 9 sample shards of 3."""
    return make_content(episodes=3, steps=9)


@pytest.fixture(scope="module")
def wds_reader(content, tmp_path_factory: pytest.TempPathFactory) -> WdsCacheReader:
    root = tmp_path_factory.mktemp("split-wds")
    write_cache("wds", root, content)
    return WdsCacheReader(root, RESOLUTION, VARIANT.name)


@pytest.fixture(scope="module")
def zarr_reader(content, tmp_path_factory: pytest.TempPathFactory) -> ZarrCacheReader:
    root = tmp_path_factory.mktemp("split-zarr")
    write_cache("zarr", root, content)
    return ZarrCacheReader(root, RESOLUTION, VARIANT.name)


def streamed_rows(reader: WdsCacheReader, rank: int, workers: int) -> list[int]:
    loader = torch.utils.data.DataLoader(reader.dataset(rank, WORLD), batch_size=None, num_workers=workers)
    return [sample.row for sample in loader]


def indexed_rows(reader: ZarrCacheReader, rank: int, workers: int, epoch: int) -> list[int]:
    sampler = Mixture((len(reader),), (1.0,), seed=5).rank_rows(epoch, rank, WORLD)  # the trainer's
    loader = torch.utils.data.DataLoader(reader, sampler=sampler, batch_size=None, num_workers=workers)
    return [sample.row for sample in loader]


def test_shards_are_dealt_to_ranks_then_to_each_ranks_workers_without_overlap() -> None:
    slots = {(r, w): shards_for(10, r, 2, w, 3) for r in range(2) for w in range(3)}
    assert slots[(0, 0)] == [0, 6] and slots[(1, 2)] == [5]
    assert sorted(s for shards in slots.values() for s in shards) == list(range(10))
    with pytest.raises(ValueError, match="rank must be an int in"):
        shards_for(10, 2, 2)


@pytest.mark.parametrize("workers", [2, 8, 16])
def test_two_ranks_with_loader_workers_stream_every_sample_exactly_once(wds_reader, content, workers: int) -> None:
    per_rank = [streamed_rows(wds_reader, rank, workers) for rank in range(WORLD)]
    seen = Counter(row for rows in per_rank for row in rows)
    assert sorted(seen) == list(range(content.n_samples))
    assert set(seen.values()) == {1}, f"read more than once: {[r for r, n in seen.items() if n > 1]}"
    # The same epoch as without worker processes, rank by rank.
    for rank in range(WORLD):
        assert sorted(per_rank[rank]) == sorted(streamed_rows(wds_reader, rank, 0))


def test_streamed_samples_in_workers_are_the_stored_samples(wds_reader, content) -> None:
    loader = torch.utils.data.DataLoader(wds_reader.dataset(1, WORLD), batch_size=None, num_workers=2)
    for sample in loader:
        assert_sample_equal(sample, content, sample.row)


def test_two_ranks_with_loader_workers_index_every_sample_exactly_once_per_epoch(zarr_reader, content) -> None:
    for epoch in (0, 1):
        per_rank = [indexed_rows(zarr_reader, rank, 2, epoch) for rank in range(WORLD)]
        seen = Counter(row for rows in per_rank for row in rows)
        assert sorted(seen) == list(range(content.n_samples)) and set(seen.values()) == {1}
        assert [len(rows) for rows in per_rank] == [14, 13]  # an odd count: ranks differ by one sample
        # Workers keep the sampler's order; without workers the epoch is the same.
        assert per_rank == [indexed_rows(zarr_reader, rank, 0, epoch) for rank in range(WORLD)]
        # One cache's epoch is the plain seeded permutation, dealt round-robin.
        assert per_rank == [epoch_order(content.n_samples, 5, epoch)[rank::WORLD] for rank in range(WORLD)]


def test_epoch_order_depends_on_seed_and_epoch_only_and_a_resume_continues_at_its_position() -> None:
    order = Mixture((11,), (1.0,), seed=3)
    ranks = [order.rank_rows(1, rank, 2) for rank in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(11))
    assert ranks == [Mixture((11,), (1.0,), seed=3).rank_rows(1, rank, 2) for rank in range(2)]
    assert order.rank_rows(2, 0, 2) != ranks[0]
    resumed = order.rank_rows(1, 1, 2, start=6)  # after 3 samples on each of the 2 ranks
    assert resumed == ranks[1][3:] and len(resumed) == len(ranks[1]) - 3
    # Resumed on 3 ranks instead (elastic): the same sequence goes on, every sample still once.
    on_three = [order.rank_rows(1, rank, 3, start=6) for rank in range(3)]
    assert sorted(ranks[0][:3] + ranks[1][:3] + [row for rows in on_three for row in rows]) == list(range(11))


def test_a_reader_needs_an_existing_resolution_and_variant(tmp_path: Path, content) -> None:
    from janus_cache.store import StoreError

    write_cache("zarr", tmp_path / "zarr", content)
    write_cache("wds", tmp_path / "wds", content)
    with pytest.raises(StoreError, match="has no array 'frames/pad56'"):
        ZarrCacheReader(tmp_path / "zarr", "pad56", VARIANT.name)
    with pytest.raises(StoreError, match="holds no webdataset shards"):
        WdsCacheReader(tmp_path / "wds", "pad56", VARIANT.name)
