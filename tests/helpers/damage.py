"""Helpers shared by several test modules (moved from tests/test_damage_training.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers.profiles import REPO_ROOT, write_test_profile

N_PROC = 2  # the ranks of a launched training


MAX_STEPS = 4


def write_profile(path: Path, **train: object) -> Path:
    write_test_profile(path, cache={"samples_per_shard": 1})
    data = yaml.safe_load(path.read_text())
    data["train"].update({"epochs": 100, "max_steps": MAX_STEPS, "save_every": 1, "save_total_limit": 10,
                          "log_every": 1, "warmup_ratio": 0.0, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def error_lines(result: Any) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]


RUN_TIMEOUT_S = 300  # start-up on a loaded 2-core machine; a hang fails the test at this point


class OneProcess:
    """The collective of a single process (what draw_step agrees through, without a process group)."""

    def sum(self, values: list[float]) -> list[float]:
        return list(values)

    def gather(self, value: Any) -> list[Any]:
        return [value]


STOP_GRACE_S = 60


def start_time(pid: int) -> str | None:
    """When ``pid`` started (/proc's stat field 22; None once it has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def launch(launcher: str, *args: str | Path, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m LAUNCHER --standalone --nproc_per_node 2 -m pipelines.train ARGS`` as a real launch.

    Its output goes to files, not pipes, so a process that outlives the launch cannot block the test
    reading them. Still running after ``timeout`` seconds fails the test: the launcher is asked to
    stop its ranks (SIGTERM), and ``STOP_GRACE_S`` later every process the launch started (recorded
    while it ran: the ranks are in sessions of their own, out of reach of a signal to the launcher's
    group) is SIGKILLed by pid.
    """
    from helpers.processes import alive, descendants

    command = [sys.executable, "-m", launcher, "--standalone", f"--nproc_per_node={N_PROC}",
               "-m", "pipelines.train", *map(str, args)]
    with tempfile.TemporaryDirectory() as logs:
        stdout_file, stderr_file = Path(logs, "stdout"), Path(logs, "stderr")
        with open(stdout_file, "w") as out, open(stderr_file, "w") as err:
            process = subprocess.Popen(command, cwd=REPO_ROOT, env=dict(os.environ), stdout=out, stderr=err,
                                       start_new_session=True)
        started: dict[int, str] = {}  # pid -> its start time: a pid reused since is not the launch's

        def record() -> None:
            for pid in descendants(process.pid) - started.keys():
                if (since := start_time(pid)) is not None:
                    started[pid] = since

        def ended_by(deadline: float) -> bool:
            while process.poll() is None and time.monotonic() < deadline:
                record()
                time.sleep(0.5)
            return process.poll() is not None

        ended = ended_by(time.monotonic() + timeout)
        if not ended:
            process.send_signal(signal.SIGTERM)  # the launcher stops its ranks after their step
            ended_by(time.monotonic() + STOP_GRACE_S)
            record()
        process.kill()
        for pid, since in started.items():  # whatever is left, ended or not (none, normally)
            if alive(pid) and start_time(pid) == since:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        process.wait()
        stdout, stderr = stdout_file.read_text(), stderr_file.read_text()
    if not ended:
        pytest.fail(f"the run did not end within {timeout} s:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_train(*args: str | Path, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``python -m pipelines.launch`` (what ``make train`` runs) on 2 processes (:func:`launch`)."""
    return launch("pipelines.launch", *args, timeout=timeout)


def copies(clean_caches: tuple[Path, Path, Path], dest: Path) -> tuple[Path, Path]:
    """Writable copies of caches a and b of ``(profile, a, b)`` under ``dest``."""
    import shutil

    _, a, b = clean_caches
    return Path(shutil.copytree(a, dest / "a")), Path(shutil.copytree(b, dest / "b"))


# The damaged caches of the training tests (tests/unit/test_damaged_reads.py, tests/e2e/test_damage_training.py):
# 2 episodes x 4 steps, one sample per feature shard; micro-batch 1, gradient accumulation 2 on 2
# ranks, so a step takes 4 samples and an epoch of 8 samples is 2 steps. The damaged sample is rank
# 1's first micro-batch of step 2.
PER_RANK_STEP, N_SAMPLES = 2, 8
DAMAGED_RANK, DAMAGED_STEP = 1, 2
TEXT_COLUMNS = ("key", "source", "instruction", "subinstruction", "description_2d", "description_3d", "episode_id")
NUMERIC_COLUMNS = ("action", "step", "window_rows")


def sample_table_arrays() -> tuple[str, ...]:
    """Every array of a cache's samples table, ``column[/part]``."""
    from janus_cache.store.layout import TEXT_OFFSETS, TEXT_PAYLOAD

    return (*(f"{c}/{part}" for c in TEXT_COLUMNS for part in (TEXT_PAYLOAD, TEXT_OFFSETS)), *NUMERIC_COLUMNS)


SAMPLE_TABLE_ARRAYS = sample_table_arrays()
DAMAGE_TARGETS = (*SAMPLE_TABLE_ARRAYS, "frames", "features")


def training_order() -> Any:
    """The trainer's sample order of the cache (seed 0)."""
    from janus_train.data.mixture import Mixture

    return Mixture((N_SAMPLES,), (1.0,), seed=0)


@dataclass(frozen=True)
class Damaged:
    profile: Path
    cache: Path
    file: Path
    key: str
    row: int


def damage_the_drawn_feature(profile: Path, clean: Path, dest: Path) -> Damaged:
    """A copy of ``clean`` at ``dest`` with one byte flipped in the feature shard of the sample rank
    ``DAMAGED_RANK`` draws first in step ``DAMAGED_STEP``."""
    import shutil

    from janus_core.profile import load_profile
    from janus_train.loop.parts import open_training_cache

    cache = Path(shutil.copytree(clean, dest))
    reader = open_training_cache(load_profile(profile), cache).reader
    assert len(reader) == N_SAMPLES
    row = training_order().rank_rows(0, DAMAGED_RANK, N_PROC)[PER_RANK_STEP]
    key = reader.sample(row).key
    file = reader.shard_file(reader.features_array, row)  # one sample per shard
    flip_byte(file, 20)
    return Damaged(profile, cache, file, key, row)


def damaged_copy(clean_zarr: tuple[Path, Path], target: str, dest: Path) -> tuple[Path, Path]:
    """(cache, file): a copy of the clean cache with one byte flipped in the first shard of ``target``
    (a samples-table array ``column[/part]``, ``frames`` or ``features``)."""
    import shutil

    from janus_cache.store.layout import SAMPLES_TABLE, table_group
    from janus_core.profile import load_profile
    from janus_train.loop.parts import open_training_cache

    profile, clean = clean_zarr
    cache = Path(shutil.copytree(clean, dest))
    reader = open_training_cache(load_profile(profile), cache).reader
    array = {"frames": reader.frames_array, "features": reader.features_array}.get(
        target, f"{table_group(SAMPLES_TABLE)}/{target}")
    file = reader.shard_file(array, 0)
    flip_byte(file, 0)
    return cache, file
