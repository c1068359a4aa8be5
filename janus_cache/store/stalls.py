"""Reads that do not return: which cache file each read in flight waits on, and a deadline that ends
a wait on them in one line.

A network file system or an object store can stall a read without any error (an NFS server that
stops answering, a hung connection): not damage, nothing to repair, but a process blocked in it
would keep every other rank of a job waiting in a collective until its timeout (gloo's: 30 min).
The readers record each file read while it is in flight (:func:`reading`); :func:`read_deadline`
bounds how long the calling thread waits for the reads it starts and raises :class:`StalledRead`
naming the file the oldest of them waits on. The wait is interrupted by ``SIGALRM`` in the main
thread (where the zarr and tar reads are waited for; zarr's own I/O thread may stay blocked in the
kernel, the waiting thread does not), so it needs no co-operation from the read itself. Nothing else
in janus uses ``SIGALRM``. A tar read waits in the main thread itself: a read the kernel does not
let a signal interrupt (a hard NFS mount) is not ended there.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_in_flight: dict[int, tuple[str, float]] = {}
"""Reads in flight in this process: a number per read -> (file, start on the monotonic clock)."""
_numbers = itertools.count()
os.register_at_fork(after_in_child=_in_flight.clear)  # a forked loader worker waits on none of its parent's


class StalledRead(BaseException):
    """A read of a cache file did not return within the deadline; ``file`` is the one it waited on
    longest (empty when no read was in flight: the wait was elsewhere). One line, picklable.

    A ``BaseException`` (as ``KeyboardInterrupt``): it is raised inside whatever the read runs, and
    a reader's ``except Exception`` (zarr's, webdataset's, janus's own damage locating) would take it
    for damage or read the file again, this time with no deadline."""

    def __init__(self, file: str, seconds: float) -> None:
        self.file, self.seconds = file, seconds
        waited = f"a read of {file}" if file else "a sample's read"
        super().__init__(f"{waited} has not returned in {seconds:g} s: a stalled file system or object store "
                         "(not damage: the file is not rewritten)")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.file, self.seconds))


@contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Record a read of ``path`` as in flight for the block (any thread)."""
    number = next(_numbers)
    _in_flight[number] = (str(path), time.monotonic())
    try:
        yield
    finally:
        _in_flight.pop(number, None)


def oldest_read() -> str:
    """The file of the read in flight longest in this process ("" when none is)."""
    reads = list(_in_flight.values())
    return min(reads, key=lambda read: read[1])[0] if reads else ""


@contextmanager
def read_deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`StalledRead` in the block once it has run ``seconds`` (0: no deadline). Only in
    a process's main thread (where a signal handler runs); elsewhere the block runs unbounded."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_number: int, _frame: object) -> None:
        raise StalledRead(oldest_read(), seconds)

    previous = signal.signal(signal.SIGALRM, expired)
    outer, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:  # an outer timer (a test runner's timeout) keeps what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 1e-3), outer_interval)
