"""Training never consumes damaged cache data: it stops naming the file and sample, or skips and counts.

Real caches of 2 episodes x 4 steps (tiny profile, one sample per feature shard), damaged after
precompute the way a disk does (one flipped byte), which the trainer's start-up check (shard
presence and size, no hashing) lets through: the damage is found when the sample is read.

The runs: 2 processes started by torch's elastic agent (helpers.training.train_on_ranks;
the killed launcher: a real ``pipelines.launch``), DeepSpeed ZeRO-3 over gloo; micro-batch 1, gradient
accumulation 2, so a step takes 4 samples and an epoch of 8 samples is 2 steps. The damaged
sample is rank 1's first micro-batch of step 2. The clean cache is the session's
(helpers.shared_runs); the start-up check and a step's reads in one process are
tests/unit/test_damaged_reads.py.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.damage import (
    DAMAGED_RANK,
    DAMAGED_STEP,
    MAX_STEPS,
    N_PROC,
    PER_RANK_STEP,
    Damaged,
    damage_the_drawn_feature,
    damaged_copy,
    error_lines,
    flip_byte,
    training_order,
    write_profile,
)
from helpers.processes import Launch
from helpers.profiles import REPO_ROOT
from helpers.shared_runs import OneSampleShards
from helpers.training import assert_succeeded, train_on_ranks
from janus_cache.store.damage import REPAIR_HINT
from janus_cache.store.layout import TEXT_PAYLOAD, wds_shard_name
from janus_cache.store.wds_store import encode_key
from janus_core.profile import load_profile
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples
from janus_train.run.layout import CHECKPOINTS_DIR, METRICS_FILE
from pipelines.precompute_run import Options, run


@pytest.fixture(scope="module")
def workdir(one_sample_shards: OneSampleShards, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a folder of this module's, the sample data of the session's clean cache)."""
    one_sample_shards.cache("a")
    return tmp_path_factory.mktemp("damage-training"), one_sample_shards.data("a")


@pytest.fixture(scope="module")
def clean_zarr(one_sample_shards: OneSampleShards) -> tuple[Path, Path]:
    """(profile, cache): the session's intact zarr cache, read-only; tests damage copies of it."""
    return one_sample_shards.profile, one_sample_shards.cache("a")


@pytest.fixture(scope="module")
def damaged_zarr(workdir: tuple[Path, Path], clean_zarr: tuple[Path, Path]) -> Damaged:
    return damage_the_drawn_feature(*clean_zarr, workdir[0] / "zarr")


@pytest.fixture(scope="module")
def builder(clean_zarr: tuple[Path, Path]) -> Any:
    from janus_train.build import prompt_builder

    return prompt_builder(load_profile(clean_zarr[0]))


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines()]


def test_a_damaged_sample_stops_every_rank_naming_the_shard_file_and_the_sample(
    damaged_zarr: Damaged, tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", damaged_zarr.cache, "--profile", damaged_zarr.profile,
                            "--no-export")
    output = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 1, "\n".join(output)
    reports = error_lines(result)
    assert len(reports) == 1, "\n".join(output)
    assert reports[0].startswith(f"error: step {DAMAGED_STEP}, rank {DAMAGED_RANK}: damaged cache data: "
                                 f"{damaged_zarr.file}: checksum mismatch (crc32c) (read for sample {damaged_zarr.key})")
    assert "janus_cache/store" not in result.stderr  # no traceback through the reader
    # Nothing of the damaged step was trained or saved.
    assert (out / CHECKPOINTS_DIR / "latest").read_text().strip() == "step00000001"
    assert [r["step"] for r in records(out)] == [1]


def damaged_draws(row: int, step: int) -> int:
    """How often the ranks' loaders have drawn ``row`` by the end of ``step`` when each damaged draw
    is left out and the micro-batch taken from the next row (``damaged_samples: skip``)."""
    total = 0
    for rank in range(N_PROC):
        rows = itertools.chain.from_iterable(
            training_order().rank_rows(epoch, rank, N_PROC) for epoch in itertools.count())
        good = 0
        while good < step * PER_RANK_STEP:
            if next(rows) == row:
                total += 1
            else:
                good += 1
    return total


