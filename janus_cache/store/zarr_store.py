"""zarr v3 cache: frames once per frame row, one feature per sample, tables; sharded, committed.

Layout of a cache directory (one zarr v3 group; ``<variant>`` is ``WindowVariant.name``; every
path is named in :mod:`janus_cache.store.layout`):

``frames/<resolution>``
    uint8 ``[n_frames, H, W, 3]``; one chunk per frame, ``frames_per_shard`` frames per shard.
``vggt/<variant>/<resolution>``
    ``[n_samples, N, 2C]`` features; one chunk per sample, ``samples_per_shard`` per shard.
    bf16 is stored as its uint16 bits; attribute ``logical_dtype`` says which (see
    :mod:`janus_cache.store.features`).
``tables/frames/<column>``, ``tables/samples/<column>``
    The frame and sample tables, row-aligned with the arrays above. Required columns: ``key``
    (str) in both, ``window_rows`` (int ``[n_samples, history + 1]``, rows of ``frames/*``) in
    samples; any other numeric or text column is stored as given and comes back as the
    sample's ``meta``.
``commits/...``
    One commit record per shard (:mod:`janus_cache.store.commit`).

Text columns are stored as two plain arrays, ``<column>/utf8`` (uint8, the concatenated UTF-8
bytes) and ``<column>/offsets`` (int64 ``[n + 1]``): core zarr v3 dtypes only, so any v3 reader
can open them, row ``i`` is one slice away (O(1)), and they are checksummed and committed like
every other array. (zarr-python's variable-length string dtype is an extension outside the core
spec; a JSON-lines side table would need its own integrity and random-access scheme.)

Every array is sharded with zarr's sharding codec and written one whole shard per call, which
produces exactly one shard file per call. Creating arrays and writing tables is single-process
work (rank 0, before the shard writers start); shard writes may come from any number of
processes as long as each shard has one writer. A cache can hold several resolutions: preparing
a new one creates its arrays and leaves the others untouched.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.storage import LocalStore

from janus_cache.store.commit import (
    CommitRecord,
    ShardCheck,
    StoreError,
    check_shard,
    commit_shard,
    fsync_path,
    read_record,
    remove_partials,
    shard_plan,
    uncommit,
    uncommit_array,
)
from janus_cache.store.compression import (
    FEATURES_COMPRESSION,
    FRAMES_COMPRESSION,
    TABLES_COMPRESSION,
    Compression,
)
from janus_cache.store.features import from_stored, stored_dtype, to_stored
from janus_cache.store.layout import (
    FRAMES_TABLE,
    KEY_COLUMN,
    SAMPLES_TABLE,
    TEXT_OFFSETS,
    TEXT_PAYLOAD,
    WINDOW_ROWS_COLUMN,
    ZARR_ROOT_NAME,
    CacheLayout,
    features_array,
    frames_array,
    table_column,
    table_group,
)
from janus_cache.store.manifest import ShardEntry
from janus_cache.store.records import CacheSample, SampleMeta

TABLE_CHUNK_ROWS = 65536
"""Rows per chunk of a table column (UTF-8 payloads: bytes per chunk)."""

ColumnData = np.ndarray | Sequence[str]


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not name or "/" in name or name.startswith(("_", ".")):
        raise ValueError(f"{kind} name must be a non-empty path component, got {name!r}")


@dataclass(frozen=True)
class PlannedShard:
    """A shard the cache should hold: array path, shard index, rows and the file it lives in."""

    array: str
    shard: int
    rows: range
    file: Path


@dataclass(frozen=True)
class _ArraySpec:
    """What an array must look like; compared against an existing array before reusing it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    shards: tuple[int, ...]
    compression: Compression
    attributes: Mapping[str, Any]

    def describe(self) -> str:
        return f"shape {self.shape}, dtype {self.dtype}, chunks {self.chunks}, shards {self.shards}, attrs {dict(self.attributes)}"


def _row_spec(shape: tuple[int, ...], dtype: np.dtype, rows_per_chunk: int, rows_per_shard: int,
              compression: Compression, attributes: Mapping[str, Any] | None = None) -> _ArraySpec:
    rest = tuple(shape[1:])
    return _ArraySpec(tuple(shape), np.dtype(dtype), (rows_per_chunk, *rest), (rows_per_shard, *rest),
                      compression, dict(attributes or {}))


