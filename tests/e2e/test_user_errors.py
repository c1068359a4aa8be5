"""Training-side user errors are one line: through the public commands (`make
train`, `make precompute`, `janus-cache plan`) each listed mistake prints one ``error:`` line and
no traceback, and under make the last lines are janus's own: torchrun's child-failure report goes
to a log file that one ``launcher:`` line names.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.commands import TIMEOUT_S, assert_one_error_line, janus_lines, make, make_command  # noqa: F401
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.training import precompute
from janus_core.sample_data import write_sample_data

ERROR_EXIT = 2  # make's own exit code when a recipe fails


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real cache of 1 episode x 3 steps: 3 samples, fewer than one optimizer step of the tiny
    profile on 2 processes (micro-batch 1 x accumulation 2 x 2)."""
    root = tmp_path_factory.mktemp("user-errors")
    data = write_sample_data(root / "data", episodes=1, steps=3, seed=0)
    return precompute(data, root / "cache", write_test_profile(root / "tiny.yaml"))


def profile_with(path: Path, section: str, **settings: object) -> Path:
    write_test_profile(path)
    data = yaml.safe_load(path.read_text())
    data[section].update(settings)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("section, setting, value, expected", [
    ("cache", "history", 0, "setting 'cache.history' is 0; it must be >= 1"),
    ("train", "num_workers", -1, "setting 'train.num_workers' is -1; it must be >= 0"),
])
def test_a_bad_setting_is_one_line_naming_the_file_and_setting(
    cache: Path, tmp_path: Path, section: str, setting: str, value: int, expected: str,
) -> None:
    profile = profile_with(tmp_path / "bad.yaml", section, **{setting: value})
    result = make("train", PROFILE=profile, CACHE=cache, RUN=tmp_path / "run", NPROC=2)
    assert_one_error_line(result, str(profile), expected)


@pytest.mark.parametrize("content, reason", [
    ("zero_optimization:\n  stage: 3\n", "not JSON: Expecting value: line 1 column 1 (char 0)"),
    ('{"optimizer": {"type": "Adam"}}', "it sets 'optimizer', which janus's run sets itself: leave it out"),
], ids=["yaml", "optimizer"])
def test_a_deepspeed_file_that_is_not_a_deepspeed_config_is_one_line(
    cache: Path, tmp_path: Path, content: str, reason: str,
) -> None:
    """``train.deepspeed`` naming a YAML file or a JSON object setting what janus sets itself: one line naming the setting's file, the DeepSpeed file and why (before: a
    230-line traceback from inside the DeepSpeed config)."""
    deepspeed = tmp_path / "ds_config.json"
    deepspeed.write_text(content)
    profile = profile_with(tmp_path / "bad.yaml", "train", deepspeed=str(deepspeed))
    result = make("train", PROFILE=profile, CACHE=cache, RUN=tmp_path / "run", NPROC=1)
    assert_one_error_line(result, f"{profile}: setting 'train.deepspeed' names {deepspeed}, which is not a DeepSpeed "
                                  f"config for janus ({reason}); name a JSON object of DeepSpeed settings")


