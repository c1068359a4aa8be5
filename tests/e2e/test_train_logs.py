"""Readable training logs (issue 14, item 4): one line per logged step, library chatter gone, and
Weights & Biases only when asked for.

The run: the tiny profile as `make train` starts it (real torchrun, 2 processes, DeepSpeed ZeRO-3
over gloo) on a precomputed cache of 2 episodes x 4 steps, 12 optimizer steps with every step
logged, a checkpoint at step 10 and 12 and the end-of-run export.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.profiles import REPO_ROOT, write_test_profile
from helpers.training import assert_succeeded, precompute, torchrun_train

from janus_cache.sample_data import write_sample_data
from janus_train.logs import Eta, WandbMissing, check_wandb, step_line
from janus_train.trainer import METRICS_FILE

STEPS = 12
LINE_BUDGET = 25
STEP_LINE = re.compile(
    r"^step (?P<step>\d+)/12 ep (?P<epoch>\d+) \| loss \d+\.\d{4} \(tok \d+\.\d{4} act \d+\.\d{4}\) grad \S+ \| "
    r"lr \d\.\d\de[-+]\d\d \| \d+\.\d\d samples/s wait \d+% \| eta \d+:\d\d:\d\d$"
)


def tiny_profile(path: Path, **train: object) -> Path:
    """The tiny profile (absolute model paths) with enough epochs for 12 steps and ``train`` overrides."""
    write_test_profile(path)
    data = yaml.safe_load(path.read_text())
    data["train"].update({"epochs": 100, "max_steps": STEPS, **train})
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("logs")
    data = write_sample_data(root / "data", episodes=2, steps=4, seed=0)
    profile = tiny_profile(root / "tiny.yaml")
    cache = precompute(data, root / "cache", profile)
    out = root / "run"
    result = torchrun_train("--out", out, "--cache", cache, "--profile", profile)
    assert_succeeded(result)
    return out, (result.stdout + result.stderr).splitlines()


def test_twelve_steps_on_two_processes_print_one_line_per_step_within_the_budget(run_output) -> None:
    out, lines = run_output
    assert len(lines) <= LINE_BUDGET, f"{len(lines)} lines:\n" + "\n".join(lines)
    steps = [m for m in map(STEP_LINE.match, lines) if m]
    assert [int(m["step"]) for m in steps] == list(range(1, STEPS + 1)), "\n".join(lines)
    # 8 samples, 4 per step: 2 steps per epoch.
    assert [int(m["epoch"]) for m in steps] == [(s - 1) // 2 for s in range(1, STEPS + 1)]
    assert steps[-1].group(0).endswith("eta 0:00:00")
    assert sum(line.startswith("training 12 steps of 4 samples on 2 processes") for line in lines) == 1
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


def test_the_line_names_step_total_epoch_loss_parts_lr_speed_wait_and_eta() -> None:
    record = {"step": 30, "epoch": 2, "loss": 1.5, "token_loss": 1.25, "action_loss": 0.25, "grad_norm": 0.5,
              "lr": 1e-4, "samples_per_s": 12.5, "data_wait_share": 0.07, "step_s": 2.0, "nonfinite_skips": 0}
    assert step_line(record, 100, eta_s=3725.4) == (
        "step 30/100 ep 2 | loss 1.5000 (tok 1.2500 act 0.2500) grad 0.5 | lr 1.00e-04 | 12.50 samples/s "
        "wait 7% | eta 1:02:05")
    skipped = {**record, "loss": None, "token_loss": None, "grad_norm": None, "nonfinite_skips": 1}
    assert step_line(skipped, 100, 0.0).startswith("step 30/100 ep 2 | loss nan (tok nan act 0.2500) grad nan")
    assert step_line(skipped, 100, 0.0).endswith("| eta 0:00:00 | non-finite skips 1")


def test_the_eta_averages_the_steps_after_the_first() -> None:
    eta = Eta(total_steps=10)
    eta.update(1, now=100.0)  # a slow first step (warm-up) is not averaged in
    assert eta.seconds_left(step_s=50.0) == 50.0 * 9
    eta.update(2, now=102.0)
    eta.update(4, now=106.0)
    assert eta.seconds_left(step_s=50.0) == pytest.approx(2.0 * 6)


def wandb_installed() -> bool:
    try:
        import wandb  # noqa: F401
    except ImportError:
        return False
    return True


def test_weights_and_biases_is_off_unless_the_profile_names_a_project(tmp_path: Path) -> None:
    check_wandb("", tmp_path / "p.yaml")  # off: nothing to check, whether or not it is installed


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
        f"error: {profile}: setting 'train.wandb_project' is 'janus-test' but the wandb package is not installed "
        "(pip install wandb, or leave the setting empty)"]
    assert not (tmp_path / "run").exists()
