"""The trainer's readers: zarr (map-style), webdataset (streaming) and live give the same items."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import write_test_profile

from janus_cache.index import build_index
from janus_cache.profile import load_profile
from janus_cache.resolution import Resolution
from janus_train.data import CachedSamples, EpochSampler, LiveSamples, StreamedSamples, collate
from janus_train.trainer import prompt_builder
from pipelines.precompute import Options, run


@pytest.fixture(scope="module")
def caches(sample_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A zarr and a webdataset cache of the sample data, both with several sample shards."""
    root = tmp_path_factory.mktemp("readers")
    profile = write_test_profile(root / "p.yaml", cache={"samples_per_shard": 4, "frames_per_shard": 8})
    for fmt in ("zarr", "wds"):
        assert run(Options(sample_dataset, root / fmt, str(profile), cache_format=fmt, workers=1)) == 0
    return root / "zarr", root / "wds", profile


def same_item(a: dict, b: dict) -> None:
    assert a["key"] == b["key"]
    assert torch.equal(a["frames"], b["frames"])
    assert torch.equal(a["prompt"].input_ids, b["prompt"].input_ids)
    assert torch.equal(a["prompt"].labels, b["prompt"].labels)
    assert a["prompt"].action_id == b["prompt"].action_id


def test_streamed_ranks_read_disjoint_shards_that_cover_the_cache_with_the_zarr_items(caches) -> None:
    zarr_cache, wds_cache, profile_path = caches
    builder = prompt_builder(load_profile(profile_path))
    by_key = {item["key"]: item for item in CachedSamples(zarr_cache, builder)}
    seen: list[str] = []
    for rank in range(2):
        for item in StreamedSamples(wds_cache, builder, rank=rank, world=2):
            same_item(item, by_key[item["key"]])
            assert torch.equal(item["features"].view(torch.int16), by_key[item["key"]]["features"].view(torch.int16))
            seen.append(item["key"])
    assert sorted(seen) == sorted(by_key) and len(seen) == len(set(seen))


def test_cached_items_equal_live_items_except_that_live_has_no_feature(caches, sample_dataset: Path) -> None:
    zarr_cache, _, profile_path = caches
    profile = load_profile(profile_path)
    builder = prompt_builder(profile)
    cached = CachedSamples(zarr_cache, builder)
    index = build_index(sample_dataset, history=profile.cache.history)
    live = LiveSamples(index, builder, Resolution.parse(profile.cache.resolution))
    for row in (0, 5, len(live) - 1):
        assert live[row]["features"] is None
        same_item(live[row], cached[row])


def test_collate_stacks_frames_and_features_and_pads_prompts(caches) -> None:
    zarr_cache, _, profile_path = caches
    builder = prompt_builder(load_profile(profile_path))
    cached = CachedSamples(zarr_cache, builder)
    batch = collate([cached[0], cached[10]], builder.pad_token_id)
    assert batch["frames"].shape[:2] == (2, 9) and batch["frames"].dtype == torch.uint8
    assert batch["features"].shape[0] == 2 and batch["features"].dtype == torch.bfloat16
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["labels"].shape
    assert batch["keys"] == [cached[0]["key"], cached[10]["key"]]


def test_epoch_sampler_splits_a_seeded_permutation_and_resumes_at_a_position() -> None:
    ranks = [list(EpochSampler(10, rank, 2, seed=3, epoch=1)) for rank in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(10))
    assert ranks == [list(EpochSampler(10, rank, 2, seed=3, epoch=1)) for rank in range(2)]
    assert list(EpochSampler(10, 0, 2, seed=3, epoch=2)) != ranks[0]
    assert list(EpochSampler(10, 1, 2, seed=3, epoch=1, start=3)) == ranks[1][3:]
    assert len(EpochSampler(11, 0, 2, seed=0, epoch=0)) == 5  # the tail that cannot fill every rank is dropped
