"""Stage 1 precompute end to end: real processes on CPU write real caches.

Every run here is the installed pipeline in processes of its own: 2 ranks of ``pipelines.precompute``
(torch's elastic agent, helpers.precompute_runs.precompute_on_ranks) or ``janus-cache precompute``, on the session's sample dataset (3 episodes x 12 frames), with the
tiny profile cut into small shards (4 frames, 2 samples per shard: 9 frame shards, 18 sample
shards), so that shards are spread over both ranks and a run can be killed between two commits.
The session's shared uninterrupted cache per format (``small_shards_cache``, one process) is the
reference that the other runs must equal; a 2-process run writes it byte for byte.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from helpers.precompute_runs import (
    FRAMES_PER_SHARD,
    RESOLUTION,
    RUN_TIMEOUT,
    SAMPLES_PER_SHARD,
    copy_cache,
    flip_byte,
    output,
    precompute_command,
    precompute_on_ranks,
    profile,
    run,
    run_env,
    run_in_process,
    succeeded,
    tail,
    workdir,
)
from helpers.profiles import file_digests, write_test_profile
from janus_cache.job import REPORT_NAME, PrecomputeJob
from janus_cache.keys import window_variant
from janus_cache.plan import Plan
from janus_cache.store import FORMATS, CacheLayout, CacheReader, open_cache, read_manifest
from janus_cache.store.commit import read_record
from janus_cache.store.layout import features_array as features_array_path
from janus_cache.store.layout import frames_array as frames_array_path
from janus_cache.store.layout import wds_samples as wds_array_path
from janus_cache.work_units import encode_windows
from janus_core.imaging import load_frame
from janus_core.index import DatasetIndex, build_index, build_sources_index
from janus_core.profile import Profile, load_profile
from janus_core.resolution import Resolution
from janus_core.vggt.encoder import WindowEncoder

# ------------------------------------------------------------------------------------ running


def opened_reader(cache: Path, resolution: str = RESOLUTION) -> CacheReader:
    """The reader of ``resolution`` of the cache's window variant (through open_cache)."""
    manifest = read_manifest(cache)
    assert manifest is not None, f"{cache} has no manifest"
    return open_cache(cache, resolution=resolution, variant=manifest.window.name).reader


def committed(cache: Path, array: str) -> int:
    directory = CacheLayout(cache).commit_dir(array)
    return sum(1 for _ in directory.glob("*.json")) if directory.is_dir() else 0


def corrupt_png_pixels(path: Path) -> None:
    """Break the zlib stream of a PNG's first IDAT chunk but keep the chunk's CRC valid.

    Every chunk then passes PIL's ``verify()`` (what indexing checks); only decoding fails.
    """
    data = bytearray(path.read_bytes())
    position = 8  # after the PNG signature
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        if data[position + 4 : position + 8] == b"IDAT":
            body = position + 8
            data[body : body + 2] = b"\xff\xff"  # not a valid zlib header
            crc = zlib.crc32(bytes(data[position + 4 : body + length]))
            data[body + length : body + length + 4] = struct.pack(">I", crc)
            path.write_bytes(bytes(data))
            return
        position += 12 + length
    raise AssertionError(f"{path} has no IDAT chunk")


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def settings(profile: Path) -> Profile:
    return load_profile(profile)


@pytest.fixture(scope="module")
def variant(settings: Profile) -> str:
    return window_variant(settings.cache).name


@pytest.fixture(scope="module")
def references(small_shards_cache: Callable[[str], Path]) -> Callable[[str], Path]:
    """The uninterrupted cache of a format: the session's shared one, made by one process (a
    2-process run writes the same bytes: the first test below)."""
    return small_shards_cache


@pytest.fixture(scope="module")
def two_process_runs(sample_dataset: Path, profile: Path, workdir: Path) -> Callable[[str], Path]:
    """The uninterrupted 2-process cache of a format (torchrun), built on first use; its output is
    saved next to it as ``<cache>.log``."""
    built: dict[str, Path] = {}

    def reference(cache_format: str) -> Path:
        if cache_format not in built:
            out = workdir / f"two-processes-{cache_format}"
            result = precompute_on_ranks(sample_dataset, out, profile, cache_format=cache_format)
            assert succeeded(result), tail(result)
            out.with_suffix(".log").write_text(output(result))
            built[cache_format] = out
        return built[cache_format]

    return reference


