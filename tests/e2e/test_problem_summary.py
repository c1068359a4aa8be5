"""What the precompute-side commands say about a dataset, through the CLI.

* ``janus-cache plan`` prints the problem summary ``index`` prints (count per reason, the first
  problems by file, where the full report goes) and ``--strict`` fails on it, as ``index --strict``
  does; ``make precompute`` prints the same summary with its plan.
* the same precompute run a second time on a complete cache says so at once: no plan, no sample
  measured, nothing written (its ranks started as torchrun starts them: helpers.forked_ranks).

The dataset has one of each problem a user meets: a truncated PNG, an unknown action, an episode
without ``milestones_result.json`` and a malformed frame JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.commands import make
from helpers.forked_ranks import forked_launch
from helpers.profiles import file_digests
from janus_core.sample_data import write_sample_data
from pipelines.cache_cli import app

runner = CliRunner()
KINDS = {"unreadable_image", "unknown_action", "missing_milestones", "malformed_json"}


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = write_sample_data(tmp_path_factory.mktemp("problems") / "data", episodes=3, steps=6, seed=0)
    first, second, third = sorted(p for p in data.iterdir() if p.is_dir())
    png = next(first.glob("step_0004_*.png"))
    png.write_bytes(png.read_bytes()[: png.stat().st_size // 2])  # truncated
    for old in second.glob("step_0002_*"):  # an action the model does not know
        old.rename(old.with_name(f"step_0002_JUMP{old.suffix}"))
    next(second.glob("step_0004_*.json")).write_text("{not json")
    (third / "milestones_result.json").unlink()
    return data


def problem_block(output: str) -> list[str]:
    """The summary's problem lines: from ``problems`` up to where the full report goes."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  problems "))
    end = next(i for i, line in enumerate(lines) if line.startswith("    full report: "))
    return lines[start : end + 1]


def test_plan_prints_the_problem_summary_of_index_and_strict_fails(bad_data: Path, tmp_path: Path) -> None:
    indexed = runner.invoke(app, ["index", str(bad_data)])
    assert indexed.exit_code == 0, indexed.output
    report = tmp_path / "problems.json"
    planned = runner.invoke(app, ["plan", str(bad_data), "--probe", "1", "--report", str(report)])
    assert planned.exit_code == 0, planned.output
    assert "zarr cache" in planned.output  # still the plan

    summary = problem_block(planned.output)
    # The same summary as index's, but for where the full report went.
    assert summary[:-1] == problem_block(indexed.output)[:-1]
    assert problem_block(indexed.output)[-1] == "    full report: not written (add --report FILE)"
    assert summary[-1] == f"    full report: {report}"
    counts = dict(line.split() for line in summary[1:] if len(line.split()) == 2 and line.split()[1].isdigit())
    assert KINDS <= set(counts)
    for name in ("step_0004_", "step_0002_JUMP.png", "milestones_result.json", "step_0004_"):
        assert any(name in line for line in summary), name
    listed = json.loads(report.read_text())["dataset_problems"]
    total = int(summary[0].split()[1])
    assert len(listed) == total and {p["reason"] for p in listed} >= KINDS

    strict = runner.invoke(app, ["plan", str(bad_data), "--probe", "1", "--strict"])
    assert strict.exit_code == 1
    errors = [line for line in strict.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "strict mode" in errors[0] and "milestones_result.json" in errors[0]
    assert "zarr cache" not in strict.output and "Traceback" not in strict.output


def test_make_precompute_shows_the_problems_and_a_second_run_says_at_once_the_cache_is_complete(
        bad_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "cache"
    first = make("precompute", DATA=bad_data, OUT=out, PROFILE="tiny", NPROC=2)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert f"plan for {bad_data} -> {out} (zarr, pad224, profile tiny):" in first.stdout.splitlines()
    indexed = runner.invoke(app, ["index", str(bad_data)])
    assert problem_block(first.stdout)[:-1] == problem_block(indexed.output)[:-1]
    assert problem_block(first.stdout)[-1] == f"    full report: {out / 'report.json'} (when the run ends)"
    written = file_digests(out)

    # The same command again (its ranks, started as torchrun starts them: helpers.forked_ranks).
    again = forked_launch("pipelines.precompute", bad_data, "--out", out, "--profile", "tiny")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert [line for line in said.splitlines() if "complete" in line] == [
        f"cache {out} is complete: 8 samples at pad224 (zarr), every shard committed; nothing to do "
        "(janus-cache verify checks its contents, --overwrite rebuilds it)"], said
    # Nothing measured, nothing written: no plan, no phase, no summary.
    assert not any(text in said for text in ("plan for", "ms/window", "[frames]", "[features]", "precompute done"))
    assert file_digests(out) == written
