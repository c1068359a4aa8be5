"""What the training loop does after each optimizer step, one job per object.

The trainer runs a step (draws the micro-batches, forward, backward, optimizer step, the step's
record) and hands it to its policies in order, as a :class:`StepDone`; each policy does one thing:
refuse or count a non-finite step, put counts, sample keys, a live check or validation metrics in
the record, log it, flush the CUDA cache, save a checkpoint, start or collect its external evaluations,
or agree to stop on a signal. A policy
returns whether the run ends after this step.

Every rank runs the same policies at the same steps (several of them are collectives). What the
ranks agree through is a :class:`~janus_train.data.damaged.Collective` (the process group, or a
single process), what they act on is given (a run log, a checkpoint writer, a callable measuring
the model), so each policy runs in one process without DeepSpeed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from janus_cache.store.split import merge_rank_shares
from janus_train.checkpoint.elastic import DataLayout, rng_states
from janus_train.checkpoint.store import Checkpoints, tag_name
from janus_train.data.damaged import Collective
from janus_train.data.val_metric_names import VAL_LOSS
from janus_train.evals.evaluations import Evaluations
from janus_train.loop.logs import RunLog, write_alike
from janus_train.loop.nonfinite import NonFiniteStep, nonfinite_message
from janus_train.loop.preemption import Preemption
from janus_train.loop.progress import Progress


@dataclass
class StepDone:
    """One optimizer step as the policies after it see it: the run's progress (already counting the
    step), the step's record (policies add to it), this rank's micro-batches and their losses, and
    whether the optimizer applied the update (DeepSpeed's ZeRO optimizer itself skips a step whose
    global gradient norm is non-finite: weights, optimizer state and LR schedule untouched)."""

    progress: Progress
    total_steps: int
    record: dict[str, Any]
    micro: list[dict[str, Any]]
    losses: list[torch.Tensor]
    applied: bool = True

    @property
    def step(self) -> int:
        return self.progress.step

    @property
    def last(self) -> bool:
        """The run's last step (``total_steps``)."""
        return self.progress.step == self.total_steps


class AfterStep(Protocol):
    """A policy of the loop; every rank calls it after every step."""

    def after_step(self, done: StepDone) -> bool:
        """Act on the step just run; True ends the run after it."""


def every(interval: int, step: int) -> bool:
    """Whether ``step`` is one of every ``interval`` steps (0: none is)."""
    return bool(interval) and step % interval == 0


class ProcessGroup:
    """The ranks of the run's torch process group, as a :class:`Collective`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def sum(self, values: list[float]) -> list[float]:
        summed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return summed.tolist()

    def gather(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, value)
        return gathered


# ------------------------------------------------------------------------------- the record


@dataclass
class NonFiniteGuard:
    """``train.nonfinite``: a non-finite (all-reduced) loss or global gradient norm is the same
    verdict on every rank. ``skip``: counted when the optimizer skipped the update; ``stop`` (or an
    update that was applied) raises :class:`NonFiniteStep` on every rank, naming the step, the
    rank(s) and their samples, before anything of the step is logged or saved."""

    policy: str
    ranks: Collective

    def after_step(self, done: StepDone) -> bool:
        loss, grad_norm = done.record["loss"], done.record["grad_norm"]
        if math.isfinite(loss) and math.isfinite(grad_norm):
            return False
        skip = self.policy == "skip"
        if skip and not done.applied:
            done.progress.nonfinite_skips += 1
            return False
        finite = torch.isfinite(torch.stack(done.losses)).tolist()
        mine = (not all(finite), [key for ok, batch in zip(finite, done.micro) if not ok for key in batch["keys"]],
                [key for batch in done.micro for key in batch["keys"]])
        raise NonFiniteStep(nonfinite_message(done.step, loss, grad_norm, self.ranks.gather(mine), skip))


class RecordSkips:
    """Every record carries the run's counts of skipped steps and samples so far."""

    def after_step(self, done: StepDone) -> bool:
        done.record["nonfinite_skips"] = done.progress.nonfinite_skips
        done.record["damaged_skips"] = done.progress.damaged_skips
        return False


@dataclass
class SampleKeys:
    """``train.log_sample_keys``: the step's sample keys of every rank, in the order of the epoch's
    global sample sequence (to compare the data order of runs, e.g. after an elastic resume)."""

    ranks: Collective

    def after_step(self, done: StepDone) -> bool:
        per_rank = self.ranks.gather([key for batch in done.micro for key in batch["keys"]])
        done.record["sample_keys"] = merge_rank_shares(per_rank)
        return False


