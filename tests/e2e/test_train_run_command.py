"""``janus-train run`` starts a training run: torchrun with the profile's processes per node through
janus's launcher (the same process: the command replaces itself with it), each rank training with
the options that follow, exactly as ``make train`` does; the same command resumes the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profiles import REPO_ROOT
from helpers.shared_runs import ReferenceRun, TinyTraining
from helpers.training import TIMEOUT_S, assert_succeeded, read_metrics
from janus_train.run.layout import CHECKPOINTS_DIR
from janus_train.run.layout import METRICS_FILE

JANUS_TRAIN = str(Path(sys.executable).parent / "janus-train")
RESUME_AT = 6


def janus_train(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([JANUS_TRAIN, *map(str, args)], cwd=REPO_ROOT, env=dict(os.environ), capture_output=True,
                          text=True, check=False, timeout=TIMEOUT_S)


def test_janus_train_run_resumes_a_torchrun_run_and_trains_its_steps_alike(
        tiny_training: TinyTraining, reference_run: ReferenceRun, tmp_path: Path) -> None:
    """A run directory holding the reference run's step-6 checkpoint (a direct torchrun launch of 2
    processes, 10 steps) resumed by ``janus-train run`` with the same profile (its 2 processes) and
    cache: steps 7..10 repeat the reference run's losses, gradient norms and LRs."""
    out = tmp_path / "run"
    tag = f"step{RESUME_AT:08d}"
    shutil.copytree(reference_run.out / CHECKPOINTS_DIR / tag, out / CHECKPOINTS_DIR / tag)
    (out / CHECKPOINTS_DIR / "latest").write_text(tag)
    (out / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in reference_run.records[:RESUME_AT]))

    result = janus_train("run", "--out", out, "--profile", tiny_training.fp32_profile, "--cache",
                         tiny_training.fp32_cache, "--no-export")
    assert_succeeded(result)
    assert f"resumed at step {RESUME_AT}" in result.stdout
    resumed, expected = read_metrics(out)[RESUME_AT:], reference_run.records[RESUME_AT:]
    assert [r["step"] for r in resumed] == [r["step"] for r in expected] == list(range(RESUME_AT + 1, 11))
    for got, want in zip(resumed, expected):
        for name in ("loss", "grad_norm", "lr"):
            assert got[name] == pytest.approx(want[name], rel=1e-6, abs=1e-9), (got["step"], name)


def test_janus_train_run_with_an_unknown_profile_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    result = janus_train("run", "--out", tmp_path / "run", "--profile", "no-such-profile")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown profile 'no-such-profile'"), result.stderr
    assert not (tmp_path / "run").exists()


def test_a_start_the_ranks_refuse_leaves_no_run_directory(tmp_path: Path) -> None:
    """The ranks refuse a cache that does not exist: the run directory is not made for torchrun's
    report, which stays in the temporary folder that the launcher's line names."""
    out = tmp_path / "run"
    result = janus_train("run", "--out", out, "--cache", tmp_path / "no-cache", "--nproc", "1")
    assert result.returncode == 1
    *_, error, launcher = result.stderr.strip().splitlines()
    assert error.startswith(f"error: no cache exists at {tmp_path / 'no-cache'}")
    assert launcher.startswith("launcher: rank 0 exited with code 1; torchrun's report: ")
    assert Path(launcher.split("torchrun's report: ")[1]).is_file()
    assert not out.exists()


def test_janus_train_run_needs_a_run_directory() -> None:
    result = janus_train("run", "--cache", "cache")
    assert result.returncode == 2 and "Missing option '--out'" in result.stderr, result.stderr


def test_janus_train_run_help_train_lists_the_training_options() -> None:
    result = janus_train("run", "--help-train")
    assert result.returncode == 0, result.stderr
    assert all(option in result.stdout for option in ("--cache", "--data", "--max-steps", "--live-data", "--no-export"))
