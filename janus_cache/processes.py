"""Worker processes that die with the process that started them (standard library only).

A process killed with SIGKILL cannot stop its children; the kernel's parent-death signal can.
Every worker process janus starts (decode workers, the index worker, image-check workers) arms it,
so no worker outlives its parent to go on writing into a cache that a rerun is writing too.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
"""Linux prctl option: the signal the kernel sends this process when its parent ends."""

def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel SIGKILL this process as soon as its parent ends (Linux; a no-op elsewhere).

    A parent that ended before the signal was armed never sends it: then this process is no
    longer the parent's child (it was re-parented) and kills itself at once, as the kernel would
    have. ``parent`` is the pid of the process that started this one, when the caller knows it
    (a pool's initializer arguments): then even a parent that ended before this call is noticed.
    Otherwise the parent is whoever it is now, and only one that ended before this function
    started (interpreter start-up, a few tens of milliseconds) goes unnoticed.
    """
    if sys.platform != "linux":
        return
    expected = os.getppid() if parent is None else parent
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        print(f"warning: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(ctypes.get_errno())}); this process may "
              "outlive its launcher", file=sys.stderr, flush=True)
        return
    if os.getppid() != expected:
        os.kill(os.getpid(), signal.SIGKILL)
