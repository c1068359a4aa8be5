"""The training loop's policies (janus_train.loop.policies), each in this process without DeepSpeed.

After every optimizer step the trainer hands the step to its policies in order; each does one job.
Here each runs on a hand-made step: the non-finite guard, the record's skip counts and sample keys,
the live check's and validation's schedules, logging to a real run log, the CUDA cache flush's
schedule, checkpoints saved into a real run directory (by a fake engine that writes one file per
rank, as DeepSpeed's save does), and the stop on a signal. What a whole run does with them is
tests/unit/test_loop_trainer.py (in this process) and tests/e2e/test_train.py (torchrun).
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.damage import OneProcess
from janus_train.checkpoint.elastic import DataLayout
from janus_train.checkpoint.store import CHECKSUMS_FILE, Checkpoints, tag_name
from janus_train.loop.logs import RunLog
from janus_train.loop.nonfinite import NonFiniteStep
from janus_train.loop.policies import (
    CheckpointWriter,
    FlushCudaCache,
    LiveCheck,
    LogRecords,
    NonFiniteGuard,
    PeriodicValidation,
    RecordSkips,
    SampleKeys,
    SaveEvery,
    StepDone,
    StopOnSignal,
    every,
)
from janus_train.loop.preemption import Preemption
from janus_train.loop.progress import Progress
from janus_train.run.layout import RunLayout

TOTAL = 6
CPU = torch.device("cpu")


def step_record(step: int, loss: float = 1.5, grad_norm: float = 0.5) -> dict[str, Any]:
    """The fields of a step's record that the console line and the guard read."""
    return {"step": step, "epoch": 0, "loss": loss, "token_loss": loss, "action_loss": 0.0, "grad_norm": grad_norm,
            "lr": 1e-3, "samples_per_s": 2.0, "data_wait_share": 0.1, "step_s": 0.5}


def micro_batch(*keys: str, features: bool = True) -> dict[str, Any]:
    return {"keys": list(keys), "features": torch.zeros(len(keys), 1) if features else None}


def done_at(step: int, *, loss: float = 1.5, grad_norm: float = 0.5, losses: tuple[float, ...] = (0.7, 0.8),
            applied: bool = True, progress: Progress | None = None, features: bool = True) -> StepDone:
    """Step ``step`` of a TOTAL-step run, two micro-batches of one sample each (keys s<step>a/b)."""
    progress = progress if progress is not None else Progress()
    progress.step = step
    micro = [micro_batch(f"s{step}a", features=features), micro_batch(f"s{step}b", features=features)]
    return StepDone(progress, TOTAL, step_record(step, loss, grad_norm), micro,
                    [torch.tensor(v) for v in losses], applied)


def steps_acted_on(policy: Any, make: Any = done_at) -> list[int]:
    """The steps 1..TOTAL at which ``policy`` changed the record or returned True."""
    acted = []
    for step in range(1, TOTAL + 1):
        done = make(step)
        before = dict(done.record)
        if policy.after_step(done) or done.record != before:
            acted.append(step)
    return acted


def test_every_counts_whole_intervals_and_zero_means_never() -> None:
    assert [s for s in range(1, 10) if every(3, s)] == [3, 6, 9]
    assert not any(every(0, s) for s in range(1, 10))


# ---------------------------------------------------------------------------- the guard


def test_a_finite_step_passes_the_guard_untouched() -> None:
    done = done_at(2)
    assert NonFiniteGuard("stop", OneProcess()).after_step(done) is False
    assert done.progress.nonfinite_skips == 0


def test_stop_refuses_a_non_finite_loss_naming_the_step_and_the_samples_of_the_bad_micro_batch() -> None:
    done = done_at(4, loss=math.nan, losses=(0.7, math.inf))
    with pytest.raises(NonFiniteStep) as refused:
        NonFiniteGuard("stop", OneProcess()).after_step(done)
    message = str(refused.value)
    assert message.startswith("non-finite loss at step 4 (loss nan, gradient norm 0.5) on rank 0 (samples s4b)")
    assert message.endswith("stopped on every rank, nothing of step 4 was saved")


def test_skip_counts_a_step_the_optimizer_skipped_and_refuses_one_it_applied() -> None:
    guard, progress = NonFiniteGuard("skip", OneProcess()), Progress(nonfinite_skips=2)
    assert guard.after_step(done_at(3, grad_norm=math.inf, applied=False, progress=progress)) is False
    assert progress.nonfinite_skips == 3
    # Only the gradient norm: every sample of the step is a suspect, and the update cannot be undone.
    with pytest.raises(NonFiniteStep, match=r"^non-finite gradient norm at step 5 .* on one of rank 0 "
                                            r"\(samples s5a, s5b\).*the optimizer step was applied and could not "
                                            r"be skipped\)$"):
        guard.after_step(done_at(5, grad_norm=math.inf, applied=True, progress=progress))
    assert progress.nonfinite_skips == 3


# ------------------------------------------------------------------------ the record's extras


def test_every_record_carries_the_skip_counts_so_far() -> None:
    done = done_at(2, progress=Progress(nonfinite_skips=1, damaged_skips=3))
    RecordSkips().after_step(done)
    assert (done.record["nonfinite_skips"], done.record["damaged_skips"]) == (1, 3)


def test_sample_keys_are_the_steps_keys_in_the_global_order() -> None:
    done = done_at(2)
    SampleKeys(OneProcess()).after_step(done)
    assert done.record["sample_keys"] == ["s2a", "s2b"]


