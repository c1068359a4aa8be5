"""The directory lock itself, in process: a reader locks nothing where it cannot write, a writer
cannot lock a file, and releasing deletes the lock file and the directories left empty. (Locks
between real processes: tests/e2e/test_lock.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from janus_core.system.lock import LOCK_NAME, DirectoryLock, LockError


def test_releasing_deletes_the_lock_file_and_the_directories_left_empty(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "cache"
    with DirectoryLock.acquire(directory) as lock:
        assert directory.is_dir() and (directory / LOCK_NAME).is_file()
        assert lock.takeover_note() is None
    assert not (tmp_path / "new").exists(), "a writer that wrote nothing left the directories it created"
    directory.mkdir(parents=True)
    with DirectoryLock.acquire(directory) as again:
        assert again.takeover_note() is None, "a released lock is not a dead holder's"
        (directory / "shard").write_bytes(b"written")
    assert [p.name for p in directory.iterdir()] == ["shard"]


def test_a_reader_locks_nothing_where_it_cannot_write(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with DirectoryLock.acquire(missing, exclusive=False) as lock:
        assert not lock.held
    assert not missing.exists(), "a reader created the directory it was asked to read"


def test_a_writer_cannot_lock_a_file(tmp_path: Path) -> None:
    file = tmp_path / "run"
    file.write_text("not a directory")
    with pytest.raises(LockError, match=f"{re.escape(str(file))} is not a directory"):
        DirectoryLock.acquire(file)
