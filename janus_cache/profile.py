"""Run profiles: which models, resolution, window variant and hardware a job uses.

A profile is a YAML file under ``configs/profiles/`` (or any path). Loading validates every
setting and names the one that is missing or wrong, so a typo fails before hours of compute.
Values of the form ``${ENV_VAR}`` or ``${ENV_VAR:-default}`` are read from the environment, which
is how the real checkpoints' local paths are given on a cluster.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from janus_cache.device import DEVICES
from janus_cache.dtypes import DTYPE_NAMES
from janus_cache.index.subinstructions import DEFAULT_SUBINSTRUCTION_RULE, SUBINSTRUCTION_RULES
from janus_cache.resolution import Resolution
from janus_cache.vggt.config import ATTENTION_MODES, REFERENCE_FRAMES
from janus_cache.windows import DEFAULT_HISTORY

CONFIGS_DIR = Path(__file__).resolve().parent.parent / "configs"
PROFILES_DIR = CONFIGS_DIR / "profiles"


_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ProfileError(ValueError):
    """A profile setting is missing or wrong; the message names the setting and the file."""


@dataclass(frozen=True)
class CacheSettings:
    """What the precompute stage produces: resolution, window variant and shard sizes."""

    resolution: Resolution
    history: int = DEFAULT_HISTORY
    reference_frame: str = "first"
    layer: int = -2
    attention: str = "causal"
    feature_dtype: str = "bfloat16"
    frames_per_shard: int = 64
    samples_per_shard: int = 16
    vggt_batch: int = 1
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE
    """Which subinstruction a frame gets: ``reference`` (the reference trainer's rule) or ``janus``
    (see ``janus_cache.index.subinstructions``); it changes stored texts, so it is keyed."""


@dataclass(frozen=True)
class EncoderSettings:
    """The frozen VGGT aggregator: a local checkpoint, or a config built with seeded random weights."""

    path: Path | None
    config: Path | None
    seed: int


@dataclass(frozen=True)
class LanguageModelSettings:
    """The Qwen2.5-VL directory (config + tokenizer [+ weights]); random_init ignores any weights."""

    path: Path
    random_init: bool
    seed: int


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    device: str
    compute_dtype: str
    nproc_per_node: int
    cache: CacheSettings
    vggt: EncoderSettings
    qwen: LanguageModelSettings
    train: Mapping[str, Any] = field(default_factory=dict)
    """The raw ``train`` section; ``janus_train.config`` validates it when training starts."""


def _expand_env(value: Any, setting: str, source: Path) -> Any:
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if var in os.environ and os.environ[var] != "":
            return os.environ[var]
        if default is not None:
            return default
        raise ProfileError(
            f"{source}: setting '{setting}' needs environment variable {var}: "
            f"export {var}=... or write the value into the profile"
        )

    return _ENV_PATTERN.sub(substitute, value)


class Section:
    """Reads one mapping of the YAML file, tracking which keys were used to reject unknown ones.

    Also used by later stages (training) to validate their own section of a profile.
    """

    def __init__(self, data: Any, prefix: str, source: Path) -> None:
        if not isinstance(data, dict):
            raise ProfileError(f"{source}: '{prefix}' must be a mapping, got {type(data).__name__}")
        self.data, self.prefix, self.source, self.used = data, prefix, source, set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., choices: tuple = ()) -> Any:
        self.used.add(key)
        setting = self._name(key)
        if key not in self.data or self.data[key] is None:
            if default is ...:
                raise ProfileError(f"{self.source}: missing setting '{setting}'")
            return default
        value = _expand_env(self.data[key], setting, self.source)
        if kind is int and isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if kind is bool and isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            value = value.lower() in ("true", "1")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            want = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ProfileError(f"{self.source}: setting '{setting}' must be {want}, got {value!r}")
        if choices and value not in choices:
            raise ProfileError(
                f"{self.source}: setting '{setting}' is {value!r}; expected one of {', '.join(map(str, choices))}"
            )
        return value

    def section(self, key: str) -> "Section":
        self.used.add(key)
        return Section(self.data.get(key) or {}, self._name(key), self.source)

    def path(self, key: str, required: bool, hint: str = "") -> Path | None:
        raw = self.get(key, str, default=None)
        if raw is None:
            if required:
                raise ProfileError(f"{self.source}: missing setting '{self._name(key)}'{hint}")
            return None
        path = Path(raw).expanduser()
        return path if path.is_absolute() else (self.source.parent / path).resolve()

    def positive(self, key: str, default: int) -> int:
        value = self.get(key, int, default)
        if value < 1:
            raise ProfileError(f"{self.source}: setting '{self._name(key)}' must be >= 1, got {value}")
        return value

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise ProfileError(
                f"{self.source}: unknown setting(s) {', '.join(self._name(k) for k in unknown)}"
            )


def _read_cache(sec: Section) -> CacheSettings:
    try:
        resolution = Resolution.parse(sec.get("resolution", str))
    except ValueError as err:
        raise ProfileError(f"{sec.source}: setting 'cache.resolution': {err}") from None
    settings = CacheSettings(
        resolution=resolution,
        history=sec.get("history", int, DEFAULT_HISTORY),
        reference_frame=sec.get("reference_frame", str, "first", REFERENCE_FRAMES),
        layer=sec.get("layer", int, -2),
        attention=sec.get("attention", str, "causal", ATTENTION_MODES),
        feature_dtype=sec.get("feature_dtype", str, "bfloat16", DTYPE_NAMES),
        frames_per_shard=sec.positive("frames_per_shard", 64),
        samples_per_shard=sec.positive("samples_per_shard", 16),
        vggt_batch=sec.positive("vggt_batch", 1),
        subinstruction_rule=sec.get("subinstruction_rule", str, DEFAULT_SUBINSTRUCTION_RULE, SUBINSTRUCTION_RULES),
    )
    if settings.history < 0:
        raise ProfileError(f"{sec.source}: setting 'cache.history' must be >= 0, got {settings.history}")
    sec.finish()
    return settings


def _read_vggt(sec: Section) -> EncoderSettings:
    path = sec.path("path", required=False)
    config = sec.path("config", required=False)
    seed = sec.get("seed", int, 0)
    sec.finish()
    if path is None and config is None:
        raise ProfileError(
            f"{sec.source}: missing setting 'vggt.path' (a local VGGT-1B checkpoint dir or file, "
            "e.g. via JANUS_VGGT_PATH) or 'vggt.config' (a tiny config for random weights)"
        )
    if path is not None and not path.exists():
        raise ProfileError(f"{sec.source}: setting 'vggt.path' points to {path}, which does not exist")
    if config is not None and not config.is_file():
        raise ProfileError(f"{sec.source}: setting 'vggt.config' points to {config}, which is not a file")
    return EncoderSettings(path=path, config=config, seed=seed)


def _read_qwen(sec: Section) -> LanguageModelSettings:
    hint = " (a local Qwen2.5-VL directory, e.g. via JANUS_QWEN_PATH)"
    path = sec.path("path", required=True, hint=hint)
    assert path is not None
    random_init = sec.get("random_init", bool, False)
    seed = sec.get("seed", int, 0)
    sec.finish()
    if not (path / "config.json").is_file():
        raise ProfileError(
            f"{sec.source}: setting 'qwen.path' points to {path}, which has no config.json{hint}"
        )
    return LanguageModelSettings(path=path, random_init=random_init, seed=seed)


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
    root = Section(data if data is not None else {}, "", source)
    name = root.get("name", str, source.stem)
    device = root.get("device", str, "cpu", DEVICES)
    compute_dtype = root.get("compute_dtype", str, "float32", DTYPE_NAMES)
    nproc = root.positive("nproc_per_node", 1)
    cache = _read_cache(root.section("cache"))
    vggt = _read_vggt(root.section("vggt"))
    qwen = _read_qwen(root.section("qwen"))
    train = root.get("train", dict, {})
    root.finish()
    return Profile(
        name=name,
        source=source,
        device=device,
        compute_dtype=compute_dtype,
        nproc_per_node=nproc,
        cache=cache,
        vggt=vggt,
        qwen=qwen,
        train=train,
    )