def _single_shard_spec(shape: tuple[int, ...], dtype: np.dtype) -> _ArraySpec:
    """A table column: chunks of TABLE_CHUNK_ROWS rows, all in one shard (so one file)."""
    chunk = min(max(shape[0], 1), TABLE_CHUNK_ROWS)
    shard = math.ceil(max(shape[0], 1) / chunk) * chunk
    return _row_spec(shape, dtype, chunk, shard, TABLES_COMPRESSION)


class ZarrGroup:
    """Read side shared by the writers and the reader: opening arrays, tables, plans, checks.

    Arrays are opened lazily and per process (a forked or spawned worker reopens them), so one
    instance can be handed to DataLoader workers.
    """

    def __init__(self, root: Path | str, *, read_only: bool) -> None:
        self.root = Path(root)
        self._read_only = read_only
        self._pid = -1
        self._arrays: dict[str, Any] = {}
        self._columns: dict[tuple[str, str], np.ndarray] = {}
        self._tables: dict[str, Mapping[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Open zarr handles stay behind; the receiving process reopens what it reads.
        return {**self.__dict__, "_pid": -1, "_arrays": {}, "_columns": {}, "_tables": {}}

    # -- arrays ---------------------------------------------------------------------------------

    def _store(self) -> LocalStore:
        return LocalStore(self.root, read_only=self._read_only)

    def _this_process(self) -> None:
        """Drop handles opened by another process (after a fork, or when unpickled in a worker)."""
        if self._pid != os.getpid():
            self._pid, self._arrays, self._columns, self._tables = os.getpid(), {}, {}, {}

    def _array(self, path: str) -> Any:
        self._this_process()
        array = self._arrays.get(path)
        if array is None:
            if not (self.root / path / ZARR_ROOT_NAME).is_file():
                raise StoreError(f"cache {self.root} has no array {path!r}")
            array = zarr.open_array(self._store(), path=path, mode="r" if self._read_only else "r+", zarr_format=3)
            if not self._read_only:
                # zarr skips chunks equal to the fill value by default; a shard must always be one
                # file (an all-black frame shard included) so that it can be committed.
                array = array.with_config({"write_empty_chunks": True})
            self._arrays[path] = array
        return array

    def has_array(self, path: str) -> bool:
        return (self.root / path / ZARR_ROOT_NAME).is_file()

    def shard_file(self, path: str, shard: int) -> Path:
        """The file holding shard ``shard`` of array ``path``."""
        array = self._array(path)
        coords = (shard,) + (0,) * (array.ndim - 1)
        return self.root / path / array.metadata.encode_chunk_key(coords)

    def array_shard_plan(self, path: str) -> list[range]:
        """Row ranges of the shards of array ``path``."""
        array = self._array(path)
        return shard_plan(array.shape[0], array.shards[0])

    def frame_shard_plan(self, resolution: str) -> list[range]:
        return self.array_shard_plan(frames_array(resolution))

    def check_array(self, path: str, verify: bool = True) -> list[ShardCheck]:
        """One :class:`ShardCheck` per planned shard of array ``path``."""
        return [
            check_shard(self.root, path, i, rows, self.shard_file(path, i), verify)
            for i, rows in enumerate(self.array_shard_plan(path))
        ]

    def committed_shards(self, path: str, verify: bool = True) -> set[int]:
        """Shards of array ``path`` whose commit record exists (and, with ``verify``, matches)."""
        return {c.shard for c in self.check_array(path, verify) if c.ok}

    def committed_frame_shards(self, resolution: str, verify: bool = True) -> set[int]:
        return self.committed_shards(frames_array(resolution), verify)

    def array_paths(self) -> list[str]:
        """Every array of the cache's zarr group, sorted (commit records and tar shards are not zarr)."""
        found: list[str] = []

        def visit(directory: Path, rel: str) -> None:
            meta = directory / ZARR_ROOT_NAME
            if not meta.is_file():
                return
            if json.loads(meta.read_text()).get("node_type") == "array":
                found.append(rel)
                return
            for child in sorted(p for p in directory.iterdir() if p.is_dir()):
                visit(child, f"{rel}/{child.name}" if rel else child.name)

        visit(self.root, "")
        return sorted(found)

    def planned_shards(self) -> list[PlannedShard]:
        """Every shard the cache's arrays are planned to have, committed or not."""
        return [
            PlannedShard(path, i, rows, self.shard_file(path, i))
            for path in self.array_paths()
            for i, rows in enumerate(self.array_shard_plan(path))
        ]

    def audit(self, verify: bool = True) -> list[ShardCheck]:
        """A check of every planned shard (see :meth:`planned_shards`)."""
        return [check_shard(self.root, p.array, p.shard, p.rows, p.file, verify) for p in self.planned_shards()]

    def shard_table(self, verify: bool = True) -> dict[str, tuple[ShardEntry, ...]]:
        """The manifest's shard table: per array, every planned shard and its commit state."""
        table: dict[str, list[ShardEntry]] = {}
        for planned in self.planned_shards():
            check = check_shard(self.root, planned.array, planned.shard, planned.rows, planned.file, verify)
            record = read_record(self.root, planned.array, planned.shard) if check.ok else None
            table.setdefault(planned.array, []).append(
                ShardEntry(
                    shard=planned.shard, start=planned.rows.start, stop=planned.rows.stop,
                    committed=record is not None,
                    nbytes=record.nbytes if record else 0, sha256=record.sha256 if record else "",
                )
            )
        return {array: tuple(entries) for array, entries in table.items()}

    # -- frames ---------------------------------------------------------------------------------

    def frames(self, resolution: str, rows: Sequence[int] | np.ndarray | range) -> np.ndarray:
        """uint8 ``[len(rows), H, W, 3]`` frames of ``resolution`` at frame rows ``rows`` (any order)."""
        array = self._array(frames_array(resolution))
        if isinstance(rows, range) and rows.step == 1:
            if rows.start < 0 or rows.stop > array.shape[0]:
                raise IndexError(f"frame rows {rows} out of range for {array.shape[0]} frames of {resolution}")
            return array[rows.start:rows.stop]
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= array.shape[0]):
            raise IndexError(f"frame rows {index.tolist()} out of range for {array.shape[0]} frames of {resolution}")
        if not index.size:
            return np.empty((0, *array.shape[1:]), dtype=array.dtype)
        # One slice read per run of consecutive rows: zarr's integer-array (orthogonal) selection
        # costs ~10 ms per frame on sharded arrays, a slice ~1 ms per call plus decoding.
        unique, inverse = np.unique(index, return_inverse=True)
        runs = np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1)
        frames = np.concatenate([array[int(run[0]):int(run[-1]) + 1] for run in runs])
        return frames[inverse]

    # -- tables ---------------------------------------------------------------------------------

    def has_table(self, table: str) -> bool:
        return (self.root / table_group(table) / ZARR_ROOT_NAME).is_file()

    def table_columns(self, table: str) -> dict[str, str]:
        """Column name -> kind (``"utf8"`` or a numpy dtype name) of a table."""
        return dict(self._complete_table_attrs(table)["columns"])

    def table_rows(self, table: str) -> int:
        return int(self._complete_table_attrs(table)["n_rows"])

    def _complete_table_attrs(self, table: str) -> Mapping[str, Any]:
        attrs = self._table_attrs(table)
        if "columns" not in attrs:
            raise StoreError(f"the {table!r} table of {self.root} is incomplete (its write was interrupted)")
        return attrs

    def _table_attrs(self, table: str) -> Mapping[str, Any]:
        self._this_process()
        attrs = self._tables.get(table)
        if attrs is None:
            if not self.has_table(table):
                raise StoreError(f"cache {self.root} has no {table!r} table")
            group = zarr.open_group(self._store(), path=table_group(table), mode="r", zarr_format=3)
            attrs = self._tables[table] = group.attrs.asdict()
        return attrs

    def _column_array(self, table: str, column: str, part: str | None = None) -> np.ndarray:
        """A whole numeric column (or a text column's offsets), loaded once per process."""
        key = (table, column if part is None else f"{column}/{part}")
        self._this_process()
        cached = self._columns.get(key)
        if cached is None:
            cached = self._array(table_column(table, column, part))[...]
            self._columns[key] = cached
        return cached

    def _text(self, table: str, column: str, row: int) -> str:
        offsets = self._column_array(table, column, TEXT_OFFSETS)
        start, stop = int(offsets[row]), int(offsets[row + 1])
        if stop == start:
            return ""
        payload = self._array(table_column(table, column, TEXT_PAYLOAD))[start:stop]
        return payload.tobytes().decode("utf-8")

    def table_row(self, table: str, row: int) -> dict[str, Any]:
        """Row ``row`` of a table as plain Python values (str, int, float, nested lists)."""
        n_rows = self.table_rows(table)
        if not 0 <= row < n_rows:
            raise IndexError(f"row {row} out of range for the {n_rows}-row {table!r} table of {self.root}")
        values: dict[str, Any] = {}
        for column, kind in self.table_columns(table).items():
            if kind == "utf8":
                values[column] = self._text(table, column, row)
            else:
                values[column] = self._column_array(table, column)[row].tolist()
        return values

    def sample_meta_row(self, row: int) -> tuple[str, dict[str, Any]]:
        """Sample row ``row``'s key and its table row without the key (as the tars store it)."""
        values = self.table_row(SAMPLES_TABLE, row)
        return values.pop(KEY_COLUMN), values

    def read_table(self, table: str) -> dict[str, np.ndarray | list[str]]:
        """A whole table: numeric columns as arrays, text columns as lists of str."""
        result: dict[str, np.ndarray | list[str]] = {}
        for column, kind in self.table_columns(table).items():
            if kind == "utf8":
                offsets = self._column_array(table, column, TEXT_OFFSETS)
                payload = self._array(table_column(table, column, TEXT_PAYLOAD))[...].tobytes()
                result[column] = [payload[a:b].decode("utf-8") for a, b in pairwise(offsets)]
            else:
                result[column] = self._column_array(table, column)
        return result


