"""Opening a cache for reading: the manifest once, then the reader of its format.

``open_cache(path, resolution="pad644", variant=window.name)`` is how the trainer, info, the
bench and verify get at a cache. The manifest says what the cache holds; the reader is built for
exactly the asked resolution and window variant, so nothing re-derives them from directory
listings, and a cache without them is a one-line error naming what it does hold.

``open_cache(path, check_metadata=False)`` opens a cache whole, as verify does: no one reader, but
one for any resolution it lists (:meth:`OpenedCache.reader_at`), its tables and key columns read
once however many checks ask, and its metadata files left for the integrity check to report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from janus_core.plural import plural
from janus_cache.store.checksums import metadata_problems
from janus_cache.store.commit import StoreError
from janus_cache.store.formats import cache_format
from janus_cache.store.layout import KEY_COLUMN, CacheLayout, features_array, wds_samples
from janus_cache.store.location import CacheLocation, cache_location, is_remote
from janus_cache.store.manifest import Manifest, ManifestError, read_manifest

if TYPE_CHECKING:
    from janus_cache.store.wds_store import WdsCacheReader
    from janus_cache.store.zarr_group import ZarrGroup
    from janus_cache.store.zarr_store import ZarrCacheReader

CacheReader: TypeAlias = "ZarrCacheReader | WdsCacheReader"
"""The reader of either format. Opening a cache imports neither until it reads one (they bring
torch): a command that only reads a manifest, or fails on it, starts in a fraction of a second."""


class CacheOpenError(StoreError):
    """A cache cannot be opened as asked (no manifest, or not the asked resolution / variant)."""


@dataclass(frozen=True, eq=False)
class OpenedCache:
    """A cache opened for reading: its manifest (read once), paths, and the reader of the
    resolution and window variant it was opened for (:attr:`reader`; a cache opened whole has
    none, :meth:`reader_at` reads any resolution). Tables and key columns read through it are
    read once and kept."""

    manifest: Manifest
    layout: CacheLayout
    resolution: str | None
    """The resolution asked for; None for a cache opened whole."""
    variant: str
    _reader: CacheReader | None = field(default=None, repr=False)
    _tables: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _keys: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _unreadable: set[str] = field(default_factory=set, repr=False)

    @property
    def root(self) -> CacheLocation:
        return self.layout.root

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def reader(self) -> CacheReader:
        """The reader of the resolution and variant the cache was opened for."""
        if self._reader is None:
            raise CacheOpenError(f"{self.root} was opened whole, for no one resolution; reader_at(resolution) "
                                 "reads one")
        return self._reader

    @property
    def streaming(self) -> bool:
        """Whether the reader only streams (webdataset) rather than reading rows at random."""
        return cache_format(self.format).streaming

    def reader_at(self, resolution: str, variant: str | None = None) -> CacheReader:
        """A reader of ``resolution`` of this cache (of the window variant it holds by default)."""
        return reader_of(self.manifest, self.layout, resolution=resolution, variant=variant or self.variant)

    def samples_array(self, resolution: str, variant: str | None = None) -> str:
        """Where the per-sample data of ``resolution`` lives: a zarr array or a tar directory."""
        variant = variant or self.variant
        return wds_samples(variant, resolution) if self.format == "wds" else features_array(variant, resolution)

    # ------------------------------------------------------------------------------ tables

    @cached_property
    def group(self) -> ZarrGroup:
        """The cache's zarr group, read-only (tables, and every array of a zarr cache)."""
        from janus_cache.store.zarr_group import ZarrGroup

        return ZarrGroup(self.root, read_only=True)

    def table(self, name: str) -> dict[str, Any]:
        """A whole table (read once; not to be modified by callers)."""
        if name not in self._tables:
            self._tables[name] = self.group.read_table(name)
        return self._tables[name]

    def keys(self, table: str) -> list[str]:
        """The table's key column, read and decoded once (not the other text columns); not to be
        modified by callers."""
        if table not in self._keys:
            cached = self._tables.get(table)
            self._keys[table] = list(cached[KEY_COLUMN]) if cached is not None else list(
                self.group.read_column(table, KEY_COLUMN))
        return self._keys[table]

    def readable_keys(self, table: str) -> list[str] | None:
        """The table's keys, or None when a damaged table cannot be read (for naming rows in
        messages; tried once)."""
        if table not in self._unreadable:
            try:
                return self.keys(table)
            except Exception:  # noqa: BLE001 - the damage itself is reported by whoever reads it
                self._unreadable.add(table)
        return None

    def name_of(self, table: str, row: int) -> str:
        """The key of ``row`` for messages, or ``row N`` when the keys cannot be read."""
        keys = self.readable_keys(table)
        return keys[row] if keys is not None and 0 <= row < len(keys) else f"row {row}"

    def report(self) -> dict[str, Any] | None:
        """The precompute's report.json, or None when it is missing."""
        path = self.layout.report
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as err:
            raise CacheOpenError(f"{path} is not valid JSON: {err}") from None

    def failed_samples(self) -> dict[str, str]:
        """Sample key -> why precompute could not make it, as its report lists them."""
        report = self.report() or {}
        return dict(report.get("failed_samples", {}))


