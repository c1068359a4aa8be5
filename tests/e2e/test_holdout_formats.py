"""Held-out validation episodes on every kind of training data: a webdataset
cache and a mixture of caches validate with the shipped profiles' hold-out, as a zarr cache does.

* webdataset: the training stream passes the held-out episodes' samples over unread, the validation
  stream reads only them; both are split over ranks and loader workers by the stream's one split
  (``janus_cache.store.split``), checked here with 2 ranks x 16 real DataLoader workers (h800's
  ``num_workers``);
* mixture: each cache holds out its own episodes by the same seeded rule as a single cache;
* a 2-process run (the tiny profile with h800's ``num_workers``; a mixture as ``make train
  MIXTURE=...`` passes it): the run starts, validates (``val_*`` records) and trains only on the other
  episodes' samples, every one of them.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers.commands import make_command
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.training import train_on_ranks
from janus_cache.store.layout import KEY_COLUMN, SAMPLES_TABLE
from janus_cache.store.records import EPISODE_COLUMN
from janus_core.profile import load_profile
from janus_core.sample_data import write_sample_data
from janus_train.build import prompt_builder
from janus_train.config import load_train_settings
from janus_train.data.from_profile import make_dataset, open_training_cache
from janus_train.data.holdout import split_by_episode
from janus_train.data.mixture import MixedSamples
from janus_train.data.samples import CachedSamples, StreamedSamples
from janus_train.loop.validation import plan_validation

H800 = yaml.safe_load((REPO_ROOT / "configs/profiles/h800.yaml").read_text())["train"]
WORKERS = H800["num_workers"]
WORLD = 2
TIMEOUT_S = 900

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def tiny_with_h800_workers(path: Path, **train: Any) -> Path:
    """The tiny profile (its own hold-out: one episode) with h800's loader-worker count."""
    write_test_profile(path, keep_validation=True)
    data = yaml.safe_load(path.read_text())
    data["train"].update({"num_workers": WORKERS, "log_sample_keys": True, "save_every": 0, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def precompute(data: Path, out: Path, profile: Path, cache_format: str = "zarr") -> Path:
    from pipelines.precompute_run import Options, run

    assert run(Options(data, out, profile=str(profile), cache_format=cache_format, workers=1)) == 0
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A webdataset cache of 5 episodes x 8 steps (40 samples, each episode one tar shard of the
    tiny profile's 8 samples) and two zarr caches of 3 episodes x 5 and 3 x 3 steps. Sizes are
    chosen so that a run's first epoch covers every training sample: the webdataset's 4 training
    shards are 2 per rank, and the mixture's 10 + 6 training samples are drawn 0.625 : 0.375."""
    root = tmp_path_factory.mktemp("holdout-formats")
    profile = tiny_with_h800_workers(root / "tiny-h800-workers.yaml")
    built = {"root": root, "profile": profile}
    data = write_sample_data(root / "data", episodes=5, steps=8, seed=0)
    built["wds"] = precompute(data, root / "wds", profile, "wds")
    for name, (episodes, steps, seed) in {"r2r": (3, 5, 1), "rxr": (3, 3, 2)}.items():
        source = write_sample_data(root / f"data-{name}", episodes=episodes, steps=steps, seed=seed)
        built[name] = precompute(source, root / name, profile)
    return built


def stream_keys(dataset: StreamedSamples) -> list[str]:
    """Every key one rank's stream yields, read by h800's number of DataLoader worker processes."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=WORKERS)
    return [item.key for item in loader]


def episode_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


def test_a_webdataset_cache_holds_out_whole_episodes_split_once_over_ranks_and_workers(
        built: dict[str, Path]) -> None:
    profile = load_profile(built["profile"])
    settings = load_train_settings(profile)
    builder = prompt_builder(profile, settings)
    reader = open_training_cache(profile, built["wds"]).reader
    episodes = [str(e) for e in reader.read_column(SAMPLES_TABLE, EPISODE_COLUMN)]
    expected = split_by_episode(episodes, settings.val_episodes, settings.seed)  # the zarr rule

    train_keys: list[str] = []
    val_keys: list[str] = []
    for rank in range(WORLD):
        dataset = make_dataset(profile, builder, built["wds"], None, rank, WORLD)
        assert isinstance(dataset, StreamedSamples)
        train, validation = plan_validation(settings, dataset)
        assert validation is not None and validation.description == "8 samples of 1 held-out episode"
        assert isinstance(train, StreamedSamples) and len(train) == len(expected.train_rows) == 32
        mine_train, mine_val = stream_keys(train), stream_keys(validation.dataset)
        # The rows each rank streams are the ones it is told it streams (validation's batch count).
        assert len(mine_train) == len(train.rank_rows(rank))
        assert len(mine_val) == len(validation.dataset.rank_rows(rank))
        train_keys += mine_train
        val_keys += mine_val

    # Every sample exactly once over ranks and workers, in exactly one of the two sets.
    assert Counter(train_keys).most_common(1)[0][1] == 1 and Counter(val_keys).most_common(1)[0][1] == 1
    assert not set(train_keys) & set(val_keys)
    assert len(train_keys) + len(val_keys) == len(episodes) == 40
    assert {episode_of(k) for k in val_keys} == set(expected.val_episodes)
    assert not {episode_of(k) for k in train_keys} & set(expected.val_episodes)


def test_a_mixture_holds_out_episodes_of_each_cache_by_the_single_cache_rule(built: dict[str, Path]) -> None:
    from janus_train.data.sources import CacheSource

    profile = load_profile(built["profile"])
    settings = load_train_settings(profile)
    builder = prompt_builder(profile, settings)
    sources = [CacheSource("r2r", built["r2r"], 0.7), CacheSource("rxr", built["rxr"], 0.3)]
    mixed = make_dataset(profile, builder, sources, None, 0, 1)
    assert isinstance(mixed, MixedSamples)
    train, validation = plan_validation(settings, mixed)
    assert isinstance(train, MixedSamples) and validation is not None
    assert validation.description == "8 samples of 2 held-out episodes (r2r 1, rxr 1)"

    for source, part in zip(sources, mixed.datasets):
        alone = CachedSamples(open_training_cache(profile, source.path).reader, builder)
        _, single = plan_validation(settings, alone)  # the same cache trained on alone
        assert single is not None
        expected = {f"{source.name}/{alone[row].key}" for row in single.rows}
        got = {mixed[row].key for row in validation.rows if mixed.locate(row)[0] == sources.index(source)}
        assert got == expected
    train_keys = [train[i].key for i in range(len(train))]
    val_keys = [mixed[row].key for row in validation.rows]
    assert train.sizes == (15 - 5, 9 - 3)
    assert len(set(train_keys)) == len(train_keys) and not set(train_keys) & set(val_keys)
    assert len(train_keys) + len(val_keys) == len(mixed) == 24


# ----------------------------------------------------------------------------------------------
# 2 processes (a mixture as make train passes it), the tiny profile with h800's loader workers


def trained_and_validated(result: subprocess.CompletedProcess[str], run: Path) -> tuple[set[str], list[dict]]:
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    assert "holding out episodes" not in result.stderr
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validated = [r for r in records if "val_loss" in r]
    assert validated, "no validation record"
    return {key for r in records for key in r["sample_keys"]}, validated


@pytest.mark.parametrize("kind", ["webdataset", "mixture"])
def test_a_two_process_run_validates_on_held_out_episodes_and_trains_on_all_the_others(
        kind: str, built: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    if kind == "webdataset":
        # 32 training samples in 4 tar shards, 2 per rank: one epoch is 8 steps of 2 x 2 x 1.
        profile = tiny_with_h800_workers(tmp_path / "p.yaml", max_steps=8, eval_every=0)
        result = train_on_ranks("--cache", built["wds"], "--out", run, "--profile", profile, "--no-export")
        reader = open_training_cache(load_profile(profile), built["wds"]).reader
        episodes = [str(e) for e in reader.read_column(SAMPLES_TABLE, EPISODE_COLUMN)]
        held = set(split_by_episode(episodes, 1, 0).val_episodes)
        every = set(cache_keys(built["wds"], load_profile(profile)))
    else:
        # 10 + 6 training samples drawn in proportion to their counts: one epoch (4 steps) is
        # exactly one pass over each cache's training samples.
        # The command `make train MIXTURE=...` runs (each word one --cache NAME=PATH:WEIGHT), on ranks
        # started as torchrun starts them (helpers.forked_ranks): the launch itself is many tests' (make
        # train CACHE=, e.g. tests/e2e/test_user_errors.py).
        profile = tiny_with_h800_workers(tmp_path / "p.yaml", max_steps=4, eval_every=0)
        command = make_command("train", PROFILE=profile, RUN=run, TRAIN_ARGS="--no-export",
                               MIXTURE=f"r2r={built['r2r']}:0.625 rxr={built['rxr']}:0.375")
        assert command[:5] == ["pipelines.train", "--cache", f"r2r={built['r2r']}:0.625",
                               "--cache", f"rxr={built['rxr']}:0.375"], command
        result = train_on_ranks(*command[1:])
        held, every = set(), set()
        for name in ("r2r", "rxr"):
            reader = open_training_cache(load_profile(profile), built[name]).reader
            episodes = [str(e) for e in reader.read_column(SAMPLES_TABLE, EPISODE_COLUMN)]
            held |= {f"{name}/{e}" for e in split_by_episode(episodes, 1, 0).val_episodes}
            every |= {f"{name}/{key}" for key in cache_keys(built[name], load_profile(profile))}
    expected_val = 8  # the tiny profile's val_max_samples: every held-out sample here
    trained, validated = trained_and_validated(result, run)
    assert f"validating on {expected_val} samples of" in result.stdout
    assert validated[-1]["val_samples"] == expected_val
    held_keys = {k for k in every if episode_of(k) in held}
    assert len(held_keys) == expected_val
    assert not trained & held_keys  # no held-out sample is trained on
    assert trained == every - held_keys  # every other sample is


def cache_keys(cache: Path, profile: Any) -> list[str]:
    """The key of every sample row of a cache (``<episode id>/<step>``)."""
    keys = [str(k) for k in open_training_cache(profile, cache).reader.read_column(SAMPLES_TABLE, KEY_COLUMN)]
    assert all(episode_of(k) for k in keys)
    return keys
