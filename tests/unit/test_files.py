"""Crash safety, written once (janus_core.system.files): a file is replaced whole or not at all, a
folder is swapped in whole, a file's sha256 is read in blocks, and what a killed write left behind,
file or folder, is removed."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from janus_core.system.files import (
    HASH_BLOCK,
    atomic_directory,
    atomic_file,
    atomic_write_bytes,
    remove_partials,
    replace_directory,
    sha256_file,
)


def test_an_atomic_write_replaces_the_file_whole_and_a_failed_one_leaves_the_old_file_and_nothing_else(
        tmp_path: Path) -> None:
    target = tmp_path / "new" / "manifest.json"
    atomic_write_bytes(target, b"old")  # the folder is made
    with pytest.raises(RuntimeError, match="killed"), atomic_file(target) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed")
    assert target.read_bytes() == b"old" and sorted(target.parent.iterdir()) == [target]
    atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and sorted(target.parent.iterdir()) == [target]


def test_a_files_sha256_is_read_in_blocks_and_equals_that_of_its_bytes(tmp_path: Path) -> None:
    data = bytes(range(256)) * (HASH_BLOCK // 256) + b"tail"  # more than one block
    (tmp_path / "shard").write_bytes(data)
    assert sha256_file(tmp_path / "shard") == hashlib.sha256(data).hexdigest()


def test_partials_beside_a_file_and_under_a_folder_are_removed_a_folder_as_well_as_a_file(tmp_path: Path) -> None:
    """A precompute killed while storing its dataset index leaves a folder ``index/.<key>.<pid>.partial``;
    a rerun removes it as it removes a half-written file (it once failed with "Is a directory")."""
    record = tmp_path / "commits" / "000003.json"
    record.parent.mkdir()
    record.write_text("{}")
    mine, other = (record.with_name(f"{name}.123.{'0' * 32}.partial") for name in ("000003.json", "000004.json"))
    mine.write_bytes(b"half")
    other.write_bytes(b"half")
    remove_partials(record)
    assert sorted(p.name for p in record.parent.iterdir()) == ["000003.json", other.name]

    half_index = tmp_path / "index" / ".0123abcd.456.partial"
    (half_index / "tables").mkdir(parents=True)
    (half_index / "tables" / "frames.npz").write_bytes(b"half")
    kept = tmp_path / "index" / "0123abcd"
    kept.mkdir()
    remove_partials(tmp_path, under=True)
    assert not half_index.exists() and not other.exists() and kept.is_dir() and record.is_file()


def test_a_folder_is_swapped_in_whole_and_a_failed_one_is_removed(tmp_path: Path) -> None:
    target = tmp_path / "entry"
    with atomic_directory(target) as tmp:
        (tmp / "meta.json").write_text("1")
    assert [p.name for p in target.iterdir()] == ["meta.json"]
    with pytest.raises(OSError, match="full"), atomic_directory(target) as tmp:
        (tmp / "meta.json").write_text("2")
        raise OSError("disk full")
    assert (target / "meta.json").read_text() == "1" and sorted(p.name for p in tmp_path.iterdir()) == ["entry"]

    new, aside = tmp_path / "best.partial", tmp_path / "best.old"
    new.mkdir()
    (new / "best.json").write_text("3")
    replace_directory(new, target, aside=aside)
    assert (target / "best.json").read_text() == "3" and not new.exists() and not aside.exists()
