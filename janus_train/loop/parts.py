"""What a training run is made of, as the trainer receives it, and the data parts made from a profile.

The launch layer (``pipelines.train_parts``) joins the process group and turns a profile and the
command's arguments into :class:`TrainParts`: the prompt builder, the data and its order, the
checkpoints and the resume point, the model under its DeepSpeed engine, the validation and the run
log. :class:`janus_train.loop.trainer.Trainer` only runs them, so the loop knows nothing of how a
run was launched, and each part can be made (or replaced) on its own in a test.

The data functions here (:func:`prompt_builder`, :func:`open_training_cache`, :func:`make_dataset`)
are libraries: the builder, ``janus-train show-sample`` and the tests make the same samples with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from janus_cache.keys import window_variant
from janus_cache.store import OpenedCache, open_cache
from janus_core.bases import cache_base
from janus_core.profile import Profile
from janus_core.resolution import visual_tokens
from janus_train.checkpoint.best import BestCheckpoint
from janus_train.checkpoint.elastic import DataLayout, ResumePoint
from janus_train.checkpoint.store import Checkpoints, Resumable
from janus_train.config import TrainSettings, load_train_settings
from janus_train.data.live_check import SourceWindows
from janus_train.data.mixture import MixedSamples, Mixture, mixed_samples
from janus_train.data.prompt import PromptBuilder
from janus_train.data.samples import CachedSamples, LiveSamples, StreamedSamples
from janus_train.data.sources import CacheSource, as_sources
from janus_train.loop.validation import Evaluator, ValidationSet
from janus_train.data.rope import RopeIndex
from janus_train.run.layout import RunLayout
from janus_train.loop.logs import RunLog

# ----------------------------------------------------------------------------------- data parts


def load_tokenizer(profile: Profile) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(profile.qwen.path), use_fast=True)


def prompt_builder(profile: Profile, settings: TrainSettings | None = None) -> PromptBuilder:
    """The prompt builder of a profile: its tokenizer, its resolution's visual tokens per image, the
    train section's segment weights and prompt template (``settings``: the validated train section)."""
    settings = settings if settings is not None else load_train_settings(profile)
    return PromptBuilder(load_tokenizer(profile), visual_tokens(profile.cache.resolution),
                         segment_weights=settings.segment_weights, template=settings.template())


def open_training_cache(profile: Profile, cache: Path) -> OpenedCache:
    """The cache opened for the profile's resolution and window variant (a cache holding several
    resolutions trains on the profile's one; one lacking it is a one-line error) and, with
    ``cache.vit_features``, every sample's cached ViT output (the model then runs only the merger)."""
    return open_cache(cache, resolution=profile.cache.resolution.name,
                      variant=window_variant(profile.cache).name, vit_features=profile.cache.vit_features)


def make_dataset(profile: Profile, builder: PromptBuilder, cache: Path | Sequence[CacheSource] | None,
                 live_data: Path | None, rank: int, world: int) -> Dataset:
    """The run's samples: live, one cache (zarr: map-style; webdataset: this rank's stream), or
    several zarr caches as one :class:`MixedSamples`."""
    if live_data is not None:
        from janus_core.index import build_index

        index = build_index(live_data, history=profile.cache.history,
                            subinstruction_rule=profile.cache.subinstruction_rule)
        return LiveSamples(index, builder, profile.cache.resolution, cache_base(profile.qwen.path))
    assert cache is not None
    opened = [(source.name, open_training_cache(profile, source.path)) for source in as_sources(cache)]
    if len(opened) > 1:
        return mixed_samples(opened, builder)
    one = opened[0][1]
    if one.streaming:
        return StreamedSamples(one.reader, builder, rank=rank, world=world)
    return CachedSamples(one.reader, builder)


def lr_lambda(total_steps: int, warmup_steps: int, step: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0 at ``total_steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ----------------------------------------------------------------------------------- the parts


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
    """Everything a :class:`~janus_train.loop.trainer.Trainer` runs, built (``pipelines.train_parts``).

    ``settings`` are the ones the run uses (``grad_accum`` as a resume adapted it); ``rank`` of
    ``world`` and ``device`` are this process's; ``log`` and the validation parts are None where the
    run has none (``log``: every rank but 0)."""

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
