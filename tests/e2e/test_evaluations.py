"""External evaluation of every checkpoint (``train.eval_command``): asynchronous, its results logged
on their own axis and used to keep the best checkpoint; failures told in one line; a preempted run
neither loses a pending evaluation nor starts one twice; ``janus-train evals`` collects late results.

Real components: the session's 2-episode cache, ``make train`` (2 processes, ZeRO-3 on gloo) and a
launch through ``pipelines.launch`` stopped by SIGTERM, the detached jobs janus starts (each exports
the checkpoint with janus's own export, then runs the command), and an evaluator process,
``helpers/scripted_evaluator.py``, that loads the export with transformers (through the example
evaluator, ``examples/eval/evaluate_export.py``), waits for what the test's plan says and writes its
results (or fails, or hands the work on and exits at once, as ``sbatch`` does).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.commands import make
from helpers.profiles import REPO_ROOT
from helpers.shared_runs import TinyTraining
from helpers.training import assert_succeeded, read_metrics, stop_when, train_on_ranks, write_train_profile
from janus_train.evals.evaluations import pinned_tags
from janus_train.loop.preemption import PREEMPTED_EXIT_CODE
from janus_train.run.layout import RunLayout

EVALUATOR = REPO_ROOT / "tests" / "helpers" / "scripted_evaluator.py"
JANUS_TRAIN = Path(sys.prefix) / "bin" / "janus-train"
TIMEOUT_S = 300


def evaluator_command(plan: Path, export: bool) -> str:
    return (f"{sys.executable} {EVALUATOR} {plan} {{step}} {{results}} {{run}} {{checkpoint}}"
            + (" {export}" if export else ""))


def evaluation_profile(path: Path, plan: dict[str, Any], export: bool, **train: Any) -> Path:
    """The test's training settings with an evaluation after every save, best by eval/SR."""
    plan_file = path.with_name(f"{path.stem}-plan.json")
    plan_file.write_text(json.dumps(plan))
    return write_train_profile(path, cache={"feature_dtype": "float32"}, train={
        "max_steps": 6, "live_check_every": 0, "eval_command": evaluator_command(plan_file, export),
        "best_metric": "eval/SR", "best_metric_mode": "max", **({} if export else {"eval_export": "none"}),
        **train})


def evaluations(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in records if "eval_step" in record]


