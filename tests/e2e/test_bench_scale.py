"""The scale benchmark at a tiny size: it builds hard-linked datasets, runs every stage as a real
process and prints the table of costs with their growth, and the targets' verdicts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.profiles import REPO_ROOT

METRICS = ("python + imports", "index 1st", "index 2nd", "plan 1st", "plan 2nd", "precompute", "resume", "verify", "start-up check",
           "read")


def test_bench_scale_runs_at_a_tiny_size_and_prints_the_table(tmp_path: Path) -> None:
    results = tmp_path / "results" / "scale.json"
    run = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_scale.py"), "--sizes", "40,120",
         "--precompute-sizes", "40", "--steps", "10", "--nproc", "1", "--work", str(tmp_path / "work"),
         "--results", str(results)],
        capture_output=True, text=True, timeout=1200, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    # Hard links: the 120-sample dataset's frames share the template's inodes.
    data = tmp_path / "work" / "data-120"
    episodes = sorted(p for p in data.iterdir() if p.is_dir())
    assert len(episodes) == 12
    frame = next(episodes[-1].glob("step_0009_*.png"))
    assert os.stat(frame).st_nlink > 2

    table = run.stdout[run.stdout.index("| cost |"):]
    assert "| cost | no data | 40 samples | 120 samples | per 10x samples (wall) | (cpu) |" in table
    for metric in METRICS:
        assert f"| {metric} |" in table, metric
    for metric in ("index 1st", "index 2nd", "plan 1st", "plan 2nd"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {metric} |"))
        wall, cpu = row.split("|")[-3:-1]
        assert wall.strip().startswith("x") and cpu.strip().startswith("x"), row  # two sizes: a growth
    assert "read latency at 40 samples: ms per sample" in table
    assert "second plan >= 5x faster than the first" in run.stdout
    # The memory targets of the dataset-sized costs: verify --data and the first index build.
    for target, samples in (("verify --data RSS <= 1 GB", 40), ("first index build RSS <= 1 GB", 120)):
        assert re.search(rf"^PASS {re.escape(target)}: \d+ MB at {samples}$", run.stdout, re.MULTILINE), target
    saved = json.loads(results.read_text())
    measured = {(m["metric"], m["samples"]) for m in saved["measures"] if m["ok"] and m["seconds"] > 0}
    assert {(m, 40) for m in METRICS[1:]} | {(METRICS[0], 0)} <= measured
    assert results.with_suffix(".md").read_text().startswith("# bench_scale")
