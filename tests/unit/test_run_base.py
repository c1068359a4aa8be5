"""A run directory records the base model it trains: each start's entry in ``run.json``
names ``qwen.path``'s ``model_type``; once the run holds a checkpoint, ``janus-train export RUN
--profile P`` and a resume with a profile of another base are refused in one line naming the run,
both bases and the fix (not an error deep in model loading). A run recorded before runs named their
base trained Qwen2.5-VL. In this process: run records written by the trainer's own record function,
the export command through its CLI (the refusal comes before any checkpoint is read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from janus_core.bases import QWEN2_5_VL, QWEN3_VL
from janus_core.profile import Profile, ProfileError, load_profile
from janus_train.config import load_train_settings
from janus_train.run.layout import RunLayout
from janus_train.run.provenance import append_start, recorded_base, run_profile, write_profile
from pipelines.train_cli import app


@pytest.fixture(autouse=True)
def no_git(monkeypatch: pytest.MonkeyPatch) -> None:
    """A start records janus's git commit by running git, a process the unit tier starts none of;
    the commit is not what these tests are about."""
    monkeypatch.setattr("janus_train.run.provenance.git_state", lambda: {"git_commit": None, "git_dirty": None})


def trained_run(run: Path, profile: Profile) -> RunLayout:
    """A run directory as a start with ``profile`` records it, holding a (step 2) checkpoint."""
    layout = RunLayout(run)
    write_profile(layout, profile, load_train_settings(profile))
    append_start(layout, profile, world=2, caches=[])
    layout.checkpoints.mkdir(parents=True)
    layout.latest.write_text("step00000002")
    return layout


def test_each_start_records_its_base(tmp_path: Path) -> None:
    qwen3, qwen25 = load_profile("tiny-qwen3"), load_profile("tiny")
    layout = trained_run(tmp_path / "run", qwen3)
    assert [s["base"] for s in json.loads(layout.run_file.read_text())["starts"]] == ["qwen3_vl"]
    assert recorded_base(layout.root) is QWEN3_VL
    append_start(RunLayout(tmp_path / "other"), qwen25, world=1, caches=[])
    assert recorded_base(tmp_path / "other") is QWEN2_5_VL


@pytest.mark.parametrize("trained, given", [("tiny-qwen3", "tiny"), ("tiny", "tiny-qwen3")])
def test_a_profile_of_another_base_is_refused_for_resume_and_export_in_one_line(
    tmp_path: Path, trained: str, given: str,
) -> None:
    run = tmp_path / "run"
    trained_run(run, load_profile(trained))
    other = load_profile(given)
    was, now = (QWEN3_VL, QWEN2_5_VL) if trained == "tiny-qwen3" else (QWEN2_5_VL, QWEN3_VL)
    expected = (f"run {run} trained a {was.name} model ({was.model_type}, run.json) but {other.source} names a "
                f"{now.name} model (qwen.path {other.qwen.path}); give a profile of a {was.name} model (leave out "
                f"--profile to use the run's own), or train {now.name} into a new --out")
    with pytest.raises(ProfileError) as resumed:  # what pipelines.train and export read the profile with
        run_profile(run, given)
    assert str(resumed.value) == expected

    result = CliRunner().invoke(app, ["export", str(run), "--out", str(tmp_path / "export"), "--profile", given])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"error: {expected}"]
    assert not (tmp_path / "export").exists()
    assert run_profile(run, trained).name == trained  # the run's own base passes this check


def test_a_run_recorded_before_the_base_was_recorded_is_qwen25s(tmp_path: Path) -> None:
    """A run.json whose starts have no ``base`` (older janus) reads as Qwen2.5-VL: a Qwen2.5-VL
    profile exports it, a Qwen3-VL one is refused. Checkpoints without a run.json (copied alone) name
    no base and are left to the model loading."""
    run = tmp_path / "run"
    layout = trained_run(run, load_profile("tiny"))
    record = json.loads(layout.run_file.read_text())
    for start in record["starts"]:
        del start["base"]
    layout.run_file.write_text(json.dumps(record))
    assert recorded_base(run) is QWEN2_5_VL
    assert run_profile(run, "tiny").name == "tiny"
    with pytest.raises(ProfileError, match=r"trained a Qwen2\.5-VL model \(qwen2_5_vl, run\.json\) but .* names a "
                                           r"Qwen3-VL model"):
        run_profile(run, "tiny-qwen3")
    layout.run_file.unlink()  # checkpoints without any record (copied alone): nothing to check against
    assert recorded_base(run) is None
    assert run_profile(run, "tiny-qwen3").name == "tiny-qwen3"


def test_a_run_without_a_checkpoint_may_start_again_with_another_base(tmp_path: Path) -> None:
    """A start refused before its first checkpoint binds nothing: another base may start the run."""
    run = tmp_path / "run"
    layout = trained_run(run, load_profile("tiny"))
    layout.latest.unlink()
    assert run_profile(run, "tiny-qwen3").name == "tiny-qwen3"
