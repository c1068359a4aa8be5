"""What a run directory records about how it was made, and reading its profile back.

At each start the trainer's rank 0 writes (paths in :mod:`janus_train.run.layout`):

* ``profile.yaml``: the resolved profile, every setting after defaults, environment variables,
  ``extends`` and ``--set`` (paths absolute), with the ``train`` section as validated; it loads
  as a profile (``--profile RUN/profile.yaml``) into the same settings.
* ``run.json``: ``{"starts": [...]}``, one entry per start (a resume adds one): the time (ISO 8601,
  UTC), the command line and working directory, the number of processes, the profile file and
  ``--set`` overrides given, janus's version and git commit (when run from a git checkout), the
  versions of the libraries that shape a run, the sha256 of each cache's ``manifest.json``, the
  base model it trains (``base``: ``qwen.path``'s ``model_type``, :mod:`janus_core.bases`) and the
  resolved settings it ran with (``settings``: what it wrote to ``profile.yaml``). A ``run.json``
  that cannot be read is kept aside (``run.json.damaged-<time>``) and the start says so in one line.

``janus-train export RUN``, a resume and ``janus-train show-sample --run RUN`` read
``profile.yaml`` when no ``--profile`` is given; a profile given that disagrees with the run's
recorded settings on a setting of :data:`MODEL_SETTINGS` is refused in one line
(:func:`recorded_profile_conflict`), and so is a profile whose ``qwen.path`` is a model of another
base than the one the run trained (:func:`base_conflict`; a run recorded before runs recorded their
base trained Qwen2.5-VL). A ``profile.yaml`` edited since the last start (it differs from that
start's recorded ``settings``) is refused where it changes a setting of :data:`MODEL_SETTINGS` of a
run with a checkpoint, and its other changes are said in one ``note:`` line
(:func:`profile_edits_note`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from janus_cache.store.layout import CacheLayout
from janus_cache.store.location import CacheLocation, cache_location, sha256_of
from janus_core.bases import DEFAULT_BASE, BaseError, QwenBase, base_of_model_type, base_of_qwen_dir, cache_base
from janus_core.profile import Profile, load_profile
from janus_core.settings import settings_data
from janus_core.system.files import atomic_write_bytes
from janus_train.config import TrainSettings
from janus_train.run.layout import RunLayout

PACKAGES: tuple[str, ...] = ("torch", "transformers", "deepspeed", "zarr", "numcodecs", "webdataset", "numpy",
                             "safetensors", "tokenizers", "accelerate", "liger-kernel", "flash-attn")
"""Libraries whose versions a run records (``null``: not installed)."""

MODEL_SETTINGS: tuple[str, ...] = (
    "vggt.seed", "compute_dtype",
    "cache.resolution", "cache.history", "cache.reference_frame", "cache.layer", "cache.attention",
    "cache.feature_dtype", "cache.vit_features",
    "train.lam", "train.merger_hidden", "train.train_vision", "train.init_from", "train.prompt_template",
)
"""The settings that shape a run's weights and the inputs they were trained on: a checkpoint is
resumed, exported or shown only with the values it was trained with. Model paths are left out: the
same checkpoint sits at another path on another machine (export or resume there with its profile)."""

_REPO = Path(__file__).resolve().parent.parent
_GIT_TIMEOUT_S = 10


def utc_now() -> str:
    """Now as ISO 8601 in UTC with milliseconds, e.g. ``2026-01-31T12:00:00.123+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def resolved_profile_data(profile: Profile, settings: TrainSettings) -> dict[str, Any]:
    """The profile as YAML data that loads back into equal settings: every setting, paths absolute."""
    data = settings_data(profile)
    data["train"] = settings_data(settings)
    return data


def write_profile(layout: RunLayout, profile: Profile, settings: TrainSettings) -> None:
    """``profile.yaml`` of the run (replaced atomically at every start)."""
    header = (f"# The resolved profile of this run (from {profile.source}"
              + (f" with --set {' --set '.join(profile.overrides)}" if profile.overrides else "")
              + "): pass it back with --profile.\n")
    atomic_write_bytes(layout.profile, (header + yaml.safe_dump(resolved_profile_data(profile, settings),
                                                                sort_keys=False)).encode())