class ZarrGroupWriter(ZarrGroup):
    """Write side shared by both formats: the frame arrays and the tables of a cache.

    ``write_table`` and ``prepare_frames`` are single-process calls (rank 0, before any shard
    writer starts); ``write_frame_shard`` may run in many processes, one writer per shard.
    """

    def __init__(self, root: Path | str) -> None:
        super().__init__(root, read_only=False)

    def _ensure_group(self) -> None:
        if not (self.root / ZARR_ROOT_NAME).is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            zarr.open_group(self._store(), mode="a", zarr_format=3)
            fsync_path(self.root / ZARR_ROOT_NAME)

    def _prepare_array(self, path: str, spec: _ArraySpec) -> None:
        """Create array ``path`` as ``spec``; an existing equal array is kept with its shards."""
        self._ensure_group()
        if self.has_array(path):
            existing = self._array(path)
            # Compression is not compared: it changes the stored bytes, never the content.
            found = _ArraySpec(
                tuple(existing.shape), np.dtype(existing.dtype), tuple(existing.chunks),
                tuple(existing.shards or existing.chunks), spec.compression, existing.attrs.asdict(),
            )
            if found != spec:
                raise StoreError(
                    f"array {path!r} of cache {self.root} exists with {found.describe()}; "
                    f"asked for {spec.describe()}"
                )
            return
        # A new array starts without commits; records left by an earlier array of this path are void.
        uncommit_array(self.root, path)
        zarr.create_array(
            self._store(), name=path, shape=spec.shape, dtype=spec.dtype, chunks=spec.chunks,
            shards=spec.shards, compressors=spec.compression.zarr_codec(), fill_value=0,
            attributes=dict(spec.attributes), zarr_format=3, overwrite=True,
        )
        for parent in [self.root / path, *(self.root / path).parents]:
            fsync_path(parent / ZARR_ROOT_NAME)
            if parent == self.root:
                break
        self._arrays.pop(path, None)

    def _write_shard(self, path: str, shard: int, data: np.ndarray) -> CommitRecord:
        """Write all rows of one shard in one call, then fsync, checksum and commit it."""
        array = self._array(path)
        plan = self.array_shard_plan(path)
        if not 0 <= shard < len(plan):
            raise StoreError(f"array {path!r} has {len(plan)} shards; there is no shard {shard}")
        rows = plan[shard]
        expected = (len(rows), *array.shape[1:])
        if tuple(data.shape) != expected or data.dtype != array.dtype:
            raise StoreError(
                f"shard {path}#{shard} (rows {rows.start}:{rows.stop}) needs {array.dtype} {expected}, "
                f"got {data.dtype} {tuple(data.shape)}"
            )
        file = self.shard_file(path, shard)
        # Uncommit first: from here until the new record exists, a crash leaves the shard uncommitted.
        uncommit(self.root, path, shard)
        # zarr reads an existing shard file before rewriting it, which fails on a corrupt one:
        # start from no file (and no leftovers of an interrupted write).
        file.unlink(missing_ok=True)
        remove_partials(file)
        array[rows.start:rows.stop] = data
        if not file.is_file():
            raise StoreError(f"zarr wrote no file for shard {path}#{shard} (expected {file})")
        return commit_shard(self.root, path, shard, rows, file)

    # -- tables ---------------------------------------------------------------------------------

    def write_table(self, table: str, columns: Mapping[str, ColumnData]) -> None:
        """(Re)write a whole table: numeric columns as arrays, text columns as lists of str.

        Every column must have the same number of rows. The ``frames`` and ``samples`` tables
        need a text ``key`` column; ``samples`` also an integer ``window_rows`` column
        ``[n, history + 1]``. Writing the table the cache already holds changes nothing; a
        different one is refused (the cache's arrays are row-aligned with the old one); an
        interrupted write is redone.
        """
        _check_name("table", table)
        prepared = {name: _column(table, name, data) for name, data in columns.items()}
        lengths = {name: (len(c) if isinstance(c, list) else c.shape[0]) for name, c in prepared.items()}
        if len(set(lengths.values())) > 1:
            raise StoreError(f"columns of table {table!r} differ in length: {lengths}")
        n_rows = next(iter(lengths.values()), 0)
        _check_required_columns(table, prepared)
        state = self._table_state(table, prepared)
        if state == "equal":
            return  # resume, or a new resolution: the committed table is already this one
        if state == "different":
            raise StoreError(
                f"cache {self.root} already holds a different {table!r} table; rows of its arrays refer "
                "to that one, so a cache of other data needs a new (or emptied) cache directory"
            )

        self._ensure_group()
        group_path = table_group(table)
        # Drop the old table and its records, then write the new one column by column.
        for old in (self.root / group_path, CacheLayout(self.root).commit_dir(group_path)):
            if old.exists():
                shutil.rmtree(old)
        self._arrays = {k: v for k, v in self._arrays.items() if not k.startswith(group_path + "/")}
        self._columns = {k: v for k, v in self._columns.items() if k[0] != table}
        self._tables.pop(table, None)
        kinds: dict[str, str] = {}
        for name, data in prepared.items():
            if isinstance(data, list):
                encoded = [s.encode("utf-8") for s in data]
                offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
                np.cumsum([len(b) for b in encoded], out=offsets[1:])
                payload = np.frombuffer(b"".join(encoded), dtype=np.uint8)
                self._write_whole(table_column(table, name, TEXT_OFFSETS), offsets)
                self._write_whole(table_column(table, name, TEXT_PAYLOAD), payload)
                kinds[name] = "utf8"
            else:
                self._write_whole(table_column(table, name), data)
                kinds[name] = data.dtype.name
        group = zarr.open_group(self._store(), path=group_path, mode="a", zarr_format=3)
        group.attrs.update({"n_rows": n_rows, "columns": kinds})
        fsync_path(self.root / group_path / ZARR_ROOT_NAME)
        self._tables.pop(table, None)

    def _table_state(self, table: str, columns: Mapping[str, np.ndarray | list[str]]) -> str:
        """"absent", "incomplete" (an interrupted write), or whether the committed table is "equal"
        to ``columns`` or "different"."""
        if not self.has_table(table):
            return "absent"
        self._tables.pop(table, None)
        if "columns" not in self._table_attrs(table):  # the attributes are written last
            return "incomplete"
        group_path = table_group(table)
        if not all(c.ok for path in self.array_paths() if path.startswith(group_path + "/")
                   for c in self.check_array(path)):
            return "incomplete"
        if list(self.table_columns(table)) != list(columns):
            return "different"
        stored = self.read_table(table)
        for name, data in columns.items():
            if isinstance(data, list):
                if stored[name] != data:
                    return "different"
            elif not (isinstance(stored[name], np.ndarray) and stored[name].dtype == data.dtype
                      and np.array_equal(stored[name], data)):
                return "different"
        return "equal"

    def _write_whole(self, path: str, data: np.ndarray) -> None:
        self._prepare_array(path, _single_shard_spec(tuple(data.shape), data.dtype))
        if data.shape[0]:
            self._write_shard(path, 0, np.ascontiguousarray(data))

    # -- frames ---------------------------------------------------------------------------------

    def prepare_frames(self, resolution: str, frame_shape: tuple[int, int], frames_per_shard: int) -> None:
        """Create ``frames/<resolution>`` with one row per frame of the frames table.

        ``frame_shape`` is ``(H, W)``. An existing array of the same shape and layout is kept
        (resume); a different one is an error.
        """
        _check_name("resolution", resolution)
        height, width = (int(x) for x in frame_shape)
        n_frames = self.table_rows(FRAMES_TABLE)
        spec = _row_spec((n_frames, height, width, 3), np.dtype(np.uint8), 1, frames_per_shard, FRAMES_COMPRESSION,
                         {"resolution": resolution})
        self._prepare_array(frames_array(resolution), spec)

    def write_frame_shard(self, resolution: str, shard: int, frames: np.ndarray) -> CommitRecord:
        """Write frame shard ``shard`` of ``resolution``: uint8 ``[rows in shard, H, W, 3]``."""
        return self._write_shard(frames_array(resolution), shard, np.ascontiguousarray(frames))

    # -- shared by the sample writers -------------------------------------------------------------

    def _sample_rows_checked(self) -> int:
        """Rows of the samples table, after checking its window rows point at existing frames."""
        n_samples = self.table_rows(SAMPLES_TABLE)
        n_frames = self.table_rows(FRAMES_TABLE)
        window_rows = self._column_array(SAMPLES_TABLE, WINDOW_ROWS_COLUMN)
        if window_rows.size and (window_rows.min() < 0 or window_rows.max() >= n_frames):
            bad = int(np.argwhere((window_rows < 0) | (window_rows >= n_frames))[0, 0])
            raise StoreError(
                f"sample row {bad} of {self.root} has window rows {window_rows[bad].tolist()} outside "
                f"the {n_frames} frame rows"
            )
        return n_samples


