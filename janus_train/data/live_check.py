"""The trainer's periodic live check (``train.live_check_every``): a cached micro-batch's VGGT
features recomputed by the frozen VGGT and compared with the cache's, sample by sample.

VGGT runs on VGGT's own frames of each sample: the batch's frames where the base's frames are
VGGT's (Qwen2.5-VL); a Qwen3-VL cache stores Qwen3-VL's frames, from which VGGT's cannot be made,
so VGGT's frames are decoded again from the dataset's source files (:class:`SourceWindows`), as
precompute's features phase does. That is why such a run names its dataset (``--data``; refused
at start without it: :func:`janus_train.data.sources.live_check_refusal`).

A sample whose cached feature differs from the live one by more than verify's tolerance
(:mod:`janus_cache.verify.comparison`) is named in one line: its cache is damaged or stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from janus_cache.store.location import CacheLocation
from janus_cache.verify.comparison import Tolerance
from janus_core.imaging import FrameError
from janus_core.index import DatasetIndex
from janus_train.data.samples import LiveFrames


class LiveCheckError(ValueError):
    """A sample's VGGT frames cannot be made from the dataset; the message names it and the fix."""


class SourceWindows:
    """VGGT's uint8 windows ``[B, S, h, w, 3]`` of samples, by key, decoded from the source files of
    ``index`` (the dataset the cache was built from, keyed as the cache is)."""

    def __init__(self, index: DatasetIndex, frames: LiveFrames) -> None:
        self.index, self.frames = index, frames

    def __call__(self, keys: Sequence[str]) -> torch.Tensor:
        windows = []
        for key in keys:
            try:
                sample = self.index.sample(key)
            except KeyError:
                raise LiveCheckError(f"sample {key} of the cache is not in the dataset {self.index.source}: give "
                                     "--data the dataset the cache was built from") from None
            try:
                windows.append(self.frames.vggt_frames([frame.path for frame in self.index.window(sample)]))
            except (FrameError, OSError) as err:
                raise LiveCheckError(f"sample {key}: {err}; restore the dataset the cache was built from") from None
        return torch.from_numpy(np.stack(windows))


def source_windows(data: str | Path, cache: CacheLocation, history: int, frames: LiveFrames) -> SourceWindows:
    """:class:`SourceWindows` of the dataset ``data`` (as given to precompute) the cache ``cache`` was
    built from, indexed with the profile's window ``history`` (the cache's index store reused)."""
    from janus_cache.store import load_manifest
    from janus_cache.verify import dataset_indexes, index_store_of

    manifest = load_manifest(cache)
    _, index = dataset_indexes(data, manifest.window.history, history, manifest.dataset.subinstruction_rule,
                               cache_dir=index_store_of(cache), recorded_names=manifest.dataset.sources)
    assert index is not None
    return SourceWindows(index, frames)


@dataclass(frozen=True)
class FeatureCheck:
    """The live vs cached features of one micro-batch: the largest difference, and the sample
    furthest beyond (or nearest to) its tolerance, with its difference and bound."""

    max_abs: float
    sample: str
    sample_max_abs: float
    sample_bound: float

    @property
    def passed(self) -> bool:
        return self.sample_max_abs <= self.sample_bound

    def problem(self, step: int) -> str | None:
        """One line naming the sample when its cached feature is beyond the tolerance (else None)."""
        if self.passed:
            return None
        return (f"live check at step {step}: the cached VGGT feature of sample {self.sample} differs from VGGT's "
                f"on its frames by {self.sample_max_abs:.3g} (tolerance {self.sample_bound:.3g}): the cache is "
                "damaged or stale; `janus-cache verify CACHE --data DATA --live N` checks it")


def compare_features(keys: Sequence[str], live: torch.Tensor, cached: torch.Tensor, tolerance: Tolerance,
                     feature_dtype: str) -> FeatureCheck:
    """Live vs cached features ``[B, N, 2C]`` of the samples ``keys``; each sample's bound is
    verify's (:meth:`Tolerance.bound` on its cached feature's scale)."""
    live, cached = live.detach().float().cpu(), cached.detach().float().cpu()
    diffs = (live - cached).abs().flatten(1).amax(1).tolist()
    bounds = [tolerance.bound(float(c.abs().max()), feature_dtype) for c in cached]
    worst = max(range(len(keys)), key=lambda i: diffs[i] / bounds[i] if bounds[i] > 0 else float("inf"))
    return FeatureCheck(max(diffs), keys[worst], diffs[worst], bounds[worst])


def worst_of(checks: Sequence[FeatureCheck]) -> FeatureCheck:
    """One check of several ranks' (the largest difference; the sample furthest beyond its bound)."""
    worst = max(checks, key=lambda c: c.sample_max_abs / c.sample_bound if c.sample_bound > 0 else float("inf"))
    return FeatureCheck(max(c.max_abs for c in checks), worst.sample, worst.sample_max_abs, worst.sample_bound)
