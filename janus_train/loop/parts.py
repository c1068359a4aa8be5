"""What a training run is made of, as the trainer receives it.

:func:`janus_train.build.build_parts` turns a profile and the command's arguments into
:class:`TrainParts`: the prompt builder, the data and its order, the checkpoints and the resume
point, the model under its DeepSpeed engine, the validation and the run log.
:class:`janus_train.loop.trainer.Trainer` only runs them, so the loop knows nothing of how a run was
built or launched, and each part can be made (or replaced) on its own in a test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from janus_core.profile import Profile
from janus_train.checkpoint.best import BestCheckpoint
from janus_train.checkpoint.elastic import DataLayout, ResumePoint
from janus_train.checkpoint.store import Checkpoints, Resumable
from janus_train.config import TrainSettings
from janus_train.data.live_check import SourceWindows
from janus_train.data.mixture import MixedSamples, Mixture
from janus_train.data.prompt import PromptBuilder
from janus_train.data.rope import RopeIndex
from janus_train.data.samples import StreamedSamples
from janus_train.data.sources import CacheSource
from janus_train.evals.evaluations import Evaluations
from janus_train.loop.logs import RunLog
from janus_train.loop.validation import Evaluator, ValidationSet
from janus_train.run.layout import RunLayout


@dataclass(frozen=True)
class TrainData:
    """The samples a run trains on and the one global sample sequence of each of its epochs
    (:mod:`janus_train.data.mixture`; one source: its seeded permutation). With held-out episodes,
    ``dataset`` is the other episodes' rows."""

    dataset: Dataset
    validation: ValidationSet | None
    sources: tuple[CacheSource, ...]
    order: Mixture

    @property
    def streaming(self) -> bool:
        """A webdataset stream: no random access, each rank reads its own shards."""
        return isinstance(self.dataset, StreamedSamples)

    @staticmethod
    def sizes_of(dataset: Dataset) -> tuple[int, ...]:
        """Samples per source (a mixture has several)."""
        return dataset.sizes if isinstance(dataset, MixedSamples) else (len(dataset),)

    def layout(self, settings: TrainSettings, world: int) -> DataLayout:
        """What a data position means: samples consumed of the epoch's global sequence, which
        depends on the sources, their sizes and weights and the seed; the step size (global
        batch) must match too, the split over processes need not (zarr)."""
        return DataLayout(world=world, micro_batch=settings.micro_batch, grad_accum=settings.grad_accum,
                          n_samples=self.order.epoch_length, seed=settings.seed, streaming=self.streaming,
                          sources=tuple((s.name, n, s.weight) for s, n in zip(self.sources, self.order.sizes)))


@dataclass(frozen=True)
class Stepping:
    """How a run steps through its data: every optimizer step consumes ``samples_per_step`` =
    ``micro_batch x grad_accum x world`` samples of the epoch's sequence; an epoch is its whole
    steps (a remainder of fewer samples is not trained in it); ``total_steps`` is every epoch's
    steps or ``max_steps``, whichever is fewer."""

    samples_per_step: int
    steps_per_epoch: int
    total_steps: int

    @classmethod
    def of(cls, settings: TrainSettings, world: int, epoch_length: int) -> Stepping:
        samples_per_step = settings.micro_batch * settings.grad_accum * world
        steps_per_epoch = epoch_length // samples_per_step
        planned = steps_per_epoch * settings.epochs
        total = min(planned, settings.max_steps) if settings.max_steps > 0 else planned
        return cls(samples_per_step, steps_per_epoch, total)


@dataclass(frozen=True)
class LRSchedule:
    """The LR plan: each group's base LR times :meth:`factor`, a linear warm-up to 1 over
    ``warmup_steps``, then a cosine decay to 0 at ``total_steps``. Every checkpoint stores it, so a
    resume whose plan differs (another ``train.max_steps``, ``epochs`` or data) says what changed."""

    total_steps: int
    warmup_steps: int

    @classmethod
    def of(cls, total_steps: int, warmup_ratio: float) -> LRSchedule:
        return cls(total_steps, max(1, round(warmup_ratio * total_steps)))

    def factor(self, step: int) -> float:
        """The factor of the base LR after ``step`` optimizer steps (the LR of step ``step + 1``)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    def to_dict(self) -> dict[str, int]:
        return {"total_steps": self.total_steps, "warmup_steps": self.warmup_steps}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LRSchedule | None:
        """The plan a checkpoint's client state saved (None: saved before checkpoints stored it)."""
        saved = state.get("lr_schedule")
        return cls(int(saved["total_steps"]), int(saved["warmup_steps"])) if isinstance(saved, dict) else None

    def replan_note(self, saved: LRSchedule, tag: str, step: int, base_lr: float, planned_steps: int,
                    warmup_ratio: float) -> str:
        """The one line a resume prints when its plan is not checkpoint ``tag``'s (``saved``): both
        plans and the LR of the next step under each; ``planned_steps`` (every epoch's steps now) and
        ``warmup_ratio`` tell whether ``--max-steps`` alone would keep the checkpoint's plan."""
        keeps = LRSchedule.of(min(planned_steps, saved.total_steps), warmup_ratio) == saved
        return (f"note: the LR schedule follows this start's plan of {self.total_steps} steps (warm-up "
                f"{self.warmup_steps}), not the {saved.total_steps} steps (warm-up {saved.warmup_steps}) of "
                f"checkpoint {tag}: lr {base_lr * self.factor(step):.2e} at step {step + 1} instead of "
                f"{base_lr * saved.factor(step):.2e}"
                + (f"; --max-steps {saved.total_steps} keeps the checkpoint's plan" if keeps else ""))


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint a run continues (verified before any model was built) and what it changed:
    ``chosen``: the intact tag (None: a fresh run); ``point``: its state checked against the run's
    data layout; ``grad_accum_note``: the line saying grad_accum was adapted to its global batch."""

    chosen: Resumable | None = None
    point: ResumePoint | None = None
    grad_accum_note: str | None = None


@dataclass(frozen=True)
class TrainParts:
    """Everything a :class:`~janus_train.loop.trainer.Trainer` runs, built (:func:`janus_train.build.build_parts`).

    ``settings`` are the ones the run uses (``grad_accum`` as a resume adapted it); ``rank`` of
    ``world`` and ``device`` are this process's; ``log``, the validation parts and ``evaluations`` are
    None where the run has none (``log`` and ``evaluations``: every rank but 0)."""

    profile: Profile
    settings: TrainSettings
    layout: RunLayout
    rank: int
    world: int
    device: torch.device
    builder: PromptBuilder
    data: TrainData
    stepping: Stepping
    checkpoints: Checkpoints
    resume: ResumeChoice
    model: Any
    engine: Any
    scheduler: Any
    lr_schedule: LRSchedule
    rope: RopeIndex
    llm_params: int
    source_windows: SourceWindows | None = None
    evaluator: Evaluator | None = None
    best: BestCheckpoint | None = None
    log: RunLog | None = None
    evaluations: Evaluations | None = None