def _column(table: str, name: str, data: ColumnData) -> np.ndarray | list[str]:
    """A column as a numeric array or a list of str; anything else is an error naming it."""
    _check_name(f"column of table {table!r}", name)
    if isinstance(data, np.ndarray) and data.dtype.kind not in "UO":
        if data.dtype.kind not in "biuf" or data.ndim < 1:
            raise StoreError(f"column {table}.{name} must be numeric or text with one row per entry, got {data.dtype} {data.shape}")
        return data
    values = list(data)
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise StoreError(f"text column {table}.{name} row {i} is {type(value).__name__} {value!r}, not str")
    return values


def _check_required_columns(table: str, columns: Mapping[str, np.ndarray | list[str]]) -> None:
    if table in (FRAMES_TABLE, SAMPLES_TABLE):
        keys = columns.get(KEY_COLUMN)
        if not isinstance(keys, list):
            raise StoreError(f"table {table!r} needs a text column {KEY_COLUMN!r}")
        if len(set(keys)) != len(keys):
            duplicate = next(k for k, n in Counter(keys).items() if n > 1)
            raise StoreError(f"table {table!r} has the key {duplicate!r} more than once; keys must be unique")
    if table == SAMPLES_TABLE:
        rows = columns.get(WINDOW_ROWS_COLUMN)
        if not isinstance(rows, np.ndarray) or rows.ndim != 2 or rows.dtype.kind not in "iu":
            raise StoreError(
                f"table {table!r} needs an integer column {WINDOW_ROWS_COLUMN!r} of shape [n_samples, history + 1]"
            )