def test_the_live_check_measures_the_first_micro_batch_every_n_steps_of_a_cached_run() -> None:
    measured: list[list[str]] = []

    def measure(batch: dict[str, Any]) -> dict[str, Any]:
        measured.append(batch["keys"])
        return {"live_feature_max_abs": 0.0}

    assert steps_acted_on(LiveCheck(2, measure)) == [2, 4, 6]
    assert measured == [["s2a"], ["s4a"], ["s6a"]]
    # A live run's batches hold no cached features: nothing to compare.
    assert steps_acted_on(LiveCheck(2, measure), lambda step: done_at(step, features=False)) == []


def test_validation_runs_every_n_steps_and_after_the_last_one() -> None:
    validate = PeriodicValidation(4, lambda: {"val_loss": 0.25, "val_best": True})
    assert steps_acted_on(validate) == [4, TOTAL]
    assert steps_acted_on(PeriodicValidation(0, lambda: {"val_loss": 0.25})) == [TOTAL]
    done = done_at(4)
    validate.after_step(done)
    assert (done.record["val_loss"], done.record["val_best"]) == (0.25, True)


# ----------------------------------------------------------------------------- the outputs


def test_records_of_every_nth_the_last_and_validated_steps_reach_the_run_log(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    layout = RunLayout(tmp_path / "run")
    log = RunLog(layout.root, layout.metrics, TOTAL)
    policy = LogRecords(log, 4, Checkpoints(layout.checkpoints))
    for step in range(1, TOTAL + 1):
        done = done_at(step)
        if step == 3:
            done.record["val_loss"] = 0.5
        policy.after_step(done)
    log.close()
    logged = [json.loads(line)["step"] for line in layout.metrics.read_text().splitlines()]
    assert logged == [3, 4, TOTAL]
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["3/6", "4/6", "6/6"]


def test_a_rank_without_the_log_writes_nothing(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    policy = LogRecords(None, 1, Checkpoints(layout.checkpoints))
    for step in range(1, TOTAL + 1):
        policy.after_step(done_at(step))
    assert not layout.root.exists()


def test_the_cuda_cache_flush_meets_every_rank_every_n_steps() -> None:
    met: list[int] = []
    flush = FlushCudaCache(2, CPU, lambda: met.append(len(met)))
    for step in range(1, TOTAL + 1):
        assert flush.after_step(done_at(step)) is False
    assert len(met) == 3
    FlushCudaCache(0, CPU, lambda: met.append(-1)).after_step(done_at(TOTAL))
    assert len(met) == 3


class FileEngine:
    """The engine's side of a checkpoint: DeepSpeed writes each rank's files into the tag's folder
    (here one, holding the client state) and, asked not to, no ``latest``."""

    def __init__(self) -> None:
        self.saves: list[str] = []

    def save_checkpoint(self, directory: str, tag: str, client_state: dict[str, Any], save_latest: bool) -> None:
        assert save_latest is False
        (Path(directory) / tag / "client_state.json").write_text(json.dumps(client_state["step"]))
        self.saves.append(tag)


def writer_on(run: Path, keep: int = 2) -> tuple[CheckpointWriter, FileEngine, Checkpoints]:
    checkpoints = Checkpoints(RunLayout(run).checkpoints)
    engine = FileEngine()
    layout = DataLayout(world=1, micro_batch=1, grad_accum=2, n_samples=36, seed=0, streaming=False,
                        sources=(("cache", 36, 1.0),))
    return CheckpointWriter(checkpoints, engine, layout, keep, {"total_steps": 6, "warmup_steps": 1}), engine, checkpoints


def test_checkpoints_every_n_steps_are_recorded_named_by_latest_and_rotated(tmp_path: Path) -> None:
    writer, engine, checkpoints = writer_on(tmp_path / "run", keep=2)
    policy, progress = SaveEvery(2, writer), Progress()
    for step in range(1, TOTAL + 1):
        assert policy.after_step(done_at(step, progress=progress)) is False
    assert engine.saves == [tag_name(2), tag_name(4), tag_name(6)]
    assert checkpoints.tags() == [tag_name(6), tag_name(4)]  # save_total_limit 2
    assert checkpoints.latest() == tag_name(6)
    assert (checkpoints.directory / tag_name(6) / CHECKSUMS_FILE).is_file()
    assert checkpoints.resumable().tag == tag_name(6)  # intact: every recorded file matches


def test_a_step_is_saved_once_and_its_checkpoint_holds_the_progress(tmp_path: Path) -> None:
    """The run's end saves after the last step, which save_every may have saved already; a resumed
    run does not save again the step it resumed at."""
    writer, engine, checkpoints = writer_on(tmp_path / "run")
    progress = Progress(step=4, epoch=1, position=8, nonfinite_skips=1, damaged_skips=2)
    writer.save(progress)
    writer.save(progress)
    assert engine.saves == [tag_name(4)]
    state = progress.client_state(writer.layout, rng={}, lr_schedule=writer.lr_schedule)
    assert Progress.from_state(state) == progress
    assert state["data_layout"] == writer.layout.to_dict()


def test_a_stop_signal_ends_the_run_after_the_step_it_arrived_in(monkeypatch: pytest.MonkeyPatch) -> None:
    # Arming also has every later fork of this process die with it: not for the test session's forks.
    monkeypatch.setattr("janus_train.loop.preemption.forks_die_with_this_process", lambda: None)
    preemption = Preemption(("SIGUSR2",)).arm()
    try:
        stop = StopOnSignal(preemption, CPU)
        assert stop.after_step(done_at(1)) is False
        signal.raise_signal(signal.SIGUSR2)
        assert stop.after_step(done_at(2)) is True
        assert (preemption.stopping, preemption.stopped_by) == (True, "SIGUSR2")
    finally:
        preemption.disarm()
