"""One writer per directory: an advisory OS lock on a file inside it that names its holder.

Precompute holds its cache's lock and training its run directory's for the whole run, so a second
launch into the same directory fails at once, naming the holder (host, pid, what it is, start).
The lock is ``flock(2)`` on ``DIRECTORY/.janus.lock``: the kernel drops it when the holder ends, however it
ends (SIGKILL included), so a lock file left by a killed run is simply taken over; what is written
into the file only serves the messages. Readers (verify, and training on each cache it reads) take
it shared: any number of readers at once, but none while a writer holds it, and no writer while a
reader does.

A holder that releases the lock normally deletes the file, so a finished cache or run directory
holds no lock file. Linux and macOS; on NFS, ``flock`` is emulated with POSIX locks by Linux.

The lock file is opened without following a symbolic link: a link in its place (to a user's file,
or dangling) is refused in one line, never written through. A writer watches its lock file while
it holds it (every :data:`WATCH_SECONDS`, a thread): one deleted under it (by a user who took it for
a leftover) is put back at once, so a second writer started later is refused as before; if another
writer took the lock in between, the holder's :meth:`DirectoryLock.check` raises :class:`LockLost`,
and the job stops in one line instead of writing beside it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

LOCK_NAME = ".janus.lock"
"""The lock file inside a locked directory (a cache, a run directory)."""

RECORD_BYTES = 512
"""Every holder record is written padded to this size at offset 0, so that readers writing their
records at once never leave a mix of a longer and a shorter one."""

HOLDER_WAIT_SECONDS = 1.0
"""How long a refused process waits for a holder that has just taken the lock to write its record."""


WATCH_SECONDS = 1.0
"""How often a writer checks that its lock file is still the one it locked (one ``stat``)."""


class LockError(RuntimeError):
    """The directory cannot be locked; a one-line reason for the user."""


class LockLost(LockError):
    """The lock file was deleted under its holder and another process took the lock since."""


class DirectoryBusy(LockError):
    """Another process holds the directory's lock; the message names it."""


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock: for messages only, the kernel keeps the lock itself."""

    host: str
    pid: int
    started: str
    """Start of the holding, UTC, ISO 8601 to the second."""
    mode: str
    """``writer`` (exclusive) or ``reader`` (shared)."""
    purpose: str = ""
    """What holds it, for a refused user (e.g. ``training run /runs/r1``); empty: not said."""

    @classmethod
    def me(cls, exclusive: bool, purpose: str = "") -> "Holder":
        started = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
        return cls(socket.gethostname(), os.getpid(), started, "writer" if exclusive else "reader", purpose)

    @classmethod
    def parse(cls, data: bytes) -> "Holder | None":
        try:
            fields = json.loads(data.decode())
            return cls(str(fields["host"]), int(fields["pid"]), str(fields["started"]), str(fields["mode"]),
                       str(fields.get("purpose", "")))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode().ljust(RECORD_BYTES - 1) + b"\n"

    def describe(self) -> str:
        purpose = f" for {self.purpose}" if self.purpose else ""
        return f"{self.mode} pid {self.pid} on host {self.host}{purpose}, started {self.started}"


def lock_path(directory: Path) -> Path:
    """The lock file of ``directory``."""
    return Path(directory) / LOCK_NAME


def _read_record(fd: int) -> Holder | None:
    return Holder.parse(os.pread(fd, RECORD_BYTES, 0))


def _same_file(fd: int, path: Path) -> bool:
    """``fd`` is still the file at ``path`` (a releasing holder may have deleted it meanwhile)."""
    try:
        on_disk = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (on_disk.st_dev, on_disk.st_ino)


_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


def symlink_problem(path: Path) -> str:
    """The one line for a lock file that is a symbolic link (opening it failed with ELOOP)."""
    target = os.readlink(path)
    dangling = "" if (path.parent / target).exists() else ", which does not exist"
    return (f"{path} is a symbolic link (to {target}{dangling}), not a lock file: janus never writes its lock "
            f"through a link (it would overwrite what the link names); remove the link (rm {path}) and run again")


def not_a_directory(directory: Path) -> str | None:
    """Why a writer cannot lock (or create) ``directory``: it exists and is not a directory (None
    when it can try)."""
    if directory.exists() and not directory.is_dir():
        return f"{directory} is not a directory"
    return None


def holder(directory: Path) -> Holder | None:
    """Who holds ``directory``'s lock now, as a writer (None: no writer; nothing is created or
    taken): how one process sees whether another's job in that directory still runs, on this host
    or, on a shared file system, another."""
    try:
        fd = os.open(lock_path(directory), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return DirectoryLock._wait_for_record(fd) or Holder("?", 0, "", "writer")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


class DirectoryLock:
    """A held lock on a directory; ``release()`` (or leaving the ``with`` block, or the end of the
    process) gives it up. Take one with :meth:`acquire`."""

    def __init__(self, directory: Path, fd: int | None, exclusive: bool, previous: Holder | None = None,
                 created: tuple[Path, ...] = ()) -> None:
        self.directory = directory
        self._fd = fd
        self.exclusive = exclusive
        self.previous = previous
        """For a writer: the record of an earlier writer that ended without releasing (killed)."""
        self._created = created
        self._purpose = ""
        self._lost: str | None = None
        self._guard = threading.Lock()  # the watch thread and release() both replace or close the fd
        self._stop = threading.Event()

    @classmethod
    def acquire(cls, directory: Path, exclusive: bool = True, purpose: str = "") -> "DirectoryLock":
        """Take ``directory``'s lock now or raise :class:`DirectoryBusy` naming its holder (and the
        holder's ``purpose``, which this process records for whoever it refuses).

        A writer (``exclusive``) creates ``directory`` if needed. A reader locks nothing where
        the lock file cannot be created (a missing directory, a read-only cache: whoever cannot
        write there cannot take the writer's lock either) and gets a lock that holds nothing.
        """
        directory = Path(directory)
        path = lock_path(directory)
        if exclusive and (problem := not_a_directory(directory)) is not None:
            raise LockError(problem)
        # Directories this writer creates are removed again if it leaves them empty (a refused
        # run leaves nothing behind).
        created = tuple(p for p in (directory, *directory.parents) if not p.exists()) if exclusive else ()
        for _ in range(100):
            if exclusive:
                try:
                    directory.mkdir(parents=True, exist_ok=True)
                except OSError as err:
                    raise LockError(f"cannot create {directory}: {err.strerror}") from None
            try:
                fd = os.open(path, _OPEN_FLAGS, 0o644)
            except FileNotFoundError:
                if exclusive:
                    continue  # removed by a writer that created it and has just released it
                return cls(directory, None, exclusive)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    raise LockError(symlink_problem(path)) from None
                if not exclusive and err.errno in (errno.ENOTDIR, errno.EACCES, errno.EROFS, errno.EPERM):
                    return cls(directory, None, exclusive)
                raise LockError(f"cannot open the lock file {path}: {err.strerror}") from None
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = cls._wait_for_record(fd)
                os.close(fd)
                what = "writer" if exclusive else "reader"
                if holder is None:
                    named = "a process that has not yet written its record"
                elif holder.mode == "reader":  # readers share one record: the latest one's
                    named = f"readers (the latest to start: {holder.describe()})"
                else:
                    named = holder.describe()
                raise DirectoryBusy(f"{directory} is in use by {named} (lock {path}); a {what} must wait until "
                                    "it ends") from None
            if _same_file(fd, path):
                break
            os.close(fd)  # deleted by a holder releasing it between our open and flock: lock the new file
        else:
            raise LockError(f"cannot lock {directory}: its lock file keeps being deleted")
        previous = _read_record(fd) if exclusive else None
        os.pwrite(fd, Holder.me(exclusive, purpose).encode(), 0)
        lock = cls(directory, fd, exclusive, previous, created)
        if exclusive:
            lock._purpose = purpose
            threading.Thread(target=lock._watch, name="janus-lock-watch", daemon=True).start()
        return lock

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_SECONDS):
            self.restore()

    def restore(self) -> None:
        """Put the lock file back if it was deleted (or replaced) under this writer: a new file at
        the path, locked and recorded, unless another process holds the file now there (then the
        lock is lost: :meth:`check` raises). The watch thread calls it."""
        path = lock_path(self.directory)
        with self._guard:
            if self._fd is None or self._lost is not None or _same_file(self._fd, path):
                return
            try:
                fd = os.open(path, _OPEN_FLAGS, 0o644)
            except OSError as err:
                self._lost = (f"the lock file {path} was deleted under this writer and cannot be made again "
                              f"({err.strerror}); a second writer could start: stop it and run this command again")
                return
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._wait_for_record(fd)
                os.close(fd)
                other = holder.describe() if holder is not None else "another process"
                self._lost = (f"the lock file {path} was deleted while this writer held {self.directory}, and "
                              f"{other} has taken the lock since; two writers must not write one directory, so "
                              "this one stops (its finished work is kept: run this command again once the other "
                              "has ended)")
                return
            os.pwrite(fd, Holder.me(True, self._purpose).encode(), 0)
            os.close(self._fd)
            self._fd = fd

    def check(self) -> None:
        """Raise :class:`LockLost` (one line) if another process took this writer's lock after its
        lock file was deleted; a cheap call for a job's loop."""
        if self._lost is not None:
            raise LockLost(self._lost)

    @staticmethod
    def _wait_for_record(fd: int) -> Holder | None:
        deadline = time.monotonic() + HOLDER_WAIT_SECONDS
        while (holder := _read_record(fd)) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return holder

    @property
    def held(self) -> bool:
        return self._fd is not None

    def takeover_note(self) -> str | None:
        """A sentence saying that a dead holder's lock was taken over, or None."""
        if self.previous is None:
            return None
        return (f"took over the lock of {self.directory} left by {self.previous.describe()}, "
                "which ended without releasing it")

    def release(self) -> None:
        """Give the lock up and delete the lock file (only while no one else holds it)."""
        self._stop.set()
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if not self.exclusive:
                # Readers share the file: only the last one may delete it, as a writer would.
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return
            if _same_file(fd, lock_path(self.directory)):
                os.unlink(lock_path(self.directory))
            for directory in self._created:  # deepest first; stops at the first one in use
                try:
                    directory.rmdir()
                except OSError:
                    break
        finally:
            os.close(fd)

    def __enter__(self) -> "DirectoryLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
