"""Helpers shared by several test modules (moved from tests/test_sources.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profiles import REPO_ROOT, write_test_profile
from janus_cache.sample_data import write_sample_data
from janus_cache.store.layout import SAMPLES_TABLE
from janus_cache.verify import open_for_checks

ROWS_PER_SHARD = 4


STEPS = 5


RUN_TIMEOUT = 300


def janus_cache(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """One ``janus-cache`` command as a user runs it (one compute thread: the machine is shared)."""
    command = [str(Path(sys.executable).parent / "janus-cache"), *(str(a) for a in args)]
    return subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)


def precompute(out: Path, profile: Path, *sources: str | Path, cache_format: str = "zarr",
               ) -> subprocess.CompletedProcess[str]:
    return janus_cache("precompute", *sources, "--out", out, "--profile", profile, "--format", cache_format,
                       "--workers", "1")


def verify(cache: Path, profile: Path, data: str | Path, *args: str) -> subprocess.CompletedProcess[str]:
    return janus_cache("verify", cache, "--profile", profile, "--data", data, "--checksums", "none", *args)


def tail(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}:\n{(result.stdout + result.stderr)[-4000:]}"


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *named: str) -> str:
    """The run failed with exactly one ``error:`` line, no traceback, naming each of ``named``."""
    assert result.returncode != 0, tail(result)
    assert "Traceback" not in result.stderr, tail(result)
    errors = error_lines(result)
    assert len(errors) == 1, tail(result)
    for text in named:
        assert text in errors[0], f"{text!r} not in {errors[0]!r}"
    return errors[0]


def cache_keys(cache: Path) -> list[str]:
    """The sample keys of a cache of either format, in row order (its samples table)."""
    return open_for_checks(cache).keys(SAMPLES_TABLE)


@pytest.fixture(scope="session")
def source_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny profile with 4 rows per shard: the 10 frames and samples of source A end in a
    partially filled shard (rows 8-9), which an append must rewrite."""
    return write_test_profile(tmp_path_factory.mktemp("profiles") / "sources.yaml",
                              cache={"frames_per_shard": ROWS_PER_SHARD, "samples_per_shard": ROWS_PER_SHARD})


@pytest.fixture(scope="session")
def sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two small datasets (read-only; copy to change one): A with 2 episodes, B with 1, 5 frames each.
    Both name their episodes ``episode_0000``...: only the source name keeps their keys apart."""
    root = tmp_path_factory.mktemp("sources")
    return (write_sample_data(root / "A", episodes=2, steps=STEPS, seed=0),
            write_sample_data(root / "B", episodes=1, steps=STEPS, seed=1))

