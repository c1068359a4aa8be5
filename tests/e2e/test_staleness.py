"""A cache made stale by its dataset: the dataset identity covers every
episode's frames, texts and actions, so ``verify --data`` fails naming the episode and the edited
file (a description JSON, the milestones file, an annotation record, a PNG), and a training run
with ``--data`` (``make train DATA=...``) runs the same check before training and refuses the cache.

Real PNG datasets, real ``janus-cache`` commands (their CLI, run in this process), a 2-rank verify
and a 1-rank training run (their ranks started as torchrun starts them: helpers.forked_ranks).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from helpers.forked_ranks import forked_launch
from helpers.sources import (
    assert_one_line_error,
    precompute_in_process,
    tail,
    verify_in_process,
)
from helpers.training import train_on_ranks
from janus_core.index import build_index


@pytest.fixture(scope="module")
def stale_setup(sources: tuple[Path, Path], source_profile: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> tuple[Path, Path]:
    """A private copy of dataset A (the tests edit it and restore it) and its cache."""
    root = tmp_path_factory.mktemp("stale")
    data = Path(shutil.copytree(sources[0], root / "data"))
    cache = root / "cache"
    result = precompute_in_process(cache, source_profile, data)
    assert result.returncode == 0, tail(result)
    fresh = verify_in_process(cache, source_profile, data, "--live", "0")
    assert fresh.returncode == 0, tail(fresh)
    return data, cache


class Edited:
    """Edit one file of the dataset for the length of a ``with`` block, then put it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.original = path.read_bytes()

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.path.write_bytes(self.original)


def edit_json(path: Path, field: str, text: str) -> None:
    data = json.loads(path.read_text())
    data[field] = text
    path.write_text(json.dumps(data))


def test_an_edited_description_fails_verify_naming_the_episode_and_the_json_file(
    stale_setup: tuple[Path, Path], source_profile: Path
) -> None:
    data, cache = stale_setup
    with Edited(min((data / "episode_0001").glob("step_0003_*.json"))) as path:
        edit_json(path, "spatial_description", "The kitchen is now on the left.")
        result = verify_in_process(cache, source_profile, data, "--live", "0")
    assert_one_line_error(result, "completeness", "changed episode episode_0001",
                          "description_3d of sample episode_0001/3", str(path))


def test_an_edited_instruction_fails_verify_naming_the_milestones_file(
    stale_setup: tuple[Path, Path], source_profile: Path
) -> None:
    data, cache = stale_setup
    with Edited(data / "episode_0000" / "milestones_result.json") as path:
        edit_json(path, "instruction_text", "Walk to the garden instead.")
        result = verify_in_process(cache, source_profile, data, "--live", "0")
    assert_one_line_error(result, "changed episode episode_0000", "instruction of sample episode_0000/0", str(path))


def test_an_edited_png_fails_verify_naming_it(stale_setup: tuple[Path, Path], source_profile: Path) -> None:
    data, cache = stale_setup
    with Edited(min((data / "episode_0001").glob("step_0004_*.png"))) as path:
        with Image.open(path) as image:  # a valid PNG of the same size, other pixels
            ImageOps.invert(image.convert("RGB")).save(path)
        result = verify_in_process(cache, source_profile, data, "--live", "0")
    assert_one_line_error(result, "changed episode episode_0001", f"changed source file {path}", "content hash")


def test_two_ranks_of_verify_name_the_edited_description_and_pass_on_the_restored_one(
    stale_setup: tuple[Path, Path], source_profile: Path
) -> None:
    """Completeness runs on rank 0; without the live check the other rank never receives the index
    (over a gigabyte per rank at the real set's size), and the verdict is the same. The ranks start as
    torchrun starts them (helpers.forked_ranks)."""
    data, cache = stale_setup

    def verify() -> subprocess.CompletedProcess[str]:
        return forked_launch("pipelines.verify", cache, "--data", data, "--profile", source_profile, "--live", "0",
                             "--checksums", "none", timeout=600)

    with Edited(min((data / "episode_0000").glob("step_0002_*.json"))) as path:
        edit_json(path, "spatial_description", "The stairs lead down now.")
        result = verify()
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and "Traceback" not in result.stderr, tail(result)
    assert errors and "changed episode episode_0000" in errors[0] and str(path) in errors[0], tail(result)
    restored = verify()
    assert restored.returncode == 0, tail(restored)


def test_an_edited_annotation_record_fails_verify_naming_its_line(
    sources: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    """An annotation file's records hold the texts: the edited one is named by file and line."""
    images = Path(shutil.copytree(sources[0], tmp_path / "images"))
    index = build_index(images)
    annotation = images / "train.jsonl"
    records = [
        {"id": sample.key, "instruction": sample.instruction, "subinstruction": sample.subinstruction,
         "2D_description": sample.description_2d, "3D_description": sample.description_3d,
         "action": sample.action, "images": [frame.relpath for frame in index.window(sample)]}
        for sample in index.samples
    ]
    annotation.write_text("".join(json.dumps(r) + "\n" for r in records))
    cache = tmp_path / "cache"
    built = precompute_in_process(cache, source_profile, annotation)
    assert built.returncode == 0, tail(built)

    records[6]["subinstruction"] = "Turn around."
    annotation.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = verify_in_process(cache, source_profile, annotation, "--live", "0")
    assert_one_line_error(result, f"subinstruction of sample {records[6]['id']} changed in {annotation}:7")


def test_a_training_run_with_data_refuses_a_stale_cache_naming_the_file(
    stale_setup: tuple[Path, Path], source_profile: Path, tmp_path: Path
) -> None:
    """``pipelines.train --data`` (``make train DATA=...``, whose quoting of an awkward path
    tests/e2e/test_moved_dataset.py runs) on one rank started as torchrun starts it."""
    data, cache = stale_setup
    run = tmp_path / "run"
    with Edited(min((data / "episode_0000").glob("step_0001_*.json"))) as path:
        edit_json(path, "landmark_description", "A staircase that was not there.")
        result = train_on_ranks("--cache", cache, "--data", data, "--profile", source_profile, "--out", run,
                                "--no-export", nproc=1)
    assert result.returncode != 0, tail(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors and "changed episode episode_0000" in errors[0] and str(path) in errors[0], tail(result)
    assert not (run / "checkpoints").exists()  # refused before any training step
