"""Training never consumes damaged cache data, read in this process: the start-up check lets a flipped
byte through (shard presence and size, no hashing) and refuses a deleted shard or an edited zarr.json;
a step that reads damaged data anywhere in the samples table, frames or features stops naming the
file, or with ``train.damaged_samples: skip`` leaves the damaged samples out and counts them (or
stops when none is readable). The launches that end on every rank: tests/e2e/test_damage_training.py.

The cache: the session's 2 episodes x 4 steps (tiny profile, one sample per feature shard;
helpers.shared_runs), damaged in copies.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from helpers.damage import (
    DAMAGE_TARGETS,
    N_SAMPLES,
    SAMPLE_TABLE_ARRAYS,
    Damaged,
    OneProcess,
    damage_the_drawn_feature,
    damaged_copy,
)
from helpers.shared_runs import OneSampleShards
from janus_cache.store import DamagedData
from janus_cache.store.layout import SAMPLES_TABLE, table_group
from janus_core.profile import load_profile
from janus_train.data.damaged import DamagedSample, draw_step
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples, collate


@pytest.fixture(scope="module")
def clean_zarr(one_sample_shards: OneSampleShards) -> tuple[Path, Path]:
    """(profile, cache): the session's intact zarr cache, read-only; tests damage copies of it."""
    return one_sample_shards.profile, one_sample_shards.cache("a")


@pytest.fixture(scope="module")
def damaged_zarr(clean_zarr: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Damaged:
    return damage_the_drawn_feature(*clean_zarr, tmp_path_factory.mktemp("damaged") / "zarr")


@pytest.fixture(scope="module")
def builder(clean_zarr: tuple[Path, Path]) -> Any:
    from janus_train.build import prompt_builder

    return prompt_builder(load_profile(clean_zarr[0]))


def micro_batches(profile: Path, cache: Path, builder: Any) -> Iterator[tuple[dict[str, Any], int, int]]:
    """(micro-batch of 1, epoch, position) over the cache's rows in order, epoch after epoch, as the
    trainer's loader yields them (a micro-batch of a damaged sample included)."""
    dataset = CachedSamples(open_training_cache(load_profile(profile), cache).reader, builder)
    for epoch in itertools.count():
        loader = DataLoader(dataset, batch_size=1, collate_fn=partial(collate, pad_token_id=builder.pad_token_id))
        for position, batch in enumerate(loader, start=1):
            yield batch, epoch, position


def test_the_damage_passes_the_start_up_check_and_is_found_on_read(damaged_zarr: Damaged) -> None:
    from pipelines.train_run import cache_refusal

    assert cache_refusal(damaged_zarr.cache, load_profile(damaged_zarr.profile)) is None


def test_a_deleted_shard_is_refused_by_the_start_up_check_naming_it(damaged_zarr: Damaged, tmp_path: Path) -> None:
    from pipelines.train_run import cache_refusal

    cache = Path(shutil.copytree(damaged_zarr.cache, tmp_path / "cache"))
    missing = cache / damaged_zarr.file.relative_to(damaged_zarr.cache)
    missing.unlink()
    refusal = cache_refusal(cache, load_profile(damaged_zarr.profile))
    assert refusal is not None and str(missing) in refusal


def test_an_edited_endian_is_refused_by_the_start_up_check_naming_the_zarr_json(
    damaged_zarr: Damaged, tmp_path: Path,
) -> None:
    """An edited ``"endian"`` would have every bf16 feature read byte-swapped (``loss nan`` at every
    step, and exit 0): the start-up check refuses the cache, naming its ``zarr.json``."""
    from pipelines.train_run import cache_refusal

    cache = Path(shutil.copytree(damaged_zarr.cache, tmp_path / "cache"))
    reader = open_training_cache(load_profile(damaged_zarr.profile), damaged_zarr.cache).reader
    meta = cache / reader.features_array / "zarr.json"
    meta.write_text(meta.read_text().replace('"little"', '"big"'))
    refusal = cache_refusal(cache, load_profile(damaged_zarr.profile))
    assert refusal is not None and f"{meta} differs from the sha256 recorded" in refusal, refusal


def test_the_damage_targets_are_every_array_of_the_samples_table(clean_zarr: tuple[Path, Path]) -> None:
    profile, cache = clean_zarr
    reader = open_training_cache(load_profile(profile), cache).reader
    stored = {path.removeprefix(table_group(SAMPLES_TABLE) + "/") for path in reader.array_paths()
              if path.startswith(table_group(SAMPLES_TABLE) + "/")}
    assert stored == set(SAMPLE_TABLE_ARRAYS)


@pytest.mark.parametrize("target", DAMAGE_TARGETS)
def test_a_step_that_reads_damaged_data_stops_naming_the_file(
    clean_zarr: tuple[Path, Path], builder: Any, tmp_path: Path, target: str,
) -> None:
    cache, file = damaged_copy(clean_zarr, target, tmp_path / "cache")
    batches = micro_batches(clean_zarr[0], cache, builder)
    with pytest.raises(DamagedSample) as raised:  # a step of every sample of the epoch
        draw_step(batches, N_SAMPLES, N_SAMPLES, "stop", OneProcess(), step=1)
    assert str(raised.value).startswith(f"step 1, rank 0: damaged cache data: {file}: checksum mismatch (crc32c)")


@pytest.mark.parametrize("target", DAMAGE_TARGETS)
def test_with_skip_a_step_leaves_damaged_samples_out_or_stops_when_none_is_readable(
    clean_zarr: tuple[Path, Path], builder: Any, tmp_path: Path, target: str,
) -> None:
    cache, file = damaged_copy(clean_zarr, target, tmp_path / "cache")
    reader = open_training_cache(load_profile(clean_zarr[0]), cache).reader
    damaged = []
    for row in range(N_SAMPLES):
        try:
            reader.sample(row)
        except DamagedData as err:
            assert err.file == str(file)
            damaged.append(row)
    assert damaged, "the flipped byte damaged no sample"
    batches = micro_batches(clean_zarr[0], cache, builder)
    if len(damaged) == N_SAMPLES:  # a table column: no sample is readable, skipping would draw forever
        with pytest.raises(DamagedSample) as raised:
            draw_step(batches, 2, N_SAMPLES, "skip", OneProcess(), step=1)
        assert str(raised.value).startswith(f"step 1, rank 0: damaged cache data: {file}: ")
        assert str(raised.value).endswith("train.damaged_samples: skip has nothing left to train on)")
        return
    good = N_SAMPLES - len(damaged)
    drawn = draw_step(batches, good, N_SAMPLES, "skip", OneProcess(), step=1)
    assert [batch["keys"][0] for batch, _, _ in drawn.micro] == [
        reader.sample(row).key for row in range(N_SAMPLES) if row not in damaged]
    assert drawn.skipped == len(damaged)
