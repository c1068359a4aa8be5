"""A dataset that moves: a copied or renamed dataset folder, a path with a space
and a non-ASCII folder name are the same dataset. A bare path takes the source name its cache
recorded, so the identity follows the content (episode ids, texts, frame hashes), not the folder's
name; ``DATA`` reaches the commands unsplit, whatever characters the path holds.

Real PNG datasets, real ``janus-cache`` commands (their CLI, run in this process), real ``make
verify`` / ``make precompute`` runs (torchrun) and the training command ``make train`` runs (its
dry run, on a forked rank) on copies of the dataset a cache was built from. (How such a path is
read as one source: tests/unit/test_source_parsing.py.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.commands import make, make_command
from helpers.profiles import file_digests, write_test_profile
from helpers.sources import assert_one_line_error, precompute_in_process, tail, verify_in_process
from helpers.training import train_on_ranks
from janus_core.sample_data import write_sample_data

AWKWARD = "it's \"my\" données $HOME"
"""A folder name with a space, both quotes, a '$' and non-ASCII letters."""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(dataset, its cache, profile): two episodes of 3 frames in a folder named ``data``. Read-only."""
    root = tmp_path_factory.mktemp("moved")
    profile = write_test_profile(root / "tiny.yaml")
    data = write_sample_data(root / "data", episodes=2, steps=3, seed=0)
    result = precompute_in_process(root / "cache", profile, data)
    assert result.returncode == 0, tail(result)
    return data, root / "cache", profile


def copy_of(data: Path, where: Path) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(data, where))


def edit_description(data: Path, episode: str) -> Path:
    path = min((data / episode).glob("step_0001_*.json"))
    fields = json.loads(path.read_text())
    fields["landmark_description"] = "A staircase that was not there."
    path.write_text(json.dumps(fields))
    return path


# ------------------------------------------------------------------------------------ verify


@pytest.mark.parametrize("moved", ["renamed", "a path with a space", "données"])
def test_verify_passes_on_a_copied_or_renamed_dataset(
        built: tuple[Path, Path, Path], moved: str, tmp_path: Path) -> None:
    data, cache, profile = built
    target = tmp_path / "d2" if moved == "renamed" else tmp_path / "elsewhere" / moved
    target.parent.mkdir(exist_ok=True)
    copy = copy_of(data, tmp_path / "copy").rename(target)
    result = verify_in_process(cache, profile, copy, "--live", "0")
    assert result.returncode == 0, tail(result)
    assert "changed" not in result.stdout + result.stderr


def test_an_edit_in_a_moved_copy_fails_verify_naming_only_that_episode_and_file(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, cache, profile = built
    copy = copy_of(data, tmp_path / "moved data")
    edited = edit_description(copy, "episode_0001")
    line = assert_one_line_error(verify_in_process(cache, profile, copy, "--live", "0"),
                                 "changed episode episode_0001", str(edited))
    assert "episode_0000" not in line


# ------------------------------------------------------------------------------------ make


def test_make_verify_takes_a_data_path_with_spaces_quotes_dollar_and_non_ascii(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, cache, profile = built
    copy = copy_of(data, tmp_path / AWKWARD)
    result = make("verify", CACHE=cache, DATA=copy, PROFILE=profile, NPROC=1, VERIFY_ARGS="--live 0 --checksums none")
    assert result.returncode == 0, tail(result)
    assert f"data {copy}" in result.stdout, tail(result)


def test_the_command_of_make_train_checks_a_moved_dataset_by_content_naming_only_the_edited_episode(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The command ``make train DATA=...`` runs (make's dry run: the path arrives as one word), on a
    rank started as torchrun starts it."""
    data, cache, profile = built
    copy = copy_of(data, tmp_path / AWKWARD)
    edited = edit_description(copy, "episode_0001")
    run = tmp_path / "run"
    command = make_command("train", CACHE=cache, DATA=copy, PROFILE=profile, RUN=run, TRAIN_ARGS="--no-export")
    assert command[command.index("--data") + 1] == str(copy), command
    result = train_on_ranks(*command[1:], nproc=1)
    assert result.returncode != 0, tail(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors and "changed episode episode_0001" in errors[0] and str(edited) in errors[0], tail(result)
    assert "episode_0000" not in errors[0]
    assert not (run / "checkpoints").exists()  # refused before any training step


def test_make_precompute_of_a_moved_dataset_resumes_its_cache_unchanged(
        built: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, cache, profile = built
    copy = copy_of(data, tmp_path / AWKWARD)
    before = file_digests(cache)
    result = make("precompute", DATA=copy, OUT=cache, PROFILE=profile, NPROC=1)
    assert result.returncode == 0, tail(result)
    assert file_digests(cache) == before
