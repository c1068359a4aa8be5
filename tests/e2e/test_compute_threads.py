"""Numbers a user plans with (issue 25 item 4): compute threads per process and plan's time model.

* A process runs ``cores // processes on the node - 1`` torch threads (one core of its share left
  to its shard reader and writer), at least one, unless the user set ``OMP_NUM_THREADS``; torch's
  own default (every core of the machine) oversubscribed a one-process precompute several times.
* ``janus-cache plan`` times the encoder with the threads precompute would give each process,
  assumes precompute's default decode workers, and counts the run's fixed costs (setup measured in
  the plan's own process, one worker-process start per spawn precompute waits for).

The calibration's figures (plan vs a real precompute on the development machine) are in the
issue's closing note; no test times anything.
"""

from __future__ import annotations

import dataclasses

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from janus_cache.plan import Plan
from janus_cache.sample_data import write_sample_data
from janus_cache.threads import compute_threads, default_decode_workers, usable_cores

JANUS_CACHE = Path(sys.executable).parent / "janus-cache"


@pytest.mark.parametrize(("cores", "processes", "threads"), [
    (2, 1, 1),     # this laptop: one core for the encoder, one for the reader and writer
    (16, 1, 15),
    (16, 2, 7),
    (64, 8, 7),    # an 8-GPU node: 8 cores per process
    (8, 8, 1),
    (1, 1, 1),     # never zero
    (4, 16, 1),    # more processes than cores
])
def test_a_process_gets_its_share_of_the_cores_less_one_for_its_pipeline(cores: int, processes: int,
                                                                          threads: int) -> None:
    assert compute_threads(cores, processes) == threads


def test_the_time_estimate_is_the_fixed_costs_plus_the_measured_rates_per_process() -> None:
    plan = Plan(episodes=1, frames=100, samples=80, frames_per_sample=9, frame_shape=(224, 224),
                feature_shape=(256, 128), probe_samples=4, frame_bytes_raw=1, frame_bytes=1.0, feature_bytes_raw=1,
                feature_bytes=1.0, text_bytes_per_sample=1.0, decode_seconds_per_frame=0.02,
                encode_seconds_per_window=0.5, store_seconds_per_frame=0.001, setup_seconds=12.0,
                worker_start_seconds=5.0, compute_threads=1)
    # One process without a decode pool waits for one spawn (its index worker); a decode pool adds
    # one, several processes two (the launcher's start; the ranks' rendezvous and its teardown).
    assert plan.worker_starts(1, 1) == 1 and plan.worker_starts(1, 2) == 2 and plan.worker_starts(2, 2) == 4
    assert plan.fixed_seconds(1, 2) == pytest.approx(12.0 + 2 * 5.0)
    assert plan.seconds(1, 2) == pytest.approx(22.0 + 100 * 0.02 / 2 + 100 * 0.001 + 80 * 0.5)
    assert plan.seconds(2, 1) == pytest.approx(27.0 + 100 * 0.02 / 2 + 100 * 0.001 / 2 + 80 * 0.5 / 2)
    # Processes sharing the cores do their per-row work one core-share at a time: 2 processes of 1
    # thread (+1 core for their shard reader/writer) on 2 cores run no faster than one, except the
    # decode pool (sized by the cores) and, on an accelerator, the encoder (one device per process).
    on_two_cores = dataclasses.replace(plan, cores=2)
    assert on_two_cores.busy_at_once(2) == 1 and on_two_cores.busy_at_once(1) == 1
    assert on_two_cores.seconds(2, 1) == pytest.approx(27.0 + 100 * 0.02 / 2 + 100 * 0.001 + 80 * 0.5)
    on_gpus = dataclasses.replace(on_two_cores, encoder_on_cpu=False)
    assert on_gpus.seconds(2, 1) == pytest.approx(27.0 + 100 * 0.02 / 2 + 100 * 0.001 + 80 * 0.5 / 2)
    assert dataclasses.replace(plan, cores=16).busy_at_once(8) == 8
    said = plan.format(1, 2)
    assert "(start-up 22 s, decode 20.0 ms/frame, encode 500.0 ms/window with 1 thread(s);" in said
    assert plan.to_dict(1, 2)["fixed_seconds"] == 22.0


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
    assert f"with {compute_threads(usable_cores(), 1)} thread(s);" in time_line, time_line
