"""The non-finite guard's report, as a function: a non-finite gradient norm with
finite losses names every rank's samples (the runs on a poisoned cache: tests/e2e/test_nonfinite.py)."""

from __future__ import annotations


def test_a_non_finite_gradient_norm_with_finite_losses_names_every_rank_s_samples() -> None:
    """No rank's loss shows the fault, so the report lists the step's samples of every rank."""
    from janus_train.loop.nonfinite import nonfinite_message

    per_rank = [(False, [], ["a/0", "a/1"]), (False, [], ["b/0", "b/1"])]
    assert nonfinite_message(7, 2.5, float("inf"), per_rank, nonfinite_skip=False) == (
        "non-finite gradient norm at step 7 (loss 2.5, gradient norm inf) on one of rank 0 (samples a/0, a/1); "
        "rank 1 (samples b/0, b/1); stopped on every rank, nothing of step 7 was saved")
