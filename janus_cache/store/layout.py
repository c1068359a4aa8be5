"""Every path of a cache, named once.

A cache directory holds (``<variant>`` is ``WindowVariant.name``, ``<resolution>`` e.g. ``pad644``)::

    manifest.json                           what the cache holds (janus_cache.store.manifest)
    checksums.json                          sha256 of every metadata file (janus_cache.store.checksums)
    report.json                             the finished precompute's report (failed samples...)
    episodes.json                           each episode's identity (janus_core.index.identity)
    zarr.json                               the root of the zarr v3 group (both formats)
    frames/<resolution>/                    uint8 frames, one row per frame
    vit/<resolution>/                       optional: the frozen Qwen ViT's output, one row per frame
    vggt/<variant>/<resolution>/            features, one row per sample (zarr format)
    tables/<table>/<column>[/utf8|/offsets] the frame and sample tables
    wds/<variant>/<resolution>/layout.json  what the tar shards hold (webdataset format)
    wds/<variant>/<resolution>/shard-000000.tar ...
    commits/<array>/000000.json ...         one commit record per shard of every array
    failures/frames/<resolution>/000000.json  frames of a shard that could not be decoded
    index/<key>/                            the dataset's stored index (janus_core.index.cached),
                                            not cache content: kept by --overwrite

*Array names* (``frames/pad644``, ``wds/<variant>/pad644``...) are paths relative to the cache
root; commit records, shard tables and messages name arrays by them. :class:`CacheLayout` turns
them into absolute paths under one cache root.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from janus_cache.store.location import CacheLocation, cache_location

MANIFEST_NAME = "manifest.json"
REPORT_NAME = "report.json"
CHECKSUMS_NAME = "checksums.json"
"""sha256 of every metadata file of the cache, recorded with each manifest write."""
EPISODES_NAME = "episodes.json"
"""Per-episode dataset identities, in row order (what staleness checks and appends compare)."""
ZARR_ROOT_NAME = "zarr.json"
"""zarr v3 metadata file of every group and array (the root one marks a zarr group)."""

FRAMES_GROUP = "frames"
FEATURES_GROUP = "vggt"
VIT_GROUP = "vit"
"""Per-frame output of Qwen's frozen ViT blocks (``cache.vit_features``), in both formats."""
TABLES_GROUP = "tables"
WDS_DIR = "wds"
COMMITS_DIR = "commits"
FAILURES_DIR = "failures"

FRAMES_TABLE = "frames"
SAMPLES_TABLE = "samples"
KEY_COLUMN = "key"
WINDOW_ROWS_COLUMN = "window_rows"
TEXT_PAYLOAD = "utf8"
TEXT_OFFSETS = "offsets"
"""A text column is two arrays: ``<column>/utf8`` (the UTF-8 bytes) and ``<column>/offsets``."""

WDS_LAYOUT_NAME = "layout.json"
INDEX_STORE_DIR = "index"


def frames_array(resolution: str) -> str:
    """Array name of the frames of ``resolution``."""
    return f"{FRAMES_GROUP}/{resolution}"


def vit_array(resolution: str) -> str:
    """Array name of the cached ViT features of the frames of ``resolution`` (row-aligned with them)."""
    return f"{VIT_GROUP}/{resolution}"


def features_array(variant: str, resolution: str) -> str:
    """Array name of the zarr features of window variant ``variant`` at ``resolution``."""
    return f"{FEATURES_GROUP}/{variant}/{resolution}"


def table_group(table: str) -> str:
    """Group of a table (``tables/samples``)."""
    return f"{TABLES_GROUP}/{table}"


def table_column(table: str, column: str, part: str | None = None) -> str:
    """Array name of a numeric column, or with ``part`` (:data:`TEXT_PAYLOAD` / :data:`TEXT_OFFSETS`)
    of one of a text column's two arrays."""
    name = f"{table_group(table)}/{column}"
    return name if part is None else f"{name}/{part}"


def wds_variant(variant: str) -> str:
    """Directory of the tar shards of every resolution of window variant ``variant``."""
    return f"{WDS_DIR}/{variant}"


def wds_samples(variant: str, resolution: str) -> str:
    """Directory (and array name, for commit records) of the tar shards of a variant and resolution."""
    return f"{wds_variant(variant)}/{resolution}"


def wds_shard_name(shard: int) -> str:
    """File name of tar shard ``shard``."""
    return f"shard-{shard:06d}.tar"


def commit_dir(array: str) -> str:
    """Directory of the commit records of ``array``."""
    return f"{COMMITS_DIR}/{array}"


def commit_record(array: str, shard: int) -> str:
    """The commit record of ``array``'s shard ``shard``."""
    return f"{commit_dir(array)}/{shard:06d}.json"


def is_table_array(array: str) -> bool:
    return array.startswith(TABLES_GROUP + "/")


@dataclass(frozen=True)
class CacheLayout:
    """The absolute paths of the cache at ``root`` (see the module docstring)."""

    root: CacheLocation

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", cache_location(self.root))

    def path(self, relative: str) -> Path:
        """``root / relative`` for an array name or any other relative cache path."""
        return self.root / relative

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def checksums(self) -> Path:
        return self.root / CHECKSUMS_NAME

    @property
    def report(self) -> Path:
        return self.root / REPORT_NAME

    @property
    def episodes(self) -> Path:
        return self.root / EPISODES_NAME

    @property
    def zarr_root(self) -> Path:
        return self.root / ZARR_ROOT_NAME

    @property
    def commits(self) -> Path:
        return self.root / COMMITS_DIR

    @property
    def index_store(self) -> Path:
        """The folder of stored dataset indexes (``janus_core.index.IndexStore``) of this cache's runs."""
        return self.root / INDEX_STORE_DIR

    def frames(self, resolution: str) -> Path:
        return self.path(frames_array(resolution))

    def vit(self, resolution: str) -> Path:
        return self.path(vit_array(resolution))

    def features(self, variant: str, resolution: str) -> Path:
        return self.path(features_array(variant, resolution))

    def table(self, table: str) -> Path:
        return self.path(table_group(table))

    def wds_samples(self, variant: str, resolution: str) -> Path:
        return self.path(wds_samples(variant, resolution))

    def wds_layout(self, variant: str, resolution: str) -> Path:
        return self.wds_samples(variant, resolution) / WDS_LAYOUT_NAME

    def wds_shard(self, variant: str, resolution: str, shard: int) -> Path:
        return self.wds_samples(variant, resolution) / wds_shard_name(shard)

    def commit_dir(self, array: str) -> Path:
        return self.path(commit_dir(array))

    def commit_record(self, array: str, shard: int) -> Path:
        return self.path(commit_record(array, shard))

    def frame_failures_dir(self, resolution: str) -> Path:
        """Where frame shards of ``resolution`` record the frames they could not decode."""
        return self.root / FAILURES_DIR / FRAMES_GROUP / resolution

    def frame_failures(self, resolution: str, shard: int) -> Path:
        return self.frame_failures_dir(resolution) / f"{shard:06d}.json"
