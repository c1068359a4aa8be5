"""How a run's DataLoader starts its worker processes.

Forked, as torch does by default (a worker starts in milliseconds with everything its rank
imported), unless this process has read a cache in a bucket: obstore's client runtime does not
survive a fork (a forked worker's first request would hang), so then the workers come from a fork
server, a fresh interpreter started once per process that has imported what a worker runs
(:data:`PRELOADED`) and forks each worker from there. Their prefetching (``prefetch_factor``
batches per worker, torch's default 2) is what hides a bucket's latency behind the training step.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from janus_cache.store.remote.client import forks_can_read_buckets
from janus_core.bases import BASES

PRELOADED = ("torch", "transformers", "janus_train.data.samples", "janus_train.data.mixture", "janus_train.data.rope",
             *(base.modeling_module for base in BASES.values()))
"""What the fork server imports once, so each worker it forks starts at once: with the modeling
modules of the bases, whose M-RoPE the collate computes (imported in each worker, every epoch's
workers waited seconds for it)."""


def worker_start(num_workers: int) -> dict[str, Any]:
    """The DataLoader keyword arguments that choose how its ``num_workers`` workers start."""
    if num_workers == 0 or forks_can_read_buckets():
        return {}
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED))
    return {"multiprocessing_context": context}
