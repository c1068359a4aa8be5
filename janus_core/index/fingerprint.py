"""The cheap fingerprint of a dataset's source files: relative path, byte size and ``mtime_ns``.

A stored index (:mod:`janus_core.index.cached`) is reused only while every file it was built
from has the same size and modification time, and no file came or went. Getting the fingerprint
costs one ``stat`` per file (no file is opened), so an unchanged dataset is neither re-read nor
re-hashed.

* Episode folders: every entry of every non-hidden folder of the root (frame images, frame JSONs,
  ``milestones_result.json`` and any other file: a superset of what the builder reads, so a
  change it would see is never missed), plus one entry per folder (a new, empty episode folder
  is a change too, it is reported by the builder).
* Annotation files: the annotation file itself, then every image path its records name (a
  missing image is recorded as missing: its later arrival is a change).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from janus_core.index.files import link_loop

MISSING = -1
"""Size and mtime of a file that does not exist (a referenced image that is missing)."""
FOLDER = -2
"""Size and mtime of a folder entry (episode folders: the folder itself)."""
RACY = -3
"""mtime recorded for a file modified too recently to trust its mtime (``SourceFiles.without_racy``)."""
LOOP = -4
"""Size and mtime of a symbolic-link loop at the root (``x -> x``, ``episode -> ..``)."""


@dataclass(frozen=True)
class SourceFiles:
    """Per source file, in sorted path order: path relative to the dataset base, size, mtime_ns."""

    relpaths: tuple[str, ...]
    sizes: np.ndarray
    mtimes: np.ndarray

    @classmethod
    def of(cls, entries: Iterable[tuple[str, int, int]]) -> "SourceFiles":
        rows = sorted(entries)
        return cls(
            tuple(r[0] for r in rows),
            np.array([r[1] for r in rows], dtype=np.int64),
            np.array([r[2] for r in rows], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.relpaths)

    def digest(self) -> str:
        """sha256 over every (path, size, mtime): equal digests mean an unchanged dataset."""
        h = hashlib.sha256()
        h.update("\0".join(self.relpaths).encode("utf-8", "surrogateescape"))
        h.update(np.ascontiguousarray(self.sizes, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.mtimes, dtype="<i8").tobytes())
        return h.hexdigest()

    def without_racy(self, since_ns: int) -> "SourceFiles":
        """These files with the mtime of each one modified at or after ``since_ns`` replaced by
        :data:`RACY` (never equal to a real scan's, so the next fingerprint differs)."""
        racy = self.mtimes >= since_ns
        if not racy.any():
            return self
        return SourceFiles(self.relpaths, self.sizes, np.where(racy, RACY, self.mtimes))

    def stats(self) -> dict[str, tuple[int, int]]:
        """relpath -> (size, mtime_ns)."""
        return dict(zip(self.relpaths, zip(self.sizes.tolist(), self.mtimes.tolist(), strict=True), strict=True))


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:  # gone, or unreadable (a symbolic-link loop): the builder reports which
        return MISSING, MISSING
    return st.st_size, st.st_mtime_ns


def _folder_entries(root: Path, name: str) -> tuple[list[str], np.ndarray]:
    """A folder's entries: relative paths, and their [size, mtime_ns] as one int64 array (at 1.26M
    files a tuple of Python ints per file is ~200 MB, and what it leaves behind stays in RSS)."""
    paths, stats = [f"{name}/"], [FOLDER, FOLDER]
    try:
        with os.scandir(root / name) as entries:
            for entry in entries:
                try:
                    st = entry.stat()  # follows links, as the builder's reads do
                except OSError:
                    paths.append(f"{name}/{entry.name}")
                    stats += (MISSING, MISSING)
                    continue
                if entry.is_dir():
                    continue  # the builder reads no sub-folders
                paths.append(f"{name}/{entry.name}")
                stats += (st.st_size, st.st_mtime_ns)
    except OSError:
        pass  # an unreadable folder: the builder reports it; its folder entry alone is the fingerprint
    return paths, np.array(stats, dtype=np.int64).reshape(-1, 2)


def scan_episode_folders(root: Path, threads: int) -> SourceFiles:
    """The fingerprint of an episode-folder root (folders listed in threads: ``stat`` releases the GIL)."""
    names, loops = [], []
    with os.scandir(root) as entries:
        for e in entries:
            if e.name.startswith("."):
                continue
            if e.is_symlink() and link_loop(e.path) is not None:
                loops.append((e.name, LOOP, LOOP))  # reported by the builder, never entered
            elif e.is_dir():
                names.append(e.name)
    names.sort()
    if threads <= 1 or len(names) < 2:
        parts = [_folder_entries(root, name) for name in names]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            parts = list(pool.map(lambda name: _folder_entries(root, name), names, chunksize=64))
    relpaths = [name for name, _, _ in loops] + [path for paths, _ in parts for path in paths]
    stats = np.concatenate([np.array([[size, mtime] for _, size, mtime in loops], dtype=np.int64).reshape(-1, 2),
                            *(folder for _, folder in parts)])
    del parts
    order = np.argsort(np.array(relpaths, dtype=object), kind="stable")  # SourceFiles.of's order
    return SourceFiles(tuple(relpaths[i] for i in order.tolist()), stats[order, 0].copy(), stats[order, 1].copy())


def annotation_entry(file: Path) -> tuple[str, int, int]:
    """The annotation file's own entry (its name; its images are relative to the image root)."""
    size, mtime = _stat(str(file))
    return (f"@annotation/{file.name}", size, mtime)


def scan_files(base: Path, relpaths: Sequence[str], threads: int, extra: Sequence[tuple[str, int, int]] = ()
               ) -> SourceFiles:
    """The fingerprint of named files under ``base`` (a missing one is recorded as missing)."""
    paths = [str(base / rel) for rel in relpaths]
    if threads <= 1 or len(paths) < 256:
        stats = [_stat(p) for p in paths]
    else:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            stats = list(pool.map(_stat, paths, chunksize=512))
    return SourceFiles.of([*extra, *((rel, s, m) for rel, (s, m) in zip(relpaths, stats, strict=True))])
