"""A rank process dies with the launcher that started it, a worker process with its rank
(imported first: standard library only).

torchrun starts every rank in a session of its own, so a signal to the launcher's process group
(``kill -9 -PGID``, an OOM kill of the agent, a closed terminal) does not reach the ranks: they
would go on writing shards or checkpoints as orphans while a rerun writes the same ones, or wait
minutes for a dead rendezvous. ``pipelines/__init__.py`` therefore arms the kernel's parent-death
signal before any other import of the launch layer runs (torch, DeepSpeed and transformers take
seconds to import, during which a kill must already work).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

PR_SET_PDEATHSIG = 1
"""Linux prctl option: the signal the kernel sends this process when its parent ends."""

LAUNCHER_VARIABLE = "LOCAL_RANK"
"""Set by every launcher (torchrun, the DeepSpeed launcher) in the environment of the ranks it
starts, and by no shell: a process with it was started by a launcher, as its child."""


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


PARENT_VARIABLE = "JANUS_PARENT_PID"
"""Set by a process for the workers it spawns (:func:`spawn_pool`): its pid, which the workers
consume on import (their own children do not inherit it) to die with it from their first line."""


def die_with_launcher() -> None:
    """Under a launcher (torchrun), die with it; a plain process (a user's own ``janus-cache``,
    an interactive session) is left alone. A worker of :func:`spawn_pool` dies with its parent."""
    parent = os.environ.pop(PARENT_VARIABLE, None)
    if parent is not None:
        die_with_parent(int(parent))
    elif LAUNCHER_VARIABLE in os.environ:
        die_with_parent()


def spawn_pool(processes: int) -> "Pool":
    """A pool of ``processes`` spawned workers that die with this process: from their first line
    (they import this package first), and if started later (a pool replaces a dead worker) from
    their initializer."""
    from multiprocessing import get_context

    os.environ[PARENT_VARIABLE] = str(os.getpid())
    try:
        return get_context("spawn").Pool(processes, initializer=die_with_parent, initargs=(os.getpid(),))
    finally:
        del os.environ[PARENT_VARIABLE]
