"""Bad input that used to escape the index's problem report: a symbolic-link
loop in a dataset, annotation records whose image list is not one window, and an annotation file
whose image paths lie under another root. Each is reported naming the path (skipped; ``--strict``
fails in one line), through the CLIs on real PNG datasets and real symbolic links: ``janus-cache
index`` as a process once, the other commands' CLI run in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest

from helpers.profiles import write_test_profile
from helpers.sources import assert_one_line_error, janus_cache, janus_cache_in_process, precompute_in_process, tail
from janus_cache.store import read_manifest
from janus_core.index import build_index
from janus_core.sample_data import write_sample_data

HISTORY_PLUS_ONE = 9
"""Images in one window of the tiny profile (history 8 + the current view)."""


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two episodes of 3 frames (read-only: copy to change it)."""
    return write_sample_data(tmp_path_factory.mktemp("small") / "data", episodes=2, steps=3, seed=0)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_test_profile(tmp_path_factory.mktemp("profiles") / "tiny.yaml")


def looped(dataset: Path, tmp_path: Path) -> Path:
    """A copy of ``dataset`` with a link to itself (``x -> x``) and one to its parent (``episode -> ..``)."""
    copy = Path(shutil.copytree(dataset, tmp_path / "looped"))
    os.symlink("x", copy / "x")
    os.symlink("..", copy / "episode")
    return copy


def output(result) -> str:
    return result.stdout + result.stderr


# ------------------------------------------------------------------------------ symbolic links


def test_index_reports_symlink_loops_naming_each_path_and_keeps_every_sample(
        small_dataset: Path, tmp_path: Path) -> None:
    data = looped(small_dataset, tmp_path)
    for run in ("built", "reused from the stored index"):
        result = janus_cache("index", data)
        assert result.returncode == 0, f"{run}: {tail(result)}"
        assert "Traceback" not in output(result), run
        assert f"{data / 'x'}: symlink_loop: a symbolic link loop" in result.stdout, run
        assert f"{data / 'episode'}: symlink_loop: a symbolic link to .., a folder that holds it" in result.stdout, run
        assert "samples           6" in result.stdout, run  # the real episodes are all there


def test_index_strict_fails_in_one_line_naming_the_loop(small_dataset: Path, tmp_path: Path) -> None:
    data = looped(small_dataset, tmp_path)
    (data / "episode").unlink()
    assert_one_line_error(janus_cache_in_process("index", data, "--strict"), "symlink_loop", str(data / "x"))


def test_an_annotation_image_behind_a_symlink_loop_is_reported(small_dataset: Path, tmp_path: Path) -> None:
    images = Path(shutil.copytree(small_dataset, tmp_path / "images"))
    os.symlink("loop", images / "loop")
    records = annotation_records(small_dataset)
    records[0]["images"][-1] = "loop/step_0000_STOP.png"
    annotation = write_jsonl(tmp_path / "train.jsonl", records)
    result = janus_cache_in_process("index", annotation, "--image-root", images)
    assert result.returncode == 0 and "Traceback" not in output(result), tail(result)
    assert f"{images / 'loop/step_0000_STOP.png'} [sample {records[0]['id']}]: symlink_loop" in result.stdout


def test_precompute_skips_a_symlink_loop_and_strict_refuses_it_in_one_line(
        small_dataset: Path, profile: Path, tmp_path: Path) -> None:
    data = looped(small_dataset, tmp_path)
    refused = precompute_in_process(tmp_path / "strict", profile, data, "--strict")
    assert_one_line_error(refused, "symlink_loop", str(data / "x"), str(data / "episode"))
    result = precompute_in_process(tmp_path / "cache", profile, data)
    assert result.returncode == 0, tail(result)
    assert "Traceback" not in output(result) and "Errno" not in output(result), tail(result)
    assert read_manifest(tmp_path / "cache").counts["samples"] == 6


# ------------------------------------------------------------------------------ decompression bombs