def set_aside_damaged_record(layout: RunLayout) -> str | None:
    """Move a ``run.json`` that cannot be read (not JSON, or not a record of starts) aside, so the
    next entry starts a new one and nothing is lost; the one line saying so (None: nothing to do)."""
    try:
        record = json.loads(layout.run_file.read_bytes())
        if isinstance(record, dict) and isinstance(record.get("starts", []), list):
            return None
        problem = "not a record of starts"
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        problem = f"{type(err).__name__}: {err}"
    aside = layout.damaged_run_file(datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    os.replace(layout.run_file, aside)
    return (f"warning: {layout.run_file} could not be read ({problem}); kept it as {aside} and began a new record "
            "with this start")


def append_start(layout: RunLayout, profile: Profile, world: int, caches: Sequence[Path],
                 settings: TrainSettings | None = None) -> dict[str, Any]:
    """Add this start's entry to ``run.json`` (atomically), with the resolved ``settings`` it runs
    with when given; returns it. A damaged ``run.json`` is set aside first
    (:func:`set_aside_damaged_record`, whose line the caller prints)."""
    entry = {
        "time": utc_now(),
        "command": list(getattr(sys, "orig_argv", sys.argv)),
        "cwd": os.getcwd(),
        "world": world,
        "profile": {"name": profile.name, "file": str(profile.source), "overrides": list(profile.overrides)},
        "janus": {"version": _version("janus"), **git_state()},
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "caches": [cache_entry(path) for path in caches],
        "base": cache_base(profile.qwen.path).model_type,
    }
    if settings is not None:
        entry["settings"] = resolved_profile_data(profile, settings)
    starts: list[Any] = []
    if layout.run_file.is_file():
        try:
            starts = list(json.loads(layout.run_file.read_text()).get("starts", []))
        except (ValueError, AttributeError):  # damaged (and not set aside by the caller): starts over
            starts = []
    atomic_write_bytes(layout.run_file, (json.dumps({"starts": [*starts, entry]}, indent=1) + "\n").encode())
    return entry


def cache_entry(cache: CacheLocation) -> dict[str, Any]:
    """A cache as a run records it: its path (or URL) and the sha256 of its manifest file."""
    manifest = CacheLayout(cache).manifest
    digest = sha256_of(manifest)[1] if manifest.is_file() else None
    return {"path": str(cache_location(cache).resolve()), "manifest_sha256": digest}


def git_state() -> dict[str, Any]:
    """The git commit of the janus checkout this runs from (None outside one) and whether it has
    uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True,
                                    timeout=_GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout.strip() if result.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ------------------------------------------------------------------------------------ reading back


def run_profile(run: Path, profile: str | None, overrides: Sequence[str] = (), default: str | None = "tiny") -> Profile:
    """The profile to use on the run ``run``: ``profile`` when given, else the run's recorded
    ``profile.yaml``, else ``default`` (a new run; None: that is an error); with the ``--set``
    overrides on top. Raises ProfileError (one line) when the run records a profile and the result
    disagrees with it on a setting of :data:`MODEL_SETTINGS`."""
    from janus_core.profile import ProfileError
    from janus_train.config import load_train_settings

    recorded = RunLayout(run).profile
    name = profile if profile is not None else (recorded if recorded.is_file() else default)
    if name is None:
        raise ProfileError(f"{run} records no profile ({recorded} is missing: a run from before janus recorded it, "
                           "or not a run directory); give the one it was trained with as --profile")
    chosen = load_profile(name, overrides)
    conflict = base_conflict(run, chosen)
    if conflict is not None:
        raise ProfileError(conflict)
    if name == recorded:
        edited = [edit for edit in profile_file_edits(run) if edit[0] in MODEL_SETTINGS]
        if edited and RunLayout(run).has_checkpoint():
            raise ProfileError(f"{recorded} was edited after the run's last start ({RunLayout(run).run_file.name} "
                               f"records its settings): {_changes(edited)}; these settings shape the run's "
                               "checkpoints: restore them, or train into a new --out")
    if not overrides and name == recorded:
        return chosen
    if recorded.is_file():
        conflict = recorded_profile_conflict(run, chosen, load_train_settings(chosen))
        if conflict is not None:
            raise ProfileError(conflict)
    return chosen


def _last_start(run: Path) -> Mapping[str, Any] | None:
    """The latest start of the run's ``run.json`` (None: none, or not readable)."""
    try:
        starts = json.loads(RunLayout(run).run_file.read_text()).get("starts")
    except (OSError, ValueError, AttributeError):
        return None
    return starts[-1] if isinstance(starts, list) and starts and isinstance(starts[-1], Mapping) else None


def recorded_settings(run: Path) -> dict[str, Any] | None:
    """The resolved settings of the run's latest start as ``run.json`` records them, flat (dotted
    names); None for a run whose starts did not record them."""
    start = _last_start(run)
    settings = start.get("settings") if start is not None else None
    return _flat(settings) if isinstance(settings, Mapping) else None


def profile_file_edits(run: Path) -> list[tuple[str, Any, Any]]:
    """Each setting where the run's ``profile.yaml`` differs from what its latest start recorded
    (edited since): (dotted name, the file's value, the recorded one); empty when it was not edited
    or nothing is recorded to compare with."""
    from janus_train.config import load_train_settings

    recorded = recorded_settings(run)
    if recorded is None or not RunLayout(run).profile.is_file():
        return []
    profile = load_profile(str(RunLayout(run).profile))
    now = _flat(json.loads(json.dumps(resolved_profile_data(profile, load_train_settings(profile)), default=str)))
    return [(key, now.get(key), recorded.get(key)) for key in sorted(set(now) | set(recorded))
            if now.get(key) != recorded.get(key)]


def _changes(edits: Sequence[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{key} is {now!r}, the run's was {was!r}" for key, now, was in edits)


def profile_edits_note(run: Path) -> str | None:
    """One ``note:`` line naming the settings the run's ``profile.yaml`` changed since its latest
    start (those that shape its checkpoints are refused by :func:`run_profile`); None when none."""
    edits = [edit for edit in profile_file_edits(run) if edit[0] not in MODEL_SETTINGS]
    if not edits:
        return None
    return (f"note: {RunLayout(run).profile} was edited after the run's last start: {_changes(edits)}; the file's "
            "values are used")


def recorded_base(run: Path) -> QwenBase | None:
    """The base model the run trained: its latest start's ``base`` in ``run.json``; Qwen2.5-VL for a
    run recorded before starts named their base; None without a readable ``run.json`` (checkpoints
    copied without their record: nothing says what they hold)."""
    layout = RunLayout(run)
    try:
        starts = json.loads(layout.run_file.read_text()).get("starts")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(starts, list):
        return None
    for start in reversed(starts):
        if isinstance(start, Mapping) and "base" in start:
            return base_of_model_type(str(start["base"]), str(layout.run_file))
    return DEFAULT_BASE


def base_conflict(run: Path, profile: Profile) -> str | None:
    """Why ``profile`` must not resume or export ``run`` (None when it may): its ``qwen.path`` is a
    model of another base than the one the run's checkpoints hold. A profile whose Qwen directory
    has no ``config.json`` is left to the model loading, which names the missing file."""
    from janus_core.profile import ProfileError

    layout = RunLayout(run)
    if not layout.has_checkpoint() or not (Path(profile.qwen.path) / "config.json").is_file():
        return None
    try:
        trained, wanted = recorded_base(run), base_of_qwen_dir(profile.qwen.path)
    except BaseError as err:
        raise ProfileError(str(err)) from None
    if trained is None or trained is wanted:
        return None
    given = str(profile.source) + "".join(f" --set {text}" for text in profile.overrides)
    return (f"run {run} trained a {trained.name} model ({trained.model_type}, {layout.run_file.name}) but {given} "
            f"names a {wanted.name} model (qwen.path {profile.qwen.path}); give a profile of a {trained.name} model "
            f"(leave out --profile to use the run's own), or train {wanted.name} into a new --out")


def recorded_profile_conflict(run: Path, profile: Profile, settings: TrainSettings) -> str | None:
    """Why ``profile`` must not be used on ``run`` (None when it may): the settings of
    :data:`MODEL_SETTINGS` where it differs from the run's recorded ``profile.yaml``."""
    layout = RunLayout(run)
    if not layout.profile.is_file() or not layout.has_checkpoint():  # nothing trained yet to disagree with
        return None
    recorded = recorded_settings(run)  # what the last start ran with; else its profile.yaml
    if recorded is None:
        try:
            recorded = _flat(yaml.safe_load(layout.profile.read_text()) or {})
        except yaml.YAMLError as err:
            return f"{layout.profile}: not valid YAML ({err}); remove it to use --profile's settings on this run"
    wanted = _flat(resolved_profile_data(profile, settings))
    differing = [key for key in MODEL_SETTINGS if key in recorded and key in wanted and recorded[key] != wanted[key]]
    if not differing:
        return None
    given = str(profile.source) + "".join(f" --set {text}" for text in profile.overrides)
    changes = "; ".join(f"{key} is {wanted[key]!r}, the run's is {recorded[key]!r}" for key in differing)
    return (f"{given} disagrees with the profile run {run} was trained with ({layout.profile}): {changes}; "
            f"leave out --profile to use the run's own, or train into a new --out")


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat
