"""The zarr v3 group of a cache, write side: frame arrays and tables (shared by both formats).

``write_table`` and ``prepare_frames`` are single-process work (rank 0, before the shard writers
start); shard writes may come from any number of processes as long as each shard has one
writer, and every call writes one whole shard as one file and commits it. A cache can hold
several resolutions: preparing a new one creates its arrays and leaves the others untouched.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr
from zarr.storage import MemoryStore

from janus_cache.store.commit import (
    CommitRecord,
    StoreError,
    commit_shard,
    uncommit,
    uncommit_array,
)
from janus_cache.store.compression import FEATURES_COMPRESSION, FRAMES_COMPRESSION, TABLES_COMPRESSION, Compression
from janus_cache.store.damage import DamagedData
from janus_cache.store.features import stored_dtype, to_stored
from janus_cache.store.layout import (
    FRAMES_TABLE,
    KEY_COLUMN,
    SAMPLES_TABLE,
    TABLES_GROUP,
    TEXT_OFFSETS,
    TEXT_PAYLOAD,
    WINDOW_ROWS_COLUMN,
    ZARR_ROOT_NAME,
    CacheLayout,
    frames_array,
    table_column,
    table_group,
    vit_array,
)
from janus_cache.store.zarr_group import ColumnData, ZarrGroup, _check_name
from janus_core.system.files import atomic_write_bytes, fsync_path, remove_partials
from janus_core.text_column import NotText, TextColumn

TABLE_CHUNK_ROWS = 65536
"""Rows per chunk of a table column (UTF-8 payloads: bytes per chunk)."""


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


def _create(store: Any, path: str, spec: _ArraySpec) -> Any:
    return zarr.create_array(
        store, name=path, shape=spec.shape, dtype=spec.dtype, chunks=spec.chunks,
        shards=spec.shards, compressors=spec.compression.zarr_codecs(), fill_value=0,
        attributes=dict(spec.attributes), zarr_format=3, overwrite=True,
    )


def _array_metadata(path: str, spec: _ArraySpec) -> bytes:
    """The exact ``zarr.json`` zarr writes for array ``path`` of ``spec`` (what a repair restores)."""
    store = MemoryStore()
    _create(store, path, spec)
    return store._store_dict[f"{path}/{ZARR_ROOT_NAME}"].to_bytes()


def _group_metadata() -> bytes:
    """The exact ``zarr.json`` of a group without attributes."""
    store = MemoryStore()
    zarr.open_group(store, mode="w", zarr_format=3)
    return store._store_dict[ZARR_ROOT_NAME].to_bytes()


def _identity(metadata: bytes) -> tuple[Any, ...] | None:
    """What makes an array that array: shape, data type, shard and chunk shapes, attributes (None
    when the metadata cannot be parsed). Codecs are not in it: they say how bytes are stored."""
    try:
        data = json.loads(metadata)
        inner = data["codecs"][0]["configuration"]["chunk_shape"]
        return (tuple(data["shape"]), data["data_type"], tuple(data["chunk_grid"]["configuration"]["chunk_shape"]),
                tuple(inner), data.get("attributes", {}))
    except (ValueError, KeyError, TypeError, IndexError):
        return None


class ZarrGroupWriter(ZarrGroup):
    """Write side shared by both formats: the frame arrays and the tables of a cache.

    ``write_table`` and ``prepare_frames`` are single-process calls (rank 0, before any shard
    writer starts); ``write_frame_shard`` may run in many processes, one writer per shard.
    """

    def __init__(self, root: Path | str) -> None:
        super().__init__(root, read_only=False)
        self.repairs: list[str] = []
        """Metadata files and tables this writer rewrote because they were damaged or edited."""

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "repairs": []}

    def _repaired(self, what: str) -> None:
        self.repairs.append(what)
        self._pid = -1  # reopen every handle: the metadata under them changed

    def _ensure_group(self) -> None:
        if not (self.root / ZARR_ROOT_NAME).is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            zarr.open_group(self._store(), mode="a", zarr_format=3)
            fsync_path(self.root / ZARR_ROOT_NAME)

    def _repair_groups(self, path: str) -> None:
        """The ``zarr.json`` of every group above array ``path``: a plain group's must be zarr's own
        bytes; a table's group (it has attributes) must at least parse, its content is
        ``write_table``'s to check."""
        parts = path.split("/")[:-1]
        for depth in range(len(parts) + 1):
            relative = "/".join([*parts[:depth], ZARR_ROOT_NAME])
            file = self.root / relative
            if not file.is_file():
                continue  # zarr creates a missing one with the array
            current, canonical = file.read_bytes(), _group_metadata()
            if depth == 2 and parts[0] == TABLES_GROUP:
                try:
                    json.loads(current)
                    continue
                except ValueError:
                    pass
            if current != canonical:
                atomic_write_bytes(file, canonical)
                self._repaired(f"{relative} (damaged or edited)")

    def _prepare_array(self, path: str, spec: _ArraySpec, grow: bool = False) -> None:
        """Create array ``path`` as ``spec``; an existing equal array is kept with its shards.

        An existing array's ``zarr.json`` that differs from what zarr writes for ``spec`` in
        anything but the array's identity (shape, dtype, shard and chunk shapes, attributes), e.g.
        an edited ``"endian"`` or a damaged file, is rewritten: committed shards stay, each still
        checked against its commit record. A different identity is a different array: an error.

        With ``grow`` (appending rows), an existing array that differs only in having fewer rows
        is resized to ``spec``: its full shards are kept untouched, a partially filled last shard
        is uncommitted (so it is rewritten whole, as a build from scratch writes it).
        """
        self._ensure_group()
        self._repair_groups(path)
        expected = _array_metadata(path, spec)
        file = self.root / path / ZARR_ROOT_NAME
        if file.is_file():
            current = file.read_bytes()
            if current == expected:
                return
            found, wanted = _identity(current), _identity(expected)
            if grow and found is not None and wanted is not None and found[0][0] < wanted[0][0] \
                    and found[0][1:] == wanted[0][1:] and found[1:] == wanted[1:]:
                self._grow_array(path, found[0][0], spec)
                if file.read_bytes() != expected:  # e.g. an edited codec: as a build from scratch writes it
                    atomic_write_bytes(file, expected)
                return
            if found is not None and found != wanted:
                shape, dtype, shards, chunks, attrs = found
                raise StoreError(
                    f"array {path!r} of cache {self.root} exists with shape {shape}, dtype {dtype}, chunks {chunks}, "
                    f"shards {shards}, attrs {attrs}; asked for {spec.describe()} (if {file} was edited, rebuild "
                    "the cache: precompute --overwrite)"
                )
            atomic_write_bytes(file, expected)
            self._repaired(f"{path}/{ZARR_ROOT_NAME} (damaged or edited)")
            return
        # A new array starts without commits; records left by an earlier array of this path are void.
        uncommit_array(self.root, path)
        _create(self._store(), path, spec)
        for parent in [self.root / path, *(self.root / path).parents]:
            fsync_path(parent / ZARR_ROOT_NAME)
            if parent == self.root:
                break
        self._arrays.pop(path, None)

    def _grow_array(self, path: str, old_rows: int, spec: _ArraySpec) -> None:
        rows_per_shard = spec.shards[0]
        if old_rows % rows_per_shard:
            # Uncommitted before the resize: a crash in between leaves the shard to be rewritten.
            uncommit(self.root, path, old_rows // rows_per_shard)
        self._array(path).resize(spec.shape)
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

    def write_table(self, table: str, columns: Mapping[str, ColumnData], append: bool = False) -> None:
        """(Re)write a whole table: numeric columns as arrays, text columns as :class:`TextColumn`
        (or any sequence of str, encoded here).

        Every column must have the same number of rows. The ``frames`` and ``samples`` tables
        need a text ``key`` column; ``samples`` also an integer ``window_rows`` column
        ``[n, history + 1]``. Writing the table the cache already holds changes nothing; a
        different one is refused (the cache's arrays are row-aligned with the old one); an
        interrupted write is redone. With ``append``, a stored table whose rows are the first rows
        of ``columns`` (same columns) is rewritten with the new rows after them.
        """
        _check_name("table", table)
        prepared = {name: _column(table, name, data) for name, data in columns.items()}
        lengths = {name: _rows(c) for name, c in prepared.items()}
        if len(set(lengths.values())) > 1:
            raise StoreError(f"columns of table {table!r} differ in length: {lengths}")
        n_rows = next(iter(lengths.values()), 0)
        _check_required_columns(table, prepared)
        state = self._table_state(table, prepared)
        if state == "equal":
            return  # resume, or a new resolution: the committed table is already this one
        if state == "different" and not (append and self._table_is_prefix(table, prepared)):
            raise StoreError(
                f"cache {self.root} already holds a different {table!r} table; rows of its arrays refer "
                "to that one, so a cache of other data needs a new (or emptied) cache directory"
            )
        if state == "incomplete":
            self._repaired(f"table {table} (interrupted, damaged or edited)")

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
            for path, array in _stored_columns(table, name, data):
                self._write_whole(path, array)
            kinds[name] = "utf8" if isinstance(data, TextColumn) else data.dtype.name
        group = zarr.open_group(self._store(), path=group_path, mode="a", zarr_format=3)
        group.attrs.update({"n_rows": n_rows, "columns": kinds})
        fsync_path(self.root / group_path / ZARR_ROOT_NAME)
        self._tables.pop(table, None)

    def _table_state(self, table: str, columns: Mapping[str, np.ndarray | TextColumn]) -> str:
        """"absent", "incomplete" (an interrupted write), or whether the committed table is "equal"
        to ``columns`` or "different"."""
        if not self.has_table(table):
            return "absent"
        self._tables.pop(table, None)
        try:
            attrs = self._table_attrs(table)
        except DamagedData:
            return "incomplete"
        if "columns" not in attrs:  # the attributes are written last
            return "incomplete"
        group_path = table_group(table)
        if not all(c.ok for path in self.array_paths() if path.startswith(group_path + "/")
                   for c in self.check_array(path)):
            return "incomplete"
        if list(attrs["columns"]) != list(columns):
            return "different"
        if self._column_metadata_damaged(table, columns):
            return "incomplete"
        # Column by column, text in its stored form (offsets and UTF-8 bytes): decoding a 612k-row
        # table into Python strings beside the new one took a gigabyte in the process writing it.
        try:
            same = [self._column_equal(table, name, data) for name, data in columns.items()]
        except DamagedData:
            return "incomplete"
        n_rows = next((_rows(c) for c in columns.values()), 0)
        if attrs.get("n_rows") != n_rows and all(self._stored_rows(table, name, isinstance(data, TextColumn)) == n_rows
                                                 for name, data in columns.items()):
            return "incomplete"  # an edited row count over intact columns
        return "equal" if all(same) else "different"

    def _column_equal(self, table: str, name: str, data: np.ndarray | TextColumn, rows: int | None = None) -> bool:
        """Whether the stored column ``name`` holds exactly the first ``rows`` rows of ``data``
        (default: all; same dtype, shape and values); a text column's payload is compared a block
        of rows at a time, read from the store without keeping it."""
        if not isinstance(data, TextColumn):
            return self._array_equal(table_column(table, name), data[:rows])
        offsets = data.offsets if rows is None else data.offsets[:rows + 1]
        if not self._array_equal(table_column(table, name, TEXT_OFFSETS), offsets):
            return False
        path = table_column(table, name, TEXT_PAYLOAD)
        if self._array(path).shape != (int(offsets[-1]),):
            return False
        return all(np.array_equal(self.read_rows(path, start, stop), encoded)
                   for start, stop, encoded in data.blocks(rows))

    def _array_equal(self, path: str, array: np.ndarray) -> bool:
        stored = self.read_rows(path, 0, self._array(path).shape[0])
        return stored.dtype == array.dtype and np.array_equal(stored, array)

    def _stored_rows(self, table: str, name: str, text: bool) -> int:
        """Rows of the stored column ``name``, from its array's shape."""
        if text:
            return int(self._array(table_column(table, name, TEXT_OFFSETS)).shape[0]) - 1
        return int(self._array(table_column(table, name)).shape[0])

    def _column_metadata_damaged(self, table: str, columns: Mapping[str, np.ndarray | TextColumn]) -> bool:
        """Whether a column array's ``zarr.json`` differs from what writing ``columns`` would give
        in anything but the array's identity (a different identity is a different table, not
        damage)."""
        for name, data in columns.items():
            for path, (shape, dtype) in _stored_shapes(table, name, data).items():
                file = self.root / path / ZARR_ROOT_NAME
                if not file.is_file():
                    return True
                current = file.read_bytes()
                expected = _array_metadata(path, _single_shard_spec(shape, dtype))
                if current != expected and _identity(current) in (None, _identity(expected)):
                    return True
        return False

    def _table_is_prefix(self, table: str, columns: Mapping[str, np.ndarray | TextColumn]) -> bool:
        """Whether the stored ``table`` has ``columns``' names and is their first rows (text compared
        in its stored form)."""
        kinds = self.table_columns(table)
        if list(kinds) != list(columns):
            return False
        for name, data in columns.items():
            text = isinstance(data, TextColumn)
            if (kinds[name] == "utf8") != text:
                return False
            stored = self._stored_rows(table, name, text)
            if stored > _rows(data) or not self._column_equal(table, name, data, stored):
                return False
        return True

    def _write_whole(self, path: str, data: np.ndarray) -> None:
        self._prepare_array(path, _single_shard_spec(tuple(data.shape), data.dtype))
        if data.shape[0]:
            self._write_shard(path, 0, np.ascontiguousarray(data))

    # -- frames ---------------------------------------------------------------------------------

    def prepare_frames(self, resolution: str, frame_shape: tuple[int, int], frames_per_shard: int,
                       grow: bool = False) -> None:
        """Create ``frames/<resolution>`` with one row per frame of the frames table.

        ``frame_shape`` is ``(H, W)``. An existing array of the same shape and layout is kept
        (resume); a different one is an error, except, with ``grow``, one with fewer rows
        (appending: see ``_prepare_array``).
        """
        _check_name("resolution", resolution)
        height, width = (int(x) for x in frame_shape)
        n_frames = self.table_rows(FRAMES_TABLE)
        spec = _row_spec((n_frames, height, width, 3), np.dtype(np.uint8), 1, frames_per_shard, FRAMES_COMPRESSION,
                         {"resolution": resolution})
        self._prepare_array(frames_array(resolution), spec, grow)

    def write_frame_shard(self, resolution: str, shard: int, frames: np.ndarray) -> CommitRecord:
        """Write frame shard ``shard`` of ``resolution``: uint8 ``[rows in shard, H, W, 3]``."""
        return self._write_shard(frames_array(resolution), shard, np.ascontiguousarray(frames))

    # -- ViT features (cache.vit_features) ---------------------------------------------------------

    def prepare_vit(self, resolution: str, feature_shape: tuple[int, int], dtype: str, frames_per_shard: int,
                    grow: bool = False) -> None:
        """Create ``vit/<resolution>``: the frozen ViT's output ``[n_frames, grid tokens, D]``, row-aligned
        with ``frames/<resolution>`` and sharded like it (one chunk per frame); bf16 stored as its
        uint16 bits, attribute ``logical_dtype`` says which. Kept, grown or refused as ``prepare_frames``."""
        _check_name("resolution", resolution)
        n_frames = self.table_rows(FRAMES_TABLE)
        spec = _row_spec((n_frames, *(int(x) for x in feature_shape)), stored_dtype(dtype), 1, frames_per_shard,
                         FEATURES_COMPRESSION, {"logical_dtype": dtype, "resolution": resolution})
        self._prepare_array(vit_array(resolution), spec, grow)

    def vit_shard_plan(self, resolution: str) -> list[range]:
        """Frame rows of each ViT-features shard (the frame shards' rows)."""
        return self.array_shard_plan(vit_array(resolution))

    def write_vit_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray) -> CommitRecord:
        """Write and commit ViT-features shard ``shard``: ``[rows in shard, grid tokens, D]`` of its logical dtype."""
        path = vit_array(resolution)
        return self._write_shard(path, shard, to_stored(features, str(self._array(path).attrs["logical_dtype"])))

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


