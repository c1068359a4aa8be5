"""What a training start checks before it imports torch, transformers or DeepSpeed.

Every rank runs these checks alike on the command line and the files it names: the options go
together, the ``--cache`` values parse, the profile and its ``--set`` overrides resolve to valid
train settings (and agree with the run directory's recorded profile), the base model is known, the
live check can read what it needs, a reference checkpoint to start from fits the model, wandb is
there when asked for, the run directory can be one, and each named cache exists. A mistake here is
one ``error:`` line after about a second per rank, where the run's half (:mod:`pipelines.train_run`)
costs several CPU-seconds of imports per rank before its first check.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from janus_cache.store.errors import StoreError
from janus_cache.store.location import CacheLocation, cache_location, is_remote
from janus_core.bases import BaseError, cache_base
from janus_core.profile import Profile, ProfileError
from janus_core.system.lock import not_a_directory
from janus_train.config import TrainSettings, load_train_settings
from janus_train.data.sources import CacheSource, MixtureError, live_check_refusal
from janus_train.loop.logs import WandbMissing, check_wandb
from janus_train.run.provenance import profile_edits_note, run_profile
from pipelines.distributed import Ranks


class Refused(Exception):
    """A start refused in one line, worded where it is refused (the same on every rank)."""


START_ERRORS: tuple[type[Exception], ...] = (Refused, ProfileError, BaseError, MixtureError, WandbMissing)
"""The failures of these checks a user can fix: each is met alike on every rank."""


def usage_problem(cache: list[str] | None, live_data: Path | None, data: str | None) -> str | None:
    """Options that do not go together (exit code 2)."""
    if (not cache) == (live_data is None):
        return "give exactly one of --cache or --live-data"
    if data is not None and (not cache or len(cache) != 1):
        return ("--data checks one --cache against its dataset (--live-data reads the dataset itself; "
                "check the caches of a mixture one by one with janus-cache verify --data)")
    return None


def missing_cache(cache: CacheLocation) -> str | None:
    """The usual first mistake, training (or verifying) before any precompute: why ``cache`` cannot
    be read (None when it exists). A cache in a bucket is asked for its manifest (its credentials, endpoint and
    bucket with it: each failure one line)."""
    if is_remote(cache):
        from janus_cache.store.open import load_manifest  # the readers import torch: only for a bucket

        try:
            load_manifest(cache)
        except StoreError as err:
            return str(err)
        return None
    if Path(cache).exists():
        return None
    return (f"no cache exists at {cache}: make one with `make precompute DATA=<dataset> OUT={cache}` "
            f"(janus-cache precompute <dataset> --out {cache}), or name another with CACHE=<dir>")


def first_refusal(sources: list[CacheSource], refusal: Callable[[Path], str | None]) -> str | None:
    """The first ``refusal`` of a run's caches (None when there is none), naming the cache when
    there are several."""
    for source in sources:
        if (problem := refusal(source.path)) is not None:
            return problem if len(sources) == 1 else f"cache {source.name!r}: {problem}"
    return None


def check_init_from(checkpoint: Path, prof: Profile, ranks: Ranks) -> None:
    """A reference checkpoint to start from (``train.init_from``) has every key the model needs, in
    its shapes (rank 0 notes the heads it keeps unused). Reading one needs transformers' Qwen classes:
    a run that names one pays that import here."""
    from janus_train.checkpoint.reference import ReferenceCheckpointError, check_reference_checkpoint, unused_heads_note

    try:
        check_reference_checkpoint(checkpoint, prof)
    except ReferenceCheckpointError as err:
        raise Refused(str(err)) from None
    note = unused_heads_note(checkpoint)
    if note and ranks.is_main:
        print(note, file=sys.stderr, flush=True)


def run_settings(out: Path, profile: str | None, overrides: list[str] | None, cache: list[str] | None,
                 data: str | None, max_steps: int | None, val_cache: str | None,
                 ranks: Ranks) -> tuple[Profile, TrainSettings]:
    """The run's profile and train settings with the command's overrides, and the checkpoint it
    starts from."""
    if (problem := not_a_directory(out)) is not None:
        raise Refused(problem)
    prof = run_profile(out, profile, overrides or ())
    if profile is None and ranks.is_main and (note := profile_edits_note(out)) is not None:
        print(note, file=sys.stderr, flush=True)
    settings = load_train_settings(prof)
    cache_base(prof.qwen.path)  # an unknown model_type is one line before any rank starts work
    if (refusal := live_check_refusal(prof, settings.live_check_every, len(cache or []), data)) is not None:
        raise Refused(refusal)
    if settings.init_from is not None:
        check_init_from(settings.init_from, prof, ranks)
    check_wandb(settings.wandb_project, prof.source)
    if max_steps is not None:
        settings = replace(settings, max_steps=max_steps)
    if val_cache is not None:  # instead of the profile's validation source (a bucket's kept as its URL)
        location = cache_location(val_cache)
        settings = replace(settings, val_cache=val_cache if is_remote(location) else location, val_episodes=0,
                           val_episodes_fraction=0.0)
    return prof, settings
