"""A text column in the form a cache stores it: the rows' UTF-8 bytes end to end, and row offsets.

Tables are written from this form, not from lists of ``str``: at 612k rows a column of keys,
paths or hashes is 50-70 MB of Python strings, and a table of several of them beside their
encoded copies took the process writing it past a gigabyte. Two ways to make one, both taking
any iterable of strings (a generator decoding a stored index row by row makes no list at all):

- :meth:`TextColumn.encode` for texts that differ row to row (keys, paths, hashes): the payload
  is encoded a block of rows at a time and held;
- :meth:`TextColumn.encode_repeated` for texts that many rows share (instructions, descriptions,
  episode ids): the distinct texts and a code per row are held, and the payload (hundreds of MB
  at 612k rows) is made only when asked for, a block at a time or whole for the one column being
  written.

The same form stores the texts of a stored dataset index (``janus_core.index.columns``): there a
text field is a dictionary, a code per row (``None`` is -1) into the column of its distinct texts
(:meth:`TextColumn.dictionary`), encoded with ``errors="surrogatepass"`` so that file names that
are not UTF-8 round-trip. A cache's own tables are strict UTF-8: a reader calls other bytes damage.
This module is the one encoder of both, and a leaf (numpy only): the index uses it without
loading the store's readers and writers (zarr).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice

import numpy as np

TEXT_BLOCK_ROWS = 65536
"""Rows of a text column encoded (or compared) at a time."""


class NotText(ValueError):
    """A row of a would-be text column is not a ``str`` (``row``: its number, ``value``: it)."""

    def __init__(self, row: int, value: object) -> None:
        super().__init__(f"row {row} is {type(value).__name__} {value!r}, not str")
        self.row, self.value = row, value


STORE_ERRORS = "strict"
"""How a cache's tables encode text: UTF-8 proper (other bytes read back are damage)."""


def _checked(strings: Iterable[object]) -> Iterator[str]:
    for row, value in enumerate(strings):
        if not isinstance(value, str):
            raise NotText(row, value)
        yield value


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _codes(codes: np.ndarray, n_distinct: int) -> np.ndarray:
    """int32 codes when the table is small enough (half the bytes on disk and in memory)."""
    return codes.astype(np.int32) if n_distinct < 2**31 else codes


