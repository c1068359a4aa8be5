"""A rank process dies with the launcher that started it, a worker process with its rank
(imported first: the standard library and ``janus_core.system.processes`` only).

torchrun starts every rank in a session of its own, so a signal to the launcher's process group
(``kill -9 -PGID``, an OOM kill of the agent, a closed terminal) does not reach the ranks: they
would go on writing shards or checkpoints as orphans while a rerun writes the same ones, or wait
minutes for a dead rendezvous. ``pipelines/__init__.py`` therefore arms the kernel's parent-death
signal before any other import of the launch layer runs (torch, DeepSpeed and transformers take
seconds to import, during which a kill must already work). A launcher killed even earlier, while
its ranks start their interpreters, is noticed too under ``pipelines.launch``: it tells its ranks
its pid (:data:`LAUNCHER_PID_VARIABLE`), and a rank whose parent is no longer that pid once the
signal is armed ends at once.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from janus_core.system.processes import die_with_parent, exit_quietly_on_interrupt, start_worker

LAUNCHER_VARIABLE = "LOCAL_RANK"
"""Set by every launcher (torchrun, the DeepSpeed launcher) in the environment of the ranks it
starts, and by no shell: a process with it was started by a launcher, as its child."""

LAUNCHER_PID_VARIABLE = "JANUS_LAUNCHER_PID"
"""Set by ``pipelines.launch`` to its own pid for the ranks it starts (its direct children), which
consume it on import: without it a rank can only take whoever is its parent when it arms the
signal for its launcher, and a launcher killed before then would go unnoticed."""

if TYPE_CHECKING:
    from multiprocessing.pool import Pool

PARENT_VARIABLE = "JANUS_PARENT_PID"
"""Set by a process for the workers it spawns (:func:`spawn_pool`): its pid, which the workers
consume on import (their own children do not inherit it) to die with it from their first line."""


def die_with_launcher() -> None:
    """Under a launcher (torchrun), die with it; a plain process (a user's own ``janus-cache``,
    an interactive session) is left alone. A worker of :func:`spawn_pool` dies with its parent.
    Both end silently on a Ctrl-C, from their first line (their launcher or parent says why)."""
    parent = os.environ.pop(PARENT_VARIABLE, None)
    launcher = os.environ.pop(LAUNCHER_PID_VARIABLE, None)  # a rank's own children must not inherit it
    if parent is not None:
        start_worker(int(parent))
    elif LAUNCHER_VARIABLE in os.environ:
        die_with_parent(int(launcher) if launcher else None)
        exit_quietly_on_interrupt()


def spawn_pool(processes: int) -> "Pool":
    """A pool of ``processes`` spawned workers that die with this process: from their first line
    (they import this package first), and if started later (a pool replaces a dead worker) from
    their initializer."""
    from multiprocessing import get_context

    os.environ[PARENT_VARIABLE] = str(os.getpid())
    try:
        return get_context("spawn").Pool(processes, initializer=start_worker, initargs=(os.getpid(),))
    finally:
        del os.environ[PARENT_VARIABLE]
