"""External evaluations, in one process: the settings a profile may give, the command line janus
runs, what an evaluation's folder says (results, a job's end, a job still running), the run log's
eval axis, the best checkpoint chosen by an evaluation, the retention rule and the collection,
resume and end-of-run wait of a run's evaluations on folders as jobs leave them. Jobs and commands
run for real in tests/e2e/test_evaluations.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from helpers.profiles import write_test_profile
from janus_core.bases import QWEN2_5_VL, QWEN3_VL
from janus_core.profile import ProfileError, load_profile
from janus_core.system.lock import DirectoryLock
from janus_train.checkpoint.best import BestCheckpoint
from janus_train.checkpoint.store import Checkpoints
from janus_train.config import load_train_settings
from janus_train.evals.command import export_format, fill_command
from janus_train.evals.evaluations import EvalSettings, Evaluations, pinned_tags
from janus_train.evals.record import START_GRACE_S, Evaluation, JobRecord, judge, read_results
from janus_train.loop.logs import RunLog
from janus_train.run.layout import LATEST_FILE, RunLayout

PLAIN = "evaluate {export} {results}"


def train_settings(tmp_path: Path, **train: object):  # noqa: ANN201 - TrainSettings
    path = write_test_profile(tmp_path / "profile.yaml")
    data = yaml.safe_load(path.read_text())
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data))
    return load_train_settings(load_profile(path))


# ----------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(("train", "message"), [
    ({"best_metric": "eval/SR", "eval_command": PLAIN},
     "setting 'train.best_metric' is 'eval/SR', a metric of the evaluator's results, whose better direction janus "
     "cannot know: set train.best_metric_mode to max or min"),
    ({"best_metric": "eval/SR", "best_metric_mode": "max"},
     "setting 'train.best_metric' is 'eval/SR', a metric of an external evaluation, but train.eval_command is empty: "
     "name the command that writes it"),
    ({"best_metric": "val_loss", "best_metric_mode": "max"},
     "setting 'train.best_metric_mode' is 'max', but val_loss is best at its lowest (min); leave "
     "train.best_metric_mode out for a validation metric"),
    ({"eval_command": "evaluate {exports} {results}"},
     "setting 'train.eval_command' names {exports}, which janus does not fill; its placeholders are {export}, {step}, "
     "{results}, {run}, {checkpoint}"),
    ({"eval_command": PLAIN, "eval_export": "none"},
     "setting 'train.eval_command' uses {export} but train.eval_export is none (nothing is exported); set "
     "train.eval_export to janusvln or janus, or pass {checkpoint}"),
    ({"best_metric": "SR"}, "'SR' is not a metric janus keeps a best checkpoint by"),
    ({"eval_export": "hf"}, "setting 'train.eval_export' is 'hf'; expected one of janusvln, janus, none"),
])
def test_a_profile_with_evaluation_settings_that_do_not_go_together_is_refused_in_one_line(
        tmp_path: Path, train: dict, message: str) -> None:
    with pytest.raises(ProfileError) as refused:
        train_settings(tmp_path, **train)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert str(refused.value).startswith(str(tmp_path / "profile.yaml"))


def test_an_evaluation_metric_with_its_direction_is_a_best_metric(tmp_path: Path) -> None:
    settings = train_settings(tmp_path, best_metric="eval/NE", best_metric_mode="min",
                              eval_command="sbatch eval.sbatch {export} {results}")
    assert (settings.best_metric, settings.best_metric_mode) == ("eval/NE", "min")
    assert (settings.eval_export, settings.eval_keep_exports, settings.eval_wait_minutes) == (None, False, 60.0)
    # A validation metric may repeat its own direction.
    assert train_settings(tmp_path, best_metric="val_action_accuracy", best_metric_mode="max").best_metric_mode == "max"


def test_the_reference_layout_is_refused_for_a_qwen3_run() -> None:
    with pytest.raises(ProfileError, match=r"setting 'train.eval_export' is janusvln, JanusVLN's reference layout, "
                                           r"which is Qwen2\.5-VL only, but qwen\.path is a Qwen3-VL model"):
        load_train_settings(load_profile("tiny-qwen3", ["train.eval_command=evaluate {export}",
                                                        "train.eval_export=janusvln"]))


def test_the_default_export_is_the_bases_natural_format() -> None:
    assert export_format(None, QWEN2_5_VL) == "janusvln" and export_format(None, QWEN3_VL) == "janus"
    assert export_format("janus", QWEN2_5_VL) == "janus" and export_format("none", QWEN2_5_VL) is None


def test_the_placeholders_are_filled_quoted_for_the_shell_and_other_braces_are_left() -> None:
    command = fill_command("sbatch e.sbatch {export} {results} --step {step}; awk '{print $1}'",
                           {"export": Path("/runs/my run/evals/step00000010/export"), "step": 10,
                            "results": Path("/runs/r/evals/step00000010/results.json")})
    assert command == ("sbatch e.sbatch '/runs/my run/evals/step00000010/export' "
                       "/runs/r/evals/step00000010/results.json --step 10; awk '{print $1}'")


# ------------------------------------------------------------------- what an evaluation's folder says


def folder(tmp_path: Path, step: int = 10, state: str = "pending", launched_s_ago: float = 0.0):  # noqa: ANN201
    """(run layout, evaluation folder, janus's record) of a run with an evaluation of ``step``."""
    layout = RunLayout(tmp_path / "run")
    paths = layout.evaluation(f"step{step:08d}")
    paths.root.mkdir(parents=True)
    launched = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - launched_s_ago))
    evaluation = Evaluation(step=step, command="evaluate", export=None, launched=launched, state=state)
    evaluation.save(paths.record)
    return layout, paths, evaluation


