"""A rank process dies with the launcher that started it (imported first: standard library only).

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

PR_SET_PDEATHSIG = 1
"""Linux prctl option: the signal the kernel sends this process when its parent ends."""

LAUNCHER_VARIABLE = "LOCAL_RANK"
"""Set by every launcher (torchrun, the DeepSpeed launcher) in the environment of the ranks it
starts, and by no shell: a process with it was started by a launcher, as its child."""


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process as soon as its parent ends (Linux; a no-op elsewhere).

    A parent that ended before the signal was armed never sends it: then this process is no
    longer the parent's child (it was re-parented) and kills itself at once, as the kernel would
    have. Only a parent that ended before this function started (interpreter start-up, a few tens
    of milliseconds) goes unnoticed.
    """
    if sys.platform != "linux":
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        print(f"warning: prctl(PR_SET_PDEATHSIG) failed ({os.strerror(ctypes.get_errno())}); this process may "
              "outlive its launcher", file=sys.stderr, flush=True)
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_launcher() -> None:
    """Under a launcher (torchrun), die with it; a plain process (a user's own ``janus-cache``,
    an interactive session) is left alone. Worker processes that a rank spawns inherit the
    launcher's variables and re-import this package, so they die with their rank."""
    if LAUNCHER_VARIABLE in os.environ:
        die_with_parent()
