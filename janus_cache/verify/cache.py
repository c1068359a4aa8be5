"""A cache opened for checking: :func:`~janus_cache.store.open_cache` opened whole, read-only.

Every check reads the cache through the store's readers (the zarr group's arrays and tables,
:class:`~janus_cache.store.WdsCacheReader`, :class:`~janus_cache.store.ZarrCacheReader`) and the
:class:`~janus_cache.store.OpenedCache` it shares keeps what several checks read, so a table is
read once per check run.
"""

from __future__ import annotations

from pathlib import Path

from janus_cache.store.open import CacheOpenError, OpenedCache, open_cache
from janus_cache.store.wds_store import WdsCacheReader
from janus_cache.store.zarr_store import ZarrCacheReader
from janus_cache.verify.results import CheckResult


def open_for_checks(root: Path | str) -> OpenedCache:
    """The cache at ``root`` opened whole. Its metadata files are not checked on opening: the
    integrity check reports each damaged one, and the other checks still run."""
    return open_cache(root, check_metadata=False)


def open_checked(root: Path | str, name: str) -> OpenedCache | CheckResult:
    """The cache, or the failed ``name`` result saying why it cannot be opened."""
    try:
        return open_for_checks(root)
    except CacheOpenError as err:
        return CheckResult(name, False, "cannot open the cache", [str(err)])


def wds_reader(cache: OpenedCache, resolution: str, variant: str | None = None) -> WdsCacheReader:
    """The tar shards of ``resolution`` of a webdataset cache (StoreError when it has none)."""
    reader = cache.reader_at(resolution, variant)
    assert isinstance(reader, WdsCacheReader), f"{cache.root} is a {cache.format} cache"
    return reader


def zarr_reader(cache: OpenedCache, resolution: str, variant: str | None = None) -> ZarrCacheReader:
    """The feature reader of ``resolution`` of a zarr cache (StoreError when it has none)."""
    reader = cache.reader_at(resolution, variant)
    assert isinstance(reader, ZarrCacheReader), f"{cache.root} is a {cache.format} cache"
    return reader
