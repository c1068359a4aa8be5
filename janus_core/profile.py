"""Run profiles: which models, resolution, window variant and hardware a job uses.

A profile is a YAML file under ``configs/profiles/`` (or any path). Each setting is declared once
below (default, type, doc, allowed values); :func:`janus_core.settings.read_settings` validates
the file against these declarations and names the setting that is missing or wrong, so a typo
fails before hours of compute. Values of the form ``${ENV_VAR}`` or ``${ENV_VAR:-default}`` are
read from the environment, which is how the real checkpoints' local paths are given on a cluster.

A profile may start from another (``extends: h800``, a profile name or a path relative to the
file): its settings deep-merge over the parent's, each relative path staying relative to the file
that writes it. Command-line overrides (``--set train.grad_accum=4``) go over both and are read by
the same reader, so a wrong one is the same one-line error, naming the ``--set``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from janus_core.dtypes import DTYPE_NAMES
from janus_core.index.subinstructions import DEFAULT_SUBINSTRUCTION_RULE, SUBINSTRUCTION_RULES
from janus_core.resolution import Resolution
from janus_core.settings import Origin, SettingsError, read_settings, setting
from janus_core.system.device import DEVICES
from janus_core.windows import ATTENTION_MODES, DEFAULT_HISTORY, REFERENCE_FRAMES

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
PROFILES_DIR = CONFIGS_DIR / "profiles"
EXTENDS_KEY = "extends"
"""The profile a profile starts from (a name under configs/profiles/ or a path relative to the file)."""
SET_OPTION = "--set"
SET_HELP = ("Override a profile setting, KEY=VALUE with a dotted name (repeatable), e.g. --set train.grad_accum=4 "
            "--set cache.resolution=pad448; the value is read as YAML, a relative path from the working directory.")


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
        "is bfloat16, else compute_dtype) so training runs only the merger on it (janus_core.qwen_vit).")
    subinstruction_rule: str = setting(
        DEFAULT_SUBINSTRUCTION_RULE, "Which subinstruction a frame gets: reference (the reference trainer's rule) or "
        "janus (see janus_core.index.subinstructions); it changes stored texts, so it is keyed.",
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
                                       "janus_train.config validates them (janus_core knows nothing of training).")
    # Where the settings not written in ``source`` come from (a parent profile, a --set), by dotted
    # key: read_settings names them in errors and resolves their relative paths there.
    origins: Mapping[str, Origin] = field(default_factory=dict, compare=False, metadata={"yaml": False})
    overrides: tuple[str, ...] = field(default=(), compare=False, metadata={"yaml": False})

    def where(self, key: str) -> str:
        """The file (or ``--set``) that wrote the setting ``key``, for an error message."""
        return str(self.origins.get(key, self.source))


def _check_vggt(profile: Profile) -> None:
    vggt = profile.vggt
    if vggt.path is None and vggt.config is None:
        raise ProfileError(
            f"{profile.source}: missing setting 'vggt.path' (a local VGGT-1B checkpoint dir or file, "
            "e.g. via JANUS_VGGT_PATH) or 'vggt.config' (a tiny config for random weights)"
        )
    if vggt.path is not None and not vggt.path.exists():
        raise ProfileError(f"{profile.where('vggt.path')}: setting 'vggt.path' points to {vggt.path}, "
                           f"which does not exist{_copied_hint(profile, 'vggt.path', vggt.path)}")
    if vggt.config is not None and not vggt.config.is_file():
        raise ProfileError(f"{profile.where('vggt.config')}: setting 'vggt.config' points to {vggt.config}, "
                           f"which is not a file{_copied_hint(profile, 'vggt.config', vggt.config)}")


def _check_qwen(profile: Profile) -> None:
    qwen = profile.qwen
    if not (qwen.path / "config.json").is_file():
        raise ProfileError(
            f"{profile.where('qwen.path')}: setting 'qwen.path' points to {qwen.path}, which has no config.json "
            f"(a local Qwen2.5-VL or Qwen3-VL directory, e.g. via JANUS_QWEN_PATH)"
            f"{_copied_hint(profile, 'qwen.path', qwen.path)}"
        )


def _copied_hint(profile: Profile, key: str, resolved: Path) -> str:
    """For a shipped profile copied elsewhere, whose relative model paths no longer resolve: how to
    keep them (empty when the setting's path does not come from such a copy)."""
    written = profile.origins.get(key)
    folder = written.parent if written is not None else profile.source.parent
    if folder.resolve() == PROFILES_DIR.resolve() or (written is not None and not written.label.endswith(".yaml")):
        return ""
    relative = Path(os.path.relpath(resolved, folder))
    if relative.is_absolute() or not (PROFILES_DIR / relative).exists():
        return ""
    shipped = profile.name if (PROFILES_DIR / f"{profile.name}.yaml").is_file() else "tiny"
    return (f"; a profile copied out of {PROFILES_DIR} keeps its relative paths ({relative}): write "
            f"'extends: {shipped}' and only the settings that differ, instead of a copy")


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


def load_profile(name_or_path: str | Path, overrides: Sequence[str] = ()) -> Profile:
    """Load and validate a profile (its ``extends`` chain merged in, then the ``--set`` overrides
    ``KEY=VALUE`` on top); any problem raises ProfileError naming the setting and where it is written."""
    source = profile_path(name_or_path)
    data, origins = _read_chain(source, ())
    origins = {key: origin for key, origin in origins.items() if origin.label != str(source)}
    for text in overrides:
        _apply_override(data, origins, text)
    given = {"source": source, "origins": origins, "overrides": tuple(overrides)}
    try:
        profile = read_settings(Profile, data, "", source, given, origins=origins)
    except SettingsError as err:
        raise ProfileError(str(err)) from None
    _check_vggt(profile)
    _check_qwen(profile)
    return replace(profile, name=profile.name or source.stem)


def _read_file(source: Path) -> dict[str, Any]:
    if not source.is_file():
        raise ProfileError(f"profile file {source} does not exist")
    try:
        data = yaml.safe_load(source.read_text())
    except yaml.YAMLError as err:
        raise ProfileError(f"{source}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ProfileError(f"{source}: the file must be a mapping of settings, got {type(data).__name__}")
    return dict(data)


def _read_chain(source: Path, children: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Origin]]:
    """The settings of ``source`` merged over those of the profiles it extends, and each dotted
    key's file (``children``: the files that extend ``source``, to catch a cycle)."""
    if source in children:
        cycle = " -> ".join(str(path) for path in (*children[children.index(source):], source))
        raise ProfileError(f"{children[0]}: '{EXTENDS_KEY}' makes a cycle: {cycle}")
    data = _read_file(source)
    parent = data.pop(EXTENDS_KEY, None)
    own = {key: Origin.file(source) for key in _keys(data)}
    if parent is None:
        return data, own
    base, origins = _read_chain(_parent_path(parent, source), (*children, source))
    base.pop("name", None)  # a name belongs to its file: the child is named after its own
    return _merged(base, data), {**origins, **own}


def _parent_path(value: Any, child: Path) -> Path:
    """The file that ``extends: value`` in ``child`` names: a path relative to ``child``'s folder,
    else a profile name under configs/profiles/."""
    if not isinstance(value, str) or not value.strip():
        raise ProfileError(f"{child}: setting '{EXTENDS_KEY}' must be a profile name (e.g. h800) or a YAML path, "
                           f"got {value!r}")
    candidate = Path(value).expanduser()
    candidate = candidate if candidate.is_absolute() else child.parent / candidate
    if candidate.is_file():
        return candidate.resolve()
    named = PROFILES_DIR / f"{value}.yaml"
    if named.is_file():
        return named
    known = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
    raise ProfileError(f"{child}: setting '{EXTENDS_KEY}' names {value!r}, which is neither a file ({candidate}) "
                       f"nor a profile (known profiles: {known})")


def _keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every dotted key of ``data``: its sections and their settings."""
    keys = []
    for name, value in data.items():
        key = f"{prefix}{name}"
        keys.append(key)
        if isinstance(value, Mapping):
            keys += _keys(value, f"{key}.")
    return keys


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged over ``base``: sections merge, anything else (lists too) replaces."""
    merged = dict(base)
    for name, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(name), Mapping):
            merged[name] = _merged(merged[name], value)
        else:
            merged[name] = value
    return merged


def _apply_override(data: dict[str, Any], origins: dict[str, Origin], text: str) -> None:
    """``--set KEY=VALUE`` written into ``data``; the keys it adds come from ``text``."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    where = f"{SET_OPTION} {text}"
    if not sep or not all(part.strip() for part in parts):
        raise ProfileError(f"{where}: expected KEY=VALUE with a dotted setting name, e.g. "
                           f"{SET_OPTION} train.grad_accum=4")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or "cannot be read"
        raise ProfileError(f"{where}: the value {raw!r} is not valid YAML ({problem})") from None
    origin = Origin(where, Path.cwd())
    node = data
    for depth, part in enumerate(parts[:-1]):
        section = ".".join(parts[: depth + 1])
        if node.get(part) is None:
            node[part] = {}
            origins[section] = origin
        elif not isinstance(node[part], Mapping):
            raise ProfileError(f"{where}: '{section}' is a setting, not a section of settings")
        node[part] = node = dict(node[part])
    node[parts[-1]] = value
    origins[key] = origin
