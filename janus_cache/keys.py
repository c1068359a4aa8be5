"""What a cache is keyed on: the settings and dataset facts a cache's manifest records, as the
manifest a run with given settings must find (:func:`wanted_manifest`).

Precompute (to refuse or resume a cache), verify (freshness, completeness) and the trainer (which
window variant's arrays to open) all derive the keys from here, so a cache made by one reads as
"the same" in the others.

A cache is made for one base model (:mod:`janus_core.bases`). A resolution names VGGT's frame
(``pad224``); the stored uint8 frames are the base's own frame of the same source at the paired
size (:meth:`QwenBase.frame_shape`: VGGT's frame itself for Qwen2.5-VL, 256x256 for Qwen3-VL at
pad224), and the VGGT features are computed from VGGT's frame. The base, both frame sizes and the
pairing rule are keyed (``base``, ``resolutions.<name>.frame_shape`` and ``.preprocessing``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from janus_cache.store.compression import FEATURES_COMPRESSION, FRAMES_COMPRESSION
from janus_cache.store.manifest import (
    DatasetIdentity,
    Manifest,
    ResolutionEntry,
    ShardSizes,
    ViTFeaturesEntry,
    WindowVariant,
    library_versions,
)
from janus_core.bases import DEFAULT_BASE, VGGT_PATCH_SIZE, QwenBase
from janus_core.index import DatasetIndex, EpisodeIdentity, episode_identities
from janus_core.profile import CacheSettings
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution
from janus_core.vggt.encoder import WindowEncoder, encoder_fingerprint

SAMPLING_RULE = "linspace"
"""Name of the window rule of janus_core.windows (front padding with frame 0, then linspace)."""

RESAMPLING = "PIL bicubic"


def window_variant(cache: CacheSettings) -> WindowVariant:
    return WindowVariant(
        history=cache.history,
        sampling=SAMPLING_RULE,
        reference_frame=cache.reference_frame,
        layer=cache.layer,
        attention=cache.attention,
    )


def preprocessing(resolution: Resolution, base: QwenBase = DEFAULT_BASE) -> dict[str, Any]:
    """How stored frames are made from source images (keyed in the manifest): VGGT's preprocessing
    at ``resolution``; for a base with other patches than VGGT's, with every side counted in the
    base's ``frame_patch``-px patches (``frame_target``: the pad/crop side of the stored frame)."""
    made = {"mode": resolution.mode, "target": resolution.target, "resample": RESAMPLING, "pad_value": 255}
    if base.patch_size != VGGT_PATCH_SIZE:  # Qwen2.5-VL's entry stays as caches before a second base have it
        made.update(frame_patch=base.patch_size, frame_target=resolution.target // VGGT_PATCH_SIZE * base.patch_size)
    return made


def describe_preprocessing(made: Mapping[str, Any]) -> str:
    """A manifest's ``preprocessing`` entry as a user reads it: ``pad to 224 px, PIL bicubic, pad value 255``."""
    said = f"{made.get('mode')} to {made.get('target')} px, {made.get('resample')}"
    if made.get("mode") == "pad":
        said += f", pad value {made.get('pad_value')}"
    if "frame_patch" in made:
        said += f"; frames of {made['frame_patch']}-px patches, {made.get('frame_target')} px"
    return said


def frame_shape(index: DatasetIndex, resolution: Resolution) -> tuple[int, int]:
    """(H, W) of VGGT's frame at ``resolution``: fixed for pad mode, from the first source for crop mode."""
    if not index.frames:
        raise ValueError(f"{index.source}: the dataset has no usable frames")
    first = index.frames[0]
    return resolution.frame_shape(first.width, first.height)


def stored_frame_shape(vggt_shape: tuple[int, int], base: QwenBase = DEFAULT_BASE) -> tuple[int, int]:
    """(H, W) of the frames a cache for ``base`` stores, paired with VGGT's frame of ``vggt_shape``."""
    if base.patch_size == VGGT_PATCH_SIZE:
        return vggt_shape
    return base.frame_shape(*vggt_shape)


def resolution_entry(resolution: Resolution, vggt_shape: tuple[int, int], encoder: Any,
                     base: QwenBase = DEFAULT_BASE) -> ResolutionEntry:
    """The manifest's keyed entry of ``resolution`` whose VGGT frames are ``vggt_shape`` (H, W);
    ``encoder``: anything with ``feature_shape(H, W)`` (a :class:`WindowEncoder` or its identity)."""
    return ResolutionEntry(
        name=resolution.name,
        preprocessing=preprocessing(resolution, base),
        frame_shape=(*stored_frame_shape(vggt_shape, base), 3),
        feature_shape=encoder.feature_shape(*vggt_shape),
    )


def dataset_identity(index: DatasetIndex, episodes: Sequence[EpisodeIdentity] | None = None) -> DatasetIdentity:
    """The manifest's dataset identity of ``index`` (from its ``episodes`` identities when given)."""
    episodes = episode_identities(index) if episodes is None else episodes
    return DatasetIdentity.compute(episodes, subinstruction_rule=index.subinstruction_rule,
                                   sources=(s.name for s in index.sources))


def wanted_manifest(
    index: DatasetIndex,
    cache: CacheSettings,
    resolution: Resolution,
    cache_format: str,
    encoder: WindowEncoder,
    episodes: Sequence[EpisodeIdentity] | None = None,
    vit: ViTEncoder | None = None,
    base: QwenBase = DEFAULT_BASE,
) -> Manifest:
    """The manifest a cache built from ``index`` with these settings must have (no shards yet);
    ``episodes``: the index's episode identities, when already computed; ``vit``: the frozen ViT
    whose output the cache holds per frame (``cache.vit_features``); ``base``: the base model whose
    frames the cache stores."""
    shape = frame_shape(index, resolution)
    vit_features = {} if vit is None else {resolution.name: vit_entry(vit, resolution.name, shape)}
    entry = resolution_entry(resolution, shape, encoder, base)
    return Manifest(
        format=cache_format,
        base=base.model_type,
        window=window_variant(cache),
        encoder_fingerprint=encoder_fingerprint(encoder.model),
        feature_dtype=cache.feature_dtype,
        dataset=dataset_identity(index, episodes),
        layout=ShardSizes(frames_per_shard=cache.frames_per_shard, samples_per_shard=cache.samples_per_shard),
        resolutions={resolution.name: entry},
        counts={"episodes": len(index.episodes), "frames": len(index.frames), "samples": len(index.samples)},
        compression={"frames": FRAMES_COMPRESSION.to_dict(), "features": FEATURES_COMPRESSION.to_dict()},
        versions=library_versions(),
        vit_features=vit_features,
    )


def vit_entry(vit: ViTEncoder, resolution: str, vggt_shape: tuple[int, int]) -> ViTFeaturesEntry:
    """The manifest's keyed entry of ``vit``'s features at ``resolution``, whose VGGT frames are
    ``vggt_shape`` (H, W): the ViT sees the base's stored frames paired with them."""
    return ViTFeaturesEntry(name=resolution, fingerprint=vit.fingerprint, base_model=vit.base_model,
                            dtype=vit.stored_dtype,
                            feature_shape=vit.feature_shape(*stored_frame_shape(vggt_shape, vit.base)))
