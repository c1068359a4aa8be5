"""Changes to a dataset's files that only some readers can notice (an old mtime, same-size bytes)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from janus_core.index.files import IMAGE_SUFFIXES


def age(*paths: Path, seconds: float = 3600) -> None:
    """Give files (every file under a folder) an mtime ``seconds`` ago: a file modified moments
    before indexing is re-read next time (its mtime may not move on a quick second change)."""
    then = time.time_ns() - int(seconds * 1e9)
    for path in paths:
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            os.utime(p, ns=(then, then))


def images(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)


def scramble_keeping_size_and_mtime(paths: list[Path]) -> None:
    """Overwrite each file with other bytes of the same length (not an image any more), then give
    it back its mtime: a reader of the file would notice, a ``stat`` cannot."""
    for path in paths:
        st = path.stat()
        path.write_bytes(bytes((i * 7 + 3) % 256 for i in range(st.st_size)))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
