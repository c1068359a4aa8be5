"""Readable training logs: one line per logged step, library chatter gone, and
Weights & Biases only when asked for.

The run: the session's reference run (helpers.shared_runs; real torchrun, 2 processes, DeepSpeed
ZeRO-3 over gloo) on a precomputed cache of 2 episodes x 4 steps, 10 optimizer steps with every
step logged, checkpoints, a live check every 5 steps, recorded outputs and the end-of-run export.
The step line and the ETA as functions are tests/unit/test_train_log_lines.py.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.shared_runs import ReferenceRun
from helpers.training import MAX_STEPS, TRAIN
from janus_train.loop.logs import WandbMissing, check_wandb
from janus_train.run.layout import METRICS_FILE

STEPS = MAX_STEPS
LINE_BUDGET = 25
STEP_LINE = re.compile(
    rf"^step (?P<step>\d+)/{STEPS} ep (?P<epoch>\d+) \| loss \d+\.\d{{4}} \(tok \d+\.\d{{4}} act \d+\.\d{{4}}\) grad \S+ \| "
    r"lr \d\.\d\de[-+]\d\d \| \d+\.\d\d samples/s wait \d+% \| eta (?P<eta>\d+:\d\d:\d\d)"
    r"(?P<live> \| live check: feature diff \S+, loss rel diff \S+)?$"  # the steps of train.live_check_every
)


def tiny_profile(path: Path, **train: object) -> Path:
    """The tiny profile (absolute model paths) with ``train`` overrides."""
    write_test_profile(path)
    data = yaml.safe_load(path.read_text())
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def run_output(reference_run: ReferenceRun) -> tuple[Path, list[str]]:
    return reference_run.out, reference_run.lines


def test_ten_steps_on_two_processes_print_one_line_per_step_within_the_budget(run_output) -> None:
    out, lines = run_output
    assert len(lines) <= LINE_BUDGET, f"{len(lines)} lines:\n" + "\n".join(lines)
    steps = [m for m in map(STEP_LINE.match, lines) if m]
    assert [int(m["step"]) for m in steps] == list(range(1, STEPS + 1)), "\n".join(lines)
    # 8 samples, 4 per step: 2 steps per epoch.
    assert [int(m["epoch"]) for m in steps] == [(s - 1) // 2 for s in range(1, STEPS + 1)]
    assert steps[-1]["eta"] == "0:00:00"
    live_every = TRAIN["live_check_every"]
    assert [int(m["step"]) for m in steps if m["live"]] == list(range(live_every, STEPS + 1, live_every))
    assert sum(line.startswith(f"training {STEPS} steps of 4 samples on 2 processes") for line in lines) == 1
    assert sum(line.startswith("exported consolidated weights to") for line in lines) == 1


def test_repeated_library_warnings_and_progress_chatter_are_gone(run_output) -> None:
    _, lines = run_output
    text = "\n".join(lines)
    for noise in ("FutureWarning", "is deprecated", "built successfully", "Setting accelerator to CPU",
                  "Processing zero checkpoint", "Gathering sharded weights", "Loading checkpoint shards", "Traceback"):
        assert noise not in text, f"{noise!r} in the log:\n{text}"
    repeated = {line for line in lines if lines.count(line) > 1 and line.strip("W* ")}
    assert all("torch/distributed/run.py" in line for line in repeated), repeated


def test_every_logged_record_is_strict_json_with_the_line_fields(run_output) -> None:
    out, _ = run_output

    def refuse(constant: str) -> None:
        raise AssertionError(f"metrics.jsonl holds {constant}")

    records = [json.loads(line, parse_constant=refuse) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert record["nonfinite_skips"] == 0
        assert 0.0 <= record["data_wait_share"] <= 1.0 and record["samples_per_s"] > 0


def wandb_installed() -> bool:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(wandb_installed(), reason="wandb is installed here: enabling it is not an error")
def test_enabling_weights_and_biases_without_the_package_is_a_one_line_error(tmp_path: Path) -> None:
    profile = tiny_profile(tmp_path / "wandb.yaml", wandb_project="janus-test")
    with pytest.raises(WandbMissing, match=r"wandb.yaml: setting 'train.wandb_project' is 'janus-test' but the "
                                           r"wandb package is not installed"):
        check_wandb("janus-test", profile)
    # The training entry refuses before starting any process group or reading the cache.
    result = subprocess.run([sys.executable, "-m", "pipelines.train", "--out", str(tmp_path / "run"),
                             "--cache", str(tmp_path / "cache"), "--profile", str(profile)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {profile}: setting 'train.wandb_project' is 'janus-test' but the wandb package is not installed: "
        "install the wandb extra (make setup EXTRAS=train,test,wandb), or leave the setting empty"]
    # The extra the line names is one janus declares.
    assert "wandb" in (importlib.metadata.metadata("janus").get_all("Provides-Extra") or [])
    assert not (tmp_path / "run").exists()
