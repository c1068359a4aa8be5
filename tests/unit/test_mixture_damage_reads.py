"""Damaged cache data in a mixture of caches, read in this process by the trainer's own step drawing
and validation: the step stops with the same one line as one cache does, naming the damaged file of
the cache it is in and the sample under its mixture key (``b/<key>``), or the sample is skipped and
counted under ``train.damaged_samples: skip``; for training draws and for the held-out validation
rows alike (a webdataset cache's included). The launch that ends on every rank in one line:
tests/e2e/test_mixture_damage.py.

Two real zarr caches of 2 episodes x 4 steps (tiny profile, one sample per feature shard; the
session's, helpers.shared_runs), a byte flipped in a copy of cache ``b``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import closing
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from helpers.damage import OneProcess, copies, flip_byte, write_profile
from helpers.shared_runs import OneSampleShards
from janus_cache.store.layout import wds_shard_name
from janus_core.profile import load_profile
from janus_core.sample_data import write_sample_data
from janus_train.data.damaged import DamagedSample, draw_step
from janus_train.data.from_profile import open_training_cache
from janus_train.data.mixture import MixedSamples, Mixture, mixed_samples
from janus_train.data.samples import collate
from pipelines.precompute_run import Options, run

N_PER_CACHE = 8


NAMES = ("a", "b")


@pytest.fixture(scope="module")
def clean_caches(one_sample_shards: OneSampleShards) -> tuple[Path, Path, Path]:
    """(profile, cache a, cache b): the session's two intact zarr caches of different sample data, read-only."""
    return one_sample_shards.profile, one_sample_shards.cache("a"), one_sample_shards.cache("b")


@pytest.fixture(scope="module")
def builder(clean_caches: tuple[Path, Path, Path]) -> Any:
    from janus_train.build import prompt_builder

    return prompt_builder(load_profile(clean_caches[0]))


def mixture_of(profile: Path, a: Path, b: Path, builder: Any) -> MixedSamples:
    """The trainer's dataset of ``--cache a=A:1 --cache b=B:1``."""
    opened = [(name, open_training_cache(load_profile(profile), path)) for name, path in zip(NAMES, (a, b))]
    return mixed_samples(opened, builder)


def micro_batches(dataset: MixedSamples, builder: Any, workers: int) -> Iterator[tuple[dict[str, Any], int, int]]:
    """(micro-batch of 1, epoch, position) in the mixture's sequence, epoch after epoch, as the trainer's
    loader yields them (read by ``workers`` loader processes; damaged micro-batches included)."""
    order = Mixture(dataset.sizes, (1.0, 1.0), seed=0)
    for epoch in itertools.count():
        loader = DataLoader(dataset, batch_size=1, sampler=order.epoch_sequence(epoch), num_workers=workers,
                            collate_fn=partial(collate, pad_token_id=builder.pad_token_id))
        for position, batch in enumerate(loader, start=1):
            yield batch, epoch, position


def damage_feature(profile: Path, cache: Path, row: int) -> tuple[Path, str]:
    """(file, key): one byte flipped in the feature shard of ``cache``'s sample ``row`` (its only sample)."""
    reader = open_training_cache(load_profile(profile), cache).reader
    key = reader.sample(row).key
    file = reader.shard_file(reader.features_array, row)
    flip_byte(file, 0)
    return file, key


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_sample_of_one_cache_stops_the_step_naming_its_file_and_mixture_key(
    clean_caches: tuple[Path, Path, Path], builder: Any, tmp_path: Path, workers: int,
) -> None:
    profile = clean_caches[0]
    a, b = copies(clean_caches, tmp_path)
    file, key = damage_feature(profile, b, row=3)
    dataset = mixture_of(profile, a, b, builder)
    # Closed here: left to the garbage collector (the raised error's frames hold it), the loader's
    # workers would be shut down during a later test, each after a 5 s timeout.
    with closing(micro_batches(dataset, builder, workers)) as batches, pytest.raises(DamagedSample) as raised:
        draw_step(batches, len(dataset), len(dataset), "stop", OneProcess(), step=1)  # a whole epoch: it reads the damage
    assert str(raised.value).startswith(
        f"step 1, rank 0: damaged cache data: {file}: checksum mismatch (crc32c) (read for sample b/{key}); ")
    assert "\n" not in str(raised.value)


