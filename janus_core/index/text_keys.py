"""A column of texts (keys, paths, hashes) as one numpy array, matched by sorting.

At 612k rows a ``dict`` or ``set`` of keys costs ~100 MB of Python objects per column, and
comparing a cache with its dataset needs several (sample and frame keys of both sides, paths,
hashes). :class:`TextKeys` holds a column as fixed-width UTF-8 bytes (``numpy`` ``S`` dtype, a
few dozen bytes a row, no object per row) and finds rows of one column in another with a sort and
a binary search, so ``verify --data`` compares a 612k-sample cache in a few hundred MB.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from janus_core.index.columns import (
    TEXT_ERRORS,  # lone surrogates (odd file names) round-trip, as the index stores them
)


class TextKeys:
    """Texts of one column, row by row, as fixed-width UTF-8 bytes (texts never hold NUL)."""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    @classmethod
    def of(cls, texts: Iterable[str | None]) -> TextKeys:
        """The column of ``texts`` (``None`` is the empty text), encoded as it is iterated."""
        encoded = [b"" if t is None else t.encode("utf-8", TEXT_ERRORS) for t in texts]
        return cls(np.array(encoded, dtype=bytes) if encoded else np.zeros(0, dtype="S1"))

    def __len__(self) -> int:
        return len(self.values)

    def text(self, row: int) -> str:
        return bytes(self.values[row]).decode("utf-8", TEXT_ERRORS)

    def texts(self, rows: Iterable[int]) -> list[str]:
        return [self.text(int(r)) for r in rows]

    def rows_in(self, other: TextKeys) -> np.ndarray:
        """For each row of this column, the first row of ``other`` holding the same text, -1 where
        ``other`` has none (int64, one per row)."""
        if not len(other) or not len(self):
            return np.full(len(self), -1, dtype=np.int64)
        order = np.argsort(other.values, kind="stable")
        ordered = other.values[order]
        at = np.minimum(np.searchsorted(ordered, self.values), len(ordered) - 1)
        return np.where(ordered[at] == self.values, order[at], -1).astype(np.int64)

    def repeated(self) -> list[str]:
        """The texts that appear in more than one row, sorted."""
        if len(self) < 2:
            return []
        ordered = np.sort(self.values)
        same = ordered[1:] == ordered[:-1]
        return sorted({bytes(v).decode("utf-8", TEXT_ERRORS) for v in ordered[1:][same]})


def differs(a: TextKeys, a_rows: Sequence[int] | np.ndarray, b: TextKeys, b_rows: Sequence[int] | np.ndarray
            ) -> np.ndarray:
    """Per pair, whether row ``a_rows[i]`` of ``a`` and row ``b_rows[i]`` of ``b`` hold different texts."""
    return a.values[np.asarray(a_rows, dtype=np.int64)] != b.values[np.asarray(b_rows, dtype=np.int64)]