class VariantWriter(ZarrGroupWriter):
    """A cache writer for one window variant: frames and tables in the zarr group, plus samples."""

    def __init__(self, root: Path | str, variant: str) -> None:
        super().__init__(root)
        _check_name("variant", variant)
        self.variant = variant


class ZarrCacheWriter(VariantWriter):
    """Writes a zarr cache for the window variant named ``variant``: frames, tables, features.

    Implements :class:`janus_cache.store.CacheWriter`.
    """

    format = "zarr"

    def samples_array_path(self, resolution: str) -> str:
        return features_array(self.variant, resolution)

    def prepare_samples(self, resolution: str, feature_shape: tuple[int, int], feature_dtype: str,
                        samples_per_shard: int) -> None:
        """Create ``vggt/<variant>/<resolution>`` with one row per sample of the samples table."""
        _check_name("resolution", resolution)
        n_samples = self._sample_rows_checked()
        shape = (n_samples, *(int(x) for x in feature_shape))
        spec = _row_spec(shape, stored_dtype(feature_dtype), 1, samples_per_shard, FEATURES_COMPRESSION,
                         {"logical_dtype": feature_dtype, "resolution": resolution, "variant": self.variant})
        self._prepare_array(self.samples_array_path(resolution), spec)

    def sample_shard_plan(self, resolution: str) -> list[range]:
        return self.array_shard_plan(self.samples_array_path(resolution))

    def committed_sample_shards(self, resolution: str, verify: bool = True) -> set[int]:
        return self.committed_shards(self.samples_array_path(resolution), verify)

    def write_feature_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray) -> CommitRecord:
        """Write feature shard ``shard``: ``[rows in shard, N, 2C]`` of the cache's feature dtype."""
        path = self.samples_array_path(resolution)
        logical = str(self._array(path).attrs["logical_dtype"])
        return self._write_shard(path, shard, to_stored(features, logical))

    def write_samples_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray,
                            window_frames: np.ndarray | None = None) -> CommitRecord:
        """The format-independent call: zarr stores frames once per frame row (``write_frame_shard``),
        so only the features are written here; ``window_frames`` is accepted and ignored."""
        return self.write_feature_shard(resolution, shard, features)


