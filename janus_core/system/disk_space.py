"""A write that ran out of room (a full disk, a quota, a file-size limit), told apart from other
failures, so a checkpoint save or an export ends in one line with real byte counts instead of the
writer's traceback (precompute does the same for cache shards: ``janus_cache.job``)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Write failures that mean "no room": the filesystem is full, a quota or a file-size limit is hit."""

def format_bytes(n: float) -> str:
    """A byte count in the largest decimal unit that keeps it at least 1 (``412 B``, ``3.2 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    raise AssertionError("unreachable: TB is the last unit")


_PROBE_BYTES = 1 << 20


class NoRoom(ValueError):
    """A save or export ran out of disk space (one line: the path, bytes needed and free, the fix)."""


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem holding ``path`` (its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def bytes_under(path: Path) -> int:
    """Bytes of every file under ``path`` (0 when it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _probe(directory: Path) -> str | None:
    """The kernel's reason when 1 MiB more does not fit in ``directory`` (None when it does)."""
    probe = directory / ".room-probe"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(_PROBE_BYTES))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return err.strerror if err.errno in DISK_FULL_ERRNOS else None
    finally:
        probe.unlink(missing_ok=True)
    return None


def no_room_reason(err: BaseException, directory: Path) -> str | None:
    """The OS's reason (e.g. "No space left on device") when ``err``, raised while writing into
    ``directory``, means that there is no room; None for any other failure.

    torch's zip writer reports a full disk as a bare ``RuntimeError`` ("unexpected pos ...") and
    safetensors as its own error type with the OS message inside: the causes are searched, then
    the message, and for a RuntimeError without either a 1 MiB probe write asks the kernel.
    """
    seen: BaseException | None = err
    visited: set[int] = set()
    while seen is not None and id(seen) not in visited:
        visited.add(id(seen))
        if isinstance(seen, OSError) and seen.errno in DISK_FULL_ERRNOS:
            return seen.strerror
        for number in DISK_FULL_ERRNOS:
            if os.strerror(number) in str(seen):
                return os.strerror(number)
        seen = seen.__cause__ or seen.__context__
    if isinstance(err, RuntimeError) and Path(directory).is_dir():
        return _probe(Path(directory))
    return None


@contextmanager
def export_room(out: Path, needed_bytes: int, run: Path) -> Iterator[None]:
    """Writing an export of ``needed_bytes`` (its tensors) into ``out``: refused before the first
    byte when the free space cannot hold it (an earlier export in ``out`` would be overwritten file
    by file, and a write that failed halfway would leave neither: its room does not count), and a
    write that runs out of room anyway is :class:`NoRoom`, one line."""
    reason = None
    if free_bytes(out) < needed_bytes:
        reason = "not enough free space"
    else:
        try:
            yield
        except Exception as err:
            reason = no_room_reason(err, out if out.is_dir() else out.parent)
            if reason is None:
                raise
    if reason is not None:
        raise NoRoom(f"{out}: no room left writing the export ({reason}): the disk has "
                     f"{format_bytes(free_bytes(out))} free and the export needs {format_bytes(needed_bytes)}; "
                     f"free space, or write it elsewhere with janus-train export {run} --out DIR "
                     "(the checkpoints are unchanged)")


def free_space_problem(directory: Path, free_bytes: int, needed_bytes: float) -> str | None:
    """The sentence saying that ``directory`` is too small, or None when ``needed_bytes`` fit."""
    if needed_bytes <= free_bytes:
        return None
    return f"{directory} has {format_bytes(free_bytes)} free, the plan needs {format_bytes(needed_bytes)} more"


def disk_full_problem(out: Path, err: OSError, doing: str, planned_bytes: float | None = None) -> str:
    """The one line saying that writing the cache at ``out`` ran out of room while ``doing`` (e.g.
    ``writing frame shard 3``), with the real byte counts (free now, held by the cache so far,
    planned) and what to do next."""
    free = shutil.disk_usage(out).free if out.exists() else 0
    planned = f" of the {format_bytes(planned_bytes)} planned" if planned_bytes else ""
    doing = f"writing {err.filename}" if err.filename else doing
    return (f"{out}: no room left {doing} ({err.strerror or err}): the disk has {format_bytes(free)} free and the "
            f"cache holds {format_bytes(bytes_under(out))}{planned}; free space and run the same command again "
            "to resume (committed shards are kept)")
