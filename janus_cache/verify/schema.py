"""The schema check: the manifest is valid; frame arrays, feature arrays (or webdataset layouts)
and tables exist with the shapes and dtypes the manifest says; the precompute finished; every
metadata file matches the sha256 recorded for it in ``checksums.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from janus_core.plural import plural
from janus_cache.store import StoreError
from janus_cache.store.checksums import metadata_problems
from janus_cache.store.manifest import ResolutionEntry, ViTFeaturesEntry
from janus_cache.store.layout import (
    REPORT_NAME,
    WDS_LAYOUT_NAME,
    wds_samples,
    FRAMES_TABLE,
    KEY_COLUMN,
    SAMPLES_TABLE,
    TABLES_GROUP,
    WINDOW_ROWS_COLUMN,
    frames_array,
    vit_array,
)
from janus_cache.store.open import OpenedCache
from janus_cache.verify.cache import open_checked, wds_reader
from janus_cache.verify.results import SCHEMA, CheckResult, guarded, result, timer


@guarded(SCHEMA)
def check_schema(root: Path | str) -> CheckResult:
    """Manifest, arrays, layouts and tables present with the shapes and dtypes the manifest says."""
    with timer() as elapsed:
        cache = open_checked(root, SCHEMA)
        if isinstance(cache, CheckResult):
            cache.seconds = elapsed()
            return cache
        problems: list[str] = []
        m = cache.manifest
        n_frames, n_samples = _tables(cache, problems)
        for name, entry in m.resolutions.items():
            _frames(cache, name, entry, n_frames, problems)
            if name in m.vit_features:
                _vit(cache, m.vit_features[name], n_frames, problems)
            if cache.format == "wds":
                _wds(cache, name, entry, n_samples, problems)
            else:
                _features(cache, name, entry, n_samples, problems)
        if not m.resolutions:
            problems.append(f"{cache.root}/manifest.json lists no resolution")
        if not m.shards or "samples_written" not in m.counts:
            problems.append(
                f"{cache.root}/manifest.json has no final shard table: the precompute that made this cache "
                "did not finish (run the same precompute command again to resume)"
            )
        else:  # a finished precompute recorded the checksums of every metadata file (first: the cause)
            report = str(cache.root / REPORT_NAME)  # a missing one is said below, with what it means
            problems = [p for p in metadata_problems(cache.root) if not p.startswith(f"{report} is missing")] + problems
        if not (cache.root / REPORT_NAME).is_file():
            problems.append(f"{cache.root} has no {REPORT_NAME}: the precompute that made this cache did not finish")
        detail = (
            f"{m.format} cache, variant {cache.variant}, resolutions {', '.join(m.resolutions)}, "
            f"{plural(n_frames, 'frame')}, {plural(n_samples, 'sample')}, features {m.feature_dtype} (stored {m.stored_dtype})"
        )
        return result(SCHEMA, problems, detail, elapsed(), format=m.format, variant=cache.variant,
                      resolutions=list(m.resolutions), n_frames=n_frames, n_samples=n_samples,
                      feature_dtype=m.feature_dtype)


def _tables(cache: OpenedCache, problems: list[str]) -> tuple[int, int]:
    """Row counts of the frames and samples tables (-1 when unreadable), checked against the manifest."""
    counts = {FRAMES_TABLE: -1, SAMPLES_TABLE: -1}
    expected = {FRAMES_TABLE: cache.manifest.counts.get("frames"),
                SAMPLES_TABLE: cache.manifest.counts.get("samples_written")}
    for table in (FRAMES_TABLE, SAMPLES_TABLE):
        try:
            columns = cache.group.table_columns(table)
            counts[table] = cache.group.table_rows(table)
        except (StoreError, OSError, ValueError, KeyError) as err:
            problems.append(f"{table} table: {err}")
            continue
        if columns.get(KEY_COLUMN) != "utf8":
            problems.append(f"{table} table of {cache.root} has no text column {KEY_COLUMN!r}")
        for column, kind in columns.items():
            _column(cache, table, column, kind, counts[table], problems)
        if expected[table] is not None and counts[table] != expected[table]:
            problems.append(f"{table} table has {counts[table]} rows, the manifest counts {expected[table]}")
    if counts[SAMPLES_TABLE] >= 0:
        path = f"{TABLES_GROUP}/{SAMPLES_TABLE}/{WINDOW_ROWS_COLUMN}"
        want = (counts[SAMPLES_TABLE], cache.manifest.window.frames)
        try:
            rows = cache.group.array(path)
            if tuple(rows.shape) != want or np.dtype(rows.dtype).kind not in "iu":
                problems.append(f"{path} is {rows.dtype} {tuple(rows.shape)}, expected integer {want}")
        except (StoreError, OSError, ValueError) as err:
            problems.append(f"{path}: {err}")
    return counts[FRAMES_TABLE], counts[SAMPLES_TABLE]


def _column(cache: OpenedCache, table: str, column: str, kind: str, n_rows: int, problems: list[str]) -> None:
    """A numeric column has ``n_rows`` rows of its dtype; a text column ``n_rows + 1`` offsets."""
    base = f"{TABLES_GROUP}/{table}/{column}"
    want = {f"{base}/offsets": (n_rows + 1, "int64"), f"{base}/utf8": (None, "uint8")} if kind == "utf8" else {
        base: (n_rows, kind)}
    for path, (rows, dtype) in want.items():
        try:
            array = cache.group.array(path)
        except Exception as err:  # noqa: BLE001 - damaged metadata is the finding
            problems.append(f"{path}: cannot be opened: {type(err).__name__}: {err}")
            continue
        if (rows is not None and array.shape[0] != rows) or str(np.dtype(array.dtype)) != dtype:
            problems.append(f"{path} is {array.dtype} {tuple(array.shape)}, the {table} table says {dtype} "
                            f"with {rows if rows is not None else 'any number of'} rows")


def _frames(cache: OpenedCache, name: str, entry: ResolutionEntry, n_frames: int, problems: list[str]) -> None:
    _array(cache, frames_array(name), (n_frames, *entry.frame_shape), "uint8", None, problems)


def _vit(cache: OpenedCache, entry: ViTFeaturesEntry, n_frames: int, problems: list[str]) -> None:
    """The cached ViT output of a resolution: one row per frame, of the manifest's shape and dtype."""
    _array(cache, vit_array(entry.name), (n_frames, *entry.feature_shape), entry.stored_dtype, entry.dtype,
           problems)


