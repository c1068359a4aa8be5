"""Appending to a cache (DAgger rounds): precompute on a dataset that adds
episodes writes only the new rows, keeps the old shards as they are, and gives exactly the cache a
build from scratch on the union gives; a changed, removed or misplaced episode is refused in one
line naming it and its file, leaving the cache untouched.

Real PNG datasets, real ``janus-cache precompute`` commands (their CLI, run in this process; the
caches built from scratch are the session's shared ``source_caches``); source A (2 episodes, 10
frames and samples) fills 2 shards of 4 rows and half of a third, which the append must rewrite.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.profiles import file_digests
from helpers.sources import (
    ROWS_PER_SHARD,
    STEPS,
    assert_one_line_error,
    cache_keys,
    precompute_in_process,
    tail,
)

from janus_cache.store import FORMATS, read_manifest
from janus_cache.store.commit import read_record
from janus_cache.store.layout import CacheLayout, features_array, frames_array, wds_samples



@pytest.fixture(scope="module")
def base_caches(source_caches: Callable[[str, str], Path]) -> dict[str, Path]:
    """Per format, the cache of source A alone, named ``r2r`` (the session's: read-only, copy it to append)."""
    return {cache_format: source_caches(cache_format, "a") for cache_format in FORMATS}


def sample_array(cache: Path) -> str:
    manifest = read_manifest(cache)
    assert manifest is not None
    variant = manifest.window.name
    return wds_samples(variant, "pad224") if manifest.format == "wds" else features_array(variant, "pad224")


def full_shard_files(cache: Path, array: str, rows: int) -> dict[Path, tuple[int, str]]:
    """(mtime_ns, sha256) of the files of the shards of ``array`` that ``rows`` rows fill completely."""
    out = {}
    for shard in range(rows // ROWS_PER_SHARD):
        record = read_record(cache, array, shard)
        assert record is not None, f"{array}#{shard} is not committed"
        path = cache / record.file
        out[path] = (path.stat().st_mtime_ns, record.sha256)
    return out


@pytest.mark.parametrize("cache_format", FORMATS)
def test_an_appended_cache_equals_a_cache_built_from_scratch_on_the_union(
    cache_format: str, base_caches: dict[str, Path], source_caches: Callable[[str, str], Path],
    sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    a, b = sources
    appended = Path(shutil.copytree(base_caches[cache_format], tmp_path / "appended"))
    old_rows = 2 * STEPS
    untouched = {**full_shard_files(appended, frames_array("pad224"), old_rows),
                 **full_shard_files(appended, sample_array(appended), old_rows)}
    assert len(untouched) == 2 * (old_rows // ROWS_PER_SHARD)

    result = precompute_in_process(appended, source_profile, f"r2r={a}", f"d1={b}", cache_format=cache_format)
    assert result.returncode == 0, tail(result)
    assert f"appending 1 new episode ({STEPS} frames, {STEPS} samples) after the cache's 2" in result.stdout
    # The half-filled last shards (frames, samples) grew: said as growth, not as damage repaired.
    last = (2 * STEPS) // ROWS_PER_SHARD
    grown = [read_record(appended, array, last) for array in (frames_array("pad224"), sample_array(appended))]
    said = next(line for line in result.stdout.splitlines() if "partly filled" in line)
    assert re.match(r"  extended 2 partly filled shards and \d+ table files with the new rows: ", said), said
    assert all(record is not None and record.file in said for record in grown), said
    assert "repaired" not in result.stdout + result.stderr
    # The rate counts this run's work: the new samples and the rewritten partly filled shard's, not the cache's.
    computed = 3 * STEPS - (2 * STEPS) // ROWS_PER_SHARD * ROWS_PER_SHARD
    assert re.search(rf"^precompute done in [\d.]+ s: {3 * STEPS} samples, {computed} computed by this run "
                     r"\([\d.]+/s\), ", result.stdout, re.M), result.stdout

    scratch = source_caches(cache_format, "ab")  # the session's build from scratch of r2r=A d1=B

    # Every file is the same, byte for byte: frame and feature (or tar) shards, their zarr.json,
    # tables, commit records, the manifest and the episode table.
    assert file_digests(appended) == file_digests(scratch)
    assert cache_keys(appended) == cache_keys(scratch)
    assert cache_keys(appended)[old_rows:] == [f"d1/episode_0000/{s}" for s in range(STEPS)]
    manifest = read_manifest(appended)
    assert manifest is not None
    assert manifest.dataset.sources == ("r2r", "d1")
    assert (manifest.dataset.n_episodes, manifest.counts["samples"], manifest.counts["frames"]) == (3, 15, 15)
    # The old rows' full shards were not rewritten (the half-filled last one was).
    for path, (mtime, digest) in untouched.items():
        assert (path.stat().st_mtime_ns, file_digests(path.parent)[path.name]) == (mtime, digest), path


def edited(dataset: Path, target: Path) -> tuple[Path, Path]:
    """A copy of ``dataset`` with one description edited; the copy and the edited JSON file."""
    copy = Path(shutil.copytree(dataset, target))
    path = min((copy / "episode_0001").glob("step_0002_*.json"))
    texts = json.loads(path.read_text())
    texts["landmark_description"] = "A red door that was never there."
    path.write_text(json.dumps(texts))
    return copy, path


def test_a_changed_episode_is_refused_naming_it_and_its_file_and_the_cache_is_untouched(
    base_caches: dict[str, Path], sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    cache = Path(shutil.copytree(base_caches["zarr"], tmp_path / "cache"))
    before = file_digests(cache)
    changed, json_file = edited(sources[0], tmp_path / "A")
    result = precompute_in_process(cache, source_profile, f"r2r={changed}", f"d1={sources[1]}")
    assert_one_line_error(result, "episode r2r/episode_0001", "description_2d of sample r2r/episode_0001/2",
                          str(json_file))
    assert file_digests(cache) == before


def test_a_removed_episode_is_refused_naming_it(
    base_caches: dict[str, Path], sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    cache = Path(shutil.copytree(base_caches["zarr"], tmp_path / "cache"))
    before = file_digests(cache)
    smaller = Path(shutil.copytree(sources[0], tmp_path / "A"))
    shutil.rmtree(smaller / "episode_0000")
    result = precompute_in_process(cache, source_profile, f"r2r={smaller}", f"d1={sources[1]}")
    assert_one_line_error(result, "episode r2r/episode_0000: gone from the dataset",
                          f"restore {smaller / 'episode_0000'} or")
    assert file_digests(cache) == before


def test_a_new_episode_that_would_land_before_cached_ones_is_refused(
    base_caches: dict[str, Path], sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    """New episodes go after the cached ones, or the rows would differ from a build from scratch."""
    cache = Path(shutil.copytree(base_caches["zarr"], tmp_path / "cache"))
    before = file_digests(cache)
    grown = Path(shutil.copytree(sources[0], tmp_path / "A"))
    shutil.copytree(sources[1] / "episode_0000", grown / "episode_0000b")  # sorts between the two
    result = precompute_in_process(cache, source_profile, f"r2r={grown}")
    assert_one_line_error(result, "new episode r2r/episode_0000b comes before cached episode r2r/episode_0001",
                          "new source")
    assert file_digests(cache) == before
    assert len(cache_keys(cache)) == 2 * STEPS


def test_a_cache_of_one_unnamed_source_cannot_grow_by_a_second_source(
    sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    """A bare path keeps the dataset's keys; with a second source they would need a prefix."""
    cache = tmp_path / "cache"
    assert precompute_in_process(cache, source_profile, sources[0]).returncode == 0
    result = precompute_in_process(cache, source_profile, sources[0], f"d1={sources[1]}")
    assert_one_line_error(result, "needs named sources (NAME=PATH) from its first build", "--overwrite")
    assert CacheLayout(cache).episodes.is_file()
