"""The freshness check: the cache's keyed fingerprints (encoder weights, resolution and
preprocessing, window variant, feature dtype and, with ``cache.vit_features``, the frozen Qwen
ViT's weights, base model and dtype) equal those a profile makes; every differing field
is named with both values. Library versions that differ are noted, never a failure."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from janus_cache.keys import resolution_entry, vit_entry, window_variant
from janus_cache.store.layout import FRAMES_TABLE
from janus_cache.store.manifest import (
    FieldDiff,
    ResolutionEntry,
    ViTFeaturesEntry,
    keyed_differences,
    library_versions,
    version_differences,
)
from janus_cache.store.open import OpenedCache
from janus_cache.verify.cache import open_checked
from janus_cache.verify.results import FRESHNESS, CheckResult, guarded, result, short, timer
from janus_core.bases import BASES, QwenBase, cache_base
from janus_core.plural import plural
from janus_core.profile import Profile, load_profile
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution
from janus_core.vggt.encoder import EncoderIdentity, encoder_identity


def as_profile(profile: Profile | str | Path) -> Profile:
    """A profile, or the one a name or YAML path names."""
    return profile if isinstance(profile, Profile) else load_profile(profile)


def profile_encoder(profile: Profile) -> EncoderIdentity:
    """The fingerprint and architecture of the profile's encoder, from its checkpoint file
    (never building the aggregator) or, for a seeded random encoder, from the seeded weights."""
    return encoder_identity(profile.vggt, profile.cache.attention)


def profile_vit(profile: Profile) -> ViTEncoder | None:
    """The profile's frozen Qwen ViT when it caches its output (``cache.vit_features``), on the CPU."""
    return ViTEncoder.from_profile(profile, "cpu") if profile.cache.vit_features else None


def profile_differences(cache: OpenedCache, profile: Profile, encoder: EncoderIdentity,
                        vit: ViTEncoder | None = None) -> list[FieldDiff]:
    """Keyed fields in which the cache differs from what ``profile`` (with its ``encoder`` and, for
    ``cache.vit_features``, its frozen ``vit``) makes."""
    m = cache.manifest
    base = cache_base(profile.qwen.path)
    if m.base != base.model_type:  # every frame differs then: the base is the one difference to name
        return [FieldDiff("base", m.base, base.model_type)]
    resolution = profile.cache.resolution
    differences: list[FieldDiff] = []
    wanted_resolutions: dict[str, ResolutionEntry] = {}
    wanted_vit: dict[str, ViTFeaturesEntry] = {}
    if resolution.name not in m.resolutions:
        differences.append(FieldDiff("resolution", sorted(m.resolutions), resolution.name))
    else:
        height, width = _frame_shape(cache, resolution)
        wanted_resolutions[resolution.name] = resolution_entry(resolution, (height, width), encoder, base)
        if vit is not None:
            wanted_vit[resolution.name] = vit_entry(vit, resolution.name, (height, width))
            if resolution.name not in m.vit_features:
                differences.append(FieldDiff(f"vit_features.{resolution.name}", None,
                                             "ViT features (cache.vit_features: true; a precompute with this "
                                             "profile adds them)"))
    wanted = replace(
        m,
        window=window_variant(profile.cache),
        encoder_fingerprint=encoder.fingerprint,
        feature_dtype=profile.cache.feature_dtype,
        resolutions=wanted_resolutions,
        vit_features=wanted_vit,
    )
    # Dataset, layout and format are the same by construction: the dataset is completeness's job,
    # and shard sizes change no stored value.
    return differences + keyed_differences(m, wanted)


def base_problem(root: Path | str, profile: Profile, made_for: QwenBase, wanted: QwenBase) -> str:
    """The line refusing a cache made for another base than the profile's ``qwen.path``."""
    return (f"{root} is a cache for {made_for.name} (its frames are {made_for.name}'s), profile {profile.name}'s "
            f"qwen.path {profile.qwen.path} is a {wanted.name} model: use a profile whose qwen.path is a "
            f"{made_for.name} model, or precompute a cache with this profile into another --out")


def _frame_shape(cache: OpenedCache, resolution: Resolution) -> tuple[int, int]:
    if resolution.mode == "pad":
        return resolution.frame_shape()
    first = cache.group.table_row(FRAMES_TABLE, 0)  # crop: the frame height follows the sources
    return resolution.frame_shape(int(first["source_width"]), int(first["source_height"]))


@guarded(FRESHNESS)
def check_freshness(root: Path | str, profile: Profile | str | Path,
                    encoder: EncoderIdentity | None = None) -> CheckResult:
    """The cache's keyed fingerprints against ``profile``'s; the encoder's identity is computed
    from the profile (:func:`profile_encoder`) unless given, the frozen ViT's (``cache.vit_features``)
    from the profile's Qwen weights."""
    with timer() as elapsed:
        cache = open_checked(root, FRESHNESS)
        if isinstance(cache, CheckResult):
            return cache
        profile = as_profile(profile)
        differences = profile_differences(cache, profile, encoder or profile_encoder(profile), profile_vit(profile))
        problems = [base_problem(root, profile, BASES[d.existing], BASES[d.wanted]) if d.name == "base" else
                    f"{d.name}: cache has {d.existing!r}, profile {profile.name} has {d.wanted!r}" for d in differences]
        current = replace(cache.manifest, versions=library_versions())
        versions = version_differences(cache.manifest, current)
        m = cache.manifest
        detail = (f"profile {profile.name}: encoder {short(m.encoder_fingerprint)}, {', '.join(m.resolutions)}, "
                  f"{m.window.name}, {m.feature_dtype}"
                  + "".join(f", ViT {short(v.fingerprint)} {v.dtype} at {v.name}" for v in m.vit_features.values()))
        if problems:
            detail = f"{plural(len(problems), 'keyed field', 'differs')} from profile {profile.name}"
        if versions:
            detail += "; made with other library versions (" + ", ".join(
                f"{d.name.removeprefix('versions.')} {d.existing} -> {d.wanted}" for d in versions) + ")"
        return result(FRESHNESS, problems, detail, elapsed(), profile=profile.name,
                      differences=[{"field": d.name, "cache": d.existing, "profile": d.wanted} for d in differences],
                      version_differences=[{"field": d.name, "cache": d.existing, "now": d.wanted} for d in versions])