class ZarrCacheReader(ZarrGroup):
    """Random access to one resolution and window variant of a zarr cache; ``reader[row]`` is the
    :class:`~janus_cache.store.records.CacheSample` of sample row ``row``.

    The reader reads exactly the ``resolution`` and ``variant`` it is given; open it through
    :func:`janus_cache.store.open_cache`, which checks them against the cache's manifest.
    """

    format = "zarr"

    def __init__(self, root: Path | str, resolution: str, variant: str) -> None:
        super().__init__(root, read_only=True)
        if not (self.root / ZARR_ROOT_NAME).is_file():
            raise StoreError(f"{self.root} is not a zarr cache (no {ZARR_ROOT_NAME})")
        _check_name("resolution", resolution)
        _check_name("variant", variant)
        self.resolution, self.variant = resolution, variant
        self.frames_array = frames_array(resolution)
        self.features_array = features_array(variant, resolution)
        for array in (self.frames_array, self.features_array):
            if not self.has_array(array):
                raise StoreError(f"cache {self.root} has no array {array!r}")

    def feature(self, row: int) -> torch.Tensor:
        """Feature ``[N, 2C]`` of sample row ``row`` in its logical dtype (bf16 viewed from uint16)."""
        array = self._array(self.features_array)
        if not 0 <= row < array.shape[0]:
            raise IndexError(f"sample row {row} out of range for {array.shape[0]} samples in {self.root}")
        return from_stored(array[row], str(array.attrs["logical_dtype"]))

    def sample_shard_plan(self) -> list[range]:
        """Sample rows of each feature shard."""
        return self.array_shard_plan(self.features_array)

    def check(self, verify: bool = True) -> list[ShardCheck]:
        """One check per planned shard of this resolution's frames and this variant's features."""
        return self.check_array(self.frames_array, verify) + self.check_array(self.features_array, verify)

    def __len__(self) -> int:
        return self.table_rows(SAMPLES_TABLE)

    def sample(self, row: int) -> CacheSample:
        key, values = self.sample_meta_row(row)
        meta = SampleMeta.from_row(values, f"sample row {row} of {self.root}")
        return CacheSample(
            key=key,
            row=row,
            frames=self.frames(self.resolution, meta.window_rows),
            feature=self.feature(row),
            meta=meta,
        )

    def __getitem__(self, row: int) -> CacheSample:
        return self.sample(row)
