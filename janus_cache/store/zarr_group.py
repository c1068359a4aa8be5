"""The zarr v3 group of a cache, read side: frames, tables, shard plans and checks.

Both cache formats keep their frames (once per frame row) and their frame and sample tables in
one zarr v3 group; :mod:`janus_cache.store.zarr_group_writer` writes it. Every array is sharded
with zarr's sharding codec, one whole shard per file, each committed with a checksummed record
(:mod:`janus_cache.store.commit`). Paths are named in :mod:`janus_cache.store.layout`.

Text columns are stored as two plain arrays, ``<column>/utf8`` (uint8, the concatenated UTF-8
bytes) and ``<column>/offsets`` (int64 ``[n + 1]``): core zarr v3 dtypes only, so any v3 reader
can open them, row ``i`` is one slice away (O(1)), and they are checksummed and committed like
every other array. (zarr-python's variable-length string dtype is an extension outside the core
spec; a JSON-lines side table would need its own integrity and random-access scheme.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.storage import LocalStore

from janus_cache.store.commit import ShardCheck, StoreError, check_shard, read_record, shard_plan
from janus_cache.store.damage import DamagedData, StrictLocalStore, describe
from janus_cache.store.features import from_stored
from janus_cache.store.layout import (
    KEY_COLUMN,
    SAMPLES_TABLE,
    TEXT_OFFSETS,
    TEXT_PAYLOAD,
    ZARR_ROOT_NAME,
    frames_array,
    table_column,
    table_group,
    vit_array,
)
from janus_cache.store.location import cache_location
from janus_cache.store.manifest import ShardEntry
from janus_cache.store.remote.errors import RemoteError
from janus_cache.store.remote.path import S3Path
from janus_cache.store.remote.zarr_store import StrictObjectStore, remote_zarr_store
from janus_core.text_column import TextColumn

ColumnData = np.ndarray | TextColumn | Sequence[str]
"""A table column to write: numeric rows, or text (stored form, or any sequence of str)."""


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


class ZarrGroup:
    """Read side shared by the writers and the reader: opening arrays, tables, plans, checks.

    Arrays are opened lazily and per process (a forked or spawned worker reopens them), so one
    instance can be handed to DataLoader workers.
    """

    def __init__(self, root: Path | str, *, read_only: bool) -> None:
        self.root = cache_location(root)
        self._read_only = read_only
        self._pid = -1
        self._arrays: dict[str, Any] = {}
        self._columns: dict[tuple[str, str], np.ndarray] = {}
        self._tables: dict[str, Mapping[str, Any]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Open zarr handles stay behind; the receiving process reopens what it reads.
        return {**self.__dict__, "_pid": -1, "_arrays": {}, "_columns": {}, "_tables": {}}

    # -- arrays ---------------------------------------------------------------------------------

    def _store(self) -> LocalStore | StrictObjectStore:
        if isinstance(self.root, S3Path):  # read in place (janus_cache.store.remote)
            if not self._read_only:
                raise StoreError(f"{self.root}: a cache in a bucket is written by janus-cache push, not in place")
            return remote_zarr_store(self.root)
        # Readers never see zarr's fill value for a missing chunk; writers must (zarr reads the
        # shard it is about to replace, and a new shard has no file yet).
        if self._read_only:
            return StrictLocalStore(self.root, read_only=True)
        return LocalStore(self.root, read_only=False)

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
            try:
                array = zarr.open_array(self._store(), path=path, mode="r" if self._read_only else "r+",
                                        zarr_format=3)
            except Exception as err:  # noqa: BLE001 - whatever zarr makes of damaged metadata
                raise DamagedData(self.root / path / ZARR_ROOT_NAME, f"metadata cannot be read ({describe(err)})") from None
            if not self._read_only:
                # zarr skips chunks equal to the fill value by default; a shard must always be one
                # file (an all-black frame shard included) so that it can be committed.
                array = array.with_config({"write_empty_chunks": True})
            self._arrays[path] = array
        return array

    def array(self, path: str) -> Any:
        """Array ``path`` of the cache, opened (read-only in a reader): its shape, dtype, attributes."""
        return self._array(path)

    def read_rows(self, path: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of array ``path``, every chunk checked (crc32c, present): damage is a
        :class:`DamagedData` naming the shard file."""
        array = self._array(path)
        try:
            return array[start:stop]
        except StoreError:  # damage already named, or the bucket's own failure (one line each)
            raise
        except Exception as err:  # noqa: BLE001 - a chunk that fails its check or cannot be decoded
            raise self._locate_damage(path, start, stop, err) from None

    def read_runs(self, path: str, runs: list[np.ndarray]) -> np.ndarray:
        """The rows of ``runs`` (runs of consecutive rows) of array ``path``, concatenated; from a
        bucket, the chunks of all runs in a shard are fetched at once first (one ranged GET per
        shard where their gaps are small: :meth:`StrictObjectStore.read_ahead`)."""
        spans = [(int(run[0]), int(run[-1]) + 1) for run in runs]
        remote = remote_zarr_store(self.root) if isinstance(self.root, S3Path) else None
        if remote is not None:
            remote.read_ahead(self._array(path), path, spans)
        try:
            return np.concatenate([self.read_rows(path, start, stop) for start, stop in spans])
        finally:
            if remote is not None:
                remote.forget_read_ahead()

    def _locate_damage(self, path: str, start: int, stop: int, err: BaseException) -> DamagedData:
        """The damage of the first shard of rows ``start:stop`` that fails on its own (the error path only)."""
        array = self._array(path)
        per_shard = (array.shards or array.chunks)[0]
        for shard in range(start // per_shard, (max(stop, start + 1) - 1) // per_shard + 1):
            try:
                array[shard * per_shard:min((shard + 1) * per_shard, array.shape[0])]
            except RemoteError:
                raise
            except Exception as shard_err:  # noqa: BLE001
                if isinstance(shard_err, DamagedData):
                    return shard_err
                return DamagedData(self.shard_file(path, shard), describe(shard_err))
        return DamagedData(self.shard_file(path, start // per_shard), describe(err))

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
            children = sorted(p for p in directory.iterdir() if p.is_dir())
            try:
                is_array = json.loads(meta.read_text()).get("node_type") == "array"
            except (ValueError, AttributeError):  # damaged: an array unless nodes lie below it
                is_array = not any((child / ZARR_ROOT_NAME).is_file() for child in children)
            if is_array:
                found.append(rel)
                return
            for child in children:
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
        path = frames_array(resolution)
        if isinstance(rows, range) and rows.step == 1:
            if rows.start < 0 or rows.stop > array.shape[0]:
                raise IndexError(f"frame rows {rows} out of range for {array.shape[0]} frames of {resolution}")
            return self.read_rows(path, rows.start, rows.stop)
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= array.shape[0]):
            raise IndexError(f"frame rows {index.tolist()} out of range for {array.shape[0]} frames of {resolution}")
        if not index.size:
            return np.empty((0, *array.shape[1:]), dtype=array.dtype)
        # One slice read per run of consecutive rows: zarr's integer-array (orthogonal) selection
        # costs ~10 ms per frame on sharded arrays, a slice ~1 ms per call plus decoding.
        unique, inverse = np.unique(index, return_inverse=True)
        runs = np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1)
        frames = self.read_runs(path, runs)
        return frames[inverse]

    def vit_features(self, resolution: str, rows: Sequence[int] | np.ndarray) -> torch.Tensor:
        """Cached ViT features ``[len(rows), grid tokens, D]`` of frame rows ``rows`` of ``resolution``
        in their logical dtype (``cache.vit_features``; chunks checked like the frames')."""
        path = vit_array(resolution)
        array = self._array(path)
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= array.shape[0]):
            raise IndexError(f"frame rows {index.tolist()} out of range for {array.shape[0]} ViT rows of {resolution}")
        unique, inverse = np.unique(index, return_inverse=True)
        runs = np.split(unique, np.flatnonzero(np.diff(unique) != 1) + 1) if unique.size else []
        stored = self.read_runs(path, runs) if runs else np.empty((0, *array.shape[1:]), dtype=array.dtype)
        return from_stored(stored[inverse], str(array.attrs["logical_dtype"]))

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
            try:
                group = zarr.open_group(self._store(), path=table_group(table), mode="r", zarr_format=3)
                attrs = group.attrs.asdict()
            except Exception as err:  # noqa: BLE001 - whatever zarr makes of damaged metadata
                raise DamagedData(self.root / table_group(table) / ZARR_ROOT_NAME,
                                  f"metadata cannot be read ({describe(err)})") from None
            self._tables[table] = attrs
        return attrs

    def _column_array(self, table: str, column: str, part: str | None = None) -> np.ndarray:
        """A whole numeric column (or a text column's offsets), loaded once per process."""
        key = (table, column if part is None else f"{column}/{part}")
        self._this_process()
        cached = self._columns.get(key)
        if cached is None:
            path = table_column(table, column, part)
            cached = self.read_rows(path, 0, self._array(path).shape[0])
            self._columns[key] = cached
        return cached

    def _text(self, table: str, column: str, row: int) -> str:
        offsets = self._column_array(table, column, TEXT_OFFSETS)
        start, stop = int(offsets[row]), int(offsets[row + 1])
        if stop == start:
            return ""
        path = table_column(table, column, TEXT_PAYLOAD)
        payload = self.read_rows(path, start, stop)
        try:
            return payload.tobytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise DamagedData(self.shard_file(path, 0), f"row {row} of text column {table}.{column} is not UTF-8 "
                              f"({err.reason})") from None

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

    def read_column(self, table: str, column: str) -> np.ndarray | list[str]:
        """One whole column: a numeric array, or a text column as a list of str (only this column
        is read and decoded; a damaged chunk or non-UTF-8 text is :class:`DamagedData`)."""
        kind = self.table_columns(table).get(column)
        if kind is None:
            raise StoreError(f"the {table!r} table of {self.root} has no column {column!r}")
        if kind != "utf8":
            return self._column_array(table, column)
        offsets = self._column_array(table, column, TEXT_OFFSETS)
        path = table_column(table, column, TEXT_PAYLOAD)
        payload = self.read_rows(path, 0, self._array(path).shape[0])
        try:
            return list(TextColumn(offsets, payload))
        except UnicodeDecodeError as err:
            raise DamagedData(self.shard_file(path, 0), f"text column {table}.{column} is not UTF-8 "
                              f"({err.reason})") from None

    def read_table(self, table: str) -> dict[str, np.ndarray | list[str]]:
        """A whole table: numeric columns as arrays, text columns as lists of str."""
        return {column: self.read_column(table, column) for column in self.table_columns(table)}