def load_manifest(path: CacheLocation | str) -> Manifest:
    """The manifest of the cache at ``path``; a missing or invalid one is a one-line error."""
    layout = CacheLayout(cache_location(path))
    if not is_remote(layout.root) and layout.root.exists() and not layout.root.is_dir():
        raise CacheOpenError(f"{layout.root} is not a directory")
    try:
        manifest = read_manifest(layout.root)
    except ManifestError as err:
        raise CacheOpenError(str(err)) from None
    if manifest is None:
        raise CacheOpenError(f"{layout.root} is not a janus cache (no {layout.manifest.name}){_unfinished(layout)}")
    return manifest


def _unfinished(layout: CacheLayout) -> str:
    """For a bucket's prefix without a manifest: whether a push into it did not finish (a push
    writes the manifest last) or it holds nothing at all."""
    if not is_remote(layout.root):
        return ""
    if layout.zarr_root.is_file():
        return ": a push into it did not finish (the manifest comes last); run that janus-cache push again"
    return ": nothing janus wrote is there; push a cache with janus-cache push CACHE " + str(layout.root)


def open_cache(path: CacheLocation | str, *, resolution: str | None = None, variant: str | None = None,
               vit_features: bool = False, check_metadata: bool = True) -> OpenedCache:
    """Open the cache at ``path`` to read ``resolution`` (e.g. ``"pad644"``) of the window variant
    named ``variant`` (``WindowVariant.name``; both named, or neither for the cache opened whole);
    with ``vit_features`` every sample also carries its frames' cached ViT output (a cache without
    it for ``resolution`` is an error).

    Reads the manifest once and (``check_metadata``) checks every metadata file against
    ``checksums.json``. A cache that lacks the resolution or variant, or whose metadata was edited
    or damaged, is a :class:`CacheOpenError` naming the file.
    """
    if (resolution is None) != (variant is None):
        raise ValueError("open_cache reads a resolution of a window variant: name both, or neither")
    layout = CacheLayout(cache_location(path))
    manifest = load_manifest(layout.root)
    problems = metadata_problems(layout.root) if check_metadata else []
    if problems:
        more = f" (and {plural(len(problems) - 1, 'more metadata file')})" if len(problems) > 1 else ""
        raise CacheOpenError(problems[0] + more)
    if resolution is None or variant is None:
        return OpenedCache(manifest=manifest, layout=layout, resolution=None, variant=manifest.window.name)
    reader = reader_of(manifest, layout, resolution=resolution, variant=variant, vit_features=vit_features)
    return OpenedCache(manifest=manifest, layout=layout, resolution=resolution, variant=variant, _reader=reader)


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
        reader: type[CacheReader] = cache_format(manifest.format).reader_class()
        return reader(layout.root, resolution=resolution, variant=variant, vit_features=vit_features)
    except StoreError as err:
        raise CacheOpenError(f"{layout.manifest} lists {resolution}, but {err}") from None