def janus_evals(run: Path, told: list[str] | None = None) -> list[str]:
    """``janus-train evals RUN``: its listing (stdout); the lines it told on stderr go to ``told``."""
    result = subprocess.run([str(JANUS_TRAIN), "evals", str(run)], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    if told is not None:
        told += result.stderr.splitlines()
    return result.stdout.splitlines()


def listed(lines: list[str], tag: str) -> str:
    """The listing's line of checkpoint ``tag``, without the tag."""
    found = [line.strip().removeprefix(tag).strip() for line in lines if line.strip().startswith(tag)]
    assert len(found) == 1, lines
    return found[0]


# ------------------------------------------------------------- make train, with janus's own export


@pytest.fixture(scope="module")
def evaluated(tiny_training: TinyTraining, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``make train`` of 6 steps with a checkpoint every 3 and only one kept (save_total_limit 1),
    each evaluated on its janusvln export (the tiny Qwen2.5-VL's natural format): step 3's evaluator
    waits until the run's ``latest`` names step 6, then writes SR 0.3; step 6's writes SR 0.6."""
    root = tmp_path_factory.mktemp("evaluated")
    plan = {"3": {"metrics": {"SR": 0.3}, "wait": {"latest": "step00000006"}}, "6": {"metrics": {"SR": 0.6}}}
    profile = evaluation_profile(root / "profile.yaml", plan, export=True, save_every=3, save_total_limit=1)
    run = root / "run"
    result = make("train", PROFILE=profile, CACHE=tiny_training.fp32_cache, RUN=run, NPROC="2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return {"run": run, "result": result, "records": read_metrics(run)}


def test_training_goes_on_while_a_checkpoint_is_evaluated_and_its_results_arrive_later(evaluated: dict) -> None:
    """Step 3's evaluator finishes only once the run has saved step 6: had training waited for it,
    the run would never have got there. Its results come into metrics.jsonl after the later steps'
    records, each metric as eval/<NAME> with the step it evaluated (eval_step), logged at a step of
    the run (the file stays in step order)."""
    records = evaluated["records"]
    step_records = [i for i, r in enumerate(records) if "eval_step" not in r]
    assert [records[i]["step"] for i in step_records] == list(range(1, 7))
    assert step_records[-1] < next(i for i, r in enumerate(records) if r.get("eval_step") == 3)
    assert [r["step"] for r in records] == sorted(r["step"] for r in records)
    by_step = {r["eval_step"]: r for r in evaluations(records)}
    assert sorted(by_step) == [3, 6]
    assert by_step[3]["eval/SR"] == 0.3 and by_step[6]["eval/SR"] == 0.6
    # The export loaded and ran: the example evaluator's metrics came with the plan's.
    assert 0.0 <= by_step[3]["eval/action_accuracy"] <= 1.0 and by_step[3]["eval/samples"] == 2.0
    output = evaluated["result"].stdout
    assert f"evaluating checkpoint step00000003 in the background: {evaluated['run']}/evals/step00000003/eval.log" \
        in output
    assert re.search(r"^evaluation of step 3: eval/SR 0\.3 ", output, re.MULTILINE), output


def test_the_best_follows_the_best_evaluated_checkpoint_and_retention_keeps_pending_ones(evaluated: dict) -> None:
    """save_total_limit 1 would have deleted step 3 at step 6's save: its evaluation was pending, so
    it stayed (its evaluator found it there). The best by eval/SR is step 6 (0.6 > 0.3): a DeepSpeed
    checkpoint whose files are step 6's (hard links). Each export was removed once its results came."""
    run = evaluated["run"]
    layout = RunLayout(run)
    by_step = {r["eval_step"]: r for r in evaluations(evaluated["records"])}
    assert by_step[3]["eval/checkpoint_present"] == 1.0
    assert json.loads((layout.best / "best.json").read_text()) == {"metric": "eval/SR", "value": 0.6, "step": 6}
    assert by_step[6]["eval_best"] is True
    step6 = layout.checkpoints / "step00000006"
    for path in step6.rglob("*.pt"):
        assert os.path.samefile(path, layout.best / path.relative_to(step6)), path
    assert not (layout.evaluation("step00000003").export).exists()
    assert not (layout.evaluation("step00000006").export).exists()
    # Nothing pending now: only the best is kept beyond the rotation's count.
    assert pinned_tags(layout) == {"step00000006"}


def test_janus_train_evals_lists_a_finished_runs_evaluations(evaluated: dict) -> None:
    lines = janus_evals(evaluated["run"])
    assert re.fullmatch(r"done +eval/SR 0\.3 .*", listed(lines, "step00000003")), lines
    assert re.fullmatch(r"done +eval/SR 0\.6 .*  \(best\)", listed(lines, "step00000006")), lines
    assert lines[-1] == f"best by eval/SR: checkpoint step 6 (0.6), {evaluated['run']}/checkpoints/best"


# ------------------------------------------- preempted with an evaluation pending, resumed, collected


def test_a_preempted_run_neither_loses_a_pending_evaluation_nor_starts_one_twice(
        tiny_training: TinyTraining, tmp_path: Path) -> None:
    """8 steps, a checkpoint every 2, nothing exported (eval_export: none). The evaluators of steps 2
    and 4 run until the run has been resumed; SIGTERM stops the run once step 4's evaluation started,
    and then the cluster kills step 4's job (its process group), as a preempted job's processes die.
    ``janus-train evals`` lists step 2 running, step 4 lost. The resume leaves step 2 to finish (not
    started again) and starts step 4 once more; each one's results are logged once. Step 6's
    evaluator fails (exit 3): one warning line, the run goes on. Step 8's hands its work on and exits
    0 at once (a scheduler's job): the run does not wait for it, and ``janus-train evals`` collects
    its results once they exist."""
    release = tmp_path / "release"
    plan = {"2": {"metrics": {"SR": 0.5}, "wait": {"starts": 2}}, "4": {"metrics": {"SR": 0.4}, "wait": {"starts": 2}},
            "6": {"exit": 3}, "8": {"metrics": {"SR": 0.7}, "hand_on": True, "wait": {"file": str(release)}}}
    profile = evaluation_profile(tmp_path / "profile.yaml", plan, export=False, max_steps=8, save_every=2,
                                 save_total_limit=10, eval_wait_minutes=2)
    run = tmp_path / "run"
    layout = RunLayout(run)
    step2, step4, step8 = (layout.evaluation(f"step0000000{n}") for n in (2, 4, 8))
    args = ["--out", str(run), "--cache", str(tiny_training.fp32_cache), "--profile", str(profile), "--no-export"]
    command = [sys.executable, "-m", "pipelines.launch", "--launcher-log", str(run / "launcher.log"), "--standalone",
               "--nproc_per_node=2", "-m", "pipelines.train", *args]
    try:
        stopped = stop_when(command, step4.job.is_file)
        assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout[-3000:] + stopped.stderr[-3000:]
        stopped_at = int(re.search(r"stopped by SIGTERM after step (\d+)", stopped.stderr).group(1))
        assert stopped_at < 8
        os.killpg(json.loads(step4.job.read_text())["pid"], signal.SIGKILL)
        assert {"step00000002", "step00000004"} <= pinned_tags(layout)
        told: list[str] = []  # what janus-train evals tells while it collects (a failure it found)
        lines = janus_evals(run, told)
        assert re.fullmatch(r"pending +running \(pid \d+ on host .*\); output: .*step00000002/eval\.log",
                            listed(lines, "step00000002")), lines
        assert listed(lines, "step00000004") == ("pending  lost: its job ended without recording how (killed?); "
                                                 "running the training command again starts it again")

        resumed = train_on_ranks(*args)
        assert_succeeded(resumed)
        assert f"resumed at step {stopped_at} " in resumed.stdout
        assert ("note: the job of checkpoint step00000004's evaluation ended without recording how (killed with the "
                "run?): starting it again") in resumed.stdout
        for paths, launches, sr in ((step2, 1, 0.5), (step4, 2, 0.4)):
            record = json.loads(paths.record.read_text())
            assert (record["launches"], record["state"]) == (launches, "done"), record
            assert paths.log.read_text().count("[janus] running: ") == launches
            assert [r["eval/SR"] for r in evaluations(read_metrics(run)) if r["eval_step"] == record["step"]] == [sr]
        # One line for the failure, naming the exit code and the evaluation's log: in the training log, or
        # from janus-train evals when that found it first (a run stopped after step 6 had started its evaluation).
        failures = [line for line in layout.train_log.read_text().splitlines() + told if "failed" in line]
        assert failures == [f"warning: the evaluation of checkpoint step00000006 failed: its command exited with "
                            f"code 3; its output: {layout.evaluation('step00000006').log}"]
        assert (f"note: the evaluation of checkpoint step00000008 was handed on (its command exited 0 without "
                f"results); `janus-train evals {run}` collects its results once {step8.results} exists"
                ) in resumed.stdout

        lines = janus_evals(run)
        assert re.fullmatch(r"done +eval/SR 0\.5 .*\(best\)", listed(lines, "step00000002")), lines
        assert listed(lines, "step00000006").startswith("failed   its command exited with code 3; its output: ")
        assert listed(lines, "step00000008") == f"pending  handed on (its command exited 0); waiting for {step8.results}"
    finally:  # the handed-on evaluation ends either way
        release.touch()
    deadline = time.monotonic() + TIMEOUT_S
    while not step8.results.is_file():
        assert time.monotonic() < deadline, "the handed-on evaluation never wrote its results"
        time.sleep(0.1)
    lines = janus_evals(run)
    assert re.fullmatch(r"done +eval/SR 0\.7 .*\(best\)", listed(lines, "step00000008")), lines
    assert lines[-1] == f"best by eval/SR: checkpoint step 8 (0.7), {layout.best}"
    late = [r for r in evaluations(read_metrics(run)) if r["eval_step"] == 8]
    assert len(late) == 1 and late[0]["step"] == 8 and late[0]["eval/SR"] == 0.7 and late[0]["eval_best"] is True
    assert json.loads((layout.best / "best.json").read_text())["step"] == 8
