"""Opening a cache for reading: the manifest once, then the reader of its format.

``open_cache(path, resolution="pad644", variant=window.name)`` is how the trainer, info, the
bench and verify get at a cache. The manifest says what the cache holds; the reader is built for
exactly the asked resolution and window variant, so nothing re-derives them from directory
listings, and a cache without them is a one-line error naming what it does hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from janus_cache.store.checksums import metadata_problems
from janus_cache.store.commit import StoreError
from janus_cache.store.layout import CacheLayout
from janus_cache.store.manifest import Manifest, ManifestError, read_manifest
from janus_cache.store.wds_store import WdsCacheReader
from janus_cache.store.zarr_store import ZarrCacheReader

CacheReader = ZarrCacheReader | WdsCacheReader

_READERS: dict[str, type[ZarrCacheReader] | type[WdsCacheReader]] = {"zarr": ZarrCacheReader, "wds": WdsCacheReader}


class CacheOpenError(StoreError):
    """A cache cannot be opened as asked (no manifest, or not the asked resolution / variant)."""


@dataclass(frozen=True)
class OpenedCache:
    """A cache opened for one resolution and window variant: its manifest, paths and reader."""

    manifest: Manifest
    layout: CacheLayout
    reader: CacheReader
    resolution: str
    variant: str

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def streaming(self) -> bool:
        """Whether the reader only streams (webdataset) rather than reading rows at random."""
        return isinstance(self.reader, WdsCacheReader)


def load_manifest(path: Path | str) -> Manifest:
    """The manifest of the cache at ``path``; a missing or invalid one is a one-line error."""
    layout = CacheLayout(Path(path))
    try:
        manifest = read_manifest(layout.root)
    except ManifestError as err:
        raise CacheOpenError(str(err)) from None
    if manifest is None:
        raise CacheOpenError(f"{layout.root} is not a janus cache (no {layout.manifest.name})")
    return manifest


def open_cache(path: Path | str, *, resolution: str, variant: str, vit_features: bool = False) -> OpenedCache:
    """Open the cache at ``path`` to read ``resolution`` (e.g. ``"pad644"``) of the window variant
    named ``variant`` (``WindowVariant.name``); with ``vit_features`` every sample also carries its
    frames' cached ViT output (a cache without it for ``resolution`` is an error).

    Reads the manifest once and checks every metadata file against ``checksums.json``. A cache
    that lacks the resolution or variant, or whose metadata was edited or damaged, is a
    :class:`CacheOpenError` naming the file.
    """
    layout = CacheLayout(Path(path))
    manifest = load_manifest(layout.root)
    problems = metadata_problems(layout.root)
    if problems:
        more = f" (and {len(problems) - 1} more metadata file(s))" if len(problems) > 1 else ""
        raise CacheOpenError(problems[0] + more)
    reader = reader_of(manifest, layout, resolution=resolution, variant=variant, vit_features=vit_features)
    return OpenedCache(manifest=manifest, layout=layout, reader=reader, resolution=resolution, variant=variant)


def reader_of(manifest: Manifest, layout: CacheLayout, *, resolution: str, variant: str,
              vit_features: bool = False) -> CacheReader:
    """The reader of an already loaded ``manifest``'s format for ``resolution`` and ``variant``
    (for callers that read several resolutions of one cache, e.g. verify)."""
    if variant != manifest.window.name:
        raise CacheOpenError(
            f"{layout.manifest}: the cache holds window variant {manifest.window.name}, not {variant}"
        )
    if resolution not in manifest.resolutions:
        held = ", ".join(sorted(manifest.resolutions)) or "none"
        raise CacheOpenError(
            f"{layout.manifest}: the cache holds resolution(s) {held}, not {resolution} "
            f"(precompute with --resolution {resolution} adds it)"
        )
    if vit_features and resolution not in manifest.vit_features:
        raise CacheOpenError(
            f"{layout.manifest}: the cache holds no ViT features at {resolution} (the profile sets "
            "cache.vit_features: true); run precompute with this profile to add them, or set it to false"
        )
    try:
        return _READERS[manifest.format](layout.root, resolution=resolution, variant=variant,
                                         vit_features=vit_features)
    except StoreError as err:
        raise CacheOpenError(f"{layout.manifest} lists {resolution}, but {err}") from None