def test_with_skip_the_run_leaves_damaged_samples_out_and_counts_them(damaged_zarr: Damaged, tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "skip.yaml", damaged_samples="skip")
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", damaged_zarr.cache, "--profile", profile, "--no-export")
    assert_succeeded(result)
    assert not error_lines(result)
    logged = records(out)
    assert [r["step"] for r in logged] == list(range(1, MAX_STEPS + 1))
    assert [r["damaged_skips"] for r in logged] == [damaged_draws(damaged_zarr.row, s) for s in range(1, MAX_STEPS + 1)]
    assert logged[-1]["damaged_skips"] >= 1
    line = next(line for line in result.stdout.splitlines() if line.startswith(f"step {MAX_STEPS}/{MAX_STEPS}"))
    assert f"| damaged samples skipped {logged[-1]['damaged_skips']}" in line


def test_a_flipped_action_digit_in_a_tar_stops_naming_the_tar_and_the_sample(
    workdir: tuple[Path, Path], tmp_path: Path,
) -> None:
    """Read by 2 DataLoader worker processes per rank: the error crosses them intact."""
    root, data = workdir
    profile = write_profile(root / "wds.yaml", num_workers=2)
    cache = root / "wds"
    assert run(Options(data, cache, str(profile), cache_format="wds", workers=1)) == 0
    reader = open_training_cache(load_profile(profile), cache).reader
    tar = reader.root / reader.array / wds_shard_name(0)  # rank 0's first shard: sample row 0
    key = next(iter(reader.shard(0))).key
    content = tar.read_bytes()
    at = content.index(b'"action": ', content.index(f"{encode_key(key)}.json".encode())) + len(b'"action": ')
    digit = content[at:at + 1]
    tar.write_bytes(content[:at] + (b"1" if digit != b"1" else b"2") + content[at + 1:])

    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", cache, "--profile", profile, "--no-export")
    assert result.returncode == 1, result.stdout + result.stderr
    reports = error_lines(result)
    assert len(reports) == 1 and f"{tar}: member {encode_key(key)}.json fails its crc32c" in reports[0], reports
    assert f"(read for sample {key})" in reports[0]
    assert not (out / CHECKPOINTS_DIR / "latest").exists()


# -- Damage anywhere a sample is read ends the run on every rank --------------------------------
#
# A damaged chunk read by every sample (a table column, a frame shard) would leave every
# micro-batch of the training rows empty, the loader drawing on, epoch after epoch, on every rank,
# a run that printed its start line and never ended: it ends the run instead.

H800_PROFILE = REPO_ROOT / "configs" / "profiles" / "h800.yaml"
H800_WORKERS = int(yaml.safe_load(H800_PROFILE.read_text())["train"]["num_workers"])


@pytest.mark.parametrize(("target", "workers", "policy"), [
    ("description_2d/utf8", 0, "stop"),  # the reported run: a text column, the tiny profile's loader
    ("window_rows", H800_WORKERS, "skip"),  # every sample damaged: skip has nothing to train on
    ("frames", H800_WORKERS, "stop"),
    ("features", H800_WORKERS, "stop"),
])
def test_a_run_reading_damaged_data_ends_on_every_rank_with_one_line(
    workdir: tuple[Path, Path], clean_zarr: tuple[Path, Path], tmp_path: Path,
    target: str, workers: int, policy: str,
) -> None:
    cache, file = damaged_copy(clean_zarr, target, tmp_path / "cache")
    profile = write_profile(tmp_path / "profile.yaml", num_workers=workers, damaged_samples=policy)
    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", cache, "--profile", profile, "--no-export")
    assert result.returncode == 1, result.stdout + result.stderr
    reports = error_lines(result)
    assert len(reports) == 1, result.stdout + result.stderr
    assert reports[0].startswith("error: step ") and f": damaged cache data: {file}: checksum mismatch" in reports[0]
    if policy == "skip":
        assert reports[0].endswith("train.damaged_samples: skip has nothing left to train on)")
    assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize(("policy", "workers"), [("stop", 0), ("skip", H800_WORKERS)])
