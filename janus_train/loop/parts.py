"""What a training run is made of, as the trainer receives it.

:func:`janus_train.build.build_parts` turns a profile and the command's arguments into
:class:`TrainParts`: the prompt builder, the data and its order, the checkpoints and the resume
point, the model under its DeepSpeed engine, the validation and the run log.
:class:`janus_train.loop.trainer.Trainer` only runs them, so the loop knows nothing of how a run was
built or launched, and each part can be made (or replaced) on its own in a test.
"""

from __future__ import annotations

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
    rope: RopeIndex
    llm_params: int
    source_windows: SourceWindows | None = None
    evaluator: Evaluator | None = None
    best: BestCheckpoint | None = None
    log: RunLog | None = None
    evaluations: Evaluations | None = None
