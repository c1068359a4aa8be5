"""One encoder of text columns: a cache's tables and a stored dataset index keep
text in the same form, made by :mod:`janus_core.text_column`.

The stored bytes are pinned: caches and index stores written before the encoder was shared must
read back unchanged, so the expected arrays below are written out by hand, not computed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from janus_core.index.columns import TEXT_ERRORS, decode_column, distinct_text_column, encode_column
from janus_core.text_column import NotText, TextColumn

ODD = "\ud800"
"""A lone surrogate: what a file name that is not UTF-8 decodes to."""
ODD_BYTES = b"\xed\xa0\x80"


def test_an_index_text_field_is_codes_into_its_distinct_texts_stored_as_a_text_column() -> None:
    values = ["a", None, "北", "a", ODD, None]
    kind, arrays = encode_column(values, Path("."))
    assert kind == "text"
    assert arrays["codes"].dtype == np.int32 and arrays["codes"].tolist() == [0, -1, 1, 0, 2, -1]
    assert arrays["offsets"].dtype == np.int64 and arrays["offsets"].tolist() == [0, 1, 4, 7]
    assert arrays["utf8"].dtype == np.uint8 and arrays["utf8"].tobytes() == b"a" + "北".encode() + ODD_BYTES
    assert decode_column(kind, arrays, Path(".")) == values

    codes, distinct = TextColumn.dictionary(values, TEXT_ERRORS)
    assert np.array_equal(codes, arrays["codes"]) and codes.dtype == np.int32
    assert np.array_equal(distinct.payload, arrays["utf8"]) and np.array_equal(distinct.offsets, arrays["offsets"])
    assert list(distinct) == ["a", "北", ODD] and distinct.text(2) == ODD


def test_a_tuple_of_texts_field_keeps_row_bounds_beside_the_codes() -> None:
    kind, arrays = encode_column([("x", "y"), (), ("y",)], Path("."))
    assert kind == "texts"
    assert list(arrays) == ["codes", "rows", "utf8", "offsets"]
    assert arrays["codes"].tolist() == [0, 1, 1] and arrays["rows"].tolist() == [0, 2, 2, 3]
    assert arrays["utf8"].tobytes() == b"xy" and arrays["offsets"].tolist() == [0, 1, 2]


def test_a_column_of_distinct_paths_is_its_own_table_each_row_its_own_code() -> None:
    paths = ["a/1.png", "b/北.png", ODD + ".png"]
    arrays = distinct_text_column(paths)
    assert list(arrays) == ["codes", "utf8", "offsets"]
    assert arrays["codes"].dtype == np.int32 and arrays["codes"].tolist() == [0, 1, 2]
    assert arrays["utf8"].tobytes() == "".join(paths).encode("utf-8", "surrogatepass")
    assert arrays["offsets"].tolist() == [0, 7, 16, 23]
    assert decode_column("text", arrays, Path(".")) == paths


def test_an_empty_column_is_one_offset_and_no_bytes() -> None:
    for column in (TextColumn.encode([]), TextColumn.encode_repeated([]), TextColumn.dictionary([])[1]):
        assert column.offsets.tolist() == [0] and column.payload.dtype == np.uint8 and column.nbytes == 0
        assert len(column) == 0 and list(column) == []
    assert TextColumn.dictionary([None])[0].tolist() == [-1]


def test_a_cache_table_is_strict_utf8_while_the_index_round_trips_odd_file_names() -> None:
    with pytest.raises(UnicodeEncodeError):
        TextColumn.encode(["ok", ODD])
    with pytest.raises(UnicodeEncodeError):
        TextColumn.encode_repeated(["ok", ODD])
    lossless = TextColumn.encode(["ok", ODD], TEXT_ERRORS)
    assert list(lossless) == ["ok", ODD] and lossless.text(1) == ODD
    stored = TextColumn(lossless.offsets, lossless.payload)  # read back as a cache's table would be
    with pytest.raises(UnicodeDecodeError):
        list(stored)


def test_held_and_repeated_forms_give_the_same_rows_and_bytes() -> None:
    rows = ["go", "", "北", "go", "stop"]
    held, repeated = TextColumn.encode(rows), TextColumn.encode_repeated(iter(rows))
    assert held == repeated and list(repeated) == rows and [repeated.text(i) for i in range(5)] == rows
    assert repeated.payload.tobytes() == held.payload.tobytes() == "".join(rows).encode()
    assert repeated.first_duplicate() == held.first_duplicate() == "go"
    for encode in (TextColumn.encode, TextColumn.encode_repeated, TextColumn.dictionary):
        with pytest.raises(NotText, match=r"row 1 is int 7, not str"):
            encode(["x", 7])
