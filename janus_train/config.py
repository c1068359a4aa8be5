"""Training settings: the ``train`` section of a profile, validated, plus the DeepSpeed config."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from janus_cache.profile import CONFIGS_DIR, Profile, ProfileError, Section
from janus_train.activation_checkpointing import FULL, ActivationCheckpointing
from janus_train.loss import LossConfig
from janus_train.model import JanusModelConfig, TrainableParts

DEEPSPEED_DIR = CONFIGS_DIR / "deepspeed"


@dataclass(frozen=True)
class TrainSettings:
    micro_batch: int = 1
    grad_accum: int = 8
    epochs: int = 3
    max_steps: int = 0
    """Optimizer steps to run (0: all epochs)."""
    lr_base: float = 2e-5
    lr_projector: float = 1e-5
    lr_vision: float = 1e-6
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    gradient_clipping: float = 1.0
    segment_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)
    distill_weight: float = 1.0
    distill_ramp_steps: int = 0
    lam: float = 0.2
    merger_hidden: int = 4096
    train_vision: bool = False
    gradient_checkpointing: ActivationCheckpointing = FULL
    """Decoder layers that recompute activations in backward: full | none | every_K (true/false too)."""
    seed: int = 0
    num_workers: int = 2
    save_every: int = 500
    save_total_limit: int = 2
    log_every: int = 10
    empty_cache_every: int = 0
    live_check_every: int = 0
    deepspeed: str = "zero3.json"
    wall_clock_breakdown: bool = False
    alloc_conf: str = ""
    """PYTORCH_CUDA_ALLOC_CONF for the training processes (e.g. expandable_segments:True)."""

    def loss_config(self) -> LossConfig:
        return LossConfig(self.segment_weights, self.distill_weight, self.distill_ramp_steps)

    def model_config(self) -> JanusModelConfig:
        trainable = TrainableParts(vision_tower=self.train_vision)
        return JanusModelConfig(lam=self.lam, merger_hidden=self.merger_hidden, trainable=trainable,
                                init_seed=self.seed)


def load_train_settings(profile: Profile) -> TrainSettings:
    """Validate the profile's ``train`` section; a wrong setting is named with the profile file."""
    sec = Section(dict(profile.train), "train", profile.source)
    d = TrainSettings()
    weights = sec.get("segment_weights", list, list(d.segment_weights))
    if len(weights) != 4 or not all(isinstance(w, (int, float)) for w in weights):
        raise ProfileError(f"{profile.source}: setting 'train.segment_weights' needs 4 numbers, got {weights!r}")
    number = (int, float)
    settings = TrainSettings(
        micro_batch=sec.positive("micro_batch", d.micro_batch),
        grad_accum=sec.positive("grad_accum", d.grad_accum),
        epochs=sec.positive("epochs", d.epochs),
        max_steps=sec.get("max_steps", int, d.max_steps),
        lr_base=float(sec.get("lr_base", number, d.lr_base)),
        lr_projector=float(sec.get("lr_projector", number, d.lr_projector)),
        lr_vision=float(sec.get("lr_vision", number, d.lr_vision)),
        weight_decay=float(sec.get("weight_decay", number, d.weight_decay)),
        warmup_ratio=float(sec.get("warmup_ratio", number, d.warmup_ratio)),
        gradient_clipping=float(sec.get("gradient_clipping", number, d.gradient_clipping)),
        segment_weights=tuple(float(w) for w in weights),  # type: ignore[arg-type]
        distill_weight=float(sec.get("distill_weight", number, d.distill_weight)),
        distill_ramp_steps=sec.get("distill_ramp_steps", int, d.distill_ramp_steps),
        lam=float(sec.get("lam", number, d.lam)),
        merger_hidden=sec.positive("merger_hidden", d.merger_hidden),
        train_vision=sec.get("train_vision", bool, d.train_vision),
        gradient_checkpointing=_checkpointing(sec, profile, str(d.gradient_checkpointing)),
        seed=sec.get("seed", int, d.seed),
        num_workers=sec.get("num_workers", int, d.num_workers),
        save_every=sec.get("save_every", int, d.save_every),
        save_total_limit=sec.positive("save_total_limit", d.save_total_limit),
        log_every=sec.positive("log_every", d.log_every),
        empty_cache_every=sec.get("empty_cache_every", int, d.empty_cache_every),
        live_check_every=sec.get("live_check_every", int, d.live_check_every),
        deepspeed=sec.get("deepspeed", str, d.deepspeed),
        wall_clock_breakdown=sec.get("wall_clock_breakdown", bool, d.wall_clock_breakdown),
        alloc_conf=sec.get("alloc_conf", str, d.alloc_conf),
    )
    sec.finish()
    if settings.gradient_clipping <= 0:
        raise ProfileError(f"{profile.source}: setting 'train.gradient_clipping' must be > 0 (set it explicitly)")
    if not 0 <= settings.warmup_ratio < 1:
        raise ProfileError(f"{profile.source}: setting 'train.warmup_ratio' must be in [0, 1)")
    if not deepspeed_config_path(settings).is_file():
        raise ProfileError(f"{profile.source}: setting 'train.deepspeed' names {deepspeed_config_path(settings)}, "
                           "which does not exist")
    return settings


def _checkpointing(sec: Section, profile: Profile, default: str) -> ActivationCheckpointing:
    try:
        return ActivationCheckpointing.parse(sec.get("gradient_checkpointing", (bool, str), default))
    except ValueError as exc:
        raise ProfileError(f"{profile.source}: setting 'train.gradient_checkpointing': {exc}") from None


def deepspeed_config_path(settings: TrainSettings) -> Path:
    path = Path(settings.deepspeed)
    return path if path.is_absolute() else DEEPSPEED_DIR / path


def deepspeed_config(settings: TrainSettings, bf16: bool) -> dict[str, Any]:
    """The ZeRO-3 file of ``configs/deepspeed`` with the run's batch, clipping and precision filled in."""
    config = json.loads(deepspeed_config_path(settings).read_text())
    config.pop("_comment", None)
    config["train_micro_batch_size_per_gpu"] = settings.micro_batch
    config["gradient_accumulation_steps"] = settings.grad_accum
    config["gradient_clipping"] = settings.gradient_clipping
    config["bf16"] = {"enabled": bf16}
    config["wall_clock_breakdown"] = settings.wall_clock_breakdown
    return config