def test_damaged_validation_data_stops_every_rank_or_is_skipped_and_counted(
    clean_zarr: tuple[Path, Path], builder: Any, tmp_path: Path, policy: str, workers: int,
) -> None:
    """One held-out episode of 2 (4 validation samples, 2 per rank), validated after the only step;
    the feature of the last validation sample is damaged. The rank that reads it does not crash in
    the model's forward with a traceback while the other waits in ZeRO-3's gathers."""
    from janus_train.config import load_train_settings
    from janus_train.loop.validation import plan_validation

    profile = write_profile(tmp_path / "profile.yaml", num_workers=workers, damaged_samples=policy,
                            val_episodes=1, val_max_samples=0)
    cache = Path(shutil.copytree(clean_zarr[1], tmp_path / "cache"))
    reader = open_training_cache(load_profile(profile), cache).reader
    _, validation = plan_validation(load_train_settings(load_profile(profile)), CachedSamples(reader, builder))
    assert validation is not None and len(validation.rows) == 4
    file = reader.shard_file(reader.features_array, validation.rows[-1])  # one sample per shard
    flip_byte(file, 0)

    out = tmp_path / "run"
    result = train_on_ranks("--out", out, "--cache", cache, "--profile", profile, "--no-export", "--max-steps", "1")
    assert "Traceback" not in result.stdout + result.stderr
    if policy == "stop":
        assert result.returncode == 1, result.stdout + result.stderr
        reports = error_lines(result)
        assert len(reports) == 1, result.stdout + result.stderr
        assert reports[0].startswith("error: validation, rank ") and f": damaged cache data: {file}: " in reports[0]
        assert reports[0].endswith("(1 damaged validation sample; stopped on every rank, "
                                   "train.damaged_samples: skip would leave them out)")
        return
    assert_succeeded(result)
    logged = records(out)
    assert [(r["step"], r["val_samples"], r["val_damaged_skips"]) for r in logged] == [(1, 3, 1)]


def test_a_damaged_episode_column_read_for_the_hold_out_ends_every_rank_with_one_line(
    clean_zarr: tuple[Path, Path], tmp_path: Path,
) -> None:
    """Holding out episodes reads the samples' episode ids whole on every rank before training:
    damage there is the same one line on every rank (before: a traceback from each rank)."""
    cache, file = damaged_copy(clean_zarr, f"episode_id/{TEXT_PAYLOAD}", tmp_path / "cache")
    profile = write_profile(tmp_path / "profile.yaml", val_episodes=1)
    result = train_on_ranks("--out", tmp_path / "run", "--cache", cache, "--profile", profile, "--no-export")
    assert result.returncode == 1, result.stdout + result.stderr
    assert error_lines(result) == [f"error: damaged cache data: {file}: checksum mismatch (crc32c); {REPAIR_HINT}"], (
        result.stdout + result.stderr)
    assert "Traceback" not in result.stdout + result.stderr


# -- A launcher killed mid-validation leaves no process -----------------------------------------


