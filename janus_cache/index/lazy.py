"""A stored index read lazily: how a process that owns a few shards reads a 612k-sample index.

:func:`read_lazy` gives a :class:`LazyIndex`, a :class:`~janus_cache.index.DatasetIndex` whose
``frames`` and ``samples`` are :class:`LazyRows`: a row object is made when it is asked for, from
the stored columns (memory-mapped). A frame's path is made only for the frames asked for (paths
are most of a materialised index's memory); the key lookups (``sample(key)``, ``frame(...)``) are
built on first use. Iterating every sample still makes every sample, one at a time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from janus_cache.index.columns import TABLES, decode_table, decode_column, load_parts, read_scalars
from janus_cache.index.model import DatasetIndex, Episode, Frame, Sample


class LazyRows(Sequence[Any]):
    """The rows of one stored table, each made on access (equal to the tuple of the same rows)."""

    def __init__(self, cls: type, kinds: dict[str, str], parts: dict[str, dict[str, np.ndarray]], base: Path,
                 n_rows: int) -> None:
        self._cls, self._kinds, self._parts, self._base, self._n = cls, kinds, parts, base, n_rows
        self._names = [f.name for f in dataclasses.fields(cls)]
        self._columns: dict[str, Callable[[int], Any]] = {}

    def _column(self, name: str) -> Callable[[int], Any]:
        if name not in self._columns:
            kind, arrays = self._kinds[name], self._parts.get(name, {})
            if kind == "path":  # strings decoded once, a Path made per row asked for
                table, codes, base = decode_table(arrays["utf8"], arrays["offsets"]), arrays["codes"], self._base

                def path(row: int) -> Path | None:
                    code = int(codes[row])
                    if code < 0:
                        return None
                    text = table[code]
                    return Path(text[1:]) if text.startswith("\0") else base / text

                self._columns[name] = path
            else:
                self._columns[name] = decode_column(kind, arrays, self._base).__getitem__
        return self._columns[name]

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


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class LazyIndex(DatasetIndex):
    """A :class:`DatasetIndex` over stored columns: rows and key lookups made on first use."""

    def __post_init__(self) -> None:
        pass  # the lookups of DatasetIndex are built by _lookups() when first asked

    def _lookups(self) -> None:
        try:
            self._samples_by_key  # noqa: B018 - set once
        except AttributeError:
            DatasetIndex.__post_init__(self)

    def sample(self, key: str) -> Sample:
        self._lookups()
        return DatasetIndex.sample(self, key)

    def episode(self, episode_id: str) -> Episode:
        self._lookups()
        return DatasetIndex.episode(self, episode_id)

    def frame(self, episode_id: str, index: int) -> Frame:
        self._lookups()
        return DatasetIndex.frame(self, episode_id, index)


def read_lazy(directory: Path, meta: dict[str, Any], source: Path, base: Path) -> LazyIndex:
    """The index stored in ``directory`` with lazy frames and samples (episodes are made at once: few)."""
    parts = load_parts(directory, mmap=True)
    tables: dict[str, Any] = {}
    for table, cls in TABLES.items():
        rows = LazyRows(cls, meta["kinds"][table], parts[table], base, meta["counts"][table])
        tables[table] = tuple(rows) if table == "episodes" else rows
    return LazyIndex(source=source, **tables, **read_scalars(directory))
