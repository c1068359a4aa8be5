"""The trainer stage: a DeepSpeed ZeRO-3 engine loop over cached (or live) samples.

The trainer receives its parts built (:class:`janus_train.loop.parts.TrainParts`, made from the profile
by :func:`janus_train.build.build_parts` once the launch layer joined the process group) and runs them:
each optimizer step, then the loop's policies after it (:mod:`janus_train.loop.policies`: the
non-finite guard, the record's extras, validation, logging, cache flushes, checkpoints, the stop on
a signal), each a small object with one job.

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
(``janus_train.checkpoint.store``). With a validation source, ``validate`` runs every ``eval_every``
steps and at the end (``janus_train.loop.validation``) and keeps the best checkpoint apart.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from janus_cache.verify.comparison import feature_tolerance
from janus_train.checkpoint.elastic import ResumeError, repair_universal_load, set_rng_states, universal_checkpoint
from janus_train.data.damaged import DamagedSample, draw_step, within_read_timeout
from janus_train.data.live_check import compare_features, worst_of
from janus_train.data.prompt import IGNORE_INDEX
from janus_train.data.samples import collate
from janus_train.data.workers import worker_start
from janus_train.loop.parts import LRSchedule, TrainParts
from janus_train.loop.policies import (
    AfterStep,
    CheckpointWriter,
    CollectEvaluations,
    EvaluateCheckpoints,
    FlushCudaCache,
    LiveCheck,
    LogRecords,
    NonFiniteGuard,
    PeriodicValidation,
    ProcessGroup,
    RecordSkips,
    SampleKeys,
    SaveEvery,
    StepDone,
    StopOnSignal,
    every,
)
from janus_train.loop.preemption import Preemption
from janus_train.loop.progress import Progress
from janus_train.loop.step_metrics import StepTimes, step_record
from janus_train.model.loss import LossDenominators, micro_batch_loss


def answer_logits(hidden: torch.Tensor, labels: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
    """float32 token logits [T, vocab] at the T supervised positions of a micro-batch, in row-major
    order (the rows whose next token has a label; see :func:`janus_train.model.loss.token_cross_entropy`)."""
    rows_b, rows_t = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    selected = hidden[:, :-1][rows_b.to(hidden.device), rows_t.to(hidden.device)]
    return torch.nn.functional.linear(selected, lm_head_weight.to(selected.dtype)).float()


class Trainer:
    """Runs a training run's built parts on this rank: resume, the steps, and the policies after
    each (every rank builds one and calls its methods together)."""

    def __init__(self, parts: TrainParts, preemption: Preemption | None = None) -> None:
        """Run ``parts``; ``preemption``: the stop signals that end the run after the current step."""
        self.parts = parts
        self.profile, self.settings = parts.profile, parts.settings
        self.rank, self.world, self.device = parts.rank, parts.world, parts.device
        self.data, self.stepping = parts.data, parts.stepping
        self.engine, self.model, self.scheduler = parts.engine, parts.model, parts.scheduler
        self.checkpoints, self.log = parts.checkpoints, parts.log
        self.loss_config = self.settings.loss_config()
        self.ranks = ProcessGroup(self.device)
        self.progress = Progress()
        self.resume_note: str | None = None  # why the resume did not start where ``latest`` pointed
        self.writer = CheckpointWriter(self.checkpoints, self.engine, self.data.layout(self.settings, self.world),
                                       self.settings.save_total_limit, parts.lr_schedule.to_dict())
        self.lr_note: str | None = None  # how this start's LR plan differs from the resumed checkpoint's
        self.policies = self.after_step_policies(preemption)

    def after_step_policies(self, preemption: Preemption | None) -> list[AfterStep]:
        """The loop's policies, in the order they act on a step: the guard first (nothing of a
        refused step is logged or saved), the record's extras, then its outputs, the stop last."""
        settings = self.settings
        policies: list[AfterStep] = [NonFiniteGuard(settings.nonfinite, self.ranks), RecordSkips()]
        if settings.log_sample_keys:
            policies.append(SampleKeys(self.ranks))
        if settings.live_check_every:
            policies.append(LiveCheck(settings.live_check_every, self.live_check))
        if self.parts.evaluator is not None:
            policies.append(PeriodicValidation(settings.eval_every, self.validate))
        policies += [LogRecords(self.log, settings.log_every, self.checkpoints),
                     FlushCudaCache(settings.empty_cache_every, self.device, dist.barrier),
                     SaveEvery(settings.save_every, self.writer)]
        if self.parts.evaluations is not None:  # rank 0 with train.eval_command
            policies += [EvaluateCheckpoints(settings.save_every, self.parts.evaluations),
                         CollectEvaluations(settings.log_every, self.parts.evaluations)]
        if preemption is not None:
            policies.append(StopOnSignal(preemption, self.device))
        return policies

    # ----------------------------------------------------------------------------- checkpoints

    def checkpoint_dir(self) -> Path:
        return self.checkpoints.directory

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint in the run directory, if any (the builder
        verified it before the engine was built and fell back past a damaged one, noting why in
        ``resume_note``): weights, optimizer and LR schedule (DeepSpeed's part), then the data
        position and this rank's RNG states. Metric records after the resumed step are dropped, so
        each step is logged once.

        Saved by another number of processes (zarr caches): rank 0 converts the checkpoint once
        with DeepSpeed's ``ds_to_universal`` into ``<tag>_universal/`` and every rank loads that
        (weights and Adam moments re-partitioned); the data position continues the same global
        sequence. A different global batch, data or streaming world is a :class:`ResumeError`,
        raised when the parts are built (before any model is).
        """
        chosen, point = self.parts.resume.chosen, self.parts.resume.point
        if self.log is not None:
            self.log.resume_at(chosen.step if chosen is not None else 0)
        if self.parts.evaluations is not None:
            step = chosen.step if chosen is not None else 0
            self.parts.evaluations.resume_at(step, due=every(self.settings.save_every, step))
        if point is None:
            return False
        assert chosen is not None
        self.resume_note = chosen.note
        tag = point.tag
        if point.elastic:
            tag = universal_checkpoint(self.checkpoint_dir(), point.tag, self.rank, point.saved_world, self.world)
            dist.barrier()
        path, state = self.engine.load_checkpoint(str(self.checkpoint_dir()), tag=tag)
        if path is None or not state:
            raise ResumeError(f"{self.checkpoint_dir() / point.tag}: the checkpoint could not be loaded")
        if point.elastic:
            repair_universal_load(self.engine.optimizer, self.scheduler.get_last_lr())
        self.progress = Progress.from_state(state)
        self.follow_lr_schedule(point.tag, state)
        # RNG states are per process: on another world each rank takes rank 0's (the only one loaded).
        set_rng_states(state["rng"])
        self.writer.saved_step = self.progress.step
        return True

    def follow_lr_schedule(self, tag: str, state: dict[str, Any]) -> None:
        """After a checkpoint's load: the LR of the next step is this run's plan's (the restored
        schedule state ends with the checkpoint's plan's LR, which another plan would apply for one
        step), and ``lr_note`` says how the plan differs from the one checkpoint ``tag`` saved."""
        schedule, step = self.parts.lr_schedule, self.progress.step
        saved = LRSchedule.from_state(state)
        if saved is not None and saved != schedule:
            self.lr_note = schedule.replan_note(saved, tag, step, self.scheduler.base_lrs[0],
                                                self.stepping.steps_per_epoch * self.settings.epochs,
                                                self.settings.warmup_ratio)
        self.scheduler.last_epoch = step - 1
        self.scheduler.step()  # sets every group's LR to its base LR x schedule.factor(step)

    def save(self) -> None:
        """A checkpoint of the current step (once per step)."""
        self.writer.save(self.progress)

    # ------------------------------------------------------------------------------------ data

    def _loader(self) -> Iterator[tuple[dict[str, Any], int, int]]:
        """(micro-batch, epoch, global position after it) from the current (epoch, position) on.

        An epoch is ``steps_per_epoch`` whole steps of its global sequence (the remainder of fewer
        than ``samples_per_step`` samples is not trained in that epoch); every rank reads its
        round-robin share, so after each micro-batch all ranks together have consumed another
        ``micro_batch x world`` samples of the sequence.
        """
        data, streaming = self.data, self.data.streaming
        epoch, position = self.progress.epoch, self.progress.position
        end = self.stepping.steps_per_epoch * self.stepping.samples_per_step
        micro_global = self.settings.micro_batch * self.world
        while True:
            # A map-style cache starts the epoch's sequence at ``position`` directly; a stream
            # has no random access and reads past the samples this rank already trained on.
            sampler = None if streaming else data.order.rank_rows(
                epoch, self.rank, self.world, start=position, stop=end
            )
            loader = DataLoader(
                within_read_timeout(data.dataset, self.settings.read_timeout_s),
                batch_size=self.settings.micro_batch,
                sampler=sampler,
                collate_fn=partial(collate, pad_token_id=self.parts.builder.pad_token_id, rope=self.parts.rope),
                num_workers=self.settings.num_workers,
                drop_last=True,
                **worker_start(self.settings.num_workers),
            )
            skip = position // micro_global if streaming else 0
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

    def train(self) -> list[dict[str, Any]]:
        """Run to ``total_steps``, or to the end of the step after which a policy ends the run (a
        stop signal); returns the logged metric records of this process."""
        records: list[dict[str, Any]] = []
        batches = self._loader()
        self.engine.train()
        while self.progress.step < self.stepping.total_steps:
            done = self.run_step(batches)
            stop = False
            for policy in self.policies:
                stop = policy.after_step(done) or stop
            records.append(done.record)
            if stop:
                break
        return records

    def run_step(self, batches: Iterator[tuple[dict[str, Any], int, int]]) -> StepDone:
        """One optimizer step on this rank's next ``grad_accum`` micro-batches (every rank together):
        the progress moves on by it, and its record is made."""
        settings, progress = self.settings, self.progress
        times = StepTimes()
        start = time.perf_counter()
        drawn = draw_step(batches, settings.grad_accum, self.stepping.steps_per_epoch * settings.grad_accum,
                          settings.damaged_samples, self.ranks, progress.step + 1)
        progress.damaged_skips += drawn.skipped
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
            loss = micro_batch_loss(out.loss_parts, denominators, self.loss_config, progress.step, scale=self.world)
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
        _, progress.epoch, progress.position = fetched[-1]
        progress.step += 1
        # The distill weight the step that just ran used (progress.step already counts it).
        record = step_record(sums, denominators, times, (tokens, images, visual), step=progress.step,
                             epoch=progress.epoch, lr=lr, grad_norm=float(self.engine.get_global_grad_norm() or 0.0),
                             distill=self.loss_config.distill_weight_at(progress.step - 1), world=self.world,
                             device=self.device, llm_params=self.parts.llm_params)
        return StepDone(progress, self.stepping.total_steps, record, micro, losses,
                        applied=self.engine.skipped_steps == skipped_before)

    # ---------------------------------------------------------------------------- validation

    def validate(self) -> dict[str, Any]:
        """The ``val_*`` metrics of the current weights (every rank calls it); a new best by
        ``best_metric`` is saved to ``checkpoints/best`` (``val_best`` says whether it was)."""
        evaluator, best, progress = self.parts.evaluator, self.parts.best, self.progress
        assert evaluator is not None and best is not None
        metrics: dict[str, Any] = evaluator.evaluate(self.engine, self.model.qwen.lm_head,
                                                     self.loss_config.distill_weight_at(progress.step - 1))
        state = {"step": progress.step, "epoch": progress.epoch, "position": progress.position, "metrics": metrics}
        metrics["val_best"] = best.offer(self.engine, progress.step, metrics, state)
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
        if self.parts.source_windows is not None:
            live_inputs["vggt_frames"] = self.parts.source_windows(batch["keys"])
        was_training = self.engine.training
        self.engine.eval()
        try:
            cached = self.engine(batch)
            live = self.engine(live_inputs)
        finally:
            self.engine.train(was_training)
        denominators = LossDenominators.from_batches([batch])
        cached_loss, live_loss = (micro_batch_loss(out.loss_parts, denominators, self.loss_config, self.progress.step - 1)
                                  for out in (cached, live))
        loss_diff = ((live_loss - cached_loss).abs() / cached_loss.abs().clamp_min(1e-12)).double().to(self.device)
        dist.all_reduce(loss_diff, op=dist.ReduceOp.MAX)
        mine = compare_features(batch["keys"], live.features, cached.features, feature_tolerance(self.device),
                                self.profile.cache.feature_dtype)
        per_rank: list[Any] = [None] * self.world
        dist.all_gather_object(per_rank, mine)
        check = worst_of(per_rank)
        problem = check.problem(self.progress.step)
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

        if self.data.streaming:
            raise ValueError("outputs_on needs a map-style dataset (a zarr cache or live data)")
        batch = collate([self.data.dataset[row] for row in rows], pad_token_id=self.parts.builder.pad_token_id)
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
