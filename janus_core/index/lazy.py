"""A stored index read lazily: how a process of a precompute reads a 612k-sample index.

:func:`read_lazy` gives a :class:`LazyIndex`, a :class:`~janus_core.index.DatasetIndex` whose
``frames`` and ``samples`` are :class:`LazyRows`: a row object is made when it is asked for, its
values decoded from the stored columns (memory-mapped), so a process holds only the pages it
touched. Whole columns come as numpy arrays or lists without making a row
(:meth:`LazyIndex.int_column`, :meth:`LazyIndex.text_column`), or a value at a time
(:meth:`LazyIndex.iter_text`): what the job's tables and window checks use; the key lookups
(``sample(key)``, ``frame(...)``) are built on first use.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from janus_core.index.columns import TABLES, decode_column, decode_table, load_parts, read_scalars, stored_texts
from janus_core.index.identity import EpisodeIdentity
from janus_core.index.model import DatasetIndex, Episode, Frame, Sample


class LazyRows(Sequence[Any]):
    """The rows of one stored table, each made on access (equal to the tuple of the same rows).

    A value is decoded from the memory-mapped arrays when its row is asked for: no column is
    turned into a list of Python objects, so a 612k-row table costs its mapped pages, not a
    gigabyte of objects. Texts shared by many rows (instructions, episode ids) are decoded once.
    """

    def __init__(self, cls: type, kinds: dict[str, str], parts: dict[str, dict[str, np.ndarray]], base: Path,
                 n_rows: int) -> None:
        self._cls, self._kinds, self._parts, self._base, self._n = cls, kinds, parts, base, n_rows
        self._names = [f.name for f in dataclasses.fields(cls)]
        self._columns: dict[str, Callable[[int], Any]] = {}

    def _column(self, name: str) -> Callable[[int], Any]:
        if name not in self._columns:
            self._columns[name] = _row_decoder(self._kinds[name], self._parts.get(name, {}), self._base, self._n)
        return self._columns[name]

    def kind(self, name: str) -> str:
        """The stored kind of field ``name`` (:func:`~janus_core.index.columns.encode_column`)."""
        return self._kinds[name]

    def values(self, name: str) -> Iterator[Any]:
        """Field ``name`` of every row, each decoded as it is asked for."""
        decode = self._column(name)
        return (decode(row) for row in range(self._n))

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        """The stored arrays of field ``name`` (memory-mapped)."""
        return self._parts.get(name, {})

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, slice):
            return tuple(self[i] for i in range(*item.indices(self._n)))
        row = item + self._n if item < 0 else item
        if not 0 <= row < self._n:
            raise IndexError(f"row {item} of {self._n}")
        return self._cls(*(self._column(name)(row) for name in self._names))

    def __iter__(self) -> Iterator[Any]:
        return (self[row] for row in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


def _text_decoder(utf8: np.ndarray, offsets: np.ndarray, codes: np.ndarray, n_rows: int
                  ) -> Callable[[int], str | None]:
    """code -> text: a table shared by many rows is decoded once, a table of (nearly) one text per
    row (keys, paths, hashes) is decoded per access."""
    if len(offsets) - 1 <= max(1, n_rows // 2):
        table: list[str | None] = [*decode_table(utf8, offsets), None]  # code -1 is None
        return lambda code: table[code]
    texts = stored_texts(utf8, offsets)

    def text(code: int) -> str | None:
        return None if code < 0 else texts.text(code)

    return text


def _row_decoder(kind: str, arrays: dict[str, np.ndarray], base: Path, n_rows: int) -> Callable[[int], Any]:
    """row -> the value of one stored column (as :func:`decode_column` gives it for that row)."""
    if kind == "int":
        data = arrays["data"]
        return lambda row: int(data[row])
    if kind == "bool":
        flags = arrays["data"]
        return lambda row: bool(flags[row])
    if kind in ("text", "path"):
        codes = arrays["codes"]
        text = _text_decoder(arrays["utf8"], arrays["offsets"], codes, n_rows)
        if kind == "text":
            return lambda row: text(int(codes[row]))

        def path(row: int) -> Path | None:
            value = text(int(codes[row]))
            if value is None:
                return None
            return Path(value[1:]) if value.startswith("\0") else base / value

        return path
    if kind in ("ints", "texts"):
        bounds = arrays["rows"]
        if kind == "ints":
            data = arrays["data"]
            return lambda row: tuple(data[bounds[row]:bounds[row + 1]].tolist())
        codes = arrays["codes"]
        text = _text_decoder(arrays["utf8"], arrays["offsets"], codes, len(codes))
        return lambda row: tuple(text(c) for c in codes[bounds[row]:bounds[row + 1]].tolist())
    return decode_column(kind, arrays, base).__getitem__  # pickled: whole (no field of the model today)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class LazyIndex(DatasetIndex):
    """A :class:`DatasetIndex` over stored columns: rows and key lookups made on first use."""

    stored_identities: tuple[EpisodeIdentity, ...] | None = None
    """The episodes' identities stored with the columns (:func:`episode_identities` returns them
    instead of reading every row again), or None."""
    origin: tuple[Path, dict[str, Any], Path, Path] | None = None
    """What :func:`read_lazy` read it from (folder, meta, source, base): a pickled lazy index is
    that folder opened again where it is unpickled (another rank), not a copy of its columns."""

    def __post_init__(self) -> None:
        pass  # the lookups of DatasetIndex are built by _lookups() when first asked

    def __reduce__(self) -> tuple[Any, ...]:
        if self.origin is None:
            return super().__reduce__()
        return read_lazy, (*self.origin, self.stored_identities)

    def _lookups(self) -> None:
        """The key lookups, from the key columns (no row made: a row per sample is ~1 KB of objects)."""
        try:
            self._samples_by_key  # noqa: B018 - set once
        except AttributeError:
            numbers = self.int_column("frames", "index").tolist()
            frame_rows = {(ep, i): row for row, (ep, i) in
                          enumerate(zip(self.iter_text("frames", "episode_id"), numbers, strict=True))}
            samples = {key: row for row, key in enumerate(self.iter_text("samples", "key"))}
            object.__setattr__(self, "_samples_by_key", samples)
            object.__setattr__(self, "_episodes_by_id", {e.episode_id: i for i, e in enumerate(self.episodes)})
            object.__setattr__(self, "_frame_rows", frame_rows)

    def sample(self, key: str) -> Sample:
        self._lookups()
        return DatasetIndex.sample(self, key)

    def episode(self, episode_id: str) -> Episode:
        self._lookups()
        return DatasetIndex.episode(self, episode_id)

    def frame(self, episode_id: str, index: int) -> Frame:
        self._lookups()
        return DatasetIndex.frame(self, episode_id, index)

    def int_column(self, table: str, name: str) -> np.ndarray:
        rows = self._table(table)
        if not len(rows):
            return np.zeros(0, dtype=np.int64)
        kind, arrays = rows.kind(name), rows.arrays(name)
        if kind in ("int", "bool"):
            return np.asarray(arrays["data"], dtype=np.int64)
        if kind == "ints":
            bounds, data = np.asarray(arrays["rows"]), np.asarray(arrays["data"], dtype=np.int64)
            widths = np.diff(bounds)
            if len(widths) and (widths == widths[0]).all():
                return data.reshape(len(widths), int(widths[0]))
            return DatasetIndex.int_column(self, table, name)  # ragged: numpy cannot shape it either
        raise TypeError(f"{table}.{name} holds {kind} values, not integers")

    def window_lengths(self) -> Counter[int]:
        rows = self._table("samples")
        if not len(rows):
            return Counter()
        bounds = np.asarray(rows.arrays("window")["rows"])
        lengths, counts = np.unique(np.diff(bounds), return_counts=True)
        return Counter(dict(zip(lengths.tolist(), counts.tolist(), strict=True)))

    def text_column(self, table: str, name: str) -> list[Any]:
        rows = self._table(table)
        kind, arrays = rows.kind(name), rows.arrays(name)
        if kind != "text":
            return DatasetIndex.text_column(self, table, name)
        return decode_column(kind, arrays, Path())

    def iter_text(self, table: str, name: str) -> Iterator[Any]:
        return self._table(table).values(name)

    def _table(self, table: str) -> LazyRows:
        rows = getattr(self, table)
        assert isinstance(rows, LazyRows), f"{table} of a stored index is read lazily"
        return rows


def read_lazy(directory: Path, meta: dict[str, Any], source: Path, base: Path,
              identities: tuple[EpisodeIdentity, ...] | None = None) -> LazyIndex:
    """The index stored in ``directory`` with lazy frames and samples (episodes are made at once:
    few); ``identities``: its episodes' identities, when stored with it."""
    parts = load_parts(directory, mmap=True)
    tables: dict[str, Any] = {}
    for table, cls in TABLES.items():
        rows = LazyRows(cls, meta["kinds"][table], parts[table], base, meta["counts"][table])
        tables[table] = tuple(rows) if table == "episodes" else rows
    return LazyIndex(source=source, **tables, **read_scalars(directory), stored_identities=identities,
                     origin=(directory, meta, source, base))