class TextColumn:
    """Rows of text in their stored form: ``offsets`` (int64 ``[rows + 1]``) and ``payload`` (uint8,
    every row's encoded bytes in row order; row ``i`` is ``payload[offsets[i]:offsets[i + 1]]``).
    ``errors``: the codec's error handler the bytes were written with, and are read back with."""

    def __init__(self, offsets: np.ndarray | None = None, payload: np.ndarray | None = None, *,
                 codes: np.ndarray | None = None, distinct: tuple[bytes, ...] = (),
                 errors: str = STORE_ERRORS) -> None:
        if (offsets is None or payload is None) == (codes is None):
            raise ValueError("a text column is either its offsets and payload, or codes into distinct texts")
        self._offsets = offsets
        self._payload = payload
        self._codes = codes
        self._distinct = distinct
        self._lengths = np.fromiter(map(len, distinct), dtype=np.int64, count=len(distinct))
        self.errors = errors

    @classmethod
    def encode(cls, strings: Iterable[str], errors: str = STORE_ERRORS) -> TextColumn:
        """The column of ``strings`` (:class:`NotText` names a row that is not a ``str``), its
        payload encoded a block of :data:`TEXT_BLOCK_ROWS` rows at a time and held."""
        values = (value.encode("utf-8", errors) for value in _checked(strings))
        lengths: list[np.ndarray] = []
        blocks: list[bytes] = []
        while block := list(islice(values, TEXT_BLOCK_ROWS)):
            lengths.append(np.fromiter(map(len, block), dtype=np.int64, count=len(block)))
            blocks.append(b"".join(block))
        offsets = _offsets(np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64))
        return cls(offsets, np.frombuffer(b"".join(blocks), dtype=np.uint8), errors=errors)

    @classmethod
    def encode_repeated(cls, strings: Iterable[str], errors: str = STORE_ERRORS) -> TextColumn:
        """The column of ``strings`` held as its distinct texts and a code per row: for texts many
        rows share, whose payload is made only when asked for."""
        table: dict[str, int] = {}
        codes = np.fromiter((table.setdefault(value, len(table)) for value in _checked(strings)), dtype=np.int64)
        return cls(codes=_codes(codes, len(table)), distinct=tuple(t.encode("utf-8", errors) for t in table),
                   errors=errors)

    @classmethod
    def dictionary(cls, values: Iterable[str | None], errors: str = STORE_ERRORS) -> tuple[np.ndarray, TextColumn]:
        """``values`` dictionary-encoded: a code per row (int32 when the table allows; ``None`` is
        -1) and the column of the distinct texts in order of first appearance (what a stored
        index keeps of a text field)."""
        table: dict[str, int] = {}

        def code(row: int, value: object) -> int:
            if value is None:
                return -1
            if not isinstance(value, str):
                raise NotText(row, value)
            return table.setdefault(value, len(table))

        codes = np.fromiter((code(row, value) for row, value in enumerate(values)), dtype=np.int64)
        return _codes(codes, len(table)), cls.encode(table, errors)

    # ------------------------------------------------------------------------------------ rows

    def __len__(self) -> int:
        return len(self._codes) if self._codes is not None else len(self._offsets) - 1

    @property
    def offsets(self) -> np.ndarray:
        """int64 ``[rows + 1]``: row ``i`` is ``payload[offsets[i]:offsets[i + 1]]`` (made now for a
        column of repeated texts: a few ms, 8 bytes a row not held)."""
        if self._offsets is not None:
            return self._offsets
        return _offsets(self._lengths[self._codes])

    @property
    def nbytes(self) -> int:
        """Bytes of the payload."""
        if self._offsets is not None:
            return int(self._offsets[-1])
        return int(self._lengths[self._codes].sum())

    @property
    def payload(self) -> np.ndarray:
        """The whole payload (made now for a column of repeated texts: keep it only while needed)."""
        if self._payload is not None:
            return self._payload
        payload = np.empty(self.nbytes, dtype=np.uint8)
        for start, stop, block in self.blocks():
            payload[start:stop] = block
        return payload

    def blocks(self, rows: int | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
        """The payload of the first ``rows`` rows (default: all) a block of :data:`TEXT_BLOCK_ROWS`
        rows at a time: (first byte, end byte, bytes)."""
        offsets, rows = self.offsets, len(self) if rows is None else rows
        for first in range(0, rows, TEXT_BLOCK_ROWS):
            last = min(first + TEXT_BLOCK_ROWS, rows)
            start, stop = int(offsets[first]), int(offsets[last])
            if self._payload is not None:
                yield start, stop, self._payload[start:stop]
            else:
                assert self._codes is not None
                joined = b"".join(map(self._distinct.__getitem__, self._codes[first:last].tolist()))
                yield start, stop, np.frombuffer(joined, dtype=np.uint8)

    def __iter__(self) -> Iterator[str]:
        if self._codes is not None:
            texts = [value.decode("utf-8", self.errors) for value in self._distinct]
            yield from map(texts.__getitem__, self._codes.tolist())
            return
        offsets, payload = self.offsets, self.payload
        for first in range(0, len(self), TEXT_BLOCK_ROWS):
            bounds = offsets[first:min(first + TEXT_BLOCK_ROWS, len(self)) + 1].tolist()
            data, start = payload[bounds[0]:bounds[-1]].tobytes(), bounds[0]
            yield from (data[a - start:b - start].decode("utf-8", self.errors) for a, b in zip(bounds, bounds[1:]))

    def text(self, row: int) -> str:
        """Row ``row`` alone (decodes only its bytes: for a column read a row at a time)."""
        if self._codes is not None:
            return self._distinct[int(self._codes[row])].decode("utf-8", self.errors)
        assert self._offsets is not None and self._payload is not None
        start, stop = int(self._offsets[row]), int(self._offsets[row + 1])
        return self._payload[start:stop].tobytes().decode("utf-8", self.errors)

    # ----------------------------------------------------------------------------- comparisons

    def first_duplicate(self) -> str | None:
        """A row value that occurs more than once, or None when every row differs."""
        if self._codes is not None:
            counts = np.bincount(self._codes, minlength=len(self._distinct))
            repeated = np.flatnonzero(counts > 1)
            return self._distinct[int(repeated[0])].decode("utf-8", self.errors) if len(repeated) else None
        seen: set[bytes] = set()
        data, bounds = self.payload.tobytes(), self.offsets.tolist()
        for a, b in zip(bounds, bounds[1:]):
            value = data[a:b]
            if value in seen:
                return value.decode("utf-8", self.errors)
            seen.add(value)
        return None

    def __eq__(self, other: object) -> bool:
        """The same rows (whichever form each column is held in)."""
        if not isinstance(other, TextColumn):
            return NotImplemented
        return np.array_equal(self.offsets, other.offsets) and all(
            np.array_equal(mine, theirs) for (_, _, mine), (_, _, theirs) in zip(self.blocks(), other.blocks()))

    __hash__ = None  # type: ignore[assignment]
