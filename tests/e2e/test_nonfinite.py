"""The non-finite guard, on a real cache whose one sample's stored feature is NaN.

The cache: a copy of the session's 2 episodes x 4 steps precomputed with the tiny profile's cache
settings (helpers.shared_runs); then one feature shard is
rewritten through the cache's own writer with a NaN in one sample's feature (a valid commit
record) and precompute is run again, which keeps the committed shards and writes the manifest
from them: a cache that passes the trainer's start-up check and holds one poisoned sample.

The runs: 2 processes started by torch's elastic agent (helpers.training.train_on_ranks),
DeepSpeed ZeRO-3 over gloo; micro-batch 1, gradient
accumulation 2, so a step takes 4 samples and an epoch of 8 samples is 2 steps. The poisoned
sample is the first micro-batch of rank 1 at step 2 (and appears once more in epoch 1).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from helpers.profiles import write_test_profile
from helpers.shared_runs import TinyTraining
from helpers.training import assert_succeeded, precompute, train_on_ranks
from janus_cache.keys import window_variant
from janus_cache.store.zarr_store import ZarrCacheWriter
from janus_core.profile import load_profile
from janus_core.resolution import Resolution
from janus_train.data.from_profile import open_training_cache
from janus_train.data.mixture import Mixture
from janus_train.run.layout import CHECKPOINTS_DIR, METRICS_FILE

N_PROC, PER_RANK_STEP, STEPS_PER_EPOCH = 2, 2, 2
MAX_STEPS = 4
POISONED_RANK, POISONED_STEP = 1, 2


@dataclass(frozen=True)
class Poisoned:
    data: Path
    profile: Path
    cache: Path
    key: str
    row: int


def strict_records(run: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, refusing NaN/Infinity (not JSON)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{run / METRICS_FILE} holds {constant}")

    return [json.loads(line, parse_constant=refuse) for line in (run / METRICS_FILE).read_text().splitlines()]


def write_profile(path: Path, **train: object) -> Path:
    write_test_profile(path)
    data = yaml.safe_load(path.read_text())
    data["train"].update({"epochs": 100, "max_steps": MAX_STEPS, "save_every": 1, "save_total_limit": 10,
                          "log_every": 1, "warmup_ratio": 0.0, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def poison_feature(cache: Path, data: Path, profile_path: Path, row: int) -> None:
    """NaN into sample ``row``'s stored feature, written as the precompute writes shards."""
    profile = load_profile(profile_path)
    resolution = Resolution.parse(profile.cache.resolution).name
    reader = open_training_cache(profile, cache).reader
    writer = ZarrCacheWriter(cache, window_variant(profile.cache).name)
    plan = writer.sample_shard_plan(resolution)
    shard = next(i for i, rows in enumerate(plan) if row in rows)
    features = torch.stack([reader.feature(r) for r in plan[shard]])
    features[row - plan[shard].start, 0, 0] = float("nan")
    writer.write_feature_shard(resolution, shard, features)
    precompute(data, cache, profile_path)  # seals the manifest over the committed shards


def steps_with(row: int, n_samples: int, max_steps: int) -> list[int]:
    """The optimizer steps (1-based) whose micro-batches hold sample ``row``, on any rank."""
    steps = []
    for step in range(1, max_steps + 1):
        epoch, in_epoch = divmod(step - 1, STEPS_PER_EPOCH)
        for rank in range(N_PROC):
            rows = Mixture((n_samples,), (1.0,), seed=0).rank_rows(epoch, rank, N_PROC)
            if row in rows[in_epoch * PER_RANK_STEP : (in_epoch + 1) * PER_RANK_STEP]:
                steps.append(step)
    return steps


