"""Precompute's rules, in process: the free-space check and its message, a frame that vanished
after indexing, and the tables and windows a rank builds from the stored index. (Precompute runs:
tests/e2e/test_precompute.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers.precompute_runs import RESOLUTION
from janus_cache.job import PrecomputeError, check_free_space
from janus_cache.work_units import (
    check_windows,
    compute_frame_shard,
    frame_table,
    sample_table,
    usable_samples,
)
from janus_core.index import build_index, build_sources_index, store_sources_index
from janus_core.resolution import Resolution
from janus_core.system.disk_space import free_space_problem


def test_a_frame_that_vanished_after_indexing_is_a_failure_of_its_samples(dataset_copy: Path) -> None:
    """Decoding records the missing file per frame; the samples whose windows need it are dropped."""
    index = build_index(dataset_copy)
    vanished = index.frames[5]
    vanished.path.unlink()
    resolution = Resolution.parse(RESOLUTION)
    frames, failures = compute_frame_shard(index.frames, range(4, 8), resolution, (224, 224), None)
    assert list(failures) == [5] and "no such file" in failures[5] and vanished.relpath in failures[5]
    assert frames.shape == (4, 224, 224, 3)
    rows, dropped = usable_samples(index, failures)
    kept = [index.samples[row] for row in rows]
    assert dropped and all(vanished.relpath in reason for reason in dropped.values())
    assert {s.key for s in kept} | set(dropped) == {s.key for s in index.samples}
    assert all(5 not in s.window_rows for s in kept)


def tables_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


def test_the_tables_and_windows_of_a_stored_index_are_those_of_the_index_in_memory(
    dataset_copy: Path, tmp_path: Path
) -> None:
    """Every precompute rank reads the stored index lazily and builds tables from its columns: the
    same tables, usable rows and dropped samples as the index in memory (two named sources, a
    frame that failed to decode)."""
    sources = [f"a={dataset_copy}", f"b={dataset_copy}"]
    fresh = build_sources_index(sources)
    lazy = store_sources_index(sources, tmp_path / "store").load()
    check_windows(lazy)
    assert tables_equal(frame_table(lazy), frame_table(fresh))
    failed = [3, len(fresh.frames) - 2]
    rows, dropped = usable_samples(lazy, failed)
    fresh_rows, fresh_dropped = usable_samples(fresh, failed)
    assert (rows == fresh_rows).all() and dropped == fresh_dropped and len(dropped) > 1
    assert list(dropped)[0].startswith("a/") and list(dropped)[-1].startswith("b/")
    assert tables_equal(sample_table(lazy, rows), sample_table(fresh, fresh_rows))
    assert tables_equal(sample_table(lazy), sample_table(fresh))


def test_the_free_space_check_refuses_unless_forced(tmp_path: Path) -> None:
    """A plan that needs more than the filesystem's free space is refused, naming --force."""
    needed = shutil.disk_usage(tmp_path).free + 10**15
    with pytest.raises(PrecomputeError, match="--force"):
        check_free_space(tmp_path, needed, force=False)
    assert "starting anyway (--force)" in (check_free_space(tmp_path, needed, force=True) or "")
    assert check_free_space(tmp_path, 1, force=False) is None


def test_the_free_space_refusal_names_both_sizes_in_readable_units(tmp_path: Path) -> None:
    """Sizes are shown in the unit that fits them: a small shortfall never reads "0.0 GB"."""
    assert free_space_problem(tmp_path, free_bytes=3_200_000_000, needed_bytes=5_100_000_000) == (
        f"{tmp_path} has 3.2 GB free, the plan needs 5.1 GB more")
    assert free_space_problem(tmp_path, free_bytes=250_000, needed_bytes=4_000_000) == (
        f"{tmp_path} has 250.0 KB free, the plan needs 4.0 MB more")
    assert free_space_problem(tmp_path, free_bytes=4_000_000, needed_bytes=4_000_000) is None
    with pytest.raises(PrecomputeError, match=r" free, the plan needs [0-9.]+ [KMGT]?B more; free space or pass"):
        check_free_space(tmp_path, shutil.disk_usage(tmp_path).free + 10**15, force=False)
