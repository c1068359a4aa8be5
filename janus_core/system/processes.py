"""Worker processes that die with the process that started them (standard library only).

A process killed with SIGKILL cannot stop its children; the kernel's parent-death signal can.
Every worker process janus starts (decode workers, the index worker, image-check workers) arms it,
so no worker outlives its parent to go on writing into a cache that a rerun is writing too.

A Ctrl-C reaches the terminal's whole process group, workers included: a worker ends on it
silently (its parent, interrupted too, says why in one line) from its start-up's first janus line
(``pipelines/__init__.py`` for the decode workers, a pool's initializer for the others).
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


def exit_quietly_on_interrupt(at_once: bool = True) -> None:
    """End this process silently on SIGINT (exit code 130), instead of a KeyboardInterrupt traceback
    from wherever it is (an import, a decode): for a process that another one started (a rank, a
    worker), which says why in one line. A Ctrl-C reaches the terminal's whole process group, and a
    launcher passes it on to its ranks. ``at_once``: without any clean-up (a rank, whose clean-up
    may wait for its peers); else as ``SystemExit`` (a worker: its pool's semaphores are released).
    A training rank replaces it with its stop-signal handler (``janus_train.loop.preemption``) once
    it runs, before it writes anything."""
    def handle(number: int, _frame: object) -> None:
        if at_once:
            os._exit(128 + number)
        raise SystemExit(128 + number)

    if at_once:
        # A process ended at once leaves its pools' semaphores to multiprocessing's resource tracker
        # (started later, with this process's -W options), which removes them; its warning about
        # them would otherwise be the last line on the console.
        sys.warnoptions.append("ignore:resource_tracker:UserWarning")
    signal.signal(signal.SIGINT, handle)


def start_worker(parent: int | None = None) -> None:
    """A worker process's first call (a pool's initializer): it dies with its parent
    (:func:`die_with_parent`) and ends silently on a Ctrl-C (:func:`exit_quietly_on_interrupt`),
    which its parent, interrupted too, tells the user about."""
    die_with_parent(parent)
    exit_quietly_on_interrupt(at_once=False)


_forking: list[int] = []
"""The pid of the process forking now (set just before each fork; a forked child reads its copy)."""


def forks_die_with_this_process() -> None:
    """Have every process forked from this one from now on (torch DataLoader workers, a fork pool)
    die with it, as :func:`die_with_parent` would have them do (Linux; idempotent).

    The parent-death signal is not inherited across fork, and a forked child may ignore SIGTERM
    (it inherits its parent's handlers) or be blocked where its own watchdog never looks (a read
    that never returns): without the signal such a child outlives a killed parent, holding the
    parent's pipes open, as long as it is blocked. The hook runs in the child right after the fork,
    before any of its own code; a child that forks in turn passes it on, each to die with its own
    parent. (The kernel sends the signal when the parent's forking thread ends: fork from the thread
    that lives as long as the process, as DataLoaders iterated in the main thread do.)
    """
    if sys.platform != "linux" or _forking:
        return
    _forking.append(os.getpid())

    def before() -> None:
        _forking[0] = os.getpid()

    os.register_at_fork(before=before, after_in_child=lambda: die_with_parent(_forking[0]))