CHECKED_SAMPLE_SHARDS = (0, 7, 12, 17)
"""Sample shards whose features are recomputed: both ranks' shards, padded and linspace windows,
the first and last shard (encoding all 18 would double this file's run time on 2 cores)."""


@pytest.fixture(scope="module")
def expected_features(sample_index: DatasetIndex, settings: Profile) -> dict[int, torch.Tensor]:
    """Sample row -> feature from a fresh encoder, for the samples of CHECKED_SAMPLE_SHARDS, each
    shard encoded as one unit in batches of ``vggt_batch`` windows, as precompute encodes it."""
    encoder = WindowEncoder.from_settings(settings.vggt, settings.cache)
    resolution = Resolution.parse(RESOLUTION)
    expected: dict[int, torch.Tensor] = {}
    for shard in CHECKED_SAMPLE_SHARDS:
        samples = sample_index.samples[shard * SAMPLES_PER_SHARD : (shard + 1) * SAMPLES_PER_SHARD]
        windows = np.stack([
            np.stack([load_frame(sample_index.frames[r].path, resolution) for r in s.window_rows]) for s in samples
        ])
        features = encode_windows(encoder, windows, settings.cache.vggt_batch)
        expected.update({s.row: f for s, f in zip(samples, features, strict=True)})
    return expected


# ------------------------------------------------------------------------ process independence


def test_one_and_two_processes_write_byte_identical_caches(
    references: Callable[[str], Path], two_process_runs: Callable[[str], Path]
) -> None:
    """Work assignment does not depend on the process count: every file is the same, byte for byte,
    in both formats.

    The 1-process caches are the session's shared ones (the precompute entry point in one
    process); the 2-process runs are torchrun launches whose ranks decode and write their own
    shards. (A plain ``janus-cache precompute`` process decoding with a pool of 2 worker processes
    writes the same cache too: the annotation-file test below.)
    """
    for cache_format in FORMATS:
        one, two = references(cache_format), two_process_runs(cache_format)
        assert (one / "manifest.json").read_text() == (two / "manifest.json").read_text()
        assert file_digests(one) == file_digests(two), cache_format


def test_the_reference_run_prints_the_plan_and_a_summary(two_process_runs: Callable[[str], Path]) -> None:
    """Both formats print the plan first and a summary last, hold every sample with every shard
    committed, and report no problem."""
    for cache_format in FORMATS:
        cache = two_process_runs(cache_format)
        printed = cache.with_suffix(".log").read_text()
        for line in ("unique frames 36, samples 36", "zarr cache", "wds cache", "naive layout", "time  "):
            assert line in printed
        assert "precompute done" in printed and "36 samples" in printed
        assert "[features] 36/36 (100%)" in printed  # the progress log (not a terminal)
        assert printed.index("zarr cache") < printed.index("precompute done")
        manifest = read_manifest(cache)
        assert manifest is not None and manifest.format == cache_format
        assert manifest.counts["samples_written"] == 36 and manifest.counts["samples_failed"] == 0
        assert all(entry.committed for entries in manifest.shards.values() for entry in entries)
        report = json.loads((cache / REPORT_NAME).read_text())
        assert report == {"dataset_problems": [], "failed_frames": {}, "failed_samples": {}}


