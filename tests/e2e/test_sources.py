"""Several dataset sources in one cache: ``precompute r2r=A d1=B`` keys every
sample with its source, the counts add up, and verify checks the cache against the same sources.

Real PNG datasets from our sample-data generator, the session's cache of both sources
(``source_caches``, made by the precompute entry point) and real ``janus-cache verify`` commands
(their CLI, run in this process). (How sources are named and combined: tests/unit/test_source_parsing.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from helpers.sources import STEPS, assert_one_line_error, cache_keys, tail, verify_in_process

from janus_cache.store import open_cache, read_manifest
from janus_cache.store.manifest import read_episodes

RESOLUTION = "pad224"


# ------------------------------------------------------------------------------------ caches


def test_two_sources_give_one_cache_whose_keys_carry_their_source(
    source_caches: Callable[[str, str], Path], sources: tuple[Path, Path], source_profile: Path
) -> None:
    a, b = sources
    cache = source_caches("zarr", "ab")  # precompute r2r=A d1=B

    keys = cache_keys(cache)
    assert len(keys) == len(set(keys)) == 3 * STEPS  # 2 + 1 episodes: the counts add up
    assert keys[:2 * STEPS] == [f"r2r/episode_{e:04d}/{s}" for e in range(2) for s in range(STEPS)]
    assert keys[2 * STEPS:] == [f"d1/episode_0000/{s}" for s in range(STEPS)]
    manifest = read_manifest(cache)
    assert manifest is not None
    assert manifest.dataset.sources == ("r2r", "d1")
    assert (manifest.dataset.n_episodes, manifest.dataset.n_frames, manifest.dataset.n_samples) == (3, 15, 15)
    assert manifest.counts["samples_written"] == 15
    reader = open_cache(cache, resolution=RESOLUTION, variant=manifest.window.name).reader
    assert [reader[row].meta.extra["source"] for row in (0, 2 * STEPS)] == ["r2r", "d1"]
    episodes = read_episodes(cache)
    assert episodes is not None
    assert [(e.episode_id, e.source, e.frames, e.samples) for e in episodes] == [
        ("r2r/episode_0000", "r2r", STEPS, STEPS), ("r2r/episode_0001", "r2r", STEPS, STEPS),
        ("d1/episode_0000", "d1", STEPS, STEPS)]

    # verify takes the same sources (as one argument, the way make passes DATA) and recomputes
    # samples of both sources live, by their prefixed keys.
    checked = verify_in_process(cache, source_profile, f"r2r={a} d1={b}", "--live", "2", "--seed", "1")
    assert checked.returncode == 0, tail(checked)
    # The sources named differently are other keys: the cache does not belong to that dataset.
    other = verify_in_process(cache, source_profile, f"r2r={a} vln={b}", "--live", "0")
    assert_one_line_error(other, "completeness", "d1/episode_0000")