@pytest.fixture(scope="module")
def poisoned(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> Poisoned:
    root = tmp_path_factory.mktemp("nonfinite")
    data = tiny_training.data
    profile = write_profile(root / "stop.yaml")
    # A copy of the session's cache of the tiny profile's cache settings (helpers.shared_runs).
    cache = Path(shutil.copytree(tiny_training.bf16_cache, root / "cache"))
    n_samples = len(open_training_cache(load_profile(profile), cache).reader)
    # Rank 1's first micro-batch of step 2 (its rows of epoch 0 from position 2).
    row = Mixture((n_samples,), (1.0,), seed=0).rank_rows(0, POISONED_RANK, N_PROC)[PER_RANK_STEP]
    assert steps_with(row, n_samples, STEPS_PER_EPOCH)[0] == POISONED_STEP
    poison_feature(cache, data, profile, row)
    key = open_training_cache(load_profile(profile), cache).reader.sample(row).key
    return Poisoned(data, profile, cache, key, row)


def test_the_poisoned_cache_holds_one_nan_feature_and_passes_the_start_up_check(poisoned: Poisoned) -> None:
    from pipelines.train_run import cache_refusal

    profile = load_profile(poisoned.profile)
    reader = open_training_cache(profile, poisoned.cache).reader
    nan_rows = [r for r in range(len(reader)) if torch.isnan(reader.feature(r).float()).any()]
    assert nan_rows == [poisoned.row]
    assert cache_refusal(poisoned.cache, profile) is None


def test_a_nan_loss_stops_every_rank_naming_the_step_rank_and_sample(poisoned: Poisoned, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", poisoned.cache, "--profile", poisoned.profile)
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1, "\n".join(output)
    # One report, from rank 0, which learned of rank 1's NaN through the all-reduced metrics.
    reports = [line for line in output if line.startswith("error:")]
    assert len(reports) == 1, "\n".join(output)
    assert reports[0].startswith(f"error: non-finite loss at step {POISONED_STEP} (loss nan, ")
    assert f"on rank {POISONED_RANK} (samples {poisoned.key}); stopped on every rank" in reports[0]
    # The processes ended with exit code 1; torchrun may stop the slower one (SIGTERM) once the
    # first has exited, but none fails any other way.
    exits = [line.split(":", 1)[1].split()[0] for line in output if line.strip().startswith("exitcode")]
    assert "1" in exits and set(exits) <= {"1", "-15"}, "\n".join(output)
    # Nothing of the bad step was written: step 1's checkpoint is the latest, step 1's record the last.
    checkpoints = out / CHECKPOINTS_DIR
    assert sorted(p.name for p in checkpoints.glob("step*")) == ["step00000001"]
    assert (checkpoints / "latest").read_text().strip() == "step00000001"
    assert [r["step"] for r in strict_records(out)] == [1]


def test_with_nonfinite_skip_the_run_completes_and_counts_the_skipped_steps(poisoned: Poisoned,
                                                                           tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "skip.yaml", nonfinite="skip")
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", poisoned.cache, "--profile", profile, "--no-export")
    assert_succeeded(result)
    records = strict_records(out)
    n_samples = len(open_training_cache(load_profile(profile), poisoned.cache).reader)
    skipped = steps_with(poisoned.row, n_samples, MAX_STEPS)
    assert skipped[0] == POISONED_STEP and len(skipped) >= 1
    assert [r["step"] for r in records] == list(range(1, MAX_STEPS + 1))
    for record in records:
        bad = record["step"] in skipped
        assert (record["loss"] is None) == bad and (record["grad_norm"] is None) == bad, record
        assert record["nonfinite_skips"] == sum(s <= record["step"] for s in skipped)
    # The skipped steps changed nothing: the later steps' losses are finite (no NaN reached the
    # weights) and the LR schedule did not move on (the step after a skip runs at the same LR).
    assert all(math.isfinite(r["loss"]) for r in records if r["step"] not in skipped)
    for step in skipped:
        if step < MAX_STEPS:
            assert records[step]["lr"] == records[step - 1]["lr"]
    assert (out / CHECKPOINTS_DIR / "latest").read_text().strip() == f"step{MAX_STEPS:08d}"
    line = next(line for line in result.stdout.splitlines() if line.startswith(f"step {MAX_STEPS}/{MAX_STEPS}"))
    assert line.endswith(f"| non-finite skips {len(skipped)}")
