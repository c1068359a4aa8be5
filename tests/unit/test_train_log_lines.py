"""Readable training logs, as functions: the step line names every part, the ETA
averages the steps after the first, and Weights & Biases is off unless the profile names a project
(the runs' own logs are tests/e2e/test_train_logs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_train.loop.logs import Eta, check_wandb, step_line


def test_the_line_names_step_total_epoch_loss_parts_lr_speed_wait_and_eta() -> None:
    record = {"step": 30, "epoch": 2, "loss": 1.5, "token_loss": 1.25, "action_loss": 0.25, "grad_norm": 0.5,
              "lr": 1e-4, "samples_per_s": 12.5, "data_wait_share": 0.07, "step_s": 2.0, "nonfinite_skips": 0}
    assert step_line(record, 100, eta_s=3725.4) == (
        "step 30/100 ep 2 | loss 1.5000 (tok 1.2500 act 0.2500) grad 0.5 | lr 1.00e-04 | 12.50 samples/s "
        "wait 7% | eta 1:02:05")
    skipped = {**record, "loss": None, "token_loss": None, "grad_norm": None, "nonfinite_skips": 1}
    assert step_line(skipped, 100, 0.0).startswith("step 30/100 ep 2 | loss nan (tok nan act 0.2500) grad nan")
    assert step_line(skipped, 100, 0.0).endswith("| eta 0:00:00 | non-finite skips 1")


def test_the_eta_averages_the_steps_after_the_first() -> None:
    eta = Eta(total_steps=10)
    eta.update(1, now=100.0)  # a slow first step (warm-up) is not averaged in
    assert eta.seconds_left(step_s=50.0) == 50.0 * 9
    eta.update(2, now=102.0)
    eta.update(4, now=106.0)
    assert eta.seconds_left(step_s=50.0) == pytest.approx(2.0 * 6)


def test_weights_and_biases_is_off_unless_the_profile_names_a_project(tmp_path: Path) -> None:
    check_wandb("", tmp_path / "p.yaml")  # off: nothing to check, whether or not it is installed
