"""Numbers a user plans with: compute threads per process and plan's time model.

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

import pytest

from janus_cache.plan import Plan
from janus_core.system.threads import compute_threads


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
    assert "(start-up 22 s, decode 20.0 ms/frame, encode 500.0 ms/window with 1 thread;" in said
    assert plan.to_dict(1, 2)["fixed_seconds"] == 22.0
