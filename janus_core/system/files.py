"""Crash safety, written once for every writer of janus: a file replaced whole or not at all, a folder
moved into place whole, a file's sha256 read in blocks, what a killed write left behind removed, and
whether a folder can be written at all (asked before long work whose output goes there).

A kill can strike at any instant, so every file that is read back is written through
:func:`atomic_file`: a uniquely named temporary file in the same directory
(``<name>.<pid>.<hex>.partial``) is written, flushed and fsynced, renamed over the file (atomic on
POSIX), and the directory is fsynced so the rename itself survives a crash. A folder is filled under
a temporary name (``.<name>.<pid>.partial``) and swapped in by :func:`replace_directory`. Whatever a
killed write leaves ends in ``.partial``, file or folder, and :func:`remove_partials` deletes it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

PARTIAL_SUFFIX = ".partial"
"""The suffix of every temporary file or folder of an interrupted write."""

HASH_BLOCK = 1 << 22
"""Files are hashed in 4 MiB blocks: large enough to be IO-bound, small enough for many threads."""


def fsync_path(path: Path) -> None:
    """Flush ``path`` (a file or a directory) to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write whose bytes become ``path`` only when the block ends without an error:
    readers see the old file or the whole new one, never a part, and nothing is left on a failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}{PARTIAL_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as f:
        f.write(data)


def replace_directory(new: Path, target: Path, aside: Path | None = None) -> None:
    """Make the complete folder ``new`` the folder ``target``: what ``target`` held is renamed to
    ``aside`` (default ``.<name>.<pid>.old``) and removed after ``new`` took its place, so a reader
    sees one folder or the other and a crash between the renames leaves ``aside`` to restore."""
    new, target = Path(new), Path(target)
    aside = Path(aside) if aside is not None else target.with_name(f".{target.name}.{os.getpid()}.old")
    shutil.rmtree(aside, ignore_errors=True)
    if target.exists():
        os.replace(target, aside)
    os.replace(new, target)
    fsync_path(target.parent)
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """A fresh temporary folder to fill; when the block ends without an error it replaces ``target``
    (:func:`replace_directory`), else it is removed."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        replace_directory(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_partials(path: Path, under: bool = False) -> None:
    """Delete what interrupted writes left: the temporary files of writes of the file ``path``
    beside it, or with ``under`` every ``*.partial`` file or folder under the folder ``path`` (a
    precompute killed while storing its dataset index leaves a folder)."""
    path = Path(path)
    if under:
        leftovers = sorted(path.rglob(f"*{PARTIAL_SUFFIX}")) if path.is_dir() else []
    else:
        leftovers = list(path.parent.glob(f"{path.name}.*{PARTIAL_SUFFIX}")) if path.parent.is_dir() else []
    for leftover in leftovers:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def sha256_stream(stream: BinaryIO) -> tuple[int, str]:
    """``(byte count, sha256 hex)`` of what ``stream`` yields to its end, read in blocks of
    :data:`HASH_BLOCK` (a local file, or an object of a bucket streamed by one GET)."""
    digest = hashlib.sha256()
    size = 0
    while block := stream.read(HASH_BLOCK):
        digest.update(block)
        size += len(block)
    return size, digest.hexdigest()


def sha256_file(path: Path) -> str:
    """The sha256 (hex) of the file at ``path``, read in blocks of :data:`HASH_BLOCK`."""
    with open(path, "rb") as f:
        return sha256_stream(f)[1]


def write_problem(directory: Path) -> str | None:
    """Why no file can be written into ``directory``: the kernel's reason for a real write into it,
    or into the nearest folder above it that exists where it does not (a read-only folder or file
    system, a pseudo file system), or None when one can. Creates nothing (a refused command leaves
    no folder behind)."""
    directory = Path(directory)
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{directory} cannot be written ({existing} is not a folder)"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        return f"{directory} cannot be written ({err.strerror or err})"
    return None
