"""Precompute runs as processes (a real ``torchrun -m pipelines.precompute``, its 2 ranks forked by
torch's elastic agent, or ``janus-cache precompute``) and what their tests share: the small-shards profile of the session's shared caches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.forked_ranks import forked_launch
from helpers.profiles import REPO_ROOT
from helpers.shared_caches import SMALL_SHARDS

FRAMES_PER_SHARD = SMALL_SHARDS["frames_per_shard"]


SAMPLES_PER_SHARD = SMALL_SHARDS["samples_per_shard"]


RESOLUTION = "pad224"


RUN_TIMEOUT = 300


def precompute_command(
    data: Path, out: Path, profile: Path, *args: str, nproc: int | None = 2, cache_format: str = "zarr",
    workers: int = 1,
) -> list[str]:
    """The command of one precompute run: torchrun with ``nproc`` processes, or one plain process."""
    if nproc is None:
        launcher = [str(Path(sys.executable).parent / "janus-cache"), "precompute"]
    else:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                    "-m", "pipelines.precompute"]
    return [*launcher, str(data), "--out", str(out), "--profile", str(profile), "--format", cache_format,
            "--workers", str(workers), *args]


def run_env() -> dict[str, str]:
    """One compute thread per process, as torchrun gives its ranks: the test machine is shared, and
    an oversubscribed OpenMP pool makes a plain process many times slower."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def precompute_on_ranks(data: Path, out: Path, profile: Path, *args: str, cache_format: str = "zarr",
                        kill_when: Callable[[], bool] | None = None) -> subprocess.CompletedProcess[str]:
    """:func:`precompute_command`'s 2-process run, its ranks started as torchrun starts them, each
    forked from a process that imported the command once (:mod:`helpers.forked_ranks`; ``kill_when``:
    SIGKILL of every rank once it holds)."""
    return forked_launch("pipelines.precompute", data, "--out", out, "--profile", profile, "--format", cache_format,
                         "--workers", "1", *args, env=run_env(), timeout=RUN_TIMEOUT, kill_when=kill_when)


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=REPO_ROOT, env=run_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False)


def run_in_process(capsys: pytest.CaptureFixture[str], data: Path | str, out: Path, profile: Path,
                   **options: object) -> subprocess.CompletedProcess[str]:
    """What ``janus-cache precompute DATA --out OUT --profile PROFILE --workers 1`` does, run in this
    process (the same entry point, without the start of a process): its exit code and what it printed."""
    from pipelines.precompute_run import Options
    from pipelines.precompute_run import run as precompute

    capsys.readouterr()
    code = precompute(Options(data, out, profile=str(profile), workers=1, **options))
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["janus-cache", "precompute", str(data)], code, printed.out, printed.err)


def output(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def succeeded(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode == 0


def tail(result: subprocess.CompletedProcess[str]) -> str:
    """An assertion message: the exit code and the end of the run's output."""
    return f"exit {result.returncode}:\n{output(result)[-4000:]}"


def flip_byte(path: Path) -> None:
    """Change one byte in the middle of ``path`` (same size: only the checksum notices)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("precompute")


@pytest.fixture(scope="module")
def profile(small_shards_profile: Path) -> Path:
    """The tiny profile with small shards: the one the session's shared ``small_shards_cache`` is made with."""
    return small_shards_profile


def copy_cache(cache: Path, target: Path) -> Path:
    return Path(shutil.copytree(cache, target))