def _column(table: str, name: str, data: ColumnData) -> np.ndarray | TextColumn:
    """A column as a numeric array or a :class:`TextColumn`; anything else is an error naming it."""
    _check_name(f"column of table {table!r}", name)
    if isinstance(data, TextColumn):
        return data
    if isinstance(data, np.ndarray) and data.dtype.kind not in "UO":
        if data.dtype.kind not in "biuf" or data.ndim < 1:
            raise StoreError(f"column {table}.{name} must be numeric or text with one row per entry, got {data.dtype} {data.shape}")
        return data
    try:
        return TextColumn.encode(data)
    except NotText as err:
        raise StoreError(f"text column {table}.{name} {err}") from None


def _rows(data: np.ndarray | TextColumn) -> int:
    return len(data) if isinstance(data, TextColumn) else data.shape[0]


def _stored_columns(table: str, name: str, data: np.ndarray | TextColumn) -> Iterator[tuple[str, np.ndarray]]:
    """The array(s) column ``name`` is stored as: a numeric column as itself, a text column as its
    offsets and UTF-8 payload (made when it is reached: one column's payload at a time)."""
    if not isinstance(data, TextColumn):
        yield table_column(table, name), data
        return
    yield table_column(table, name, TEXT_OFFSETS), data.offsets
    yield table_column(table, name, TEXT_PAYLOAD), data.payload


def _stored_shapes(table: str, name: str, data: np.ndarray | TextColumn) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of each array of :func:`_stored_columns`, without making a text payload."""
    if not isinstance(data, TextColumn):
        return {table_column(table, name): (tuple(data.shape), data.dtype)}
    return {table_column(table, name, TEXT_OFFSETS): (tuple(data.offsets.shape), data.offsets.dtype),
            table_column(table, name, TEXT_PAYLOAD): ((data.nbytes,), np.dtype(np.uint8))}


def _check_required_columns(table: str, columns: Mapping[str, np.ndarray | TextColumn]) -> None:
    if table in (FRAMES_TABLE, SAMPLES_TABLE):
        keys = columns.get(KEY_COLUMN)
        if not isinstance(keys, TextColumn):
            raise StoreError(f"table {table!r} needs a text column {KEY_COLUMN!r}")
        if (duplicate := keys.first_duplicate()) is not None:
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
