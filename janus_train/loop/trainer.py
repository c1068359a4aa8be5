"""The trainer stage: a DeepSpeed ZeRO-3 engine loop over cached (or live) samples.

One optimizer step = ``grad_accum`` micro-batches per rank. The micro-batches of a step are
fetched first (that time is the step's data wait), the loss normaliser is all-reduced over the
whole accumulated batch of all ranks, then each micro-batch's share of the loss is backpropagated
(see ``janus_train.model.loss``).

Data position: every epoch is one global sample sequence (:mod:`janus_train.data.mixture`; one cache:
its seeded permutation), and every optimizer step consumes its next ``samples_per_step`` =
``micro_batch x grad_accum x world`` items, dealt round-robin to ranks. A checkpoint stores the
position as samples consumed of the epoch's sequence, so a resumed run continues with the next
unseen sample at once, on the same or (zarr caches) another number of processes, provided the
global batch is unchanged (``janus_train.checkpoint.elastic``). Checkpoints are verified before a resume
(``janus_train.checkpoint.tags``). With a validation source, ``validate`` runs every ``eval_every``
steps and at the end (``janus_train.loop.validation``) and keeps the best checkpoint apart.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from janus_cache.keys import window_variant
from janus_cache.store import OpenedCache, open_cache
from janus_cache.store.split import merge_rank_shares
from janus_cache.verify.comparison import feature_tolerance
from janus_core.bases import cache_base
from janus_core.device import process_device
from janus_core.profile import Profile
from janus_core.resolution import visual_tokens
from janus_train.checkpoint.best import BestCheckpoint
from janus_train.checkpoint.elastic import (
    DataLayout,
    GradAccum,
    ResumeError,
    ResumePoint,
    repair_universal_load,
    rng_states,
    set_rng_states,
    universal_checkpoint,
)
from janus_train.checkpoint.reference import start_model
from janus_train.checkpoint.tags import Checkpoints, tag_name
from janus_train.config import TrainSettings, deepspeed_config, load_train_settings
from janus_train.data.damaged import DamagedSample, draw_step
from janus_train.data.live_check import (
    LiveCheckError,
    SourceWindows,
    compare_features,
    live_check_refusal,
    source_windows,
    worst_of,
)
from janus_train.data.mixture import CacheSource, MixedSamples, Mixture, as_sources, mixed_samples
from janus_train.data.prompt import IGNORE_INDEX, PromptBuilder
from janus_train.data.samples import CachedSamples, LiveFrames, LiveSamples, StreamedSamples, collate
from janus_train.loop.nonfinite import NonFiniteStep, nonfinite_message
from janus_train.loop.preemption import Preemption
from janus_train.loop.step_metrics import StepTimes, step_record
from janus_train.loop.validation import VAL_LOSS, Evaluator, plan_validation
from janus_train.model.kernels import apply_liger, compile_decoder_layers
from janus_train.model.loss import LossDenominators, micro_batch_loss
from janus_train.model.rope import RopeIndex
from janus_train.run.layout import CHECKPOINTS_DIR as CHECKPOINTS  # noqa: F401 - the run layout's names, for callers
from janus_train.run.layout import EXPORT_DIR, METRICS_FILE, RunLayout  # noqa: F401
from janus_train.run.logs import RunLog, write_alike


def init_distributed(profile: Profile, alloc_conf: str = "") -> torch.device:
    """Join the launcher's process group (NCCL on GPU, gloo on CPU); returns this process's device.

    Idempotent, so an entry point may call it before building a :class:`Trainer` (e.g. to run a
    start-up check on rank 0 and broadcast the verdict). ``alloc_conf`` is set as
    ``PYTORCH_CUDA_ALLOC_CONF`` (unless already set) before CUDA initialises, when it still counts.
    """
    cuda = profile.device == "cuda"
    # Naming the accelerator spares every rank DeepSpeed's "Setting accelerator to CPU" warning
    # (it only applies before DeepSpeed is first imported).
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if cuda else "cpu")
    import deepspeed

    if alloc_conf and cuda:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
    # DeepSpeed print()s "... shm_comm_op built successfully" on every rank at every start; errors
    # still raise (and go to stderr).
    with contextlib.redirect_stdout(io.StringIO()):
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    if not cuda:
        return torch.device("cpu")
    device = process_device(profile.device, int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def answer_logits(hidden: torch.Tensor, labels: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """float32 token logits [T, vocab] at the T supervised positions of a micro-batch, in row-major
    order (the rows whose next token has a label; see :func:`janus_train.model.loss.token_cross_entropy`)."""
    rows_b, rows_t = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    selected = hidden[:, :-1][rows_b.to(hidden.device), rows_t.to(hidden.device)]
    return torch.nn.functional.linear(selected, lm_head_weight.to(selected.dtype)).float()


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


class _ProcessGroup:
    """The ranks of the run's process group, as :func:`janus_train.data.damaged.draw_step` agrees through them."""

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


