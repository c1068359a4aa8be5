"""The dataset index of a multi-process job, built once in a worker process and shared on disk.

Rank 0 of a precompute calls :func:`store_index_in_worker`: a spawned process indexes the sources
through the cache's index store (reusing what is stored while the files keep their sizes and
mtimes), stores the combined index as columns and exits; every rank, rank 0 included, then reads
those columns lazily (:meth:`~janus_core.index.StoredSources.load`), making only the rows it
uses. Building a 612k-sample index takes gigabytes for a few minutes; doing it in a process that
exits keeps every rank's own memory to what it reads (``benchmarks/bench_scale.py`` measures it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from janus_core.index import StoredIndex, StoredSources, store_sources_index
from janus_core.system.processes import start_worker


def _show(stored: StoredIndex) -> None:
    print(stored.describe(), flush=True)


def _store(sources: Sequence[str | Path], cache_dir: Path, options: dict[str, Any]) -> StoredSources:
    return store_sources_index(sources, cache_dir, progress=True, on_stored=_show, **options)


def store_index_in_worker(sources: Sequence[str | Path], cache_dir: Path, **options: Any) -> StoredSources:
    """:func:`~janus_core.index.store_sources_index` run in a spawned process that dies with this
    one; its output goes to this process's terminal, its exceptions are raised here. (Not a
    ``multiprocessing`` pool: its daemonic workers may not start the image-check workers.)"""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn"), initializer=start_worker,
                             initargs=(os.getpid(),)) as pool:
        return pool.submit(_store, tuple(sources), cache_dir, options).result()
