"""The `janus-cache` command line, run in this process: exit codes and one-line reasons. (The
installed entry point as a process: tests/e2e/test_cli_installed.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from pipelines.cache_cli import app


runner = CliRunner()


def test_sample_data_refuses_a_non_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("user data")
    result = runner.invoke(app, ["sample-data", str(tmp_path)])
    assert result.exit_code == 1
    assert "exists and is not empty" in result.output
    assert (tmp_path / "keep.txt").read_text() == "user data"


def test_index_strict_fails_with_a_one_line_reason_naming_the_file(sample_dataset: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(sample_dataset, data)
    episode = sorted(p for p in data.iterdir() if p.is_dir())[0]
    (episode / "milestones_result.json").write_text("{not json")
    lenient = runner.invoke(app, ["index", str(data)])
    assert lenient.exit_code == 0, lenient.output
    assert "milestones_result.json" in lenient.output
    strict = runner.invoke(app, ["index", str(data), "--strict"])
    assert strict.exit_code == 1
    assert "milestones_result.json" in strict.output


def test_index_of_a_missing_folder_fails_cleanly(tmp_path: Path) -> None:
    result = runner.invoke(app, ["index", str(tmp_path / "nowhere")])
    assert result.exit_code == 1
    assert "nowhere" in result.output


def test_profile_command_validates_and_shows_settings() -> None:
    ok = runner.invoke(app, ["profile", "tiny"])
    assert ok.exit_code == 0, ok.output
    assert "resolution pad224" in ok.output
    bad = runner.invoke(app, ["profile", "nonexistent"])
    assert bad.exit_code == 1
    assert "unknown profile 'nonexistent'" in bad.output