class TooFewSamples(ValueError):
    """The data holds fewer samples than one optimizer step takes."""


class Trainer:
    def __init__(self, profile: Profile, settings: TrainSettings, out_dir: Path,
                 cache: Path | Sequence[CacheSource] | None = None, live_data: Path | None = None,
                 data: str | None = None) -> None:
        """``data``: the dataset one ``cache`` was built from (as given to precompute); the live check
        of a cache whose frames are not VGGT's (Qwen3-VL) decodes VGGT's frames from its sources."""
        if (cache is None) == (live_data is None):
            raise ValueError("train from exactly one of a cache or (live) source data")
        self.profile, self.settings, self.out_dir = profile, settings, Path(out_dir)
        self.device = init_distributed(profile, settings.alloc_conf)
        import deepspeed

        self.rank, self.world = dist.get_rank(), dist.get_world_size()

        self.builder = prompt_builder(profile, settings)
        self.pad_token_id = self.builder.pad_token_id
        self.dataset = make_dataset(profile, self.builder, cache, live_data, self.rank, self.world)
        # With held-out episodes the training dataset becomes the other episodes' rows.
        val_data = None if settings.val_cache is None else make_dataset(
            profile, self.builder, settings.val_cache, None, self.rank, self.world)
        self.dataset, self.validation = plan_validation(settings, self.dataset, val_data)
        self.streaming = isinstance(self.dataset, StreamedSamples)
        self.sources = as_sources(cache) if cache is not None else [CacheSource("live", Path(live_data), 1.0)]
        sizes = self.dataset.sizes if isinstance(self.dataset, MixedSamples) else (len(self.dataset),)
        # The one global sample sequence of every epoch (one source: its seeded permutation).
        self.order = Mixture(sizes, tuple(s.weight for s in self.sources), settings.seed)
        # The checkpoint to resume (verified by its checksums, falling back past a damaged one) and
        # whether the run can continue it: before any model is built (a refusal costs nothing), and a
        # checkpoint of another world size is loaded as a universal checkpoint, which the engine
        # must know when it is built.
        self.layout = RunLayout(self.out_dir)
        self.checkpoints = Checkpoints(self.layout.checkpoints, self.rank, self.world)
        self._chosen = self.checkpoints.resumable()
        # Resumed on another world (or micro_batch), a changed grad_accum may keep the global batch.
        self.grad_accum_note: str | None = None
        if self._chosen is not None and settings.resume_grad_accum == "adapt":
            accum = GradAccum.for_resume(self.checkpoint_dir(), self._chosen.tag, settings.micro_batch,
                                         settings.grad_accum, self.world)
            settings = self.settings = replace(settings, grad_accum=accum.value)
            self.grad_accum_note = accum.note
        self.samples_per_step = settings.micro_batch * settings.grad_accum * self.world
        self.steps_per_epoch = self.order.epoch_length // self.samples_per_step
        if self.steps_per_epoch == 0:  # before the (slow) model build
            source = ", ".join(str(s.path) for s in self.sources)
            raise TooFewSamples(
                f"{source} holds {self.order.epoch_length} samples, fewer than one optimizer step takes "
                f"(micro_batch {settings.micro_batch} x grad_accum {settings.grad_accum} x {self.world} processes "
                f"= {self.samples_per_step})"
            )
        self._resume = (None if self._chosen is None
                        else ResumePoint.find(self.checkpoint_dir(), self._chosen.tag, self.data_layout()))

        # The frozen VGGT is built only to train live or to recompute a batch live now and then.
        live = live_data is not None or settings.live_check_every > 0
        self.source_windows: SourceWindows | None = None  # VGGT's frames of a cached batch, when not its own
        frames = LiveFrames(profile.cache.resolution, cache_base(profile.qwen.path))
        if cache is not None and settings.live_check_every > 0 and frames.separate:
            refusal = live_check_refusal(profile, settings.live_check_every, len(self.sources), data)
            if refusal is not None:
                raise LiveCheckError(refusal)
            assert data is not None
            self.source_windows = source_windows(data, self.sources[0].path, profile.cache.history, frames)
        model = start_model(profile, settings, live=live, device=self.device)
        model.set_gradient_checkpointing(settings.gradient_checkpointing)
        # The loader workers build each batch's M-RoPE positions (off the training process's critical path).
        self.rope = RopeIndex(model.qwen.config)
        if settings.liger_kernels:  # load_train_settings refused it where liger-kernel is missing
            apply_liger(model.qwen)
        if settings.compile_layers:
            compile_decoder_layers(model.qwen.model.language_model.layers)
        self.loss_config = settings.loss_config()
        planned = self.steps_per_epoch * settings.epochs
        self.total_steps = min(planned, settings.max_steps) if settings.max_steps > 0 else planned
        groups = model.parameter_groups(settings.lr_base, settings.lr_projector, settings.lr_vision,
                                        settings.weight_decay)
        optimizer = torch.optim.AdamW(
            [{k: v for k, v in g.items() if k != "param_names"} for g in groups], betas=(0.9, 0.999)
        )
        warmup = max(1, round(settings.warmup_ratio * self.total_steps))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_lambda, self.total_steps, warmup))
        config = deepspeed_config(settings, bf16=profile.compute_dtype == "bfloat16")
        if self._resume is not None and self._resume.elastic:
            config["checkpoint"] = {"load_universal": True}
        self.engine, _, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config
        )
        self.model = model
        self.llm_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                              for p in model.qwen.model.language_model.parameters())
        self.step = 0
        self._saved_step = -1
        self.epoch = 0
        self.position = 0  # samples of this epoch's global sequence consumed by all ranks together
        self.nonfinite_skips = 0
        self.resume_note: str | None = None  # why the resume did not start where ``latest`` pointed
        self.damaged_skips = 0  # samples left out for damaged cache data (train.damaged_samples: skip)
        self.metrics_file = self.layout.metrics
        self.evaluator = self.best = None
        if self.validation is not None:
            self.evaluator = Evaluator(self.validation, self.builder, settings.micro_batch, settings.num_workers,
                                       self.rank, self.world, self.device, settings.damaged_samples)
            self.best = BestCheckpoint(self.checkpoints, settings.best_metric)
        self.log = RunLog(self.out_dir, self.metrics_file, self.total_steps, settings.wandb_project,
                          run_config={"profile": profile.name, "world": self.world}) if self.rank == 0 else None

    # ----------------------------------------------------------------------------- checkpoints

    def checkpoint_dir(self) -> Path:
        return self.layout.checkpoints

    def data_layout(self) -> DataLayout:
        """What a data position means: samples consumed of the epoch's global sequence, which
        depends on the sources, their sizes and weights and the seed; the step size (global
        batch) must match too, the split over processes need not (zarr)."""
        return DataLayout(world=self.world, micro_batch=self.settings.micro_batch,
                          grad_accum=self.settings.grad_accum, n_samples=self.order.epoch_length,
                          seed=self.settings.seed, streaming=self.streaming,
                          sources=tuple((s.name, n, s.weight) for s, n in zip(self.sources, self.order.sizes)))

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint in ``out_dir``, if any (``janus_train.checkpoint.tags``
        verified it before the engine was built and fell back past a damaged one, noting why in
        ``resume_note``): weights, optimizer and LR schedule (DeepSpeed's part), then the data
        position and this rank's RNG states. Metric records after the resumed step are dropped, so
        each step is logged once.

        Saved by another number of processes (zarr caches): rank 0 converts the checkpoint once
        with DeepSpeed's ``ds_to_universal`` into ``<tag>_universal/`` and every rank loads that
        (weights and Adam moments re-partitioned); the data position continues the same global
        sequence. A different global batch, data or streaming world is a :class:`ResumeError`,
        raised when the trainer is built (before any model is).
        """
        if self.log is not None:
            self.log.resume_at(self._chosen.step if self._chosen is not None else 0)
        point = self._resume
        if point is None:
            return False
        self.resume_note = self._chosen.note
        tag = point.tag
        if point.elastic:
            tag = universal_checkpoint(self.checkpoint_dir(), point.tag, self.rank, point.saved_world, self.world)
            dist.barrier()
        path, state = self.engine.load_checkpoint(str(self.checkpoint_dir()), tag=tag)
        if path is None or not state:
            raise ResumeError(f"{self.checkpoint_dir() / point.tag}: the checkpoint could not be loaded")
        if point.elastic:
            repair_universal_load(self.engine.optimizer, self.scheduler.get_last_lr())
        self.step, self.epoch = state["step"], state["epoch"]
        self.position = DataLayout.global_position(state)
        self.nonfinite_skips = state.get("nonfinite_skips", 0)
        self.damaged_skips = state.get("damaged_skips", 0)
        # RNG states are per process: on another world each rank takes rank 0's (the only one loaded).
        set_rng_states(state["rng"])
        self._saved_step = self.step
        return True

    def save(self) -> None:
        """A checkpoint of the current step (once per step): complete and checksummed before
        ``latest`` names it; older ones beyond ``save_total_limit`` go."""
        if self._saved_step == self.step:
            return
        state = {"step": self.step, "epoch": self.epoch, "position": self.position,
                 "data_layout": self.data_layout().to_dict(), "rng": rng_states(),
                 "nonfinite_skips": self.nonfinite_skips, "damaged_skips": self.damaged_skips}
        self.checkpoints.save(self.engine, tag_name(self.step), state, keep=self.settings.save_total_limit)
        self._saved_step = self.step

    # ------------------------------------------------------------------------------------ data

    def _loader(self) -> Iterator[tuple[dict[str, Any], int, int]]:
        """(micro-batch, epoch, global position after it) from the current (epoch, position) on.

        An epoch is ``steps_per_epoch`` whole steps of its global sequence (the remainder of fewer
        than ``samples_per_step`` samples is not trained in that epoch); every rank reads its
        round-robin share, so after each micro-batch all ranks together have consumed another
        ``micro_batch x world`` samples of the sequence.
        """
        epoch, position = self.epoch, self.position
        end = self.steps_per_epoch * self.samples_per_step
        micro_global = self.settings.micro_batch * self.world
        while True:
            # A map-style cache starts the epoch's sequence at ``position`` directly; a stream
            # has no random access and reads past the samples this rank already trained on.
            sampler = None if self.streaming else self.order.rank_rows(
                epoch, self.rank, self.world, start=position, stop=end
            )
            loader = DataLoader(
                self.dataset,
                batch_size=self.settings.micro_batch,
                sampler=sampler,
                collate_fn=partial(collate, pad_token_id=self.pad_token_id, rope=self.rope),
                num_workers=self.settings.num_workers,
                drop_last=True,
            )
            skip = position // micro_global if self.streaming else 0
            fresh = position == 0
            for i, batch in enumerate(loader):
                if i < skip:
                    continue
                if position >= end:
                    break
                position += micro_global
                # Damaged samples travel under "damaged" (a micro-batch of damaged samples only has
                # no "keys"): draw_step makes the ranks agree on them.
                yield batch, epoch, position
            if fresh and position == 0:  # else the next epoch would read nothing again, forever
                raise ValueError(f"rank {self.rank} reads no sample of an epoch (a webdataset cache with fewer "
                                 f"shards than the {self.world} processes?)")
            epoch, position = epoch + 1, 0

    # ------------------------------------------------------------------------------- training

    def train(self, preemption: Preemption | None = None) -> list[dict[str, Any]]:
        """Run to ``total_steps``, or to the end of the step at which any rank had received one of
        ``preemption``'s stop signals; returns the logged metric records of this process."""
        records: list[dict[str, Any]] = []
        batches = self._loader()
        self.engine.train()
        while self.step < self.total_steps:
            times = StepTimes()
            start = time.perf_counter()
            drawn = draw_step(batches, self.settings.grad_accum, self.steps_per_epoch * self.settings.grad_accum,
                              self.settings.damaged_samples, _ProcessGroup(self.device), self.step + 1)
            self.damaged_skips += drawn.skipped
            fetched = drawn.micro
            micro = [batch for batch, _, _ in fetched]
            times.data_wait = time.perf_counter() - start
            local = LossDenominators.from_batches(micro).as_tensor(self.device)
            dist.all_reduce(local)
            denominators = LossDenominators.from_tensor(local)

            compute_start = time.perf_counter()
            # The LR this step applies (the scheduler moves on inside the last engine.step()).
            lr = self.scheduler.get_last_lr()[0]
            sums: dict[str, torch.Tensor] = {}
            losses: list[torch.Tensor] = []
            skipped_before = self.engine.skipped_steps
            tokens = images = visual = 0
            for batch in micro:
                t0 = time.perf_counter()
                out = self.engine(batch)
                # DeepSpeed averages gradients over ranks: scale by the world size to keep the sum.
                loss = micro_batch_loss(out.loss_parts, denominators, self.loss_config, self.step, scale=self.world)
                losses.append(loss.detach())
                times.forward += times.lap(t0, self.device)
                t0 = time.perf_counter()
                self.engine.backward(loss, scale_wrt_gas=False)
                times.backward += times.lap(t0, self.device)
                t0 = time.perf_counter()
                self.engine.step()
                times.optimizer += times.lap(t0, self.device)
                for name, value in out.loss_parts.metric_sums().items():
                    sums[name] = sums.get(name, 0) + value.to(self.device)
                tokens += int(batch["attention_mask"].sum())
                images += int(batch["frames"].shape[0] * batch["frames"].shape[1])
                visual += int((batch["mm_token_type_ids"] == 1).sum())
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.compute = time.perf_counter() - compute_start
            _, self.epoch, self.position = fetched[-1]
            self.step += 1

            record = self._metrics(sums, denominators, times, tokens, images, visual, lr)
            # DeepSpeed's ZeRO-3 optimizer itself skips a step whose global gradient norm is
            # non-finite (weights, optimizer state and LR schedule untouched, gradients dropped).
            self._guard_nonfinite(record, micro, losses, applied=self.engine.skipped_steps == skipped_before)
            record["nonfinite_skips"] = self.nonfinite_skips
            record["damaged_skips"] = self.damaged_skips
            if self.settings.log_sample_keys:
                per_rank: list[Any] = [None] * self.world  # every rank's keys, in the global order
                dist.all_gather_object(per_rank, [key for batch in micro for key in batch["keys"]])
                record["sample_keys"] = merge_rank_shares(per_rank)
            every = self.settings.live_check_every
            if every and self.step % every == 0 and micro[0]["features"] is not None:
                record.update(self.live_check(micro[0]))
            if self.validation_due():
                record.update(self.validate())
            records.append(record)
            if self.log is not None:
                self.log.step_done(self.step)
            if self.step % self.settings.log_every == 0 or self.step == self.total_steps or VAL_LOSS in record:
                write_alike(self.log, record, self.checkpoints)  # every rank: a full disk ends them alike
            if self.settings.empty_cache_every and self.step % self.settings.empty_cache_every == 0:
                dist.barrier()  # all ranks flush together, so no rank waits on another's flush
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
            if self.settings.save_every and self.step % self.settings.save_every == 0:
                self.save()
            if preemption is not None and preemption.agreed(self.device):  # the same step on every rank
                break
        return records

    def _metrics(self, sums: dict[str, torch.Tensor], denominators: LossDenominators, times: StepTimes,
                 tokens: int, images: int, visual: int, lr: float) -> dict[str, Any]:
        # The distill weight the step that just ran used (self.step already counts it).
        return step_record(sums, denominators, times, (tokens, images, visual), step=self.step, epoch=self.epoch,
                           lr=lr, grad_norm=float(self.engine.get_global_grad_norm() or 0.0),
                           distill=self.loss_config.distill_weight_at(self.step - 1), world=self.world,
                           device=self.device, llm_params=self.llm_params)

    def _guard_nonfinite(self, record: dict[str, Any], micro: list[dict[str, Any]], losses: list[torch.Tensor],
                         applied: bool) -> None:
        """After a step: a non-finite (all-reduced) loss or global gradient norm is the same verdict
        on every rank. ``skip``: counted when DeepSpeed skipped the update; otherwise every rank
        raises :class:`NonFiniteStep` naming the step, the rank(s) and their samples."""
        if math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"]):
            return
        skip = self.settings.nonfinite == "skip"
        if skip and not applied:
            self.nonfinite_skips += 1
            return
        finite = torch.isfinite(torch.stack(losses)).tolist()
        mine = (not all(finite), [key for ok, batch in zip(finite, micro) if not ok for key in batch["keys"]],
                [key for batch in micro for key in batch["keys"]])
        per_rank: list[Any] = [None] * self.world
        dist.all_gather_object(per_rank, mine)
        raise NonFiniteStep(nonfinite_message(self.step, record["loss"], record["grad_norm"], per_rank, skip))

    # ---------------------------------------------------------------------------- validation

    def validation_due(self) -> bool:
        every = self.settings.eval_every
        return self.evaluator is not None and (self.step == self.total_steps or bool(every and self.step % every == 0))

    def validate(self) -> dict[str, Any]:
        """The ``val_*`` metrics of the current weights (every rank calls it); a new best by
        ``best_metric`` is saved to ``checkpoints/best`` (``val_best`` says whether it was)."""
        assert self.evaluator is not None and self.best is not None
        metrics: dict[str, Any] = self.evaluator.evaluate(self.engine, self.model.qwen.lm_head,
                                                          self.loss_config.distill_weight_at(self.step - 1))
        state = {"step": self.step, "epoch": self.epoch, "position": self.position, "metrics": metrics}
        metrics["val_best"] = self.best.offer(self.engine, self.step, metrics, state)
        return metrics

    # ------------------------------------------------------------------------------- outputs

    @torch.no_grad()
    def live_check(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Recompute a cached micro-batch's features live (the frozen VGGT on VGGT's frames of its
        samples: :mod:`janus_train.data.live_check`) and run the current model on both: the largest
        feature difference, the sample furthest beyond its tolerance and the relative difference of
        the micro-batch's loss, over all ranks (every rank must call it). Rank 0 warns in one line
        naming a sample whose cached feature is beyond the tolerance."""
        live_inputs: dict[str, Any] = {**batch, "features": None}
        if self.source_windows is not None:
            live_inputs["vggt_frames"] = self.source_windows(batch["keys"])
        was_training = self.engine.training
        self.engine.eval()
        try:
            cached = self.engine(batch)
            live = self.engine(live_inputs)
        finally:
            self.engine.train(was_training)
        denominators = LossDenominators.from_batches([batch])
        cached_loss, live_loss = (micro_batch_loss(out.loss_parts, denominators, self.loss_config, self.step - 1)
                                  for out in (cached, live))
        loss_diff = ((live_loss - cached_loss).abs() / cached_loss.abs().clamp_min(1e-12)).double().to(self.device)
        dist.all_reduce(loss_diff, op=dist.ReduceOp.MAX)
        mine = compare_features(batch["keys"], live.features, cached.features, feature_tolerance(self.device),
                                self.profile.cache.feature_dtype)
        per_rank: list[Any] = [None] * self.world
        dist.all_gather_object(per_rank, mine)
        check = worst_of(per_rank)
        problem = check.problem(self.step)
        if problem is not None and self.rank == 0:
            print(f"warning: {problem}", file=sys.stderr, flush=True)
        return {"live_feature_max_abs": check.max_abs, "live_loss_rel_diff": loss_diff.item(),
                "live_feature_sample": check.sample}

    @torch.no_grad()
    def outputs_on(self, rows: list[int]) -> dict[str, torch.Tensor]:
        """The current model's outputs on dataset ``rows`` as one micro-batch (eval mode, no update).

        Every rank must call it (ZeRO-3 gathers the sharded weights collectively). Returns
        float32 ``action_logits`` [B, n_actions], ``segment_ce_sum`` [B, 4], ``segment_tokens``
        [B, 4] and ``answer_logits`` [T, vocab] at the supervised positions
        (:func:`answer_logits`), e.g. to check an export against the trained engine.
        """
        import deepspeed

        if self.streaming:
            raise ValueError("outputs_on needs a map-style dataset (a zarr cache or live data)")
        batch = collate([self.dataset[row] for row in rows], pad_token_id=self.pad_token_id)
        if "damaged" in batch:
            raise DamagedSample(str(batch["damaged"][0]))
        was_training = self.engine.training
        self.engine.eval()
        try:
            out = self.engine(batch, return_hidden=True)
            lm_head = self.model.qwen.lm_head
            with deepspeed.zero.GatheredParameters([lm_head.weight]):
                logits = answer_logits(out.hidden_states, batch["labels"], lm_head.weight)
        finally:
            self.engine.train(was_training)
        return {
            "action_logits": out.action_logits.float().cpu(),
            "segment_ce_sum": out.loss_parts.segment_ce_sum.float().cpu(),
            "segment_tokens": out.loss_parts.segment_tokens.cpu(),
            "answer_logits": logits.cpu(),
        }

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
