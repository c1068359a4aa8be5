"""The prepared GPU run through its script and command line, in the smoke mode (tiny models on the
CPU): every row ends with a status and the results files are written and readable; a row that
fails, runs out of memory or hangs is recorded and the next rows run, the deadline leaves the rest
skipped for time; the script's time limit interrupts a call whose files stay readable, and part 2
runs what part 1 left. Also: what the run imported is in the GPU machine's image or in the carried
wheels (benchmarks/device_env.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from benchmarks.device_env import device_problems
from benchmarks.device_run import (
    FAILED,
    INTERRUPTED,
    NOT_NEEDED,
    OK,
    OOM,
    SKIPPED_FOR_TIME,
    STATUSES,
    TIMED_OUT,
    UNAVAILABLE,
)
from helpers.profiles import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "device_run.sh"


def script(part: str, limit: int, out: Path, state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """benchmarks/device_run.sh PART LIMIT in the smoke mode with this interpreter."""
    environment = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "OUT": str(out), "DEVICE_RUN_STATE": str(state),
                   **env}
    return subprocess.run(["bash", str(SCRIPT), part, str(limit)], env=environment, capture_output=True, text=True,
                          timeout=600)


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.device_run", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def statuses(data: dict[str, Any]) -> dict[str, str]:
    return {name: row["status"] for name, row in data["rows"].items()}


@pytest.mark.slow
def test_the_smoke_run_of_the_script_gives_every_row_a_status_and_writes_readable_files(tmp_path: Path) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    done = script("1", 400, out, state)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "part1.json").read_text())
    planned = [row["name"] for row in data["plan"]]
    got = statuses(data)
    assert list(got) == planned and set(got.values()) <= set(STATUSES)
    for name in ("7b_full", "7b_every_2", "7b_every_4", "7b_none", "7b_vit_cache", "7b_compile", "7b_all", "7b_mb2",
                 "7b_mb4", "vit_cache_numerics", "7b_best", "vggt_b4", "vggt_b8", "vggt_b16", "vggt_baseline",
                 "vggt_all", "vggt_dedup", "flops_qwen2_5_vl", "flops_qwen3_vl", "q3_eager"):
        assert got[name] == OK, (name, data["rows"][name])
    assert got["7b_liger"] in (UNAVAILABLE, FAILED, OK)  # liger-kernel is optional (and needs Triton)
    assert got["vggt_compile"] == NOT_NEEDED  # inductor takes minutes on a CPU: tests/e2e/test_vggt_compile.py
    rows = data["rows"]
    assert rows["7b_mb4"]["micro_batch"] == 4 and rows["7b_vit_cache"]["levers"] == ["vit_cache"]
    assert rows["vit_cache_numerics"]["within_tolerance"] and rows["vggt_dedup"]["vs_baseline"]["identical"]
    assert rows["vggt_dedup"]["frames_per_window"] < 9 and rows["q3_eager"]["base"] == "qwen3_vl"
    # The report names every row; the plots, the profile trace and the log are there and readable.
    report = (out / "part1.md").read_text()
    assert all(f"| {name}" in report for name in planned if not name.startswith("flops") and name != "vit_cache_numerics")
    assert "## Decisions" in report and "Top operators of one janus step" in report
    for plot in ("part1_training.png", "part1_vggt.png"):
        with Image.open(out / plot) as image:
            assert image.size[0] > 500
    with gzip.open(out / "part1_profile_trace.json.gz") as trace:
        assert json.load(trace)["traceEvents"]
    assert rows["7b_best"]["profile"]["trace"] == "part1_profile_trace.json.gz"
    log = (out / "part1.log").read_text()
    assert "device_run.sh part 1: exit status 0" in log and "[part1 1/" in log
    assert json.loads((state / "part1.json").read_text())["rows"] == rows  # kept for part 2
    decisions = data["decisions"]
    assert decisions["training"]["row"] in rows and set(decisions["settings"]) >= {"train.gradient_checkpointing"}
    # Everything the run imported is in the GPU machine's image or in the carried wheels.
    assert "transformers" in data["run"]["imported"] and "zarr" in data["run"]["imported"]
    assert device_problems(data["run"]["imported"]) == []


@pytest.mark.slow
def test_a_failing_an_out_of_memory_and_a_hanging_row_are_recorded_and_the_deadline_skips_the_rest(tmp_path: Path) -> None:
    rows = ("7b_full", "7b_every_2", "7b_every_4", "7b_none", "vggt_b4")
    # 20 s: the first two rows fail at once, the third hangs until the deadline (less the 5 s kept
    # for the last write), the rest find no time left; slack for a loaded machine's writes.
    done = command("run", "--smoke", "--out", str(tmp_path), "--budget-s", "20", *(a for r in rows for a in ("--only", r)),
                   "--simulate", "7b_full=oom", "--simulate", "7b_every_2=error", "--simulate", "7b_every_4=hang")
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((tmp_path / "part1.json").read_text())
    assert statuses(data) == {"7b_full": OOM, "7b_every_2": FAILED, "7b_every_4": TIMED_OUT,
                              "7b_none": SKIPPED_FOR_TIME, "vggt_b4": SKIPPED_FOR_TIME}
    assert data["rows"]["7b_every_2"]["error"] == "SimulatedFailure: a simulated failure (--simulate)"
    assert data["rows"]["7b_every_4"]["seconds"] < 20
    assert "SimulatedFailure" in done.stderr  # its traceback goes to the log
    report = (tmp_path / "part1.md").read_text()
    assert "| 7b_full | out of memory: OutOfMemoryError: CUDA out of memory (simulated by --simulate)" in report
    assert "| 7b_none | skipped for time: budget 4 s" in report
    assert "[part1 5/5] vggt_b4: skipped for time" in done.stdout


@pytest.mark.slow
def test_the_time_limit_interrupts_part_1_and_part_2_runs_the_rows_it_left(tmp_path: Path) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    # SIGTERM 15 s before the 45 s limit: after Python's start (~8 s idle, ~25 s on a loaded machine),
    # before the hanging row's own stop (the deadline, 35 s after the start).
    cut = script("1", 45, out, state, RESERVE_S="5",
                 DEVICE_RUN_ARGS="--only 7b_full --only vggt_b4 --simulate 7b_full=hang")
    assert cut.returncode == 124, cut.stdout[-3000:]
    first = json.loads((out / "part1.json").read_text())
    assert statuses(first) == {"7b_full": INTERRUPTED, "vggt_b4": INTERRUPTED}
    assert first["rows"]["vggt_b4"]["note"] == "not started: SIGTERM"
    assert "device_run.sh part 1: exit status 124" in (out / "part1.log").read_text()
    rest = script("2", 120, out, state, DEVICE_RUN_ARGS="--only vggt_b4")
    assert rest.returncode == 0, rest.stdout[-3000:]
    second = json.loads((out / "part2.json").read_text())
    assert statuses(second) == {"vggt_b4": OK} and second["run"]["earlier_rows"] == ["7b_full", "vggt_b4"]
