"""Several dataset sources in one cache: ``precompute r2r=A d1=B`` keys every
sample with its source, the counts add up, and verify checks the cache against the same sources;
an annotation file among them may keep its images elsewhere (``--image-root NAME=DIR``), and
``janus-cache info`` names a cache's sources in order (what an append lists first).

Real PNG datasets from our sample-data generator, the session's cache of both sources
(``source_caches``, made by the precompute entry point) and real ``janus-cache verify`` commands
(their CLI, run in this process). (How sources are named and combined: tests/unit/test_source_parsing.py.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import json
import shutil

from helpers.sources import (
    STEPS,
    assert_one_line_error,
    cache_keys,
    janus_cache,
    precompute_in_process,
    tail,
    verify_in_process,
)

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


def test_info_names_the_caches_sources_in_order(source_caches: Callable[[str, str], Path]) -> None:
    shown = janus_cache("info", source_caches("zarr", "ab"))
    assert shown.returncode == 0, tail(shown)
    assert "  sources (in cache order): r2r, d1" in shown.stdout.splitlines(), shown.stdout
    # Its resolution as words, not as the manifest's dictionary.
    assert ("  resolution pad224: 15 samples, frames 224x224x3, features 256x128, pad to 224 px, PIL bicubic, "
            "pad value 255") in shown.stdout.splitlines(), shown.stdout


def test_the_sample_data_as_an_annotation_file_indexes_as_its_episode_folders(tmp_path: Path) -> None:
    """``sample-data --format jsonl``: the same images and one annotation file, whose samples are
    the episode folders' (keys, windows, texts)."""
    folders, annotated = tmp_path / "folders", tmp_path / "annotated"
    for out, form in ((folders, "folders"), (annotated, "jsonl")):
        written = janus_cache("sample-data", out, "--episodes", "2", "--steps", "4", "--format", form)
        assert written.returncode == 0, tail(written)
    assert written.stdout.strip() == f"wrote 2 episodes x 4 frames to {annotated}, annotated in {annotated}/annotations.jsonl"
    assert sorted(p.name for p in annotated.iterdir()) == ["annotations.jsonl", "episode_0000", "episode_0001"]
    assert not list(annotated.glob("*/*.json"))  # the texts are in the annotation file only
    summaries = [janus_cache("index", data, "--json") for data in (folders, annotated / "annotations.jsonl")]
    assert all(s.returncode == 0 for s in summaries), [tail(s) for s in summaries]
    counts = [{k: json.loads(s.stdout)[k] for k in ("episodes", "frames", "samples")} for s in summaries]
    assert counts[0] == counts[1] == {"episodes": 2, "frames": 8, "samples": 8}
    records = [json.loads(line) for line in (annotated / "annotations.jsonl").read_text().splitlines()]
    assert records[0]["id"] == "episode_0000/0" and len(records[0]["images"]) == 9


def test_an_annotation_file_with_its_images_elsewhere_is_one_source_among_several(
        sources: tuple[Path, Path], source_profile: Path, tmp_path: Path) -> None:
    a, _ = sources
    images = tmp_path / "rxr_images"
    assert janus_cache("sample-data", images, "--episodes", "1", "--steps", str(STEPS), "--format", "jsonl",
                       "--seed", "3").returncode == 0
    annotations = tmp_path / "annotations" / "rxr_train.jsonl"  # kept apart from its images
    annotations.parent.mkdir()
    shutil.move(images / "annotations.jsonl", annotations)

    indexed = janus_cache("index", f"r2r={a} rxr={annotations}", "--image-root", f"rxr={images}", "--json")
    assert indexed.returncode == 0, tail(indexed)
    assert json.loads(indexed.stdout)["samples"] == 3 * STEPS
    unknown = janus_cache("index", f"r2r={a} rxr={annotations}", "--image-root", f"vln={images}")
    assert_one_line_error(unknown, "--image-root vln=", "no dataset source is named 'vln'", "r2r, rxr")
    bare = janus_cache("index", f"r2r={a} rxr={annotations}", "--image-root", str(images))
    assert_one_line_error(bare, f"--image-root {images}", "name it: --image-root NAME=")

    cache = tmp_path / "cache"
    built = precompute_in_process(cache, source_profile, f"r2r={a}", f"rxr={annotations}", "--image-root",
                                  f"rxr={images}")
    assert built.returncode == 0, tail(built)
    keys = cache_keys(cache)
    assert len(keys) == 3 * STEPS and keys[-1] == f"rxr/episode_0000/{STEPS - 1}"
    shown = janus_cache("info", cache)
    assert "  sources (in cache order): r2r, rxr" in shown.stdout.splitlines(), shown.stdout
