"""A resumed run's log: ``metrics.jsonl`` and TensorBoard hold each step once
after a kill, with the resumed run's values (the runs that kill and resume for real are
tests/e2e/test_checkpoints.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.training import read_metrics
from janus_train.run.layout import METRICS_FILE


def logged_record(step: int, loss: float) -> dict[str, Any]:
    """A record with the fields of the console line (what the trainer logs)."""
    return {"step": step, "epoch": 0, "loss": loss, "token_loss": loss, "action_loss": 0.0, "grad_norm": 1.0,
            "lr": 1e-3, "samples_per_s": 1.0, "data_wait_share": 0.0, "step_s": 1.0}


def test_a_resumed_log_drops_later_records_from_metrics_and_tensorboard(tmp_path: Path) -> None:
    """A run logged steps 1..5 (the last line cut short by a kill) and resumes after step 3: steps
    4 and 5 are logged again, and both metrics.jsonl and TensorBoard hold each step once, with the
    values of the resumed run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from janus_train.loop.logs import RunLog

    killed = RunLog(tmp_path, tmp_path / METRICS_FILE, total_steps=5)
    for step in range(1, 6):
        killed.write(logged_record(step, loss=10.0 + step))
    killed.close()
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 6, "loss')  # a record the kill cut short
    resumed = RunLog(tmp_path, tmp_path / METRICS_FILE, total_steps=5)
    resumed.resume_at(3)
    for step in (4, 5):
        resumed.write(logged_record(step, loss=20.0 + step))
    resumed.close()

    records = read_metrics(tmp_path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0), (5, 25.0)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 24.0),
                                                                    (5, 25.0)]