def _features(cache: OpenedCache, name: str, entry: ResolutionEntry, n_samples: int, problems: list[str]) -> None:
    m = cache.manifest
    _array(cache, cache.samples_array(name), (n_samples, *entry.feature_shape), m.stored_dtype, m.feature_dtype,
           problems)


def _array(cache: OpenedCache, path: str, want: tuple[int, ...], stored_dtype: str, logical_dtype: str | None,
           problems: list[str]) -> None:
    """An array of the manifest's shape and stored dtype; a bf16-as-uint16 array also names its
    ``logical_dtype`` (``None``: the array has no logical dtype to check)."""
    try:
        array = cache.group.array(path)
    except (StoreError, OSError, ValueError) as err:
        problems.append(f"{path}: {err}")
        return
    if tuple(array.shape) != want or np.dtype(array.dtype) != np.dtype(stored_dtype):
        problems.append(f"{path} is {array.dtype} {tuple(array.shape)}, the manifest says {stored_dtype} {want}")
    if logical_dtype is not None and array.attrs.get("logical_dtype") != logical_dtype:
        problems.append(f"{path} has logical_dtype {array.attrs.get('logical_dtype')!r}, the manifest says "
                        f"{logical_dtype!r}")


def _wds(cache: OpenedCache, name: str, entry: ResolutionEntry, n_samples: int, problems: list[str]) -> None:
    m = cache.manifest
    try:
        layout = wds_reader(cache, name).layout
    except StoreError as err:
        problems.append(str(err))
        return
    want = {
        "n_samples": n_samples,
        "window_frames": m.window.frames,
        "frame_shape": tuple(entry.frame_shape),
        "feature_shape": tuple(entry.feature_shape),
        "feature_dtype": m.feature_dtype,
        "samples_per_shard": m.layout.samples_per_shard,
    }
    where = cache.root / wds_samples(cache.variant, name) / WDS_LAYOUT_NAME
    for key, value in want.items():
        if getattr(layout, key) != value:
            problems.append(f"{where}: {key} is {getattr(layout, key)!r}, the manifest says {value!r}")
