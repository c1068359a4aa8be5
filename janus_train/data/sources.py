"""What a run reads, as the command line names it: its caches (one ``PATH``, or several
``NAME=PATH:WEIGHT`` drawn with sampling weights, see :mod:`janus_train.data.mixture`), and whether its
live check can read what it needs from them.

Parsed and checked before the run imports torch, transformers or DeepSpeed, so a mistyped
``--cache`` value is one line in a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from janus_cache.store.location import CacheLocation, cache_location
from janus_cache.store.remote.path import S3Path
from janus_core.bases import VGGT_PATCH_SIZE, cache_base
from janus_core.profile import Profile


class MixtureError(ValueError):
    """A mixture that cannot be built (a bad ``--cache`` value, a duplicate name, caches that differ)."""


@dataclass(frozen=True)
class CacheSource:
    """One cache of a run: its name (used in sample keys and logs), location (a directory, or
    ``s3://BUCKET/PREFIX`` read in place) and sampling weight."""

    name: str
    path: CacheLocation
    weight: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", cache_location(self.path))

    @classmethod
    def parse(cls, text: str) -> CacheSource:
        """``PATH`` (one cache, named after its directory) or ``NAME=PATH:WEIGHT``."""
        if "=" not in text:
            path = cache_location(text)
            return cls(path.name or str(path), path, 1.0)
        name, _, rest = text.partition("=")
        path_text, colon, weight_text = rest.rpartition(":")
        if not name or not colon or not path_text:
            raise MixtureError(f"--cache {text!r}: expected PATH or NAME=PATH:WEIGHT (e.g. r2r=caches/r2r:0.7)")
        try:
            weight = float(weight_text)
        except ValueError:
            raise MixtureError(f"--cache {text!r}: the weight {weight_text!r} is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise MixtureError(f"--cache {text!r}: the weight must be a positive number, got {weight_text}")
        return cls(name, cache_location(path_text), weight)


def parse_cache_sources(texts: Sequence[str]) -> list[CacheSource]:
    """The ``--cache`` values of a run: one ``PATH``, or several ``NAME=PATH:WEIGHT`` with distinct names."""
    sources = [CacheSource.parse(text) for text in texts]
    if not sources:
        raise MixtureError("no cache given")
    if len(sources) > 1:
        unweighted = [t for t in texts if "=" not in t]
        if unweighted:
            raise MixtureError(f"--cache {unweighted[0]!r}: several caches need NAME=PATH:WEIGHT each")
        names = [s.name for s in sources]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise MixtureError(f"--cache: the name {duplicates[0]!r} is given twice")
    return sources



def as_sources(cache: str | CacheLocation | Sequence[CacheSource]) -> list[CacheSource]:
    """A run's caches: one location (weight 1, named after it) or several weighted sources."""
    if isinstance(cache, (str, Path, S3Path)):
        location = cache_location(cache)
        return [CacheSource(location.name or str(location), location, 1.0)]
    return list(cache)


def live_check_refusal(profile: Profile, live_check_every: int, caches: int, data: str | Path | None) -> str | None:
    """Why a run from ``caches`` caches cannot run its live check (None when it can): the cache of a
    base whose frames are not VGGT's holds no VGGT frames, so the check needs the dataset it was
    built from (``data``), for one cache."""
    base = cache_base(profile.qwen.path)
    if base.patch_size == VGGT_PATCH_SIZE or not caches or not live_check_every:
        return None
    if data is not None and caches == 1:
        return None
    return (f"{profile.source}: train.live_check_every on a {base.name} cache decodes VGGT's frames from the "
            f"dataset's source files (the cache holds {base.name}'s frames): train one --cache with --data, the "
            "dataset it was built from (make train ... DATA=...), or set train.live_check_every: 0")