def test_a_run_directory_that_is_a_file_is_one_line(cache: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.write_text("not a directory")
    result = make("train", PROFILE=write_test_profile(tmp_path / "tiny.yaml"), CACHE=cache, RUN=run, NPROC=2)
    assert_one_error_line(result, str(run))


@pytest.fixture(scope="module")
def too_small_run(cache: Path, tmp_path_factory: pytest.TempPathFactory,
                  ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``make train`` of 2 processes on the 3-sample cache (fewer than one step): its run directory
    and result, made once for the two tests that read it."""
    root = tmp_path_factory.mktemp("too-small")
    run = root / "run"
    return run, make("train", PROFILE=write_test_profile(root / "tiny.yaml"), CACHE=cache, RUN=run, NPROC=2)


def test_a_cache_with_fewer_samples_than_one_step_is_one_line(
    cache: Path, too_small_run: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    _, result = too_small_run
    assert_one_error_line(result, f"{cache} holds 3 samples, fewer than one optimizer step takes",
                          "micro_batch 1 x grad_accum 2 x 2 processes = 4")


def test_a_failing_make_train_ends_with_janus_line_and_torchruns_report_is_in_the_log(
    too_small_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    """The rank's ``error:`` line, then one line naming the launcher's log; the exit code is make's
    failure code; the log holds torchrun's report of the failed rank."""
    run, result = too_small_run
    assert result.returncode == ERROR_EXIT
    assert_one_error_line(result)
    lines = janus_lines(result)
    # Both ranks fail alike; torchrun names the one it saw end first.
    assert lines[-2].startswith("error: ") and re.fullmatch(
        rf"launcher: rank [01] exited with code 1; torchrun's report: {re.escape(str(run / 'launcher.log'))}",
        lines[-1]), lines[-3:]
    report = (run / "launcher.log").read_text()
    assert "ChildFailedError" in report or "FAILED" in report
    assert "exitcode  : 1" in report


def test_paths_with_spaces_reach_make_s_commands_as_one_word_each(cache: Path, tmp_path: Path) -> None:
    """``make train RUN="victim x" CACHE="my cache"``: each path is one argument (the Makefile quotes
    them as it quotes DATA), so the run refuses the cache by its whole path, torchrun's report goes to
    RUN's own log, and a user's file ``victim`` beside RUN is left as it was (before: the report was
    appended to it and torchrun ran ``x/launcher.log``). ``OUT`` of precompute alike (make's dry run)."""
    victim = tmp_path / "victim"
    victim.write_text("a user's notes\n")
    spaced_cache = Path(shutil.copytree(cache, tmp_path / "my cache"))
    run = tmp_path / "victim x"
    result = make("train", PROFILE=write_test_profile(tmp_path / "tiny.yaml"), CACHE=spaced_cache, RUN=run, NPROC=2)
    assert_one_error_line(result, f"{spaced_cache} holds 3 samples, fewer than one optimizer step takes")
    assert janus_lines(result)[-1].endswith(f"exited with code 1; torchrun's report: {run / 'launcher.log'}")
    assert victim.read_text() == "a user's notes\n"
    assert "FAILED" in (run / "launcher.log").read_text()
    out = tmp_path / "it's my cache"
    command = make_command("precompute", DATA=tmp_path / "data", OUT=out)
    assert command[command.index("--out") + 1] == str(out), command


@pytest.mark.parametrize("resolution", ["garbage", "pad0", "pad13"])
def test_a_bad_resolution_is_one_line_on_every_command_that_takes_it(tmp_path: Path, resolution: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    plan = subprocess.run([str(Path(sys.prefix) / "bin" / "janus-cache"), "plan", str(data), "--resolution", resolution],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert_one_error_line(plan, repr(resolution))
    precompute_run = make("precompute", DATA=data, OUT=tmp_path / "cache", NPROC=2,
                          PRECOMPUTE_ARGS=f"--resolution {resolution}")
    assert_one_error_line(precompute_run, "--resolution", repr(resolution))


def test_the_launcher_exits_with_the_ranks_code_and_keeps_their_output(tmp_path: Path) -> None:
    """``python -m pipelines.launch`` (what make runs): the ranks' own lines reach the console, the
    exit code is the failed rank's (2: a bad command-line value), torchrun's report is in the log."""
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "logs" / "launcher.log"
    log.parent.mkdir()
    result = subprocess.run([sys.executable, "-m", "pipelines.launch", "--launcher-log", str(log), "--standalone",
                             "--nproc_per_node", "2", "-m", "pipelines.precompute", str(data), "--out",
                             str(tmp_path / "cache"), "--resolution", "crop0"],
                            cwd=REPO_ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=TIMEOUT_S)
    assert result.returncode == 2, result.stderr
    assert_one_error_line(result, "--resolution", "'crop0'")
    assert result.stderr.splitlines()[-1].endswith(f"exited with code 2; torchrun's report: {log}")
    report = log.read_text()
    assert "pipelines.precompute FAILED" in report and "exitcode  : 2" in report
