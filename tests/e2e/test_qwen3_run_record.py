"""A real Qwen3-VL run trained live: ``--live-data`` makes Qwen3-VL's frames and VGGT's
paired frames from the source PNGs and trains; the run directory records its base, and the installed
``janus-train export RUN --profile P`` and a resume with a Qwen2.5-VL profile are refused in one line
naming the run and both bases, before any checkpoint is read.

The data: 2 episodes x 3 steps of sample data, trained live by 1 process for 2 steps (the tests'
training profile on the tiny Qwen3-VL, tests/helpers/training.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.commands import assert_one_error_line
from helpers.training import assert_succeeded, read_metrics, train_on_ranks, write_train_profile
from janus_train.run.layout import RunLayout

QWEN3_DIR = Path(__file__).resolve().parents[2] / "configs" / "models" / "tiny-qwen3_vl"
JANUS_TRAIN = str(Path(sys.executable).parent / "janus-train")
STEPS = 2


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from janus_core.sample_data import write_sample_data

    root = tmp_path_factory.mktemp("qwen3-live-run")
    qwen3 = write_train_profile(root / "qwen3.yaml", train={"save_every": STEPS})
    data = yaml.safe_load(qwen3.read_text())
    data["qwen"]["path"] = str(QWEN3_DIR)
    qwen3.write_text(yaml.safe_dump(data, sort_keys=False))
    run, source = root / "run", write_sample_data(root / "data", episodes=2, steps=3, seed=3)
    assert_succeeded(train_on_ranks("--out", run, "--live-data", source, "--profile", qwen3, "--max-steps", STEPS,
                                    "--no-export", nproc=1))
    return {"run": run, "data": source, "qwen3": qwen3, "qwen25": write_train_profile(root / "qwen25.yaml")}


def test_a_qwen3_run_trains_live_and_records_its_base(live_run: dict[str, Path]) -> None:
    records = read_metrics(live_run["run"])
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["loss"]) for r in records)
    starts = json.loads(RunLayout(live_run["run"]).run_file.read_text())["starts"]
    assert [s["base"] for s in starts] == ["qwen3_vl"]


def test_export_and_resume_with_a_qwen25_profile_are_refused_in_one_line(live_run: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    run, qwen25 = live_run["run"], live_run["qwen25"]
    naming = (f"run {run} trained a Qwen3-VL model (qwen3_vl, run.json) but {qwen25} names a Qwen2.5-VL model",
              "give a profile of a Qwen3-VL model (leave out --profile to use the run's own)")
    exported = subprocess.run([JANUS_TRAIN, "export", str(run), "--out", str(tmp_path / "export"), "--profile",
                               str(qwen25)], capture_output=True, text=True, timeout=300, check=False)
    assert_one_error_line(exported, *naming)
    assert not (tmp_path / "export").exists()
    before = RunLayout(run).run_file.read_bytes()
    resumed = train_on_ranks("--out", run, "--live-data", live_run["data"], "--profile", qwen25,
                             "--max-steps", STEPS + 1, nproc=1)
    errors = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]  # torchrun adds its report
    assert resumed.returncode != 0 and len(errors) == 1 and all(text in errors[0] for text in naming), resumed.stderr
    assert RunLayout(run).run_file.read_bytes() == before  # the refused start is not recorded
