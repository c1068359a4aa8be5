"""The training data opened from a profile: its tokenizer, its cache for the profile's resolution and
window variant, the run's samples (live, one cache or several). Libraries: the run's builder
(:mod:`janus_train.build`), ``janus-train show-sample`` and the tests make the same samples with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

from janus_cache.keys import window_variant
from janus_cache.store import OpenedCache, open_cache
from janus_core.bases import cache_base
from janus_core.profile import LanguageModelSettings, Profile
from janus_train.data.mixture import mixed_samples
from janus_train.data.prompt import PromptBuilder
from janus_train.data.samples import CachedSamples, LiveSamples, StreamedSamples
from janus_train.data.sources import CacheSource, as_sources


def load_tokenizer(qwen: LanguageModelSettings) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen.path), use_fast=True)


def open_training_cache(profile: Profile, cache: Path) -> OpenedCache:
    """The cache opened for the profile's resolution and window variant (a cache holding several
    resolutions trains on the profile's one; one lacking it is a one-line error) and, with
    ``cache.vit_features``, every sample's cached ViT output (the model then runs only the merger)."""
    return open_cache(cache, resolution=profile.cache.resolution.name,
                      variant=window_variant(profile.cache).name, vit_features=profile.cache.vit_features)


def make_dataset(profile: Profile, builder: PromptBuilder, cache: Path | Sequence[CacheSource] | None,
                 live_data: Path | None, rank: int, world: int) -> Dataset:
    """The run's samples: live, one cache (zarr: map-style; webdataset: this rank's stream), or
    several zarr caches as one :class:`MixedSamples`."""
    if live_data is not None:
        from janus_core.index import build_index

        index = build_index(live_data, history=profile.cache.history,
                            subinstruction_rule=profile.cache.subinstruction_rule)
        return LiveSamples(index, builder, profile.cache.resolution, cache_base(profile.qwen.path))
    assert cache is not None
    opened = [(source.name, open_training_cache(profile, source.path)) for source in as_sources(cache)]
    if len(opened) > 1:
        return mixed_samples(opened, builder)
    one = opened[0][1]
    if one.streaming:
        return StreamedSamples(one.reader, builder, rank=rank, world=world)
    return CachedSamples(one.reader, builder)
