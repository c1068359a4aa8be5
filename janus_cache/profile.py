"""Run profiles: which models, resolution, window variant and hardware a job uses.

A profile is a YAML file under ``configs/profiles/`` (or any path). Each setting is declared once
below (default, type, doc, allowed values); :func:`janus_cache.settings.read_settings` validates
the file against these declarations and names the setting that is missing or wrong, so a typo
fails before hours of compute. Values of the form ``${ENV_VAR}`` or ``${ENV_VAR:-default}`` are
read from the environment, which is how the real checkpoints' local paths are given on a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from janus_cache.device import DEVICES
from janus_cache.dtypes import DTYPE_NAMES
from janus_cache.index.subinstructions import DEFAULT_SUBINSTRUCTION_RULE, SUBINSTRUCTION_RULES
from janus_cache.resolution import Resolution
from janus_cache.settings import SettingsError, read_settings, setting
from janus_cache.windows import ATTENTION_MODES, DEFAULT_HISTORY, REFERENCE_FRAMES

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
PROFILES_DIR = CONFIGS_DIR / "profiles"


class ProfileError(SettingsError):
    """A profile setting is missing or wrong; the message names the setting and the file."""


@dataclass(frozen=True)
class CacheSettings:
    """What the precompute stage produces: resolution, window variant and shard sizes."""

    resolution: Resolution = setting(doc="Frame resolution, e.g. pad644 (the reference), crop644, pad224.",
                                     parse=Resolution.parse)
    history: int = setting(DEFAULT_HISTORY, "History frames per window (the current frame comes on top).", min=1)
    reference_frame: str = setting("last", "VGGT reference frame: last (the reference trainer) or first "
                                   "(the upstream paper code).", choices=REFERENCE_FRAMES)
    layer: int = setting(-2, "Aggregator layer whose tokens are the features (negative: from the end).")
    attention: str = setting("causal", "VGGT frame attention over the window.", choices=ATTENTION_MODES)
    feature_dtype: str = setting("bfloat16", "Dtype the features are stored in.", choices=DTYPE_NAMES)
    frames_per_shard: int = setting(64, "Frames per frame-store shard.", min=1)
    samples_per_shard: int = setting(16, "Samples per feature shard.", min=1)
    vggt_batch: int = setting(1, "Windows per VGGT forward pass.", min=1)
    vit_features: bool = setting(
        False, "Also cache the frozen Qwen ViT's output per frame (the patch merger's input; bf16 when compute_dtype "
        "is bfloat16, else compute_dtype) so training runs only the merger on it (janus_cache.vit_encoder).")
    subinstruction_rule: str = setting(
        DEFAULT_SUBINSTRUCTION_RULE, "Which subinstruction a frame gets: reference (the reference trainer's rule) or "
        "janus (see janus_cache.index.subinstructions); it changes stored texts, so it is keyed.",
        choices=SUBINSTRUCTION_RULES)


@dataclass(frozen=True)
class EncoderSettings:
    """The frozen VGGT aggregator: a local checkpoint, or a config built with seeded random weights."""

    path: Path | None = setting(None, "A local VGGT-1B checkpoint directory or file (e.g. ${JANUS_VGGT_PATH}).")
    config: Path | None = setting(None, "A tiny aggregator config (JSON) built with seeded random weights.")
    seed: int = setting(0, "Seed of the random weights (with config).")
    compile: bool = setting(False, "torch.compile the blocks' elementwise work (LayerNorm, q/k norm, RoPE, "
                            "LayerScale, residual) around the matmuls and attention; features stay within "
                            "verify's tolerances of the eager path. Off by default: compiling costs minutes "
                            "at start-up, and its speed-up on a GPU awaits measurement (make bench-gpu).")


@dataclass(frozen=True)
class LanguageModelSettings:
    """The Qwen2.5-VL directory (config + tokenizer [+ weights]); random_init ignores any weights."""

    path: Path = setting(doc="A local Qwen2.5-VL directory (config.json, tokenizer, weights), "
                         "e.g. ${JANUS_QWEN_PATH}.")
    random_init: bool = setting(False, "Ignore the directory's weights and initialise randomly (tiny models).")
    seed: int = setting(0, "Seed of the random initialisation.")


@dataclass(frozen=True)
class Profile:
    """One YAML file: the run's hardware and the settings of every stage."""

    source: Path = setting(doc="The profile file.", yaml=False)
    cache: CacheSettings = setting(doc="Precompute settings.")
    vggt: EncoderSettings = setting(doc="The frozen VGGT encoder.")
    qwen: LanguageModelSettings = setting(doc="The Qwen2.5-VL model.")
    name: str = setting("", "Profile name (default: the file name without .yaml).")
    device: str = setting("cpu", "Device of every process.", choices=DEVICES)
    compute_dtype: str = setting("float32", "Dtype of the model's compute.", choices=DTYPE_NAMES)
    nproc_per_node: int = setting(1, "Processes per node (one per GPU).", min=1)
    train: Mapping[str, Any] = setting({}, "The training settings; "
                                       "janus_train.config validates them (janus_cache knows nothing of training).")


def _check_vggt(vggt: EncoderSettings, source: Path) -> None:
    if vggt.path is None and vggt.config is None:
        raise ProfileError(
            f"{source}: missing setting 'vggt.path' (a local VGGT-1B checkpoint dir or file, "
            "e.g. via JANUS_VGGT_PATH) or 'vggt.config' (a tiny config for random weights)"
        )
    if vggt.path is not None and not vggt.path.exists():
        raise ProfileError(f"{source}: setting 'vggt.path' points to {vggt.path}, which does not exist")
    if vggt.config is not None and not vggt.config.is_file():
        raise ProfileError(f"{source}: setting 'vggt.config' points to {vggt.config}, which is not a file")


def _check_qwen(qwen: LanguageModelSettings, source: Path) -> None:
    if not (qwen.path / "config.json").is_file():
        raise ProfileError(
            f"{source}: setting 'qwen.path' points to {qwen.path}, which has no config.json "
            "(a local Qwen2.5-VL directory, e.g. via JANUS_QWEN_PATH)"
        )


def profile_path(name_or_path: str | Path) -> Path:
    """A profile name (``tiny``) resolves under configs/profiles/; anything else is a file path."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        return candidate.resolve()
    named = PROFILES_DIR / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
    raise ProfileError(f"unknown profile '{name_or_path}': no file {named} (known profiles: {known})")


def load_profile(name_or_path: str | Path) -> Profile:
    """Load and validate a profile; any problem raises ProfileError naming the setting."""
    source = profile_path(name_or_path)
    if not source.is_file():
        raise ProfileError(f"profile file {source} does not exist")
    try:
        data = yaml.safe_load(source.read_text())
    except yaml.YAMLError as err:
        raise ProfileError(f"{source}: not valid YAML: {err}") from None
    try:
        profile = read_settings(Profile, data, "", source, {"source": source})
    except SettingsError as err:
        raise ProfileError(str(err)) from None
    _check_vggt(profile.vggt, source)
    _check_qwen(profile.qwen, source)
    return replace(profile, name=profile.name or source.stem)
