"""What a cache is keyed on: the settings and dataset facts a cache's manifest records, as the
manifest a run with given settings must find (:func:`wanted_manifest`).

Precompute (to refuse or resume a cache), verify (freshness, completeness) and the trainer (which
window variant's arrays to open) all derive the keys from here, so a cache made by one reads as
"the same" in the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from janus_cache.encoder import WindowEncoder, encoder_fingerprint
from janus_cache.index import DatasetIndex, EpisodeIdentity, episode_identities
from janus_cache.profile import CacheSettings
from janus_cache.resolution import Resolution
from janus_cache.store import DatasetIdentity, Layout, Manifest, ResolutionEntry, WindowVariant
from janus_cache.store.compression import FEATURES_COMPRESSION, FRAMES_COMPRESSION
from janus_cache.store.manifest import ViTFeaturesEntry, library_versions
from janus_cache.vit_encoder import ViTEncoder

SAMPLING_RULE = "linspace"
"""Name of the window rule of janus_cache.windows (front padding with frame 0, then linspace)."""

RESAMPLING = "PIL bicubic"


def window_variant(cache: CacheSettings) -> WindowVariant:
    return WindowVariant(
        history=cache.history,
        sampling=SAMPLING_RULE,
        reference_frame=cache.reference_frame,
        layer=cache.layer,
        attention=cache.attention,
    )


def preprocessing(resolution: Resolution) -> dict[str, Any]:
    """How stored frames are made from source images (keyed in the manifest)."""
    return {"mode": resolution.mode, "target": resolution.target, "resample": RESAMPLING, "pad_value": 255}


def frame_shape(index: DatasetIndex, resolution: Resolution) -> tuple[int, int]:
    """(H, W) of every stored frame: fixed for pad mode, from the first source for crop mode."""
    if not index.frames:
        raise ValueError(f"{index.source}: the dataset has no usable frames")
    first = index.frames[0]
    return resolution.frame_shape(first.width, first.height)


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
) -> Manifest:
    """The manifest a cache built from ``index`` with these settings must have (no shards yet);
    ``episodes``: the index's episode identities, when already computed; ``vit``: the frozen ViT
    whose output the cache holds per frame (``cache.vit_features``)."""
    height, width = frame_shape(index, resolution)
    vit_features = {} if vit is None else {resolution.name: vit_entry(vit, resolution.name, (height, width))}
    entry = ResolutionEntry(
        name=resolution.name,
        preprocessing=preprocessing(resolution),
        frame_shape=(height, width, 3),
        feature_shape=encoder.feature_shape(height, width),
    )
    return Manifest(
        format=cache_format,
        window=window_variant(cache),
        encoder_fingerprint=encoder_fingerprint(encoder.model),
        feature_dtype=cache.feature_dtype,
        dataset=dataset_identity(index, episodes),
        layout=Layout(frames_per_shard=cache.frames_per_shard, samples_per_shard=cache.samples_per_shard),
        resolutions={resolution.name: entry},
        counts={"episodes": len(index.episodes), "frames": len(index.frames), "samples": len(index.samples)},
        compression={"frames": FRAMES_COMPRESSION.to_dict(), "features": FEATURES_COMPRESSION.to_dict()},
        versions=library_versions(),
        vit_features=vit_features,
    )


def vit_entry(vit: ViTEncoder, resolution: str, shape: tuple[int, int]) -> ViTFeaturesEntry:
    """The manifest's keyed entry of ``vit``'s features of frames of ``shape`` (H, W) at ``resolution``."""
    return ViTFeaturesEntry(name=resolution, fingerprint=vit.fingerprint, base_model=vit.base_model,
                            dtype=vit.stored_dtype, feature_shape=vit.feature_shape(*shape))