def write_png_bomb(path: Path, side: int = 20000) -> None:
    """A valid 1-bit PNG of ``side`` x ``side`` black pixels: ~50 KB on disk, 400 million pixels decoded,
    more than PIL decodes (``Image.MAX_IMAGE_PIXELS`` x 2: a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = (b"\x00" + bytes(side // 8)) * side  # filter byte + a row of 1-bit pixels
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_bad_input_named_by_its_file_like_a_truncated_image(
        small_dataset: Path, profile: Path, tmp_path: Path) -> None:
    """A 20000 x 20000 PNG among the frames: ``index`` reports it as an unreadable image naming the
    file (before: a 230-line traceback) and precompute skips the samples that need it (before: one
    line naming no file); ``--strict`` refuses in one line naming it."""
    data = Path(shutil.copytree(small_dataset, tmp_path / "data"))
    bomb = min((data / "episode_0001").glob("step_0001_*.png"))
    write_png_bomb(bomb)
    result = janus_cache("index", data)
    assert result.returncode == 0 and "Traceback" not in output(result), tail(result)
    assert f"{bomb} [sample episode_0001/1]: unreadable_image: DecompressionBombError: Image size (400000000 " \
           "pixels) exceeds limit" in result.stdout, result.stdout
    assert_one_line_error(janus_cache_in_process("index", data, "--strict"), "unreadable_image", str(bomb))
    cache = precompute_in_process(tmp_path / "cache", profile, data)
    assert cache.returncode == 0 and "Traceback" not in output(cache), tail(cache)
    assert str(bomb) in output(cache)
    assert read_manifest(tmp_path / "cache").counts["samples"] == 4  # the bomb's frame is in 2 of 6 windows


# ------------------------------------------------------------------------------ annotation files
# ------------------------------------------------------------------------------ annotation files


def annotation_records(dataset: Path) -> list[dict]:
    """The samples of an episode-folder dataset as annotation records (images relative to it)."""
    index = build_index(dataset)
    return [{"id": s.key, "instruction": s.instruction, "subinstruction": s.subinstruction,
             "2D_description": s.description_2d, "3D_description": s.description_3d, "action": s.action,
             "images": [f.relpath for f in index.window(s)]} for s in index.samples]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_record_with_fewer_images_than_a_window_is_reported_by_index_and_skipped_by_precompute(
        small_dataset: Path, profile: Path, tmp_path: Path) -> None:
    records = annotation_records(small_dataset)[:2]
    assert len(records[1]["images"]) == HISTORY_PLUS_ONE
    records[0]["images"] = records[0]["images"][-4:]
    annotation = write_jsonl(tmp_path / "train.jsonl", records)
    report = janus_cache_in_process("index", annotation, "--image-root", small_dataset)
    assert report.returncode == 0, tail(report)
    assert (f"{annotation}:1 [sample {records[0]['id']}]: window_length: 4 images; a window is history + 1 = 9"
            in report.stdout), tail(report)
    assert "samples           1" in report.stdout
    strict = janus_cache_in_process("index", annotation, "--image-root", small_dataset, "--strict")
    assert_one_line_error(strict, "window_length", f"{annotation}:1")
    built = precompute_in_process(tmp_path / "cache", profile, annotation, "--image-root", small_dataset)
    assert built.returncode == 0, tail(built)
    assert read_manifest(tmp_path / "cache").counts["samples"] == 1


def test_an_annotation_file_away_from_its_images_names_the_root_and_a_missing_path(
        small_dataset: Path, profile: Path, tmp_path: Path) -> None:
    annotation = write_jsonl(tmp_path / "elsewhere" / "train.jsonl", annotation_records(small_dataset))
    first = sorted({p for r in annotation_records(small_dataset) for p in r["images"]})[0]
    named = ("none of the", f"image root {annotation.parent}", f"no file {annotation.parent / first}", "--image-root")
    assert_one_line_error(janus_cache_in_process("index", annotation), *named)
    assert_one_line_error(precompute_in_process(tmp_path / "cache", profile, annotation), *named)
    assert not (tmp_path / "cache" / "manifest.json").exists()
