"""A cache opened for checking: its manifest (read once), tables and readers, all read-only.

Every check reads the cache through the store's readers (the zarr group's arrays and tables,
:class:`~janus_cache.store.WdsCacheReader`, :class:`~janus_cache.store.ZarrCacheReader`); this
view only keeps what several checks share, so a table is read once per check run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from janus_cache.store import ManifestError, WdsCacheReader, ZarrCacheReader, read_manifest
from janus_cache.store.manifest import Manifest
from janus_cache.store.layout import KEY_COLUMN, CacheLayout, features_array, wds_samples
from janus_cache.store.open import reader_of
from janus_cache.store.wds_store import WdsLayout
from janus_cache.store.zarr_group import ZarrGroup

from janus_cache.verify.results import CheckResult


class CacheProblem(RuntimeError):
    """The cache cannot be opened for checking (no or invalid manifest); names the file."""


class CheckedCache:
    """Read-only view of a cache for the checks: manifest, zarr group, tables (read once)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise CacheProblem(f"{self.root} is not a directory")
        try:
            manifest = read_manifest(self.root)
        except ManifestError as err:
            raise CacheProblem(str(err)) from None
        if manifest is None:
            raise CacheProblem(f"{self.root} has no manifest.json (not a janus cache, or precompute never started)")
        self.manifest: Manifest = manifest
        self.layout = CacheLayout(self.root)
        self.group = ZarrGroup(self.root, read_only=True)
        self._tables: dict[str, dict[str, Any]] = {}
        self._keys: dict[str, list[str]] = {}
        self._unreadable: set[str] = set()

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def variant(self) -> str:
        return self.manifest.window.name

    def samples_array(self, resolution: str, variant: str | None = None) -> str:
        """Where the per-sample data of ``resolution`` lives: a zarr array or a tar directory."""
        variant = variant or self.variant
        if self.format == "wds":
            return wds_samples(variant, resolution)
        return features_array(variant, resolution)

    def table(self, name: str) -> dict[str, Any]:
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
        """The table's keys, or None when a damaged table cannot be read (names messages only;
        tried once)."""
        if table not in self._unreadable:
            try:
                return self.keys(table)
            except Exception:  # noqa: BLE001 - the damage itself is reported by the check that reads it
                self._unreadable.add(table)
        return None

    def name_of(self, table: str, row: int) -> str:
        """The key of ``row`` for messages, or ``row N`` when the keys cannot be read."""
        keys = self.readable_keys(table)
        return keys[row] if keys is not None and 0 <= row < len(keys) else f"row {row}"

    def wds_layout(self, resolution: str, variant: str | None = None) -> WdsLayout:
        return self.wds_reader(resolution, variant).layout

    def wds_reader(self, resolution: str, variant: str | None = None) -> WdsCacheReader:
        """The tar shards of ``resolution`` (StoreError when the cache has none)."""
        reader = reader_of(self.manifest, self.layout, resolution=resolution, variant=variant or self.variant)
        assert isinstance(reader, WdsCacheReader), f"{self.root} is a {self.format} cache"
        return reader

    def zarr_reader(self, resolution: str, variant: str | None = None) -> ZarrCacheReader:
        reader = reader_of(self.manifest, self.layout, resolution=resolution, variant=variant or self.variant)
        assert isinstance(reader, ZarrCacheReader), f"{self.root} is a {self.format} cache"
        return reader

    def report(self) -> dict[str, Any] | None:
        """The precompute's report.json, or None when it is missing."""
        path = self.layout.report
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as err:
            raise CacheProblem(f"{path} is not valid JSON: {err}") from None

    def failed_samples(self) -> dict[str, str]:
        report = self.report() or {}
        return dict(report.get("failed_samples", {}))


def open_checked(root: Path | str, name: str) -> CheckedCache | CheckResult:
    """The cache, or the failed ``name`` result saying why it cannot be opened."""
    try:
        return CheckedCache(root)
    except CacheProblem as err:
        return CheckResult(name, False, "cannot open the cache", [str(err)])
