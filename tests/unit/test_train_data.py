"""The trainer's readers: zarr (map-style), webdataset (streaming) and live give the same items,
and 2 ranks x N loader workers read every sample of an epoch exactly once."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import pytest
import torch

from helpers.profiles import write_test_profile
from janus_core.index import build_index
from janus_core.profile import load_profile
from janus_core.resolution import Resolution
from janus_train.build import prompt_builder
from janus_train.data.from_profile import open_training_cache
from janus_train.data.mixture import Mixture
from janus_train.data.samples import CachedSamples, LiveSamples, StreamedSamples, TrainItem, collate
from pipelines.precompute_run import Options, run

# 16 workers (the h800 profile's value) on a 2-core test machine: torch warns; the split must hold.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="module")
def caches(sample_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A zarr and a webdataset cache of the sample data, both with several sample shards."""
    root = tmp_path_factory.mktemp("readers")
    profile = write_test_profile(root / "p.yaml", cache={"samples_per_shard": 4, "frames_per_shard": 8})
    for fmt in ("zarr", "wds"):
        assert run(Options(sample_dataset, root / fmt, str(profile), cache_format=fmt, workers=1)) == 0
    return root / "zarr", root / "wds", profile


def readers(caches):
    """(profile, prompt builder, opened zarr reader, opened webdataset reader)."""
    zarr_cache, wds_cache, profile_path = caches
    profile = load_profile(profile_path)
    zarr_reader = open_training_cache(profile, zarr_cache).reader
    wds_reader = open_training_cache(profile, wds_cache).reader
    return profile, prompt_builder(profile), zarr_reader, wds_reader


def same_item(a: TrainItem, b: TrainItem) -> None:
    assert a.key == b.key
    assert torch.equal(a.frames, b.frames)
    assert torch.equal(a.prompt.input_ids, b.prompt.input_ids)
    assert torch.equal(a.prompt.labels, b.prompt.labels)
    assert a.prompt.action_id == b.prompt.action_id


def test_streamed_ranks_read_disjoint_shards_that_cover_the_cache_with_the_zarr_items(caches) -> None:
    _, builder, zarr_reader, wds_reader = readers(caches)
    by_key = {item.key: item for item in CachedSamples(zarr_reader, builder)}
    seen: list[str] = []
    for rank in range(2):
        for item in StreamedSamples(wds_reader, builder, rank=rank, world=2):
            same_item(item, by_key[item.key])
            assert torch.equal(item.features.view(torch.int16), by_key[item.key].features.view(torch.int16))
            seen.append(item.key)
    assert sorted(seen) == sorted(by_key) and len(seen) == len(set(seen))


def epoch_keys(dataset, sampler, workers: int, pad_token_id: int) -> list[str]:
    """The keys one rank's DataLoader yields in an epoch, in order (micro-batches of 2, as trained)."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=workers,
                                         collate_fn=partial(collate, pad_token_id=pad_token_id))
    return [key for batch in loader for key in batch["keys"]]


@pytest.mark.parametrize("workers", [2, 8, 16])
def test_two_ranks_with_loader_workers_stream_every_sample_once_the_same_epoch_as_without(caches, workers) -> None:
    _, builder, _, wds_reader = readers(caches)
    per_rank = {
        n: [sorted(epoch_keys(StreamedSamples(wds_reader, builder, rank=r, world=2), None, n, builder.pad_token_id))
            for r in range(2)]
        for n in (0, workers)
    }
    seen = Counter(key for keys in per_rank[workers] for key in keys)
    assert len(seen) == len(wds_reader) == 36 and set(seen.values()) == {1}
    assert per_rank[workers] == per_rank[0]


def test_two_ranks_with_loader_workers_index_every_sample_once_per_epoch_the_same_as_without(caches) -> None:
    _, builder, zarr_reader, _ = readers(caches)
    dataset = CachedSamples(zarr_reader, builder)
    order = Mixture((len(dataset),), (1.0,), seed=1)  # the trainer's sample order of one cache
    keys = {n: [epoch_keys(dataset, order.rank_rows(4, r, 2), n, builder.pad_token_id)
                for r in range(2)]
            for n in (0, 2, 16)}  # 16: the h800 profile's loader workers
    for n in (2, 16):
        seen = Counter(key for rank_keys in keys[n] for key in rank_keys)
        assert len(seen) == len(dataset) == 36 and set(seen.values()) == {1}
        assert keys[n] == keys[0]


def test_cached_items_equal_live_items_except_that_live_has_no_feature(caches, sample_dataset: Path) -> None:
    profile, builder, zarr_reader, _ = readers(caches)
    cached = CachedSamples(zarr_reader, builder)
    index = build_index(sample_dataset, history=profile.cache.history)
    live = LiveSamples(index, builder, Resolution.parse(profile.cache.resolution))
    for row in (0, 5, len(live) - 1):
        assert live[row].features is None
        same_item(live[row], cached[row])


def test_collate_stacks_frames_and_features_and_pads_prompts(caches) -> None:
    _, builder, zarr_reader, _ = readers(caches)
    cached = CachedSamples(zarr_reader, builder)
    batch = collate([cached[0], cached[10]], builder.pad_token_id)
    assert batch["frames"].shape[:2] == (2, 9) and batch["frames"].dtype == torch.uint8
    assert batch["features"].shape[0] == 2 and batch["features"].dtype == torch.bfloat16
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["labels"].shape
    assert batch["keys"] == [cached[0].key, cached[10].key]


def test_the_trainers_sampler_splits_a_seeded_permutation_and_resumes_at_a_global_position() -> None:
    order = Mixture((10,), (1.0,), seed=3)
    ranks = [order.rank_rows(1, rank, 2) for rank in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(10))
    assert ranks == [Mixture((10,), (1.0,), seed=3).rank_rows(1, rank, 2) for rank in range(2)]
    assert order.rank_rows(2, 0, 2) != ranks[0]
    # Resumed after 3 samples on each of the 2 ranks: global position 6, this rank's 4th sample on.
    assert order.rank_rows(1, 1, 2, start=6) == ranks[1][3:]
    # An odd count: every sample once, the ranks' shares differ by one (the trainer stops the
    # epoch at its last whole step, so both ranks step the same number of times).
    assert [len(Mixture((11,), (1.0,), seed=0).rank_rows(0, rank, 2)) for rank in range(2)] == [6, 5]
    assert [len(Mixture((11,), (1.0,), seed=0).rank_rows(0, rank, 2, stop=10)) for rank in range(2)] == [5, 5]