def test_the_job_run_step_by_step_in_one_process_builds_the_reference_cache(
    references: Callable[[str], Path], sample_dataset: Path, settings: Profile, tmp_path: Path
) -> None:
    """The library's precompute job driven by hand, every shard in reverse order, writes the
    reference cache byte for byte; afterwards no shard is pending."""
    encoder = WindowEncoder.from_settings(settings.vggt, settings.cache)
    index = build_sources_index(sample_dataset)  # as precompute indexes its DATA (the source's name is stored)
    job = PrecomputeJob(index, tmp_path / "cache", "zarr", settings.cache, Resolution.parse(RESOLUTION), encoder)
    shown: list[Plan] = []
    prepared = job.prepare(on_plan=shown.append)
    assert shown == [prepared.plan] and prepared.warnings == ()
    assert (prepared.plan.samples, job.n_frame_shards) == (36, 36 // FRAMES_PER_SHARD)
    for shard in reversed(range(job.n_frame_shards)):
        assert job.frame_shard(shard) == {}
    job.prepare_features()
    done: list[int] = []
    job.feature_shards(list(reversed(range(job.n_feature_shards))), on_done=lambda shard, n: done.append(shard))
    assert sorted(done) == list(range(36 // SAMPLES_PER_SHARD))
    outcome = job.finish()
    assert (outcome.written, outcome.dropped) == (36, {})
    assert file_digests(job.out) == file_digests(references("zarr"))
    assert job.pending_frame_shards(range(job.n_frame_shards)) == []
    assert job.pending_feature_shards(range(job.n_feature_shards)) == []


# ------------------------------------------------------------------------- kill and resume


@pytest.mark.parametrize(
    ("cache_format", "phase", "resume_nproc"),
    [("zarr", "features", 2), ("wds", "frames", None)],
    ids=["zarr-features-same-command", "wds-frames-one-process"],
)
def test_a_run_killed_mid_way_then_resumed_equals_an_uninterrupted_run(
    cache_format: str, phase: str, resume_nproc: int | None, references: Callable[[str], Path],
    sample_dataset: Path, profile: Path, variant: str, tmp_path: Path,
) -> None:
    """SIGKILL to every rank of a 2-process run right after the first commit of a phase (as a failed
    machine ends them; a killed launcher's ranks die with it: tests/e2e/test_orphans.py); one
    committed shard is then damaged on disk; resuming (the same command, or one plain process: the
    shards do not depend on the process count) with ``--checksums all`` gives the reference cache
    exactly, and removes what interrupted writes left (a file and a folder)."""
    out = tmp_path / "cache"
    frames_array = frames_array_path(RESOLUTION)
    samples_array = (features_array_path if cache_format == "zarr" else wds_array_path)(variant, RESOLUTION)
    watched = frames_array if phase == "frames" else samples_array

    killed = precompute_on_ranks(sample_dataset, out, profile, cache_format=cache_format,
                                 kill_when=lambda: committed(out, watched) > 0)
    assert killed.returncode != 0, tail(killed)
    n_sample_shards = 36 // SAMPLES_PER_SHARD
    assert 0 < committed(out, watched)
    assert committed(out, samples_array) < n_sample_shards, "the run had finished its sample shards"
    assert not (out / REPORT_NAME).exists(), "the run had finished"

    # Damage a committed shard of each phase that has one: the resume must notice and rewrite it.
    damaged = [frames_array] + ([samples_array] if phase == "features" else [])
    for array in damaged:
        shard = next(int(p.stem) for p in sorted(CacheLayout(out).commit_dir(array).glob("*.json")))
        record = read_record(out, array, shard)
        assert record is not None
        flip_byte(out / record.file)
    # What a kill inside an atomic write of a commit record leaves: a temporary file no shard owns.
    stray = CacheLayout(out).commit_record(frames_array, 0).with_name(f"000000.json.{os.getpid()}.{'0' * 32}.partial")
    stray.write_bytes(b'{"array": "fra')
    # And a kill while the dataset index was being stored: a half-written folder of the index store.
    half_index = CacheLayout(out).index_store / f".{'0' * 20}.{os.getpid()}.partial"
    (half_index / "tables").mkdir(parents=True)

    # A same-size flip is seen only by hashing, which a resume does on request (by default it
    # trusts committed shards by record and size: tests/e2e/test_resume_verify_cost.py).
    resumed = (precompute_on_ranks(sample_dataset, out, profile, "--checksums", "all", cache_format=cache_format)
               if resume_nproc == 2 else
               run([*precompute_command(sample_dataset, out, profile, cache_format=cache_format, nproc=resume_nproc),
                    "--checksums", "all"]))
    assert succeeded(resumed), tail(resumed)
    assert file_digests(out) == file_digests(references(cache_format))
    assert not stray.exists() and not half_index.exists()


# ---------------------------------------------------------------------- keyed-field refusals


def changed_source_dataset(sample_dataset: Path, target: Path) -> tuple[Path, str]:
    """A copy of the dataset where one frame is replaced by its negative (a valid PNG of the same
    size: a change every feature whose window holds it shows, even as history), and that frame's
    path relative to the copy."""
    data = Path(shutil.copytree(sample_dataset, target))
    frame = min((data / "episode_0001").glob("step_0005_*.png"))
    with Image.open(frame) as image:
        negative = ImageOps.invert(image.convert("RGB"))
    negative.save(frame)
    return data, frame.relative_to(data).as_posix()


@pytest.mark.parametrize(
    ("change", "field"),
    [({"vggt": {"seed": 1}}, "encoder_fingerprint"), ({"cache": {"history": 4}}, "window.history")],
    ids=["encoder-weights", "window-history"],
)
def test_a_keyed_field_change_is_refused_with_the_field_named(
    change: dict[str, dict], field: str, references: Callable[[str], Path], sample_dataset: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The run exits non-zero naming the field, and leaves every file of the cache as it was.

    The encoder change runs under torchrun (rank 0's refusal must stop rank 1 too), the window
    change as one process (the entry point in this one). (A changed source image: see the
    ``--overwrite`` test.)
    """
    cache = copy_cache(references("zarr"), tmp_path / "cache")
    before = file_digests(cache)
    profile = write_test_profile(
        tmp_path / "profile.yaml",
        cache={"frames_per_shard": FRAMES_PER_SHARD, "samples_per_shard": SAMPLES_PER_SHARD,
               **change.get("cache", {})},
        vggt=change.get("vggt"),
    )

    refused = (precompute_on_ranks(sample_dataset, cache, profile) if "vggt" in change
               else run_in_process(capsys, sample_dataset, cache, profile))
    assert refused.returncode != 0
    assert field in output(refused), tail(refused)
    assert "different settings" in output(refused)
    assert file_digests(cache) == before


def test_overwrite_starts_over_with_the_new_settings(
    references: Callable[[str], Path], sample_dataset: Path, profile: Path, variant: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A changed source image is refused naming its episode and file (nothing written); ``--overwrite``
    then rebuilds the cache from the changed source, even with its manifest damaged: of all the
    data files, exactly the changed frame's shard, the feature shards of the windows holding that
    frame and the frames table's content-hash column differ from the old cache."""
    reference = references("zarr")
    cache = copy_cache(reference, tmp_path / "cache")
    data, changed_frame = changed_source_dataset(sample_dataset, tmp_path / "data")
    refused = run_in_process(capsys, data, cache, profile)
    assert refused.returncode != 0 and f"changed source file {data / changed_frame}" in output(refused) \
        and "episode episode_0001" in output(refused), tail(refused)
    assert file_digests(cache) == file_digests(reference)

    manifest = cache / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])
    result = run_in_process(capsys, data, cache, profile, overwrite=True)
    assert succeeded(result), tail(result)
    old, new = read_manifest(reference), read_manifest(cache)
    assert old is not None and new is not None
    assert new.dataset.digest != old.dataset.digest
    assert new.counts["samples_written"] == 36

    index = build_index(data)
    row = next(f.row for f in index.frames if f.relpath == changed_frame)
    reader = opened_reader(cache)
    expected = {reader.shard_file(frames_array_path(RESOLUTION), row // FRAMES_PER_SHARD)} | {
        reader.shard_file(features_array_path(variant, RESOLUTION), s.row // SAMPLES_PER_SHARD)
        for s in index.samples if row in s.window_rows
    }
    expected = {p.relative_to(cache).as_posix() for p in expected} | {"tables/frames/source_sha256/utf8/c/0"}
    old_digests, new_digests = file_digests(reference), file_digests(cache)
    assert set(new_digests) == set(old_digests)
    changed_data = {p for p in new_digests if new_digests[p] != old_digests[p] and "/c/" in p}
    assert changed_data == expected


def test_overwrite_never_deletes_a_directory_that_is_not_a_cache(
    sample_dataset: Path, profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "my-data"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    refused = run_in_process(capsys, sample_dataset, out, profile, overwrite=True)
    assert refused.returncode != 0 and "is not a janus cache" in output(refused), tail(refused)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


# ------------------------------------------------------------------------------- bad images


def test_images_that_fail_to_decode_are_reported_and_their_samples_left_out(
    references: Callable[[str], Path], sample_dataset: Path, profile: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two frames pass indexing but fail to decode: the first frame of episode 0 (in every window of
    that episode, and in the plan's probe) and the last frame of episode 2 (only its own sample).
    The other samples are exactly those of a clean run."""
    data = Path(shutil.copytree(sample_dataset, tmp_path / "data"))
    bad = [min((data / "episode_0000").glob("step_0000_*.png")),
           min((data / "episode_0002").glob("step_0011_*.png"))]
    for path in bad:
        corrupt_png_pixels(path)
    index = build_index(data)
    assert not index.report.entries and len(index.frames) == 36, "indexing must accept the damaged PNGs"
    bad_rows = {f.row for f in index.frames if f.path in bad}
    failed = {s.key for s in index.samples if bad_rows & set(s.window_rows)}
    assert len(failed) == 13  # 12 samples of episode 0, 1 of episode 2

    cache = tmp_path / "cache"
    result = precompute_on_ranks(data, cache, profile)
    assert result.returncode == 1, tail(result)
    assert "13 samples failed" in output(result)
    first_failed = next(s.key for s in index.samples if s.key in failed)  # listed first, with its reason
    first_reason = f"window frame {index.frames[min(bad_rows)].relpath} could not be decoded"
    assert f"{first_failed}: {first_reason}" in output(result)
    report = json.loads((cache / REPORT_NAME).read_text())
    assert set(report["failed_samples"]) == failed
    assert set(report["failed_frames"]) == {index.frames[r].relpath for r in bad_rows}
    assert all(f"cannot load frame {data / relpath}" in reason for relpath, reason in report["failed_frames"].items())

    reader, clean = opened_reader(cache), opened_reader(references("zarr"))
    kept = [s for s in index.samples if s.key not in failed]
    assert len(reader) == len(kept)
    for row, sample in enumerate(kept):
        got, expected = reader[row], clean[sample.row]
        assert got.key == expected.key == sample.key
        assert not bad_rows & set(got.meta.window_rows)
        np.testing.assert_array_equal(got.frames, expected.frames)
        assert torch.equal(got.feature, expected.feature)

    # The exit code is rank 0's decision: a 1-process resume of the finished cache is enough here.
    allowed = run_in_process(capsys, data, cache, profile, allow_failures=len(failed))
    assert succeeded(allowed), tail(allowed)
    assert "13 samples failed" in output(allowed)


# ------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("cache_format", FORMATS)
def test_the_reader_returns_exactly_what_was_computed(
    cache_format: str, references: Callable[[str], Path], sample_index: DatasetIndex,
    expected_features: dict[int, torch.Tensor],
) -> None:
    """Frames equal a fresh decode of the sources, windows the index's, features a fresh encoder
    run (bit for bit, bf16; on the samples of CHECKED_SAMPLE_SHARDS), and keys and texts the index's."""
    cache = references(cache_format)
    reader = opened_reader(cache)
    samples = list(reader) if cache_format == "wds" else [reader[row] for row in range(len(reader))]
    resolution = Resolution.parse(RESOLUTION)
    sources = {f.row: load_frame(f.path, resolution) for f in sample_index.frames}
    assert [s.key for s in samples] == [s.key for s in sample_index.samples]
    for got, sample in zip(samples, sample_index.samples, strict=True):
        assert got.row == sample.row
        assert got.meta.window_rows == tuple(sample.window_rows)
        np.testing.assert_array_equal(got.frames, np.stack([sources[r] for r in sample.window_rows]))
        assert got.feature.dtype == torch.bfloat16
        assert got.feature.shape == (256, 128)
        if sample.row in expected_features:
            assert torch.equal(got.feature, expected_features[sample.row]), sample.key
        meta = got.meta
        assert (meta.extra["episode_id"], meta.extra["step"], meta.action) == (sample.episode_id, sample.step,
                                                                               sample.action_id)
        assert (meta.instruction, meta.subinstruction) == (sample.instruction, sample.subinstruction)
        assert (meta.description_2d, meta.description_3d) == (sample.description_2d, sample.description_3d)


# ------------------------------------------------------------------------- more resolutions


def test_a_second_resolution_leaves_the_first_untouched(
    references: Callable[[str], Path], sample_dataset: Path, sample_index: DatasetIndex, profile: Path,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """Every file but the manifest is unchanged; the manifest keeps the first resolution's entry
    and shard table and adds the second's."""
    cache = copy_cache(references("zarr"), tmp_path / "cache")
    before, first = file_digests(cache), read_manifest(cache)
    result = run_in_process(capsys, sample_dataset, cache, profile, resolution="crop112")
    assert succeeded(result), tail(result)
    after = file_digests(cache)
    # The manifest gains the resolution; checksums.json records the metadata files' new checksums.
    unchanged = {p for p in before if p not in ("manifest.json", "checksums.json")}
    assert {p: after.get(p) for p in unchanged} == {p: before[p] for p in unchanged}
    assert any(p.startswith("frames/crop112/") for p in after)

    manifest = read_manifest(cache)
    assert manifest is not None and first is not None
    assert sorted(manifest.resolutions) == ["crop112", RESOLUTION]
    assert manifest.resolutions[RESOLUTION] == first.resolutions[RESOLUTION]
    assert {a: e for a, e in manifest.shards.items() if a in first.shards} == first.shards
    assert manifest.resolutions["crop112"].frame_shape == (84, 112, 3)
    info = subprocess.run([str(Path(sys.executable).parent / "janus-cache"), "info", str(cache)],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert info.returncode == 0, info.stderr
    assert f"resolution {RESOLUTION}" in info.stdout and "resolution crop112" in info.stdout

    sample = opened_reader(cache, "crop112")[7]
    source = sample_index.samples[7]
    expected = np.stack([load_frame(sample_index.frames[r].path, "crop112") for r in source.window_rows])
    np.testing.assert_array_equal(sample.frames, expected)


# ------------------------------------------------------------------------------------ plan


def test_plan_prints_sizes_per_format_and_a_time_estimate(
    references: Callable[[str], Path], sample_dataset: Path, profile: Path
) -> None:
    """The JSON plan has both formats' sizes, and its zarr estimate is close to the real cache."""
    exe = str(Path(sys.executable).parent / "janus-cache")
    result = subprocess.run([exe, "plan", str(sample_dataset), "--profile", str(profile), "--json"],
                            env=run_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert (plan["samples"], plan["frames"], plan["frames_per_sample"]) == (36, 36, 9)
    assert 0 < plan["zarr_bytes"] < plan["wds_bytes"] < plan["naive_bytes"]
    assert plan["estimated_seconds"] > 0
    actual = sum(p.stat().st_size for p in references("zarr").rglob("*") if p.is_file())
    assert 0.7 < plan["zarr_bytes"] / actual < 1.3, (plan["zarr_bytes"], actual)


# ------------------------------------------------------------------------ annotation files


def test_an_annotation_file_with_an_image_root_gives_the_folder_cache(
    references: Callable[[str], Path], sample_dataset: Path, sample_index: DatasetIndex, profile: Path,
    tmp_path: Path,
) -> None:
    """A JSONL annotation file kept away from its images (``--image-root`` names them) that lists
    the sample data's samples precomputes to the same cache as the episode folders, byte for byte
    (in a plain ``janus-cache precompute`` process decoding with a pool of 2 worker processes)."""
    records = [
        {"id": s.key, "instruction": s.instruction, "subinstruction": s.subinstruction,
         "2D_description": s.description_2d, "3D_description": s.description_3d, "action": s.action,
         "images": [frame.relpath for frame in sample_index.window(s)]}
        for s in sample_index.samples
    ]
    annotation = tmp_path / "annotations" / "train.jsonl"
    annotation.parent.mkdir()
    annotation.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "cache"
    result = run(precompute_command(annotation, out, profile, "--image-root", str(sample_dataset), nproc=None,
                                    workers=2))
    assert succeeded(result), tail(result)
    assert file_digests(out) == file_digests(references("zarr"))


# ------------------------------------------------------------------------------ rank failure


def test_a_failing_rank_fails_the_whole_run_with_its_error(
    references: Callable[[str], Path], sample_dataset: Path, profile: Path, tmp_path: Path
) -> None:
    """Frame shard 1 belongs to rank 1; a directory where its file must go makes only rank 1 raise."""
    cache = copy_cache(references("zarr"), tmp_path / "cache")
    array = frames_array_path(RESOLUTION)
    record = read_record(cache, array, 1)
    assert record is not None
    CacheLayout(cache).commit_record(array, 1).unlink()
    blocked = cache / record.file
    blocked.unlink()
    blocked.mkdir()

    result = precompute_on_ranks(sample_dataset, cache, profile)
    assert result.returncode != 0
    assert "IsADirectoryError" in output(result) and record.file in output(result), tail(result)
