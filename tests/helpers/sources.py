"""Datasets of several sources and ``janus-cache`` commands over them, shared by several test modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.profiles import REPO_ROOT
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


def janus_cache_in_process(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The same ``janus-cache`` command run in this process (its CLI, without the start of a
    process): exit code, stdout and stderr as a finished process's. An exception the command does
    not turn into an ``error:`` line is raised here, as the process would print its traceback."""
    from typer.testing import CliRunner

    from pipelines.cache_cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["janus-cache", *map(str, args)], result.exit_code, result.stdout,
                                       result.stderr)


def precompute_args(out: Path, profile: Path, *sources: str | Path, cache_format: str = "zarr") -> list[str | Path]:
    return ["precompute", *sources, "--out", out, "--profile", profile, "--format", cache_format, "--workers", "1"]


def precompute(out: Path, profile: Path, *sources: str | Path, cache_format: str = "zarr",
               ) -> subprocess.CompletedProcess[str]:
    return janus_cache(*precompute_args(out, profile, *sources, cache_format=cache_format))


def precompute_in_process(out: Path, profile: Path, *sources: str | Path, cache_format: str = "zarr",
                          ) -> subprocess.CompletedProcess[str]:
    return janus_cache_in_process(*precompute_args(out, profile, *sources, cache_format=cache_format))


def verify_args(cache: Path, profile: Path, data: str | Path, *args: str) -> list[str | Path]:
    return ["verify", cache, "--profile", profile, "--data", data, "--checksums", "none", *args]


def verify(cache: Path, profile: Path, data: str | Path, *args: str) -> subprocess.CompletedProcess[str]:
    return janus_cache(*verify_args(cache, profile, data, *args))


def verify_in_process(cache: Path, profile: Path, data: str | Path, *args: str) -> subprocess.CompletedProcess[str]:
    return janus_cache_in_process(*verify_args(cache, profile, data, *args))


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