def blocked_opening_a_fifo(pids: set[int]) -> bool:
    """Whether a thread of one of ``pids`` waits in open() for a writer to a named pipe (/proc's wchan)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                if (task / "wchan").read_text() in ("wait_for_partner", "fifo_open"):
                    return True
            except OSError:
                continue
    return False


def launch_and_stall(tmp_path: Path, cache: Path, profile: Path, hung: Path) -> Launch:
    """A training of ``cache`` through ``pipelines.launch`` (as ``make train`` starts it) whose shard
    ``hung``, once the run trains, becomes a named pipe nobody writes to: returned once a loader
    worker hangs in its read (as on a hung network file system). The caller cleans the launch up."""
    from helpers.processes import Launch

    launch = Launch("pipelines.train", "--out", tmp_path / "run", "--cache", cache, "--profile", profile,
                    "--no-export", log=tmp_path / "launch.log", launcher="pipelines.launch")
    try:
        launch.wait_until(lambda: "training " in launch.log.read_text(), "the run passed its start-up check")
        os.mkfifo(tmp_path / "fifo")
        os.replace(tmp_path / "fifo", hung)
        launch.wait_until(lambda: blocked_opening_a_fifo(launch.started), "a loader worker hangs reading the shard")
    except BaseException:
        launch.cleanup()
        raise
    return launch


def test_a_launcher_killed_while_a_loader_worker_hangs_in_a_validation_read_leaves_no_process(
    clean_zarr: tuple[Path, Path], builder: Any, tmp_path: Path,
) -> None:
    """Validation every step with a damaged held-out sample (``damaged_samples: skip``) and 2 loader
    workers per rank; once the run trains, another held-out sample's feature shard becomes a named
    pipe nobody writes to, so the loader worker that reads it hangs in the read (as on a hung network
    filesystem) and its rank waits for it. The launcher (``pipelines.launch``, as ``make train``
    starts it) is then SIGKILLed alone: no rank and no loader worker may be alive 10 s later.
    The forked worker too, which has no parent-death signal and whose watchdog never runs while it is
    blocked: nothing holds the launch's output pipes open."""
    from janus_train.config import load_train_settings
    from janus_train.loop.validation import plan_validation

    profile = write_profile(tmp_path / "profile.yaml", num_workers=2, damaged_samples="skip", val_episodes=1,
                            val_max_samples=0, eval_every=1, max_steps=10_000, save_every=10_000)
    cache = Path(shutil.copytree(clean_zarr[1], tmp_path / "cache"))
    reader = open_training_cache(load_profile(profile), cache).reader
    _, validation = plan_validation(load_train_settings(load_profile(profile)), CachedSamples(reader, builder))
    assert validation is not None and len(validation.rows) == 4
    flip_byte(reader.shard_file(reader.features_array, validation.rows[-1]), 0)
    hung = reader.shard_file(reader.features_array, validation.rows[1])  # not rows[0]: a rank's filler

    launch = launch_and_stall(tmp_path, cache, profile, hung)
    try:
        assert launch.kill_launcher() == [], "ranks or loader workers outlived the launcher"
    finally:
        launch.cleanup()


STALL_WAIT_S = 90
"""How long the test waits for the ranks after the read stalls (read_timeout_s 5, and a step's
collectives, on 2 shared cores)."""


def test_a_loader_worker_hung_in_a_read_ends_every_rank_within_the_read_timeout_naming_the_shard(
    clean_zarr: tuple[Path, Path], tmp_path: Path,
) -> None:
    """``train.read_timeout_s: 5`` and 2 loader workers per rank; once the run trains, one training
    sample's feature shard becomes a named pipe nobody writes to, so the loader worker that reads it
    waits in the read forever (a stalled network file system or object store: no error, no damage).
    Within the timeout every rank ends, with exit code 1 and one line naming the step, the rank and
    the shard, and no rank or loader worker is left (before: the other rank waited in its collective
    for gloo's 30 minutes; the test waits ``STALL_WAIT_S``)."""
    profile = write_profile(tmp_path / "profile.yaml", num_workers=2, read_timeout_s=5, max_steps=10_000,
                            save_every=10_000)
    cache = Path(shutil.copytree(clean_zarr[1], tmp_path / "cache"))
    reader = open_training_cache(load_profile(profile), cache).reader
    hung = reader.shard_file(reader.features_array, 0)  # one sample per shard: read once in every epoch

    launch = launch_and_stall(tmp_path, cache, profile, hung)
    try:
        try:
            launch.process.wait(timeout=STALL_WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run still waits {STALL_WAIT_S} s after the read stalled:\n"
                        f"{launch.log.read_text()[-3000:]}")
        assert launch.survivors() == [], "ranks or loader workers outlived the run"
    finally:
        launch.cleanup()
    printed = launch.log.read_text()
    assert launch.process.returncode == 1, printed[-3000:]
    assert "Traceback" not in printed, printed[-3000:]
    reports = [line for line in printed.splitlines() if line.startswith("error:")]
    assert len(reports) == 1, printed[-3000:]
    assert re.fullmatch(
        rf"error: step \d+, rank [01]: a read of {re.escape(str(hung))} has not returned in 5 s: a stalled file "
        r"system or object store \(not damage: the file is not rewritten\); every rank stopped "
        r"\(train.read_timeout_s\): the same command resumes from the last checkpoint once the file system answers "
        r"again", reports[0]), reports[0]
