"""Compute threads in real processes: a user's OMP_NUM_THREADS wins, ``janus-cache plan`` times the
encoder with the threads precompute gives, and precompute sizes its threads from the cores it is
given. (The rule and the estimate, in process: tests/unit/test_compute_threads.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from janus_core.plural import plural
from janus_core.sample_data import write_sample_data
from janus_core.system.threads import compute_threads, default_decode_workers, usable_cores

JANUS_CACHE = Path(sys.executable).parent / "janus-cache"


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_data(tmp_path_factory.mktemp("threads") / "data", episodes=1, steps=3, seed=0)


def plan_json(data: Path, *args: str, threads_env: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads_env is not None:
        env["OMP_NUM_THREADS"] = threads_env
    result = subprocess.run([str(JANUS_CACHE), "plan", str(data), "--resolution", "pad56", "--probe", "1", "--json",
                             *args], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_plan_times_the_encoder_with_precomputes_threads_and_decode_workers(small_dataset: Path) -> None:
    alone = plan_json(small_dataset)
    assert alone["compute_threads"] == compute_threads(usable_cores(), 1)
    assert alone["decode_workers"] == default_decode_workers(1) == usable_cores()
    two = plan_json(small_dataset, "--nproc", "2")
    assert two["compute_threads"] == compute_threads(usable_cores(), 2)
    assert two["decode_workers"] == default_decode_workers(2)
    # The fixed costs are measured, not left out: setup (imports, index, models, probe) and the
    # start of a worker process precompute will spawn.
    assert alone["setup_seconds"] > 0 and alone["worker_start_seconds"] > 0
    assert alone["fixed_seconds"] == pytest.approx(
        alone["setup_seconds"] + (1 + (alone["decode_workers"] > 1)) * alone["worker_start_seconds"],
        abs=0.06)  # the index worker, and the decode pool when there is one
    rates = (alone["frames"] * (alone["decode_seconds_per_frame"] / alone["decode_workers"]
                                + alone["store_seconds_per_frame"]) + alone["samples"] * alone["encode_seconds_per_window"])
    assert alone["estimated_seconds"] == pytest.approx(alone["fixed_seconds"] + rates, abs=0.11)


def test_a_users_omp_num_threads_wins(small_dataset: Path) -> None:
    # A value other than janus's own choice (torch caps it at the machine's cores).
    wanted = 1 if compute_threads(usable_cores(), 1) > 1 else min(2, usable_cores())
    assert plan_json(small_dataset, threads_env=str(wanted))["compute_threads"] == wanted


def test_precompute_sizes_its_threads_from_the_cores_it_is_given(small_dataset: Path, tmp_path: Path) -> None:
    """One process on this node, OMP_NUM_THREADS unset: its share of the cores less one."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    result = subprocess.run([str(JANUS_CACHE), "precompute", str(small_dataset), "--out", str(tmp_path / "cache"),
                             "--resolution", "pad56", "--workers", "1"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    time_line = next(line for line in result.stdout.splitlines() if line.strip().startswith("time "))
    assert f"with {plural(compute_threads(usable_cores(), 1), 'thread')};" in time_line, time_line
