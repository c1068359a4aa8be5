"""A training run built from a profile: the parts a :class:`~janus_train.loop.trainer.Trainer` runs.

The launch layer (``pipelines.train_run``) joins the process group (``pipelines.distributed``) and
calls :func:`build_parts`, which makes them in the order in which a refusal costs least: the prompt
builder and the data (a validation source that cannot be used is refused here), the checkpoint to
resume (verified by its checksums, falling back past a damaged one) and whether the run can continue
it, the step plan (data for less than one step is refused), the live check's sources, and only then
the model, optimizer, LR schedule and DeepSpeed engine (a checkpoint of another world size is loaded
as a universal checkpoint, which the engine must know when it is built), the validation, the run log
and, on rank 0 alone, the run's external evaluations (``train.eval_command``).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial, wraps
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from janus_core.bases import cache_base
from janus_core.plural import plural
from janus_core.profile import Profile
from janus_core.resolution import visual_tokens
from janus_train.checkpoint.best import BestCheckpoint
from janus_train.checkpoint.elastic import GradAccum, ResumePoint
from janus_train.checkpoint.store import Checkpoints
from janus_train.config import TrainSettings, deepspeed_config, load_train_settings
from janus_train.data.from_profile import load_tokenizer, make_dataset
from janus_train.data.live_check import LiveCheckError, source_windows
from janus_train.data.mixture import Mixture
from janus_train.data.prompt import PromptBuilder
from janus_train.data.rope import RopeIndex
from janus_train.data.samples import LiveFrames
from janus_train.data.sources import CacheSource, as_sources, live_check_refusal
from janus_train.evals.evaluations import evaluations_of_run, pinned_tags
from janus_train.loop.logs import RunLog
from janus_train.loop.parts import LRSchedule, ResumeChoice, Stepping, TrainData, TrainParts
from janus_train.loop.validation import Evaluator, plan_validation
from janus_train.model.kernels import apply_liger, compile_decoder_layers
from janus_train.run.layout import RunLayout


class TooFewSamples(ValueError):
    """The data holds fewer samples than one optimizer step takes."""


def prompt_builder(profile: Profile, settings: TrainSettings | None = None) -> PromptBuilder:
    """The prompt builder of a profile: its tokenizer, its resolution's visual tokens per image, the
    train section's segment weights and prompt template (``settings``: the validated train section)."""
    settings = settings if settings is not None else load_train_settings(profile)
    return PromptBuilder(load_tokenizer(profile.qwen), visual_tokens(profile.cache.resolution),
                         segment_weights=settings.segment_weights, template=settings.template())


def train_data(profile: Profile, settings: TrainSettings, builder: PromptBuilder, cache: Sequence[CacheSource] | None,
               live_data: Path | None, rank: int, world: int) -> TrainData:
    """The run's samples, validation set and sample order (with held-out episodes the training
    dataset becomes the other episodes' rows)."""
    dataset = make_dataset(profile, builder, cache, live_data, rank, world)
    val_data = None if settings.val_cache is None else make_dataset(
        profile, builder, settings.val_cache, None, rank, world)
    dataset, validation = plan_validation(settings, dataset, val_data)
    sources = tuple(as_sources(cache)) if cache is not None else (CacheSource("live", Path(live_data), 1.0),)
    order = Mixture(TrainData.sizes_of(dataset), tuple(s.weight for s in sources), settings.seed)
    return TrainData(dataset, validation, sources, order)


def resume_choice(checkpoints: Checkpoints, settings: TrainSettings, world: int,
                  ) -> tuple[TrainSettings, ResumeChoice]:
    """The intact checkpoint to resume and the settings to continue it with: resumed on another
    world (or micro_batch), ``train.resume_grad_accum: adapt`` may change grad_accum to keep the
    global batch."""
    chosen = checkpoints.resumable()
    if chosen is None or settings.resume_grad_accum != "adapt":
        return settings, ResumeChoice(chosen)
    accum = GradAccum.for_resume(checkpoints.directory, chosen.tag, settings.micro_batch, settings.grad_accum, world)
    return replace(settings, grad_accum=accum.value), ResumeChoice(chosen, grad_accum_note=accum.note)


def too_few_samples(data: TrainData, settings: TrainSettings, world: int, stepping: Stepping) -> TooFewSamples:
    source = ", ".join(str(s.path) for s in data.sources)
    return TooFewSamples(
        f"{source} holds {plural(data.order.epoch_length, 'sample')}, fewer than one optimizer step takes "
        f"(micro_batch {settings.micro_batch} x grad_accum {settings.grad_accum} x {plural(world, 'process')} "
        f"= {stepping.samples_per_step})"
    )


MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_muon_uncompiled() -> None:
    """Import DeepSpeed's Muon optimizer with its functions compiled on first call, not at import.

    ``deepspeed.initialize`` imports that module to check an optimizer against ZeRO's list, and the
    import wraps three functions in ``torch.compile``, which imports the inductor compiler: 1.2
    CPU-seconds on every rank of every start. janus trains with AdamW, so they are never called.
    A DeepSpeed without that module (or an earlier import of it) is left as it is."""
    if MUON_MODULE in sys.modules or importlib.util.find_spec(MUON_MODULE) is None:
        return
    from deepspeed.runtime import compiler

    eager = compiler.compile

    def compile_on_first_call() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            compiled = functools.cache(lambda: eager()(function))

            @wraps(function)
            def call(*args: Any, **kwargs: Any) -> Any:
                return compiled()(*args, **kwargs)

            return call

        return decorate

    compiler.compile = compile_on_first_call
    try:
        importlib.import_module(MUON_MODULE)
    finally:
        compiler.compile = eager


def build_parts(profile: Profile, settings: TrainSettings, out_dir: Path, device: torch.device,
                cache: Sequence[CacheSource] | None = None, live_data: Path | None = None,
                data: str | None = None, eval_env: Mapping[str, str] | None = None) -> TrainParts:
    """The parts of a run of ``profile`` into ``out_dir`` on this rank of the joined process group,
    from exactly one of ``cache`` or (live) source data. ``data``: the dataset one ``cache`` was
    built from (as given to precompute); the live check of a cache whose frames are not VGGT's
    (Qwen3-VL) decodes VGGT's frames from its sources. ``eval_env``: the environment the jobs of
    the run's external evaluations start with (the launch layer's, which knows what makes a process
    a rank; None: this process's)."""
    if (cache is None) == (live_data is None):
        raise ValueError("train from exactly one of a cache or (live) source data")
    import deepspeed

    from janus_train.checkpoint.reference import start_model  # transformers' model code: ``show-sample`` needs none

    rank, world = dist.get_rank(), dist.get_world_size()
    builder = prompt_builder(profile, settings)
    train = train_data(profile, settings, builder, cache, live_data, rank, world)
    layout = RunLayout(Path(out_dir))
    checkpoints = Checkpoints(layout.checkpoints, rank, world, pinned=partial(pinned_tags, layout))
    settings, resume = resume_choice(checkpoints, settings, world)
    stepping = Stepping.of(settings, world, train.order.epoch_length)
    if stepping.steps_per_epoch == 0:  # before the (slow) model build
        raise too_few_samples(train, settings, world, stepping)
    if resume.chosen is not None:
        resume = replace(resume, point=ResumePoint.find(layout.checkpoints, resume.chosen.tag,
                                                        train.layout(settings, world), settings.zero_stage))

    # The frozen VGGT is built only to train live or to recompute a batch live now and then.
    live = live_data is not None or settings.live_check_every > 0
    windows = None  # VGGT's frames of a cached batch, when not its own
    frames = LiveFrames(profile.cache.resolution, cache_base(profile.qwen.path))
    if cache is not None and settings.live_check_every > 0 and frames.separate:
        refusal = live_check_refusal(profile, settings.live_check_every, len(train.sources), data)
        if refusal is not None:
            raise LiveCheckError(refusal)
        assert data is not None
        windows = source_windows(data, train.sources[0].path, profile.cache.history, frames)
    model = start_model(profile, settings, live=live, device=device)
    model.set_gradient_checkpointing(settings.gradient_checkpointing)
    # The loader workers build each batch's M-RoPE positions (off the training process's critical path).
    rope = RopeIndex(model.qwen.config)
    if settings.liger_kernels:  # load_train_settings refused it where liger-kernel is missing
        apply_liger(model.qwen)
    if settings.compile_layers:
        compile_decoder_layers(model.qwen.model.language_model.layers)
    groups = model.parameter_groups(settings.lr_base, settings.lr_projector, settings.lr_vision,
                                    settings.weight_decay)
    optimizer = torch.optim.AdamW(
        [{k: v for k, v in g.items() if k != "param_names"} for g in groups], betas=(0.9, 0.999)
    )
    schedule = LRSchedule.of(stepping.total_steps, settings.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule.factor)
    config = deepspeed_config(settings, bf16=profile.compute_dtype == "bfloat16")
    if resume.point is not None and resume.point.elastic:
        config["checkpoint"] = {"load_universal": True}
    import_muon_uncompiled()
    engine, _, _, scheduler = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                                   config=config)
    llm_params = sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                     for p in model.qwen.model.language_model.parameters())
    evaluator = best = None
    if train.validation is not None:
        evaluator = Evaluator(train.validation, builder, settings.micro_batch, settings.num_workers,
                              rank, world, device, settings.damaged_samples, settings.read_timeout_s)
        best = BestCheckpoint(checkpoints, settings.best_metric)
    log = RunLog(layout.root, layout.metrics, stepping.total_steps, settings.wandb_project,
                 run_config={"profile": profile.name, "world": world}) if rank == 0 else None
    evaluations = (evaluations_of_run(layout, settings, profile, log, env=eval_env)
                   if rank == 0 and settings.eval_command else None)
    return TrainParts(profile=profile, settings=settings, layout=layout, rank=rank, world=world, device=device,
                      builder=builder, data=train, stepping=stepping, checkpoints=checkpoints, resume=resume,
                      model=model, engine=engine, scheduler=scheduler, lr_schedule=schedule, rope=rope, llm_params=llm_params,
                      source_windows=windows, evaluator=evaluator, best=best, log=log, evaluations=evaluations)
