"""zarr v3 cache store, what only it does: stored feature dtypes, random access to frames, tables,
worker handles, commit files, refused writes, compression. The contract both formats share is
tests/unit/test_store_conformance.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from helpers.store_cases import (
    FRAMES_PER_SHARD,
    RESOLUTION,
    SAMPLES_PER_SHARD,
    VARIANT,
    assert_sample_equal,
    bits,
    make_content,
    prepare,
    write_cache,
)
from janus_cache.store import (
    CacheLayout,
    CacheWriter,
    StoreError,
    ZarrCacheReader,
    ZarrGroup,
    open_writer,
    shard_plan,
)
from janus_cache.store.layout import features_array, frames_array, table_column
from janus_core.text_column import TEXT_BLOCK_ROWS, NotText, TextColumn

FRAMES = frames_array(RESOLUTION)
FEATURES = features_array(VARIANT.name, RESOLUTION)


def shard_files(root: Path, array: str) -> list[Path]:
    return sorted(p for p in (root / array / "c").rglob("*") if p.is_file())


# -- shard plan ----------------------------------------------------------------------------------


def test_shard_plan_is_consecutive_rows_independent_of_anything_but_counts() -> None:
    assert shard_plan(10, 4) == [range(4), range(4, 8), range(8, 10)]
    assert shard_plan(8, 4) == [range(4), range(4, 8)]
    assert shard_plan(0, 4) == []
    with pytest.raises(ValueError, match="per_shard"):
        shard_plan(3, 0)


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("logical", "stored"), [("bfloat16", np.uint16), ("float32", np.float32)])
def test_features_are_stored_as_their_bits_with_the_logical_dtype_recorded(
    tmp_path: Path, logical: str, stored: type[np.generic]
) -> None:
    """bf16 is stored as its uint16 bits (zarr has no bf16), float32 as itself."""
    content = make_content(feature_dtype=logical)
    write_cache("zarr", tmp_path, content)
    array = zarr.open_array(tmp_path / FEATURES, mode="r")
    assert array.dtype == stored
    assert array.attrs["logical_dtype"] == logical
    expected = bits(content.features[RESOLUTION]).numpy().view(stored)
    assert np.array_equal(array[...], expected)


def test_frames_read_back_for_any_rows_in_any_order_with_repeats(tmp_path: Path) -> None:
    content = make_content()
    write_cache("zarr", tmp_path, content)
    reader = ZarrCacheReader(tmp_path, RESOLUTION, VARIANT.name)
    frames = content.frames[RESOLUTION]
    rows = [9, 0, 0, 13, 4]
    assert np.array_equal(reader.frames(RESOLUTION, rows), frames[rows])
    assert np.array_equal(reader.frames(RESOLUTION, range(3, 11)), frames[3:11])
    with pytest.raises(IndexError, match="out of range"):
        reader.frames(RESOLUTION, [len(frames)])


def test_tables_keep_text_exactly_including_unicode_and_empty_strings(tmp_path: Path) -> None:
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    texts = ["", "ü → 北", "", "a/b.c%2E"]
    writer.write_table("frames", {"key": ["f0", "f1", "f2", "f3"], "note": texts, "size": np.arange(4, dtype=np.int16)})
    table = ZarrGroup(tmp_path, read_only=True).read_table("frames")
    assert table["note"] == texts
    assert table["size"].dtype == np.int16 and table["size"].tolist() == [0, 1, 2, 3]
    assert ZarrGroup(tmp_path, read_only=True).table_row("frames", 1) == {"key": "f1", "note": "ü → 北", "size": 1}


def test_tables_with_no_text_bytes_or_no_rows_are_complete(tmp_path: Path) -> None:
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    writer.write_table("frames", {"key": ["f0", "f1"], "note": ["", ""]})
    writer.write_table("empty", {"key": [], "size": np.zeros(0, dtype=np.int32)})
    reader = ZarrGroup(tmp_path, read_only=True)
    assert reader.read_table("frames")["note"] == ["", ""]
    assert reader.table_rows("empty") == 0 and reader.read_table("empty")["key"] == []
    assert all(check.ok for check in writer.audit())


def test_reader_works_in_dataloader_worker_processes(tmp_path: Path) -> None:
    content = make_content()
    write_cache("zarr", tmp_path, content)
    reader = ZarrCacheReader(tmp_path, RESOLUTION, VARIANT.name)
    reader[0]  # open arrays in the parent first: workers must not reuse its handles blindly
    loader = torch.utils.data.DataLoader(reader, batch_size=None, num_workers=2)
    samples = sorted(loader, key=lambda s: s.row)
    assert [s.row for s in samples] == list(range(content.n_samples))
    for sample in samples:
        assert_sample_equal(sample, content, sample.row)


# -- commit semantics ----------------------------------------------------------------------------


def test_each_shard_write_produces_exactly_one_file_and_a_record(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("zarr", tmp_path, content)
    assert shard_files(tmp_path, FRAMES) == []
    assert isinstance(writer, CacheWriter)
    record = writer.write_frame_shard(RESOLUTION, 1, content.frames[RESOLUTION][4:8])
    assert shard_files(tmp_path, FRAMES) == [tmp_path / record.file]
    assert (record.array, record.shard, record.start, record.stop) == (FRAMES, 1, 4, 8)
    assert CacheLayout(tmp_path).commit_record(FRAMES, 1).is_file()
    assert writer.committed_frame_shards(RESOLUTION) == {1}


def test_a_shard_whose_record_is_missing_counts_as_uncommitted(tmp_path: Path) -> None:
    content = make_content()
    writer = write_cache("zarr", tmp_path, content)
    CacheLayout(tmp_path).commit_record(FRAMES, 2).unlink()
    n_shards = len(writer.frame_shard_plan(RESOLUTION))
    assert writer.committed_frame_shards(RESOLUTION) == set(range(n_shards)) - {2}
    problems = [c for c in writer.audit() if not c.ok]
    assert len(problems) == 1 and problems[0].shard == 2 and "not committed" in problems[0].problem


def test_an_all_black_shard_is_still_one_committed_file(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("zarr", tmp_path, content)
    writer.write_frame_shard(RESOLUTION, 0, np.zeros((FRAMES_PER_SHARD, 28, 28, 3), dtype=np.uint8))
    assert writer.committed_frame_shards(RESOLUTION) == {0}
    assert not ZarrCacheReader(tmp_path, RESOLUTION, VARIANT.name).frames(RESOLUTION, range(4)).any()


def test_wrong_shard_shapes_and_dtypes_are_refused_naming_the_shard(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("zarr", tmp_path, content)
    with pytest.raises(StoreError, match=rf"{FRAMES}#0 .*rows 0:4.*needs uint8 \(4, 28, 28, 3\)"):
        writer.write_frame_shard(RESOLUTION, 0, content.frames[RESOLUTION][:3])
    with pytest.raises(StoreError, match="no shard 99"):
        writer.write_frame_shard(RESOLUTION, 99, content.frames[RESOLUTION][:4])
    with pytest.raises(TypeError, match="torch.float32.*bfloat16"):
        writer.write_samples_shard(RESOLUTION, 0, torch.zeros(SAMPLES_PER_SHARD, 4, 8))
    assert writer.committed_frame_shards(RESOLUTION) == set()


def test_bad_tables_are_refused_with_the_reason(tmp_path: Path) -> None:
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    with pytest.raises(StoreError, match="key 'a' more than once"):
        writer.write_table("frames", {"key": ["a", "b", "a"]})
    with pytest.raises(StoreError, match="differ in length"):
        writer.write_table("frames", {"key": ["a", "b"], "size": np.zeros(3)})
    with pytest.raises(StoreError, match="window_rows"):
        writer.write_table("samples", {"key": ["a"]})
    writer.write_table("frames", {"key": ["a", "b"]})
    writer.write_table("samples", {"key": ["s"], "window_rows": np.array([[0, 2]], dtype=np.int32)})
    with pytest.raises(StoreError, match=r"sample row 0 .*window rows \[0, 2\] outside the 2 frame rows"):
        writer.prepare_samples(RESOLUTION, (4, 8), "bfloat16", 2)


def test_a_table_is_kept_when_equal_redone_when_interrupted_and_refused_when_different(tmp_path: Path) -> None:
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    columns = {"key": ["f0", "f1"], "size": np.array([3, 4], dtype=np.int32)}
    writer.write_table("frames", columns)
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    writer.write_table("frames", columns)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files

    with pytest.raises(StoreError, match="already holds a different 'frames' table"):
        writer.write_table("frames", {"key": ["f0", "f1"], "size": np.array([3, 5], dtype=np.int32)})

    CacheLayout(tmp_path).commit_record(table_column("frames", "size"), 0).unlink()  # as if killed before this commit
    writer.write_table("frames", {"key": ["g0"], "size": np.array([7], dtype=np.int32)})
    assert ZarrGroup(tmp_path, read_only=True).table_row("frames", 0) == {"key": "g0", "size": 7}


def test_a_text_column_longer_than_one_encoding_block_is_kept_exactly_and_compared_row_by_row(
    tmp_path: Path
) -> None:
    """Text is encoded and compared a block of rows at a time (a 612k-row table is never decoded
    whole): the rows around block edges, multi-byte text included, keep their bytes, rewriting the
    same table changes no file, and one row changed in the last block is a different table."""
    rows = TEXT_BLOCK_ROWS + 1000
    writer = open_writer("zarr", tmp_path, VARIANT.name)
    notes = [f"北{i}" if i % 3 else "" for i in range(rows)]
    columns = {"key": [f"f{i}" for i in range(rows)], "note": notes}
    writer.write_table("frames", columns)
    table = ZarrGroup(tmp_path, read_only=True).read_table("frames")
    assert table["note"] == notes and table["key"][TEXT_BLOCK_ROWS - 1: TEXT_BLOCK_ROWS + 1] == [
        f"f{TEXT_BLOCK_ROWS - 1}", f"f{TEXT_BLOCK_ROWS}"]
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    writer.write_table("frames", columns)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == files

    last = max(i for i, note in enumerate(notes) if note)
    same_length = list(notes)
    same_length[last] = "南" + notes[last][1:]  # the same byte count, other bytes
    with pytest.raises(StoreError, match="already holds a different 'frames' table"):
        writer.write_table("frames", {"key": columns["key"], "note": same_length})


def test_text_given_as_strings_as_its_stored_form_or_as_repeated_codes_is_the_same_table(tmp_path: Path) -> None:
    """``write_table`` takes text as any sequence of str, as a :class:`TextColumn` (what precompute
    passes: no list of 612k strings), or as codes into the distinct texts (instructions shared by
    many rows, their payload made only when written): the same files, the same rows, across
    encoding blocks; a duplicate key or a row that is not text is refused in either form."""
    rows = TEXT_BLOCK_ROWS + 500
    keys = [f"f{i}" for i in range(rows)]
    shared = ["go to the 北 kitchen", "", "stop"]
    notes = [shared[i % 3] for i in range(rows)]
    tables = {
        "strings": {"key": keys, "note": notes},
        "stored": {"key": TextColumn.encode(keys), "note": TextColumn.encode(notes)},
        "repeated": {"key": TextColumn.encode(iter(keys)), "note": TextColumn.encode_repeated(iter(notes))},
    }
    files = {}
    for name, columns in tables.items():
        open_writer("zarr", tmp_path / name, VARIANT.name).write_table("frames", columns)
        files[name] = {p.relative_to(tmp_path / name): p.read_bytes()
                       for p in (tmp_path / name / "tables").rglob("*") if p.is_file()}
        table = ZarrGroup(tmp_path / name, read_only=True).read_table("frames")
        assert table["key"] == keys and table["note"] == notes
    assert files["strings"] == files["stored"] == files["repeated"]
    assert list(tables["repeated"]["note"]) == notes and tables["repeated"]["note"] == tables["stored"]["note"]
    assert tables["repeated"]["note"].payload.tobytes() == "".join(notes).encode()

    # rewriting the same table from either form changes nothing; one edited row is a different table
    writer = open_writer("zarr", tmp_path / "strings", VARIANT.name)
    writer.write_table("frames", tables["repeated"])
    edited = [*notes[:-1], "stop" if notes[-1] != "stop" else ""]
    with pytest.raises(StoreError, match="already holds a different 'frames' table"):
        writer.write_table("frames", {"key": keys, "note": TextColumn.encode_repeated(edited)})

    with pytest.raises(StoreError, match="key 'b' more than once"):
        writer.write_table("samples", {"key": TextColumn.encode_repeated(["a", "b", "b"]),
                                       "window_rows": np.zeros((3, 2), dtype=np.int32)})
    with pytest.raises(StoreError, match=r"text column frames.note row 2 is int 7, not str"):
        writer.write_table("frames", {"key": ["a", "b", "c"], "note": ["x", "y", 7]})
    for encode in (TextColumn.encode, TextColumn.encode_repeated):
        with pytest.raises(NotText, match=r"row 2 is int 7, not str"):
            encode(["x", "y", 7])


# -- layout over time ----------------------------------------------------------------------------


def test_preparing_an_existing_array_with_another_layout_is_refused(tmp_path: Path) -> None:
    content = make_content()
    writer = prepare("zarr", tmp_path, content)
    with pytest.raises(StoreError, match=rf"array '{FRAMES}' .*exists with .*shards \(4, 28, 28, 3\).*asked for .*shards \(8, 28, 28, 3\)"):
        writer.prepare_frames(RESOLUTION, (28, 28), 8)
    prepare("zarr", tmp_path, content)  # the same layout again is a resume: accepted


# -- compression ---------------------------------------------------------------------------------


def test_frames_and_features_are_stored_compressed(tmp_path: Path) -> None:
    content = make_content(resolutions={"pad112": (112, 112)}, feature_shape=(64, 64))
    write_cache("zarr", tmp_path, content, "pad112")
    frames_bytes = sum(p.stat().st_size for p in shard_files(tmp_path, frames_array("pad112")))
    feature_bytes = sum(p.stat().st_size for p in shard_files(tmp_path, features_array(VARIANT.name, "pad112")))
    assert frames_bytes < content.frames["pad112"].nbytes / 3
    assert feature_bytes < content.features["pad112"].numel() * 2 * 0.9
