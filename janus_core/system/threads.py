"""Compute threads per process: sized from the cores the process is given, not the machine's.

torch sizes its intra-op pool by the machine's cores. A process that shares them (with the other
processes of its node, or with its own reader and writer threads that decompress and compress
shards beside the encoder) then runs more busy-waiting OpenMP threads than it has cores, and a
descheduled thread stalls every parallel region: a one-process precompute on 2 cores encoded
about 3x faster with one thread than with torch's two.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from janus_core.plural import plural

THREADS_ENV = "OMP_NUM_THREADS"
"""The variable a user sets to choose the threads themselves (torch and BLAS read it)."""

PIPELINE_THREADS = 1
"""Cores left to a process's pipeline threads (shard reading and writing beside the compute)."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, as torch's DataLoader counts them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_decode_workers(processes: int) -> int:
    """Decode worker processes per process: the cores shared by the ``processes`` processes on the
    node (decoding and encoding run one after the other, so each phase may use them all)."""
    return max(1, usable_cores() // max(1, processes))


@dataclass(frozen=True)
class ComputeThreads:
    """How many compute threads a process runs, and why (for the start-up line)."""

    threads: int
    reason: str


def compute_threads(cores: int, processes: int, reserved: int = PIPELINE_THREADS) -> int:
    """Threads of one of ``processes`` processes sharing ``cores``, leaving ``reserved`` cores of its
    share to its pipeline threads; at least one."""
    return max(1, cores // max(1, processes) - reserved)


def set_compute_threads(processes: int, reserved: int = PIPELINE_THREADS) -> ComputeThreads:
    """Size torch's intra-op pool for one of ``processes`` processes on this node (its
    LOCAL_WORLD_SIZE) unless the user set ``OMP_NUM_THREADS``, which torch already obeys."""
    import torch

    if os.environ.get(THREADS_ENV, "").strip():
        return ComputeThreads(torch.get_num_threads(), f"{THREADS_ENV}={os.environ[THREADS_ENV].strip()}")
    cores = usable_cores()
    threads = compute_threads(cores, processes, reserved)
    torch.set_num_threads(threads)
    return ComputeThreads(threads, f"{plural(cores, 'core')} for {plural(max(1, processes), 'process')} on this node, "
                                   f"{reserved} left per process to its shard reader and writer")
