"""The columnar form of a :class:`~janus_core.index.DatasetIndex`: one numpy array (or a few) per
field of its frames, samples and episodes, written as ``.npy`` files that can be memory-mapped.

Columns are made from the model's dataclass fields, whatever they are, by the type of their values:
integers and booleans are plain arrays; texts are dictionary-encoded (codes into a table of
distinct strings in the text-column form of :mod:`janus_core.text_column`, UTF-8 bytes plus
offsets; ``None`` is code -1), so an instruction
shared by an episode's samples is stored, and materialised, once; paths are texts relative to
the dataset's base folder, rebased on the path the caller gives; tuples of integers or texts are
ragged (flat values plus offsets). A field of any other type is kept as a pickled list (none of
the model's fields today). The few index-wide values (source format, history, report...) are
pickled: they are small.

Materialising a stored index gives a :class:`DatasetIndex` equal to the one that was stored
(``index_from_columns(columns_of(index)) == index``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import json
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from janus_core.index.model import DatasetIndex, Episode, Frame, Sample
from janus_core.text_column import TextColumn

FORMAT_VERSION = 1
"""Version of the stored layout; a stored index of another version is rebuilt."""

TABLES: dict[str, type] = {"frames": Frame, "samples": Sample, "episodes": Episode}
"""The row classes of an index, by the name of the index field holding them."""

INDEX_META = "meta.json"
INDEX_SCALARS = "index.pkl"
TEXT_ERRORS = "surrogatepass"  # lone surrogates (odd file names, JSON escapes) round-trip


def schema_tag() -> str:
    """Short hash of the model's field names and the layout version: a stored index of other code is rebuilt."""
    names = {name: [f.name for f in dataclasses.fields(cls)] for name, cls in TABLES.items()}
    names["index"] = [f.name for f in dataclasses.fields(DatasetIndex) if f.init]
    return hashlib.sha256(json.dumps([FORMAT_VERSION, names]).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------ texts


def _dictionary(values: Sequence[str | None]) -> dict[str, np.ndarray]:
    """A text field's stored parts: ``codes`` per row (-1: None) into the distinct texts, which are
    stored as a text column (``utf8`` its payload, ``offsets`` its offsets)."""
    codes, table = TextColumn.dictionary(values, TEXT_ERRORS)
    return {"codes": codes, **_text_parts(table)}


def _text_parts(column: TextColumn) -> dict[str, np.ndarray]:
    return {"utf8": column.payload, "offsets": column.offsets}


def stored_texts(utf8: np.ndarray, offsets: np.ndarray) -> TextColumn:
    """The distinct texts of a stored text field (its ``utf8`` and ``offsets`` parts)."""
    return TextColumn(offsets, utf8, errors=TEXT_ERRORS)


def decode_table(utf8: np.ndarray, offsets: np.ndarray) -> list[str]:
    """All the distinct texts of a stored text field, in code order."""
    return list(stored_texts(utf8, offsets))


def _compact(array: np.ndarray) -> np.ndarray:
    """int32 when the values fit (rows, windows: half the bytes on disk), else int64."""
    if array.size and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        return array
    return array.astype(np.int32)


# ----------------------------------------------------------------------------- columns


def _kind(values: Sequence[Any]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "text"  # all None (or empty): a text column of nulls
    if all(isinstance(v, bool) for v in present) and len(present) == len(values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present) and len(present) == len(values):
        return "int"
    if all(isinstance(v, str) for v in present):
        return "text"
    if all(isinstance(v, Path) for v in present) and len(present) == len(values):
        return "path"
    if all(isinstance(v, tuple) for v in present) and len(present) == len(values):
        items = [x for v in present for x in v]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return "ints"
        if all(isinstance(x, str) for x in items):
            return "texts"
    return "pickle"


def _relative(path: Path, prefix: str) -> str:
    text = str(path)
    if not prefix:
        return text
    if text == prefix[:-1]:
        return ""
    return text[len(prefix):] if text.startswith(prefix) else "\0" + text  # \0: not under the base


def _base_prefix(base: Path) -> str:
    text = str(base)
    return "" if text == "." else text.rstrip("/") + "/"


def encode_column(values: Sequence[Any], base: Path) -> tuple[str, dict[str, np.ndarray]]:
    """(kind, arrays) of one field's values over all rows."""
    kind = _kind(values)
    if kind in ("int", "bool"):
        return kind, {"data": _compact(np.array(values, dtype=np.int64)) if kind == "int"
                      else np.array(values, dtype=np.bool_)}
    if kind in ("text", "path"):
        if kind == "path":
            prefix = _base_prefix(base)
            values = [_relative(v, prefix) for v in values]
        return kind, _dictionary(values)
    if kind in ("ints", "texts"):
        lengths = [len(v) for v in values]
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = [x for v in values for x in v]
        if kind == "ints":
            return kind, {"data": _compact(np.array(flat, dtype=np.int64)), "rows": offsets}
        texts = _dictionary(flat)
        return kind, {"codes": texts.pop("codes"), "rows": offsets, **texts}
    blob = pickle.dumps(list(values), protocol=pickle.HIGHEST_PROTOCOL)
    return kind, {"pickle": np.frombuffer(blob, dtype=np.uint8)}


def _shared_ints(array: np.ndarray) -> list[int]:
    """``array.tolist()``, one int object per distinct value when values repeat (window rows name
    each frame up to 9 times, widths are one value): a built index shares them too."""
    if array.size < 2:
        return array.tolist()
    distinct, inverse = np.unique(array, return_inverse=True)
    if len(distinct) * 2 > array.size:
        return array.tolist()
    values = distinct.tolist()
    return [values[i] for i in inverse.tolist()]


def decode_column(kind: str, arrays: dict[str, np.ndarray], base: Path) -> list[Any]:
    """The Python values of one stored column (the inverse of :func:`encode_column`)."""
    if kind == "int":
        return _shared_ints(arrays["data"])
    if kind == "bool":
        return [bool(v) for v in arrays["data"].tolist()]
    if kind in ("text", "path"):
        table: list[Any] = decode_table(arrays["utf8"], arrays["offsets"])
        if kind == "path":
            table = [Path(t[1:]) if t.startswith("\0") else base / t for t in table]
        table.append(None)  # code -1
        return [table[c] for c in arrays["codes"].tolist()]
    if kind in ("ints", "texts"):
        bounds = arrays["rows"].tolist()
        if kind == "ints":
            flat: list[Any] = _shared_ints(arrays["data"])
        else:
            strings = decode_table(arrays["utf8"], arrays["offsets"])
            flat = [strings[c] for c in arrays["codes"].tolist()]
        return [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    if kind == "pickle":
        return _unpickle(bytes(arrays["pickle"]))
    raise ValueError(f"unknown column kind {kind!r}")


# ------------------------------------------------------------------------------ on disk


def _base(index_source: Path, image_root: Path | None) -> Path:
    """The folder stored paths are relative to: the episode root, or an annotation file's image root."""
    return image_root if image_root is not None else index_source


def write_columns(index: DatasetIndex, directory: Path, base: Path, meta: dict[str, Any]) -> None:
    """Write ``index`` into the (new, empty) ``directory``: ``<table>.<field>.<part>.npy`` files,
    the index-wide values and ``meta.json`` (``meta`` plus the column kinds), the latter last."""
    directory.mkdir(parents=True, exist_ok=True)
    kinds: dict[str, dict[str, str]] = {}
    for table, cls in TABLES.items():
        rows = getattr(index, table)
        kinds[table] = {}
        for f in dataclasses.fields(cls):
            kind, arrays = encode_column([getattr(r, f.name) for r in rows], base)
            kinds[table][f.name] = kind
            for part, array in arrays.items():
                np.save(directory / f"{table}.{f.name}.{part}.npy", array, allow_pickle=False)
    scalars = {f.name: getattr(index, f.name) for f in dataclasses.fields(DatasetIndex)
               if f.init and f.name not in TABLES and f.name != "source"}
    (directory / INDEX_SCALARS).write_bytes(pickle.dumps(scalars, protocol=pickle.HIGHEST_PROTOCOL))
    counts = {table: len(getattr(index, table)) for table in TABLES}
    (directory / INDEX_META).write_text(json.dumps({**meta, "kinds": kinds, "counts": counts}, indent=1))


def read_meta(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / INDEX_META).read_text())
    except (OSError, ValueError):
        return None


def load_parts(directory: Path, mmap: bool = True) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """table -> field -> part -> array (memory-mapped with ``mmap``) of a stored index."""
    parts: dict[str, dict[str, dict[str, np.ndarray]]] = {t: {} for t in TABLES}
    for name in os.listdir(directory):
        if name.endswith(".npy"):
            table, fieldname, part, _ = name.split(".")
            parts[table].setdefault(fieldname, {})[part] = np.load(directory / name, mmap_mode="r" if mmap else None,
                                                                   allow_pickle=False)
    return parts


def read_scalars(directory: Path) -> dict[str, Any]:
    """The index-wide values (all but ``source`` and the tables)."""
    return _unpickle((directory / INDEX_SCALARS).read_bytes())


MOVED_FROM = "janus_cache."
"""The package the shared domain (the index among it) lived in when older stored indexes were
pickled; it lives in ``janus_core`` now."""


class _Unpickler(pickle.Unpickler):
    """Reads values pickled before the shared domain moved to ``janus_core``: a class of a
    ``janus_cache`` module that is no longer there is looked up under ``janus_core``, so an index
    stored by an earlier janus (in a cache or the index store) reads as it was written."""

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(MOVED_FROM):
            try:
                importlib.import_module(module)
            except ModuleNotFoundError:
                module = "janus_core." + module[len(MOVED_FROM):]
        return super().find_class(module, name)


def _unpickle(blob: bytes) -> Any:
    return _Unpickler(io.BytesIO(blob)).load()


def read_columns(directory: Path, meta: dict[str, Any], source: Path, base: Path,
                 mmap: bool = True) -> DatasetIndex:
    """Materialise the index stored in ``directory`` (whose ``meta.json`` is ``meta``); paths are
    rebased on ``base`` and the index's ``source`` is ``source``."""
    parts = load_parts(directory, mmap)
    tables: dict[str, tuple[Any, ...]] = {}
    for table, cls in TABLES.items():
        names = [f.name for f in dataclasses.fields(cls)]
        kinds = meta["kinds"][table]
        columns = [decode_column(kinds[n], parts[table].get(n, {}), base) for n in names]
        n_rows = meta["counts"][table]
        tables[table] = tuple(cls(*values) for values in zip(*columns, strict=True)) if n_rows else ()
    return DatasetIndex(source=source, **tables, **read_scalars(directory))


# ------------------------------------------------------------------------------ a chunk at a time


class ColumnWriter:
    """Write an index into ``directory`` a chunk of frame and sample rows at a time, as
    :func:`write_columns` writes it whole: how a 612k-sample index is built and stored without
    ever holding a row object per frame and sample (each chunk is encoded, then let go; texts are
    dictionary-encoded within their chunk, which decodes to the same values)."""

    CHUNKED = ("frames", "samples")

    def __init__(self, directory: Path, base: Path) -> None:
        self.directory, self.base = directory, base
        self.kinds: dict[str, dict[str, str]] = {table: {} for table in TABLES}
        self.counts = dict.fromkeys(TABLES, 0)
        self._parts: dict[str, dict[str, list[dict[str, np.ndarray]]]] = {t: {} for t in self.CHUNKED}

    def add(self, table: str, rows: Sequence[Any]) -> None:
        """Encode the next ``rows`` of ``table`` (``frames`` or ``samples``, in row order)."""
        if not rows:
            return
        for f in dataclasses.fields(TABLES[table]):
            kind, arrays = encode_column([getattr(r, f.name) for r in rows], self.base)
            known = self.kinds[table].setdefault(f.name, kind)
            if kind != known:
                raise TypeError(f"{table}.{f.name} holds {kind} values in a later chunk, {known} before")
            if kind == "pickle":
                raise TypeError(f"{table}.{f.name} holds values that are not stored in chunks")
            self._parts[table].setdefault(f.name, []).append(arrays)
        self.counts[table] += len(rows)

    def finish(self, index: DatasetIndex, meta: dict[str, Any]) -> None:
        """Write the chunked tables, ``index``'s episodes and index-wide values (its frames and
        samples are not read: they are what was added) and ``meta.json``, the latter last."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for table in self.CHUNKED:
            for f in dataclasses.fields(TABLES[table]):
                chunks = self._parts[table].get(f.name)
                kind, arrays = (self.kinds[table][f.name], _joined(self.kinds[table][f.name], chunks)) if chunks \
                    else encode_column([], self.base)
                self.kinds[table][f.name] = kind
                for part, array in arrays.items():
                    np.save(self.directory / f"{table}.{f.name}.{part}.npy", array, allow_pickle=False)
            self._parts[table].clear()
        for f in dataclasses.fields(Episode):
            kind, arrays = encode_column([getattr(e, f.name) for e in index.episodes], self.base)
            self.kinds["episodes"][f.name] = kind
            for part, array in arrays.items():
                np.save(self.directory / f"episodes.{f.name}.{part}.npy", array, allow_pickle=False)
        self.counts["episodes"] = len(index.episodes)
        scalars = {f.name: getattr(index, f.name) for f in dataclasses.fields(DatasetIndex)
                   if f.init and f.name not in TABLES and f.name != "source"}
        (self.directory / INDEX_SCALARS).write_bytes(pickle.dumps(scalars, protocol=pickle.HIGHEST_PROTOCOL))
        (self.directory / INDEX_META).write_text(json.dumps({**meta, "kinds": self.kinds, "counts": self.counts},
                                                            indent=1))


def _joined_offsets(chunks: list[np.ndarray]) -> np.ndarray:
    """Offsets arrays (each starting at 0) of consecutive chunks as one."""
    out, end = [np.zeros(1, dtype=np.int64)], 0
    for offsets in chunks:
        out.append(np.asarray(offsets[1:], dtype=np.int64) + end)
        end += int(offsets[-1])
    return np.concatenate(out)


def _joined_codes(codes: list[np.ndarray], tables: list[int]) -> np.ndarray:
    """Codes into each chunk's table as codes into the tables end to end (-1 stays -1)."""
    out, shift = [], 0
    for chunk, size in zip(codes, tables, strict=True):
        chunk = np.asarray(chunk, dtype=np.int64)
        out.append(np.where(chunk < 0, -1, chunk + shift))
        shift += size
    return _compact(np.concatenate(out))


def _joined(kind: str, chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One column's arrays of consecutive chunks (:func:`encode_column`'s) as one column's."""
    if kind in ("int", "bool"):
        data = np.concatenate([c["data"] for c in chunks])
        return {"data": _compact(data.astype(np.int64)) if kind == "int" else data}
    out: dict[str, np.ndarray] = {}
    if kind in ("text", "path", "texts"):
        sizes = [len(c["offsets"]) - 1 for c in chunks]
        out.update(codes=_joined_codes([c["codes"] for c in chunks], sizes),
                   utf8=np.concatenate([c["utf8"] for c in chunks]),
                   offsets=_joined_offsets([c["offsets"] for c in chunks]))
    if kind in ("ints", "texts"):
        out["rows"] = _joined_offsets([c["rows"] for c in chunks])
    if kind == "ints":
        out["data"] = _compact(np.concatenate([np.asarray(c["data"], dtype=np.int64) for c in chunks]))
    return out


def distinct_text_column(strings: Sequence[str]) -> dict[str, np.ndarray]:
    """:func:`encode_column`'s arrays of a text column whose rows all differ (sorted file paths),
    without a dictionary of a million strings: each row is its own code."""
    return {"codes": _compact(np.arange(len(strings), dtype=np.int64)),
            **_text_parts(TextColumn.encode(strings, TEXT_ERRORS))}
