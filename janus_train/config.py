"""Training settings: the ``train`` section of a profile, validated, plus the DeepSpeed config.

Reading them imports neither torch nor transformers (every module below is torch-free), so
``janus-cache profile`` and the Makefile's profile reads cost a fraction of a CPU-second."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from janus_core.bases import cache_base
from janus_core.profile import CONFIGS_DIR, Profile, ProfileError
from janus_core.settings import SettingsError, read_settings, setting
from janus_train.data.prompt_template import DEFAULT_TEMPLATE, PromptTemplate
from janus_train.data.val_metric_names import (
    BEST_MODES,
    VAL_LOSS,
    best_metric_name,
    best_mode_problem,
    is_eval_metric,
)
from janus_train.model.activation_checkpointing import FULL, ActivationCheckpointing
from janus_train.model.export_formats import JANUS, JANUSVLN, JANUSVLN_BASE
from janus_train.model.kernels import liger_missing
from janus_train.model.model_config import JanusModelConfig, LossConfig, TrainableParts

DEEPSPEED_DIR = CONFIGS_DIR / "deepspeed"
NONFINITE_POLICIES = ("stop", "skip")
DAMAGED_SAMPLE_POLICIES = ("stop", "skip")
ZERO_STAGES = (2, 3)
RESUME_GRAD_ACCUM_POLICIES = ("adapt", "keep")
STOP_SIGNAL_CHOICES = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
"""Signals ``train.stop_signals`` may name: the ones ``pipelines.launch`` forwards to its ranks."""
NO_EXPORT = "none"
EVAL_EXPORTS: tuple[str, ...] = (JANUSVLN, JANUS, NO_EXPORT)
"""``train.eval_export``: the reference JanusVLN layout, janus's transformers-5 layout, or nothing."""
EVAL_PLACEHOLDERS: tuple[str, ...] = ("export", "step", "results", "run", "checkpoint")
"""``train.eval_command``'s placeholders (:func:`janus_train.evals.command.fill_command` fills them):
``{export}``: what janus wrote for the evaluator; ``{step}``: the checkpoint's optimizer step;
``{results}``: the JSON file of metrics the command writes; ``{run}``: the run directory;
``{checkpoint}``: the checkpoint's DeepSpeed folder (``RUN/checkpoints/stepNNNNNNNN``)."""
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""A ``{word}`` of ``train.eval_command``: one of :data:`EVAL_PLACEHOLDERS`, or a mistake."""


@dataclass(frozen=True)
class TrainSettings:
    """The ``train`` section of a profile; the defaults are the reference 8xH800 launch."""

    micro_batch: int = setting(1, "Samples per GPU per forward pass.", min=1)
    grad_accum: int = setting(8, "Micro-batches accumulated per optimizer step.", min=1)
    epochs: int = setting(3, "Passes over the data.", min=1)
    max_steps: int = setting(0, "Optimizer steps to run (0: all epochs).", min=0)
    lr_base: float = setting(2e-5, "Learning rate of the language model.", min=0.0)
    lr_projector: float = setting(1e-5, "Learning rate of every *merger* parameter.", min=0.0)
    lr_vision: float = setting(1e-6, "Learning rate of the vision tower (with train_vision).", min=0.0)
    weight_decay: float = setting(0.0, "AdamW weight decay.", min=0.0)
    warmup_ratio: float = setting(0.03, "Share of the steps of linear LR warm-up, in [0, 1).", min=0.0, below=1.0)
    gradient_clipping: float = setting(1.0, "Gradient norm clipping (> 0).", above=0.0)
    segment_weights: tuple[float, float, float, float] = setting(
        (1.0, 1.0, 1.0, 1.0), "Loss weights of the answer lines: subinstruction, 2D, 3D, action "
        "(the closing <|im_end|> and newline always weigh 1.0); each > 0.", above=0.0)
    distill_loss_weight: float = setting(1.0, "Weight of the action-head loss (the start of the ramp).", min=0.0)
    distill_loss_weight_end: float | None = setting(
        None, "With distill_loss_weight_warmup_steps: the action-head weight the ramp ends at.", min=0.0)
    distill_loss_weight_warmup_steps: int = setting(
        0, "Optimizer steps of the linear ramp from distill_loss_weight to distill_loss_weight_end.", min=0)
    lam: float = setting(0.2, "Scale of the VGGT merger's output added to the image embeddings.")
    merger_hidden: int = setting(4096, "Hidden size of the VGGT merger (vggt_merger_hidden_dim).", min=1)
    train_vision: bool = setting(False, "Train the vision tower too.")
    gradient_checkpointing: ActivationCheckpointing = setting(
        FULL, "Decoder layers that recompute activations in the backward pass: full, none or every_K "
        "(true/false too).", parse=ActivationCheckpointing.parse)
    seed: int = setting(0, "Seed of initialisation and data order.")
    num_workers: int = setting(16, "Data loader workers per process.", min=0)
    save_every: int = setting(1000, "Optimizer steps between checkpoints (0: only at the end).", min=0)
    save_total_limit: int = setting(4, "Checkpoints kept.", min=1)
    stop_signals: tuple[str, ...] = setting(
        ("SIGTERM", "SIGINT", "SIGUSR1"), "Signals (to any rank or the launcher) that end the run after its current "
        "optimizer step with a checkpoint and exit code 75; a second one stops it at once (janus_train.loop.preemption).",
        choices=STOP_SIGNAL_CHOICES)
    log_every: int = setting(10, "Optimizer steps between logged records.", min=1)
    log_sample_keys: bool = setting(
        False, "Add each logged step's sample keys, in the order of the epoch's global sample sequence, to its "
        "record as sample_keys (to compare the data order of runs, e.g. after an elastic resume).")
    wandb_project: str = setting("", "Weights & Biases project that also receives the logged records "
                                 "(empty: off; needs the wandb package).")
    nonfinite: str = setting(
        "stop", "A NaN/inf loss or gradient norm on any rank: stop (every rank exits 1, naming the step, rank and "
        "samples; nothing of that step is saved) or skip (no optimizer step on any rank; counted as "
        "nonfinite_skips).", choices=NONFINITE_POLICIES)
    damaged_samples: str = setting(
        "stop", "A sample whose cached data fails its checksum (or whose shard file is missing): stop (every rank "
        "exits 1, rank 0 naming the file and the sample; nothing of that step is trained) or skip (left out of its "
        "micro-batch, counted as damaged_skips).", choices=DAMAGED_SAMPLE_POLICIES)
    read_timeout_s: float = setting(
        600.0, "Seconds a sample's read may take before every rank stops with one line naming the cache file it "
        "waits on (a stalled network file system or object store: not damage); 0: no limit. Below the process "
        "group's own timeout (gloo: 30 min), which would otherwise end the other ranks' wait.", min=0.0)
    resume_grad_accum: str = setting(
        "adapt", "Resuming a checkpoint of another global batch (another number of processes, or micro_batch): "
        "adapt (grad_accum is changed to keep the checkpoint's global batch where that is possible, said in one "
        "line) or keep (the profile's grad_accum; such a resume is refused).", choices=RESUME_GRAD_ACCUM_POLICIES)
    empty_cache_every: int = setting(0, "Optimizer steps between CUDA cache flushes (0: never).", min=0)
    live_check_every: int = setting(0, "Optimizer steps between live-feature checks (0: never).", min=0)
    deepspeed: str = setting("zero3.json", "DeepSpeed config file (relative: under configs/deepspeed/).")
    zero_stage: int = setting(
        3, "DeepSpeed ZeRO stage: 3 shards weights, gradients and Adam state over the GPUs (the design's default); "
        "2 keeps the whole bf16 model on every GPU and shards gradients and Adam state: about a third of the traffic "
        "per sample, ~14 GB more per GPU at 7B (make bench-gpu's projection gives both).", choices=ZERO_STAGES)
    liger_kernels: bool = setting(
        False, "Liger-Kernel's fused RMSNorm and SwiGLU for Qwen2.5-VL (needs the liger-kernel package).")
    compile_layers: bool = setting(
        False, "torch.compile each decoder layer (regional compilation: one layer's compile time; fuses the "
        "elementwise work between the matmuls).")
    wall_clock_breakdown: bool = setting(False, "DeepSpeed's per-phase timings.")
    alloc_conf: str = setting("", "PYTORCH_CUDA_ALLOC_CONF for the training processes "
                              "(e.g. expandable_segments:True).")
    prompt_template: str = setting(
        DEFAULT_TEMPLATE, "Prompt template file (relative: under configs/prompts/): janusvln.yaml, the reference "
        "wording (default), or janus.yaml, janus's own wording.")
    val_cache: Path | None = setting(
        None, "A zarr cache to validate on (the training profile's resolution and window variant): a directory, or "
        "s3://BUCKET/PREFIX read in place (kept as that URL); one validation source at most: val_cache, val_episodes "
        "or val_episodes_fraction.", urls=True)
    val_episodes: int = setting(
        0, "Episodes of the training data held out whole for validation, a seeded choice (never trained on).", min=0)
    val_episodes_fraction: float = setting(
        0.0, "Share of the training data's episodes held out whole for validation (rounded, at least one).",
        min=0.0, below=1.0)
    val_max_samples: int = setting(0, "Validation samples per evaluation at most, a fixed seeded subset (0: all).",
                                   min=0)
    eval_every: int = setting(0, "Optimizer steps between validations (0: only at the end; there always, "
                              "when a validation source is set).", min=0)
    best_metric: str = setting(
        VAL_LOSS, "The metric whose best value keeps its checkpoint in checkpoints/best: a validation metric "
        "(accuracies: highest, losses: lowest) or eval/<NAME>, a metric of train.eval_command's results (with "
        "train.best_metric_mode).", parse=best_metric_name)
    best_metric_mode: str | None = setting(
        None, "Which way train.best_metric is better: max or min; needed for an eval/ metric (a validation metric "
        "has its own direction).", choices=BEST_MODES)
    eval_command: str = setting(
        "", "A command run, detached from training, after each checkpoint save and at the end of the run (rank 0; "
        "its output in RUN/evals/stepNNNNNNNN/eval.log), with the placeholders {export}, {step}, {results}, {run} "
        "and {checkpoint}; it writes a JSON object of metrics to {results} (write, then rename), logged as "
        "eval/<NAME> (janus_train.evals; empty: none).")
    eval_export: str | None = setting(
        None, "What janus writes to {export} before the evaluation command starts: janusvln (JanusVLN's reference "
        "layout), janus (transformers-5 weights + janus heads) or none; default: the base's natural format "
        "(janusvln for Qwen2.5-VL, janus for Qwen3-VL).", choices=EVAL_EXPORTS)
    eval_keep_exports: bool = setting(
        False, "Keep each export written for an evaluator after its results arrive (a 7B export is ~16 GB).")
    eval_wait_minutes: float = setting(
        60.0, "At the end of the run, how long to wait at most for the evaluations running as local processes "
        "(evaluations a scheduler took over are not waited for).", min=0.0)
    init_from: Path | None = setting(
        None, "A reference JanusVLN checkpoint directory to start from: its Qwen weights, VGGT merger, action head, "
        "lam and merger width replace the profile's (janus_train.checkpoint.reference).")

    def __post_init__(self) -> None:
        sources = [name for name in ("val_cache", "val_episodes", "val_episodes_fraction") if getattr(self, name)]
        if len(sources) > 1:
            raise ValueError(f"settings {' and '.join(sources)} each name a validation source; keep one")
        for problem in (best_mode_problem(self.best_metric, self.best_metric_mode),
                        eval_command_problem(self.eval_command, self.eval_export)):
            if problem is not None:
                raise ValueError(problem)
        if is_eval_metric(self.best_metric) and not self.eval_command:
            raise ValueError(f"setting 'train.best_metric' is {self.best_metric!r}, a metric of an external "
                             "evaluation, but train.eval_command is empty: name the command that writes it")

    @property
    def validates(self) -> bool:
        """Whether the run has a validation source."""
        return bool(self.val_cache or self.val_episodes or self.val_episodes_fraction)

    def loss_config(self) -> LossConfig:
        return LossConfig(self.distill_loss_weight, self.distill_loss_weight_end,
                          self.distill_loss_weight_warmup_steps)

    def model_config(self) -> JanusModelConfig:
        trainable = TrainableParts(vision_tower=self.train_vision)
        return JanusModelConfig(lam=self.lam, merger_hidden=self.merger_hidden, trainable=trainable,
                                init_seed=self.seed)

    def template(self) -> PromptTemplate:
        """The prompt template file this run uses."""
        return PromptTemplate.load(self.prompt_template)


def eval_command_problem(command: str, export: str | None) -> str | None:
    """Why ``command`` cannot be run as ``train.eval_command`` with ``train.eval_export`` ``export``
    (None when it can): a ``{word}`` that is no placeholder, or ``{export}`` with nothing exported.
    Other braces (a shell's ``${VAR}`` is expanded when the profile loads) are left as they are."""
    unknown = sorted({name for name in PLACEHOLDER.findall(command) if name not in EVAL_PLACEHOLDERS})
    if unknown:
        return (f"setting 'train.eval_command' names {', '.join('{' + n + '}' for n in unknown)}, which janus does not "
                f"fill; its placeholders are {', '.join('{' + n + '}' for n in EVAL_PLACEHOLDERS)}")
    if export == NO_EXPORT and "{export}" in command:
        return ("setting 'train.eval_command' uses {export} but train.eval_export is none (nothing is exported); "
                "set train.eval_export to janusvln or janus, or pass {checkpoint}")
    return None


def load_train_settings(profile: Profile) -> TrainSettings:
    """Validate the profile's ``train`` section; a wrong setting is named with the profile file."""
    try:  # a setting from a parent profile or a --set is named with it (profile.origins)
        settings = read_settings(TrainSettings, dict(profile.train), "train", profile.source, origins=profile.origins)
    except SettingsError as err:
        raise ProfileError(str(err)) from None
    try:
        settings.loss_config()  # the ramp's settings together
        settings.template()
    except (SettingsError, ValueError) as err:
        message = str(err) if str(err).startswith(str(profile.source)) else f"{profile.source}: train: {err}"
        raise ProfileError(message) from None
    if settings.eval_command and settings.eval_export == JANUSVLN and (base := cache_base(profile.qwen.path)) \
            is not JANUSVLN_BASE:
        raise ProfileError(f"{profile.where('train.eval_export')}: setting 'train.eval_export' is janusvln, JanusVLN's "
                           f"reference layout, which is {JANUSVLN_BASE.name} only, but qwen.path is a {base.name} model; "
                           "set train.eval_export to janus or none")
    if not deepspeed_config_path(settings.deepspeed).is_file():
        raise ProfileError(f"{profile.where('train.deepspeed')}: setting 'train.deepspeed' names "
                           f"{deepspeed_config_path(settings.deepspeed)}, which does not exist")
    if (problem := deepspeed_file_problem(deepspeed_config_path(settings.deepspeed))) is not None:
        raise ProfileError(f"{profile.where('train.deepspeed')}: setting 'train.deepspeed' names "
                           f"{deepspeed_config_path(settings.deepspeed)}, which is not a DeepSpeed config for janus "
                           f"({problem}); name a JSON object of DeepSpeed settings, as {DEEPSPEED_DIR / 'zero3.json'}")
    if settings.liger_kernels and (missing := liger_missing()) is not None:
        raise ProfileError(f"{profile.source}: setting 'train.liger_kernels' asks for Liger's kernels, but {missing}; "
                           "install it or set train.liger_kernels: false")
    if settings.train_vision and profile.cache.vit_features:
        raise ProfileError(f"{profile.source}: 'train.train_vision' trains the vision tower, but 'cache.vit_features' "
                           "trains from its cached output (the blocks would never run); set one of them to false")
    return settings


def deepspeed_config_path(name: str) -> Path:
    """``train.deepspeed``'s file: a path, or a file name under ``configs/deepspeed``."""
    path = Path(name)
    return path if path.is_absolute() else DEEPSPEED_DIR / path


JANUS_OWNED_DEEPSPEED_KEYS = ("optimizer", "scheduler")
"""DeepSpeed settings janus's run gives itself (AdamW with per-group LRs, its LR schedule): a
DeepSpeed file must leave them out."""


def deepspeed_file_problem(path: Path) -> str | None:
    """Why the file ``path`` cannot be ``train.deepspeed``'s DeepSpeed config (None when it can): not
    JSON, not an object, a ``zero_optimization`` that is not an object, or a setting janus owns."""
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        return f"cannot be read: {err}"
    except json.JSONDecodeError as err:
        return f"not JSON: {err}"
    if not isinstance(config, dict):
        return f"a JSON {type(config).__name__}, not an object"
    if not isinstance(config.get("zero_optimization", {}), dict):
        return "its 'zero_optimization' is not an object"
    owned = [key for key in JANUS_OWNED_DEEPSPEED_KEYS if key in config]
    if owned:
        return (f"it sets {' and '.join(repr(k) for k in owned)}, which janus's run sets itself: leave "
                f"{'it' if len(owned) == 1 else 'them'} out")
    return None


def deepspeed_config(settings: TrainSettings, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed file of ``configs/deepspeed`` with the run's ZeRO stage, batch, clipping and
    precision filled in (ZeRO-2 drops the file's stage-3-only settings)."""
    config = json.loads(deepspeed_config_path(settings.deepspeed).read_text())
    config.pop("_comment", None)
    zero = config.setdefault("zero_optimization", {})
    zero["stage"] = settings.zero_stage
    if settings.zero_stage < 3:
        for key in [key for key in zero if key.startswith("stage3_")]:
            del zero[key]
    config["train_micro_batch_size_per_gpu"] = settings.micro_batch
    config["gradient_accumulation_steps"] = settings.grad_accum
    config["gradient_clipping"] = settings.gradient_clipping
    config["bf16"] = {"enabled": bf16}
    config["wall_clock_breakdown"] = settings.wall_clock_breakdown
    return config
