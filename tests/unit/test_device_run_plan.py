"""The prepared GPU run's plan (benchmarks/device_run.py): every row the speed decisions wait on, most
needed first, budgets from the H100 run of make bench-gpu, part 2 taking what part 1 left, and the
decisions of both calls' files together. (The runs themselves: tests/e2e/test_device_run.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import device_run
from benchmarks.device_run import (
    BUILD_S,
    CALL_BUDGETS_S,
    FAILED,
    INTERRUPTED,
    OK,
    SKIPPED_FOR_TIME,
    STEP_REPEATS,
    STEP_WARMUP,
    TIMED_OUT,
    Expected,
    build_plan,
    part_2_rows,
)

ISSUE_ROWS = {
    # Qwen2.5-VL-7B: each policy, each lever and all on the best policy, micro-batches, the profiled best.
    "7b_full", "7b_every_2", "7b_every_4", "7b_none", "7b_vit_cache", "7b_liger", "7b_compile", "7b_all",
    "7b_mb2", "7b_mb4", "7b_best",
    # Qwen3-VL-8B at its best configuration.
    "q3_eager", "q3_best",
    # VGGT-1B at 644² for B = 4, 8, 16, each lever alone on CUDA's kernels, all together.
    "vggt_b4", "vggt_b8", "vggt_b16", "vggt_baseline", "vggt_dedup", "vggt_compile", "vggt_all",
    "vggt_kernel=flash3", "vggt_kernel=sdpa-cudnn", "vggt_kernel=sdpa-flash", "vggt_kernel=sdpa-efficient",
    # The CUDA bf16 difference of cached and live ViT output (compiled vs eager VGGT: vggt_compile's features).
    "vit_cache_numerics",
}


def test_the_plan_holds_every_row_of_the_issue_each_once() -> None:
    names = [row.name for row in build_plan("cuda", smoke=False)]
    assert len(names) == len(set(names))
    assert ISSUE_ROWS <= set(names)
    assert {row.section for row in build_plan("cuda", smoke=False)} == {"flops", "training", "numerics", "vggt"}


def test_the_rows_the_decisions_need_come_within_the_first_calls_budget() -> None:
    spent, first = 0.0, set()
    for row in build_plan("cuda", smoke=False):
        spent += row.budget_s
        if spent <= CALL_BUDGETS_S[0]:
            first.add(row.name)
    assert {"7b_full", "7b_every_2", "7b_every_4", "7b_none", "7b_vit_cache", "7b_compile", "7b_all", "7b_mb2",
            "7b_mb4", "vit_cache_numerics", "7b_best", "vggt_b4", "vggt_b8", "vggt_b16", "vggt_baseline",
            "vggt_compile", "vggt_all"} <= first
    total = sum(row.budget_s for row in build_plan("cuda", smoke=False))
    assert total < 1.3 * sum(CALL_BUDGETS_S)  # the rest are conditional rows, mostly not needed


def test_budgets_come_from_the_h100_run() -> None:
    expected = Expected.from_results()
    h100 = json.loads(device_run.H100_RESULTS.read_text())["training"]["rows"]
    assert expected.step_s["full"] == h100["janus_full"]["s_per_sample"]["median"]
    assert expected.step_s["none"] == expected.step_s["every_4"]  # out of memory on the H100: its neighbour's
    plan = {row.name: row for row in build_plan("cuda", smoke=False, expected=expected)}
    assert plan["7b_full"].budget_s == pytest.approx(BUILD_S + (STEP_WARMUP + STEP_REPEATS) * expected.step_s["full"])
    assert plan["vggt_b16"].budget_s > plan["vggt_b8"].budget_s
    assert all(row.budget_s == device_run.SMOKE_ROW_S for row in build_plan("cpu", smoke=True))


def test_part_2_runs_what_part_1_left_and_the_failed_rows_last() -> None:
    plan = build_plan("cuda", smoke=False)
    names = [row.name for row in plan]
    earlier = {name: {"status": OK} for name in names[:10]}
    earlier[names[1]] = {"status": FAILED}
    earlier[names[2]] = {"status": TIMED_OUT}
    earlier[names[3]] = {"status": INTERRUPTED}
    earlier[names[4]] = {"status": SKIPPED_FOR_TIME}
    earlier[names[5]] = {"status": "out of memory"}  # measured: its answer stands
    again = [row.name for row in part_2_rows(plan, earlier)]
    assert again == [names[2], names[3], names[4], *names[10:], names[1]]


def test_decide_merges_the_calls_rows_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def call(part: str, rows: dict[str, dict]) -> Path:
        path = tmp_path / f"part{part}.json"
        path.write_text(json.dumps({"run": {"part": part, "date": "2026-11-28 12:00 UTC", "smoke": True, "budget_s": 1,
                                            "seconds": 1, "device": "cpu"}, "plan": [], "rows": rows}))
        return path

    step = {"status": OK, "section": "training", "path": "janus", "base": "qwen2_5_vl", "checkpointing": "every_4",
            "levers": [], "micro_batch": 1, "model": "qwen2_5_vl_7b", "tokens_per_s": 5400.0, "mfu": None,
            "peak_gib": None, "resident_gib": None, "params": 8_343_000_000, "trainable_params": 7_710_000_000,
            "s_per_sample": {"median": 0.9, "min": 0.9, "max": 0.9}, "phases_s": {"backward": 0.6}}
    first = call("1", {"7b_every_4": step, "vggt_b4": {"status": SKIPPED_FOR_TIME, "section": "vggt", "note": "budget"}})
    second = call("2", {"vggt_b4": {"status": OK, "section": "vggt", "windows_per_call": 4, "tflop_per_s": 250.0,
                                    "windows_per_s": {"median": 4.1, "min": 4.0, "max": 4.2}, "peak_gib": None,
                                    "kernel": "sdpa-cudnn"}})
    device_run.decide_command([first, second], out=tmp_path / "decided")
    data = json.loads((tmp_path / "decided" / "device_run.json").read_text())
    assert data["rows"]["vggt_b4"]["status"] == OK and data["rows"]["7b_every_4"]["status"] == OK
    assert data["decisions"]["settings"]["train.gradient_checkpointing"] == "every_4"
    report = (tmp_path / "decided" / "device_run.md").read_text()
    assert "| 7b_every_4 | qwen2_5_vl_7b | every_4 |" in report and "| vggt_b4 | 4 | 9 (random) | 4.1 (4–4.2)" in report
    printed = capsys.readouterr().out
    assert "+  gradient_checkpointing: every_4" in printed and 'SET="train.gradient_checkpointing=every_4"' in printed
    assert (tmp_path / "decided" / "device_run_training.png").stat().st_size > 0