@dataclass
class LiveCheck:
    """``train.live_check_every``: every that many steps, the step's first cached micro-batch
    recomputed live (``measure`` returns the ``live_*`` metrics; every rank measures together).
    A micro-batch without cached features (a live run) has nothing to compare."""

    interval: int
    measure: Callable[[dict[str, Any]], dict[str, Any]]

    def after_step(self, done: StepDone) -> bool:
        if every(self.interval, done.step) and done.micro[0]["features"] is not None:
            done.record.update(self.measure(done.micro[0]))
        return False


@dataclass
class PeriodicValidation:
    """``train.eval_every``: the ``val_*`` metrics every that many steps and always after the last
    (``validate`` evaluates the current weights and offers them as the best checkpoint)."""

    interval: int
    validate: Callable[[], dict[str, Any]]

    def due(self, done: StepDone) -> bool:
        return done.last or every(self.interval, done.step)

    def after_step(self, done: StepDone) -> bool:
        if self.due(done):
            done.record.update(self.validate())
        return False


# -------------------------------------------------------------------------------- the outputs


@dataclass
class LogRecords:
    """``train.log_every``: the record of every that many steps, of the last one and of every
    validated one goes to the run log (rank 0 holds ``log``; every rank calls, so a full disk
    ends them alike); every step feeds the log's ETA."""

    log: RunLog | None
    interval: int
    checkpoints: Checkpoints

    def after_step(self, done: StepDone) -> bool:
        if self.log is not None:
            self.log.step_done(done.step)
        if every(self.interval, done.step) or done.last or VAL_LOSS in done.record:
            write_alike(self.log, done.record, self.checkpoints)
        return False


@dataclass
class FlushCudaCache:
    """``train.empty_cache_every``: every that many steps all ranks meet (``barrier``), so none
    waits on another's flush, and then empty the CUDA cache (nothing to flush on a CPU)."""

    interval: int
    device: torch.device
    barrier: Callable[[], None]

    def after_step(self, done: StepDone) -> bool:
        if every(self.interval, done.step):
            self.barrier()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return False


class CheckpointWriter:
    """Saves the run's checkpoint of a step, once per step: complete and checksummed before
    ``latest`` names it; the oldest beyond ``keep`` go (:meth:`Checkpoints.save`)."""

    def __init__(self, checkpoints: Checkpoints, engine: Any, layout: DataLayout, keep: int,
                 lr_schedule: dict[str, int]) -> None:
        self.checkpoints, self.engine, self.layout, self.keep = checkpoints, engine, layout, keep
        self.lr_schedule = lr_schedule
        self.saved_step = -1

    def save(self, progress: Progress) -> None:
        if self.saved_step == progress.step:
            return
        self.checkpoints.save(self.engine, tag_name(progress.step),
                              progress.client_state(self.layout, rng_states(), self.lr_schedule), keep=self.keep)
        self.saved_step = progress.step


@dataclass
class SaveEvery:
    """``train.save_every``: a checkpoint every that many steps (the run's end saves its own)."""

    interval: int
    writer: CheckpointWriter

    def after_step(self, done: StepDone) -> bool:
        if every(self.interval, done.step):
            self.writer.save(done.progress)
        return False


@dataclass
class EvaluateCheckpoints:
    """``train.eval_command`` (rank 0): the evaluation of every checkpoint ``train.save_every`` saves
    starts once it is saved, detached (:meth:`Evaluations.launch`); the run's end starts its own."""

    interval: int
    evaluations: Evaluations

    def after_step(self, done: StepDone) -> bool:
        if every(self.interval, done.step):
            self.evaluations.launch(done.step)
        return False


@dataclass
class CollectEvaluations:
    """``train.eval_command`` (rank 0): at every logged step, the results that have come in are
    logged and offered as the best (:meth:`Evaluations.collect`)."""

    interval: int
    evaluations: Evaluations

    def after_step(self, done: StepDone) -> bool:
        if every(self.interval, done.step) or done.last:
            self.evaluations.collect(done.step)
        return False


@dataclass
class StopOnSignal:
    """``train.stop_signals``: the run ends after the step at which any rank had received one
    (:meth:`Preemption.agreed`, the same step on every rank)."""

    preemption: Preemption
    device: torch.device

    def after_step(self, done: StepDone) -> bool:
        return self.preemption.agreed(self.device)
