"""`janus-cache bench` runs the CPU bench, which lives in the ``benchmarks`` package above the launch
layer: the command starts it as its own program from any folder, passing its arguments on and
returning its exit status; results go to ``benchmarks/results/`` by default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers.profiles import REPO_ROOT


def janus_cache(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "250"}  # this tree; no wrapped help lines
    return subprocess.run([str(Path(sys.executable).parent / "janus-cache"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_janus_cache_bench_shows_the_benchmarks_options_and_their_results_folder(tmp_path: Path) -> None:
    shown = janus_cache("bench", "--help", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "--repeats" in shown.stdout and "--steps" in shown.stdout and "--workers" in shown.stdout
    assert f"[default: {REPO_ROOT / 'benchmarks' / 'results'}]" in shown.stdout


def test_janus_cache_bench_passes_a_wrong_option_on_and_exits_with_the_benchs_status(tmp_path: Path) -> None:
    refused = janus_cache("bench", "--repeats", "0", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert refused.returncode == 2
    assert "Invalid value for '--repeats'" in refused.stderr
    assert not (tmp_path / "out").exists()  # refused before measuring anything