def ended(paths, exit_code: int | None = 0, error: str | None = None) -> None:  # noqa: ANN001
    job = JobRecord.me(os.getpid())
    job.ended, job.exit_code, job.error = job.started, exit_code, error
    job.save(paths.job)


@pytest.mark.parametrize(("text", "problem"), [
    ("{\"SR\": 0.5", "is not valid JSON (Expecting ',' delimiter: line 1 column 11 (char 10)); write a JSON object of "
                     "metrics, e.g. {\"SR\": 0.61, \"SPL\": 0.55}, to a temporary file and rename it"),
    ("[0.5]", "holds a JSON list, not an object of metrics; write a JSON object"),
    ("{\"split\": \"val_unseen\"}", "holds no number; write a JSON object"),
])
def test_results_that_are_no_object_of_numbers_fail_the_evaluation_in_one_line(tmp_path: Path, text: str,
                                                                               problem: str) -> None:
    _, paths, evaluation = folder(tmp_path)
    paths.results.write_text(text)
    verdict = judge(evaluation, paths, running=False, now_s=time.time(), launched_s=time.time())
    assert verdict.state == "failed" and verdict.reason.startswith(f"{paths.results} {problem}")
    assert verdict.reason.endswith(f"; its output: {paths.log}")


def test_the_numbers_of_the_results_are_its_metrics(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text('{"SR": 0.61, "NE": 4, "split": "val_unseen", "ok": true}')
    assert read_results(tmp_path / "results.json") == {"SR": 0.61, "NE": 4.0}


@pytest.mark.parametrize(("job", "running", "ago", "state", "how", "reason"), [
    ({"exit_code": 0}, False, 0.0, "pending", "submitted", ""),
    ({"exit_code": 3}, False, 0.0, "failed", "", "its command exited with code 3; its output: "),
    ({"exit_code": 127}, False, 0.0, "failed", "",
     "its command exited with code 127 (the shell found no such program); its output: "),
    ({"exit_code": None, "error": "its command could not start (/bin/sh: No such file or directory)"}, False, 0.0,
     "failed", "", "its command could not start (/bin/sh: No such file or directory); its output: "),
    (None, True, 0.0, "pending", "running", ""),
    (None, False, 0.0, "pending", "starting", ""),
    (None, False, START_GRACE_S + 5, "pending", "lost", ""),
])
def test_a_pending_evaluation_is_judged_by_its_jobs_end_or_whether_the_job_runs(
        tmp_path: Path, job: dict | None, running: bool, ago: float, state: str, how: str, reason: str) -> None:
    """A command that exits 0 without results handed the work on (``sbatch``): still pending; one
    that fails is named with its exit code and log; a job that neither runs nor ended (killed) is lost."""
    _, paths, evaluation = folder(tmp_path, launched_s_ago=ago)
    if job is not None:
        ended(paths, **job)
    verdict = judge(evaluation, paths, running, time.time(), evaluation.launched_s)
    assert (verdict.state, verdict.how) == (state, how)
    assert verdict.reason.startswith(reason) and (not reason or verdict.reason.endswith(str(paths.log)))


def test_results_count_even_when_the_command_failed_after_writing_them(tmp_path: Path) -> None:
    _, paths, evaluation = folder(tmp_path)
    paths.results.write_text('{"SR": 0.5}')
    ended(paths, exit_code=1)
    verdict = judge(evaluation, paths, running=False, now_s=time.time(), launched_s=time.time())
    assert (verdict.state, verdict.metrics) == ("done", {"SR": 0.5})


# --------------------------------------------------------------------------- best and retention


def saved_tags(layout: RunLayout, *steps: int) -> Checkpoints:
    for step in steps:
        tag = layout.checkpoints / f"step{step:08d}"
        tag.mkdir(parents=True)
        (tag / "mp_rank_00_model_states.pt").write_bytes(bytes([step]) * 16)
    (layout.checkpoints / LATEST_FILE).write_text(f"step{steps[-1]:08d}")
    return Checkpoints(layout.checkpoints, pinned=lambda: pinned_tags(layout))


def test_rotation_keeps_the_checkpoints_of_pending_evaluations_and_the_evaluated_best(tmp_path: Path) -> None:
    layout, pending, _ = folder(tmp_path, step=10)
    folder(tmp_path, step=20, state="done")
    checkpoints = saved_tags(layout, 10, 20, 30, 40)
    assert checkpoints.rotate(keep=1) == ["step00000030", "step00000020"]  # 10: pending; 40: latest
    assert BestCheckpoint(Checkpoints(layout.checkpoints), "eval/SR", "max").adopt(10, 0.4)
    done = Evaluation.load(pending.record)
    done.state = "done"
    done.save(pending.record)
    assert pinned_tags(layout) == {"step00000010"}  # no longer pending, but the best
    assert checkpoints.rotate(keep=1) == []


def test_the_best_by_an_evaluation_links_the_step_checkpoint_and_follows_the_metrics_direction(
        tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    saved_tags(layout, 10, 20, 30)
    best = BestCheckpoint(Checkpoints(layout.checkpoints), "eval/NE", "min")
    assert best.adopt(20, 5.0)
    assert not best.adopt(10, 6.0) and not best.adopt(30, 5.0)  # worse; a tie keeps the earlier
    assert best.adopt(30, 4.5)
    assert best.record() == {"metric": "eval/NE", "value": 4.5, "step": 30}
    state = "mp_rank_00_model_states.pt"
    assert os.path.samefile(layout.best / state, layout.checkpoints / "step00000030" / state)
    with pytest.raises(OSError):
        best.adopt(50, 1.0)  # no such checkpoint
    assert best.record()["step"] == 30 and not (layout.checkpoints / "best.partial").exists()


# --------------------------------------------------------------------------------- the eval axis


def test_evaluation_records_have_their_own_step_axis(tmp_path: Path) -> None:
    """metrics.jsonl keeps step order (an evaluation's record carries the step it was logged at and
    eval_step, the checkpoint it evaluated); TensorBoard plots eval/* against eval_step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = RunLog(tmp_path, tmp_path / "metrics.jsonl", total_steps=40)
    log.write_evaluation(30, 10, {"SR": 0.25, "NE": float("nan")}, best=True)
    log.write_evaluation(40, 20, {"SR": 0.5, "NE": 3.0}, best=False)
    log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [{k: v for k, v in r.items() if k != "time"} for r in records] == [
        {"step": 30, "eval_step": 10, "eval/SR": 0.25, "eval/NE": None, "eval_best": True},
        {"step": 40, "eval_step": 20, "eval/SR": 0.5, "eval/NE": 3.0, "eval_best": False}]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/SR")] == [(10, 0.25), (20, 0.5)]


# ---------------------------------------------------------------- collecting, resuming, the end


def evaluations_of(layout: RunLayout, keep_exports: bool = False, wait_s: float = 0.0) -> Evaluations:
    log = RunLog(layout.root, layout.metrics, total_steps=100)
    best = BestCheckpoint(Checkpoints(layout.checkpoints), "eval/SR", "max")
    return Evaluations(layout, EvalSettings("evaluate {results}", "janusvln", keep_exports, wait_s), log, best)


def test_collected_results_are_logged_offered_as_best_and_their_export_removed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout, paths, _ = folder(tmp_path, step=10)
    saved_tags(layout, 10)
    paths.export.mkdir()
    paths.results.write_text('{"SR": 0.5}')
    evaluations = evaluations_of(layout)
    evaluations.collect(12)
    record = Evaluation.load(paths.record)
    assert (record.state, record.metrics, record.logged_step, record.best) == ("done", {"SR": 0.5}, 12, True)
    assert not paths.export.exists() and layout.best.is_dir()
    assert "evaluation of step 10: eval/SR 0.5 (best)" in capsys.readouterr().out
    evaluations.collect(13)  # logged once
    assert len(layout.metrics.read_text().splitlines()) == 1


def test_a_failure_is_one_warning_line_and_the_export_goes(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    layout, paths, _ = folder(tmp_path, step=10)
    paths.export.mkdir()
    ended(paths, exit_code=2)
    evaluations_of(layout).collect(12)
    assert capsys.readouterr().err.splitlines() == [
        f"warning: the evaluation of checkpoint step00000010 failed: its command exited with code 2; its output: "
        f"{paths.log}"]
    assert Evaluation.load(paths.record).state == "failed" and not paths.export.exists()


def test_a_resume_logs_again_what_it_dropped_and_removes_evaluations_of_abandoned_checkpoints(
        tmp_path: Path) -> None:
    """And it removes what a killed write of janus's record left beside the record."""
    layout, paths, _ = folder(tmp_path, step=10)
    saved_tags(layout, 10)
    paths.results.write_text('{"SR": 0.5}')
    evaluations = evaluations_of(layout)
    evaluations.collect(25)
    leftover = paths.record.with_name(f"{paths.record.name}.4242.0123abcd.partial")
    leftover.write_text('{"step": 1')
    later = layout.evaluation("step00000030")
    later.root.mkdir()
    Evaluation(step=30, command="e", export=None, launched="2026-01-01T00:00:00+00:00").save(later.record)
    evaluations.log.resume_at(20)  # the records after step 20 went
    evaluations.resume_at(20, due=False)
    assert not later.root.exists() and not leftover.exists() and Evaluation.load(paths.record).step == 10
    evaluations.collect(21)
    assert [json.loads(line)["step"] for line in layout.metrics.read_text().splitlines()] == [21]


def test_the_end_waits_for_running_jobs_at_most_eval_wait_minutes(tmp_path: Path) -> None:
    """A job that still runs (it holds its folder's lock) when the wait is over is left running, with
    one line saying so and how its results get in."""
    layout, paths, _ = folder(tmp_path, step=10)
    evaluations = evaluations_of(layout, wait_s=0.3)
    with DirectoryLock.acquire(paths.root, purpose="an evaluation job"):
        JobRecord.me(os.getpid()).save(paths.job)
        started = time.monotonic()
        assert evaluations.wait(12) == [10]
        assert 0.3 <= time.monotonic() - started < 5
        notes = evaluations.open_notes()
    assert len(notes) == 1 and notes[0].startswith(
        "note: stopped waiting for the evaluation of checkpoint step00000010 after 0.005 minutes "
        f"(train.eval_wait_minutes); it runs on (pid {os.getpid()} on host ")
    assert notes[0].endswith(f"`janus-train evals {layout.root}` collects its results")


class LogThatEndsAJob(RunLog):
    """The run log, and the instant another evaluation's job ends: once the results of ``step`` are
    logged, inside a collect that judged that job still running a moment before."""

    def __init__(self, layout: RunLayout, step: int, job_ends: Callable[[], None]) -> None:
        super().__init__(layout.root, layout.metrics, total_steps=100)
        self.step, self.job_ends = step, job_ends

    def write_evaluation(self, step: int, eval_step: int, metrics: dict[str, float], best: bool | None) -> None:
        super().write_evaluation(step, eval_step, metrics, best)
        if eval_step == self.step:
            self.job_ends()


def test_the_end_collects_a_job_that_ends_right_after_a_collect_judged_it_running(tmp_path: Path) -> None:
    """A job may end at any instant of the wait, also between a collect that found it running and the
    look at which jobs still run: the wait collects its results before it returns, and no line calls
    it killed."""
    layout, running, _ = folder(tmp_path, step=10)
    _, done, _ = folder(tmp_path, step=20)
    done.results.write_text('{"SR": 0.4}')
    ended(done)
    lock = DirectoryLock.acquire(running.root, purpose="an evaluation job")
    JobRecord.me(os.getpid()).save(running.job)

    def job_ends() -> None:
        running.results.write_text('{"SR": 0.5}')
        ended(running)
        lock.release()

    evaluations = Evaluations(layout, EvalSettings("evaluate {results}", None, False, 60.0),
                              LogThatEndsAJob(layout, 20, job_ends))
    assert evaluations.wait(25) == []
    assert [json.loads(line)["eval_step"] for line in layout.metrics.read_text().splitlines()] == [20, 10]
    assert Evaluation.load(running.record).state == "done" and evaluations.open_notes() == []


def test_results_that_come_after_the_last_collect_of_the_end_are_left_to_janus_train_evals(tmp_path: Path) -> None:
    """A job that ends just as the wait runs out is no killed job: one note says who collects it."""
    layout, paths, _ = folder(tmp_path, step=10)
    paths.results.write_text('{"SR": 0.5}')
    ended(paths)
    assert evaluations_of(layout).open_notes() == [
        "note: the evaluation of checkpoint step00000010 ended as the run stopped waiting for it; "
        f"`janus-train evals {layout.root}` collects its results"]


def test_an_evaluation_job_runs_without_the_ranks_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the job runs (a torchrun of its own, sbatch) starts afresh, not as a rank of the run."""
    from pipelines.distributed import environment_outside_ranks

    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "8", "MASTER_PORT": "29500",
                        "TORCHELASTIC_RUN_ID": "x", "JANUS_LAUNCHER_PID": "1", "JANUS_QWEN_PATH": "/m"}.items():
        monkeypatch.setenv(name, value)
    env = environment_outside_ranks()
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "JANUS_LAUNCHER_PID"} & set(env)
    assert env["JANUS_QWEN_PATH"] == "/m"


def test_the_demos_evaluation_profile_loads() -> None:
    """examples/eval/demo.yaml: the tiny profile with the local evaluator after every save."""
    from helpers.profiles import REPO_ROOT

    settings = load_train_settings(load_profile(str(REPO_ROOT / "examples" / "eval" / "demo.yaml")))
    assert settings.eval_command.startswith(".venv/bin/python examples/eval/evaluate_export.py --export {export}")
    assert (settings.best_metric, settings.best_metric_mode, settings.val_episodes) == ("eval/answer_loss", "min", 1)


def test_keep_exports_leaves_the_export_after_the_results(tmp_path: Path) -> None:
    layout, paths, _ = folder(tmp_path, step=10)
    paths.export.mkdir()
    paths.results.write_text('{"SR": 0.5}')
    evaluations = evaluations_of(layout, keep_exports=True)
    evaluations.best = None
    evaluations.collect(12)
    assert Evaluation.load(paths.record).state == "done" and paths.export.is_dir()


def test_janus_train_evals_only_lists_while_a_training_run_holds_the_directory(tmp_path: Path) -> None:
    """The run collects its evaluations itself: ``janus-train evals`` then changes nothing."""
    from typer.testing import CliRunner

    from pipelines.train_cli import app

    layout, paths, _ = folder(tmp_path, step=10)
    write_test_profile(layout.profile)
    paths.results.write_text('{"SR": 0.5}')
    with DirectoryLock.acquire(layout.root, purpose=f"training run {layout.root}"):
        result = CliRunner().invoke(app, ["evals", str(layout.root)])
    assert result.exit_code == 0, result.output
    assert "; listing only: that run collects the results itself" in result.output
    assert f"step00000010  pending  results in, collected by the run that holds {layout.root}" in result.output
    assert Evaluation.load(paths.record).state == "pending" and not layout.metrics.exists()