def test_with_skip_the_damaged_sample_of_one_cache_is_left_out_and_counted(
    clean_caches: tuple[Path, Path, Path], builder: Any, tmp_path: Path,
) -> None:
    profile = clean_caches[0]
    a, b = copies(clean_caches, tmp_path)
    _, key = damage_feature(profile, b, row=3)
    dataset = mixture_of(profile, a, b, builder)
    readable = len(dataset) - 1
    drawn = draw_step(micro_batches(dataset, builder, 0), readable, len(dataset), "skip", OneProcess(), step=1)
    keys = [batch["keys"][0] for batch, _, _ in drawn.micro]
    assert drawn.skipped == 1 and f"b/{key}" not in keys
    assert sorted(keys) == sorted(dataset[row].key for row in range(len(dataset)) if dataset[row].key != f"b/{key}")
    assert {k.split("/")[0] for k in keys} == set(NAMES)


def test_a_damaged_held_out_sample_of_one_cache_reaches_validation_as_its_one_line(
    clean_caches: tuple[Path, Path, Path], builder: Any, tmp_path: Path,
) -> None:
    """Each cache holds out one episode of its two; the validation micro-batches of the mixture carry
    the damaged held-out sample of cache b as its error (the evaluator stops or skips on it)."""
    import torch

    from janus_train.config import load_train_settings
    from janus_train.loop.validation import Evaluator, plan_validation

    profile = write_profile(tmp_path / "profile.yaml", val_episodes=1, val_max_samples=0)
    a, b = copies(clean_caches, tmp_path)
    _, validation = plan_validation(load_train_settings(load_profile(profile)), mixture_of(profile, a, b, builder))
    assert validation is not None and len(validation.rows) == N_PER_CACHE  # 4 of each cache
    last_of_b = max(validation.rows) - N_PER_CACHE  # cache b's rows follow a's in the mixture
    file, key = damage_feature(profile, b, row=last_of_b)

    evaluator = Evaluator(validation, builder, micro_batch=1, num_workers=0, rank=0, world=1,
                          device=torch.device("cpu"), damaged_samples="stop", read_timeout_s=0)
    batches = [batch for batch, _ in evaluator._batches()]
    damaged = [str(err) for batch in batches for err in batch.get("damaged", [])]
    assert len(damaged) == 1 and damaged[0].startswith(
        f"damaged cache data: {file}: checksum mismatch (crc32c) (read for sample b/{key}); ")
    assert sum(len(batch.get("keys", [])) for batch in batches) == N_PER_CACHE - 1


def test_a_damaged_held_out_sample_of_a_webdataset_cache_reaches_validation_as_its_one_line(
    clean_caches: tuple[Path, Path, Path], builder: Any, tmp_path: Path,
) -> None:
    """The other kind of data validation reads: a webdataset cache's held-out rows, streamed by 2 loader
    workers; one action digit flipped in the tar of the last held-out sample."""
    import torch

    from janus_cache.store.wds_store import encode_key
    from janus_train.config import load_train_settings
    from janus_train.data.samples import StreamedSamples
    from janus_train.loop.validation import Evaluator, plan_validation

    profile = write_profile(tmp_path / "profile.yaml", val_episodes=1, val_max_samples=0)
    data = write_sample_data(tmp_path / "data", episodes=2, steps=4, seed=0)
    cache = tmp_path / "wds"
    assert run(Options(data, cache, str(profile), cache_format="wds", workers=1)) == 0
    reader = open_training_cache(load_profile(profile), cache).reader
    _, validation = plan_validation(load_train_settings(load_profile(profile)), StreamedSamples(reader, builder))
    assert validation is not None and len(validation.rows) == N_PER_CACHE // 2
    row = validation.rows[-1]
    shard = next(i for i, rows in enumerate(reader.layout.plan()) if row in rows)
    tar = reader.root / reader.array / wds_shard_name(shard)
    key = next(sample.key for sample, r in zip(reader.shard(shard), reader.layout.plan()[shard]) if r == row)
    content = tar.read_bytes()
    at = content.index(b'"action": ', content.index(f"{encode_key(key)}.json".encode())) + len(b'"action": ')
    tar.write_bytes(content[:at] + (b"1" if content[at:at + 1] != b"1" else b"2") + content[at + 1:])

    evaluator = Evaluator(validation, builder, micro_batch=1, num_workers=2, rank=0, world=1,
                          device=torch.device("cpu"), damaged_samples="stop", read_timeout_s=0)
    batches = [batch for batch, _ in evaluator._batches()]
    damaged = [str(err) for batch in batches for err in batch.get("damaged", [])]
    assert len(damaged) == 1 and damaged[0].startswith(f"damaged cache data: {tar}: member {encode_key(key)}.json "
                                                       "fails its crc32c"), damaged
    assert f"(read for sample {key})" in damaged[0]
    assert sum(len(batch.get("keys", [])) for batch in batches) == len(validation.rows) - 1
