"""Several dataset sources in one cache (issue 14 item 3): ``precompute r2r=A rxr=B`` keys every
sample with its source, the counts add up, and verify checks the cache against the same sources.

Real PNG datasets from our sample-data generator, real precompute and verify processes
(``janus-cache``, one process each). The helpers here are shared by ``test_append.py`` and
``test_staleness.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from janus_cache.index import DatasetError, build_index, build_sources_index, parse_sources
from janus_cache.store import open_cache, read_manifest
from janus_cache.store.manifest import read_episodes
from helpers.sources import ROWS_PER_SHARD, RUN_TIMEOUT, STEPS, assert_one_line_error, cache_keys, error_lines, janus_cache, precompute, source_profile, sources, tail, verify  # noqa: F401

RESOLUTION = "pad224"


# ------------------------------------------------------------------------------------ helpers


# ------------------------------------------------------------------------------------ parsing


def test_a_source_is_name_equals_path_or_a_bare_path_named_after_its_folder(tmp_path: Path) -> None:
    (tmp_path / "r2r").mkdir()
    (tmp_path / "ann.jsonl").write_text("")
    # One value may hold several sources separated by spaces (make's DATA="...").
    named, bare, annotation = parse_sources([f"rxr={tmp_path / 'r2r'}", f"{tmp_path / 'r2r'} {tmp_path / 'ann.jsonl'}"])
    assert (named.name, named.path, named.named) == ("rxr", tmp_path / "r2r", True)
    assert (bare.name, bare.path, bare.named) == ("r2r", tmp_path / "r2r", False)
    assert (annotation.name, annotation.named) == (tmp_path.name, False)  # the folder of its images
    with pytest.raises(DatasetError, match="have the same name 'r2r'"):
        parse_sources([str(tmp_path / "r2r"), f"r2r={tmp_path}"])
    with pytest.raises(DatasetError, match="the name before '=' must be a word"):
        parse_sources([f"bad/name={tmp_path}"])


def test_the_combined_index_prefixes_keys_and_offsets_rows_per_source(sources: tuple[Path, Path]) -> None:
    a, b = sources
    combined = build_sources_index([f"r2r={a}", f"rxr={b}"])
    alone_a, alone_b = build_index(a), build_index(b)
    assert [s.key for s in combined.samples] == (
        [f"r2r/{s.key}" for s in alone_a.samples] + [f"rxr/{s.key}" for s in alone_b.samples])
    assert [s.source for s in combined.samples] == ["r2r"] * len(alone_a.samples) + ["rxr"] * len(alone_b.samples)
    assert [e.episode_id for e in combined.episodes] == ["r2r/episode_0000", "r2r/episode_0001", "rxr/episode_0000"]
    for sample in combined.samples:  # every window points at frames of its own source and episode
        assert {f.episode_id for f in combined.window(sample)} == {sample.episode_id}
    first_b = combined.samples[len(alone_a.samples)]
    assert [f.path for f in combined.window(first_b)] == [f.path for f in alone_b.window(alone_b.samples[0])]
    # A single bare path keeps the dataset's own keys (and still records its source name).
    single = build_sources_index(a)
    assert [s.key for s in single.samples] == [s.key for s in alone_a.samples]
    assert {s.source for s in single.samples} == {"A"}


# ------------------------------------------------------------------------------------ caches


def test_two_sources_give_one_cache_whose_keys_carry_their_source(
    sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    a, b = sources
    cache = tmp_path / "cache"
    result = precompute(cache, source_profile, f"r2r={a}", f"rxr={b}")
    assert result.returncode == 0, tail(result)

    keys = cache_keys(cache)
    assert len(keys) == len(set(keys)) == 3 * STEPS  # 2 + 1 episodes: the counts add up
    assert keys[:2 * STEPS] == [f"r2r/episode_{e:04d}/{s}" for e in range(2) for s in range(STEPS)]
    assert keys[2 * STEPS:] == [f"rxr/episode_0000/{s}" for s in range(STEPS)]
    manifest = read_manifest(cache)
    assert manifest is not None
    assert manifest.dataset.sources == ("r2r", "rxr")
    assert (manifest.dataset.n_episodes, manifest.dataset.n_frames, manifest.dataset.n_samples) == (3, 15, 15)
    assert manifest.counts["samples_written"] == 15
    reader = open_cache(cache, resolution=RESOLUTION, variant=manifest.window.name).reader
    assert [reader[row].meta.extra["source"] for row in (0, 2 * STEPS)] == ["r2r", "rxr"]
    episodes = read_episodes(cache)
    assert episodes is not None
    assert [(e.episode_id, e.source, e.frames, e.samples) for e in episodes] == [
        ("r2r/episode_0000", "r2r", STEPS, STEPS), ("r2r/episode_0001", "r2r", STEPS, STEPS),
        ("rxr/episode_0000", "rxr", STEPS, STEPS)]

    # verify takes the same sources (as one argument, the way make passes DATA) and recomputes
    # samples of both sources live, by their prefixed keys.
    checked = verify(cache, source_profile, f"r2r={a} rxr={b}", "--live", "2", "--seed", "1")
    assert checked.returncode == 0, tail(checked)
    # The sources named differently are other keys: the cache does not belong to that dataset.
    other = verify(cache, source_profile, f"r2r={a} vln={b}", "--live", "0")
    assert_one_line_error(other, "completeness", "rxr/episode_0000")
