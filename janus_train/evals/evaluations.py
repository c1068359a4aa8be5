"""A run's external evaluations: launched after checkpoint saves, tracked on disk, collected.

One process owns them: rank 0 of the training run (``janus_train.build`` builds this object
there only), or ``janus-train evals`` while no run holds the run directory. Each evaluation is a
folder ``RUN/evals/stepNNNNNNNN/`` (:mod:`janus_train.evals.record`):

* :meth:`Evaluations.launch` (after the save of a checkpoint, and at the end of the run) writes
  janus's record and starts the detached job (:mod:`janus_train.evals.job`), which exports the
  checkpoint and runs the command; training goes on at once. A step with a record is never
  launched again.
* :meth:`Evaluations.collect` (at every logged step, at the end, by ``janus-train evals``) judges
  each pending evaluation from its folder: results in: logged as ``eval/<NAME>`` (with
  ``eval_step``), offered as the best checkpoint (``train.best_metric: eval/...``), the export
  removed (unless ``train.eval_keep_exports``); failed: one ``warning:`` line. Nothing here ever
  stops the run.
* :meth:`Evaluations.resume_at`: after a preemption the records on disk tell what was pending:
  a job still running is left to finish, a job that ended without a record (killed with its
  cluster job) is started again, results logged after the resumed step (whose records the
  resume dropped from ``metrics.jsonl``) are logged again.
* :meth:`Evaluations.wait` (the end of the run) waits, bounded, for jobs still running; a
  scheduler-submitted evaluation (its command exited 0 without results) is left to
  ``janus-train evals``.

:func:`pinned_tags` is the retention rule's part: ``save_total_limit`` never deletes the
checkpoint of a pending evaluation (its job may still export it, ``{checkpoint}`` may be read, it
may become the best) nor the best chosen by an evaluation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from janus_core.bases import cache_base
from janus_core.profile import Profile
from janus_core.system.files import remove_partials
from janus_train.checkpoint.best import BestCheckpoint, best_record
from janus_train.checkpoint.store import TAG_PATTERN, Checkpoints, tag_name
from janus_train.config import TrainSettings
from janus_train.data.val_metric_names import EVAL_PREFIX, is_eval_metric
from janus_train.evals.command import export_format, fill_command
from janus_train.evals.record import DONE, FAILED, PENDING, Evaluation, JobRecord, Verdict, job_running, judge
from janus_train.run.layout import EvaluationLayout, RunLayout
from janus_train.run.provenance import utc_now

JOB_MODULE = "janus_train.evals.job"
POLL_S = 1.0
"""How often the end of a run looks at the evaluations it waits for."""


class ResultsLog(Protocol):
    """Where collected results go: the run log, :meth:`janus_train.loop.logs.RunLog.write_evaluation`
    (the loop, above this folder, holds it)."""

    def write_evaluation(self, step: int, eval_step: int, metrics: dict[str, float], best: bool | None) -> None: ...


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def note(line: str) -> None:
    print(f"note: {line}", flush=True)


def evaluation_folders(layout: RunLayout) -> list[EvaluationLayout]:
    """The run's evaluation folders, in step order."""
    if not layout.evals.is_dir():
        return []
    return [layout.evaluation(p.name) for p in sorted(layout.evals.iterdir()) if TAG_PATTERN.match(p.name)]


def read_evaluation(paths: EvaluationLayout) -> Evaluation | None:
    try:
        return Evaluation.load(paths.record)
    except (OSError, ValueError, TypeError):
        return None


def evaluated_best(layout: RunLayout) -> dict[str, Any] | None:
    """The kept best's record when an evaluation's metric chose it (None: no best, or validation's)."""
    best = best_record(layout.checkpoints)
    return best if best is not None and is_eval_metric(str(best.get("metric", ""))) else None


def pinned_tags(layout: RunLayout) -> set[str]:
    """The checkpoint tags rotation keeps for the run's evaluations: each pending one's, and the
    best's when an evaluation's metric chose it."""
    pinned = {paths.root.name for paths in evaluation_folders(layout)
              if (evaluation := read_evaluation(paths)) is not None and evaluation.state == PENDING}
    if (best := evaluated_best(layout)) is not None:
        pinned.add(tag_name(int(best["step"])))
    return pinned


@dataclass(frozen=True)
class EvalSettings:
    """What every evaluation of a run is started with: the command (placeholders unfilled), what
    janus exports for it (None: nothing), whether exports stay, how long the end waits."""

    command: str
    export: str | None
    keep_exports: bool
    wait_s: float

    @classmethod
    def of(cls, settings: TrainSettings, profile: Profile) -> EvalSettings:
        return cls(settings.eval_command, export_format(settings.eval_export, cache_base(profile.qwen.path)),
                   settings.eval_keep_exports, 60.0 * settings.eval_wait_minutes)


def eval_best(layout: RunLayout, settings: TrainSettings) -> BestCheckpoint | None:
    """The best checkpoint by an evaluation's metric (one process), when ``train.best_metric`` names one."""
    if not is_eval_metric(settings.best_metric):
        return None
    return BestCheckpoint(Checkpoints(layout.checkpoints), settings.best_metric, settings.best_metric_mode)


class Evaluations:
    """The evaluations of the run in ``layout``, owned by this process: ``log`` (None: list only,
    nothing collected), ``best`` (the best by an evaluation's metric, or None), ``env``: the
    environment the jobs start with."""

    def __init__(self, layout: RunLayout, settings: EvalSettings, log: ResultsLog | None = None,
                 best: BestCheckpoint | None = None, env: Mapping[str, str] | None = None) -> None:
        self.layout, self.settings, self.log, self.best = layout, settings, log, best
        self.env = dict(env) if env is not None else None
        self._jobs: dict[int, subprocess.Popen[bytes]] = {}  # the jobs this process started

    # ------------------------------------------------------------------------------ reading

    def records(self) -> list[tuple[EvaluationLayout, Evaluation]]:
        return [(paths, evaluation) for paths in evaluation_folders(self.layout)
                if (evaluation := read_evaluation(paths)) is not None]

    def collectable(self) -> bool:
        """Whether :meth:`collect` may have something to log: an evaluation pending, or done and not logged."""
        return any(evaluation.state == PENDING or (evaluation.state == DONE and evaluation.logged_step is None)
                   for _, evaluation in self.records())

    def verdict(self, paths: EvaluationLayout, evaluation: Evaluation) -> Verdict:
        job = self._jobs.get(evaluation.step)
        running = job.poll() is None if job is not None else job_running(paths)
        return judge(evaluation, paths, running, time.time(), evaluation.launched_s)

    # ---------------------------------------------------------------------------- launching

    def launch(self, step: int) -> None:
        """Start the evaluation of the checkpoint of ``step`` (saved, ``latest`` names it), unless it
        has one already; returns at once."""
        tag = tag_name(step)
        paths = self.layout.evaluation(tag)
        if paths.record.is_file():
            return
        values = {"export": paths.export, "step": step, "results": paths.results, "run": self.layout.root,
                  "checkpoint": self.layout.checkpoints / tag}
        evaluation = Evaluation(step=step, command=fill_command(self.settings.command, values),
                                export=self.settings.export, launched=utc_now())
        try:
            paths.root.mkdir(parents=True, exist_ok=True)
            evaluation.save(paths.record)
        except OSError as err:
            warn(f"the evaluation of checkpoint {tag} could not start: cannot write {paths.record} ({err.strerror})")
            return
        self._start(paths, evaluation)

    def _start(self, paths: EvaluationLayout, evaluation: Evaluation) -> None:
        """The job of ``evaluation``: detached (a session of its own, so a stop signal to the run is
        not its), its output appended to ``eval.log``."""
        try:
            with open(paths.log, "ab") as log:
                self._jobs[evaluation.step] = subprocess.Popen(
                    [sys.executable, "-m", JOB_MODULE, str(paths.root)], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
        except OSError as err:
            self._fail(paths, evaluation, f"its job could not start ({err}); its output: {paths.log}")
            return
        print(f"evaluating checkpoint {tag_name(evaluation.step)} in the background: {paths.log}", flush=True)

    # --------------------------------------------------------------------------- collecting

    def collect(self, step: int) -> None:
        """Pick up what the evaluations' folders hold now (logged at training step ``step``): results
        logged and offered as the best, failures told; then results not yet logged (a resume dropped
        them) logged again. Never raises over an evaluation."""
        if self.log is None:
            return
        for paths, evaluation in self.records():
            if evaluation.state == PENDING:
                verdict = self.verdict(paths, evaluation)
                if verdict.state == DONE:
                    self._done(paths, evaluation, verdict.metrics)
                elif verdict.state == FAILED:
                    self._fail(paths, evaluation, verdict.reason)
            if evaluation.state == DONE and evaluation.logged_step is None:
                self._log(paths, evaluation, step)

    def _done(self, paths: EvaluationLayout, evaluation: Evaluation, metrics: dict[str, float]) -> None:
        evaluation.state, evaluation.metrics = DONE, metrics
        if self.best is not None and (value := metrics.get(self.best.metric.removeprefix(EVAL_PREFIX))) is not None:
            try:
                evaluation.best = self.best.adopt(evaluation.step, value)
            except OSError as err:
                warn(f"checkpoint {tag_name(evaluation.step)} could not become the best by {self.best.metric} "
                     f"({value:.6g}): {err}; the best is kept as it was")
        self._save(paths, evaluation)
        self._remove_export(paths)

    def _fail(self, paths: EvaluationLayout, evaluation: Evaluation, reason: str) -> None:
        evaluation.state, evaluation.reason = FAILED, reason
        self._save(paths, evaluation)
        self._remove_export(paths)
        warn(f"the evaluation of checkpoint {tag_name(evaluation.step)} failed: {reason}")

    def _log(self, paths: EvaluationLayout, evaluation: Evaluation, step: int) -> None:
        assert self.log is not None and evaluation.metrics is not None
        try:
            self.log.write_evaluation(step, evaluation.step, evaluation.metrics,
                                      evaluation.best if self.best is not None else None)
        except (OSError, ValueError) as err:  # a full disk: the next step's record says so, alike on every rank
            warn(f"the results of checkpoint {tag_name(evaluation.step)}'s evaluation could not be logged ({err}); "
                 "they are logged again at the next logged step")
            return
        evaluation.logged_step = step
        self._save(paths, evaluation)

    def _save(self, paths: EvaluationLayout, evaluation: Evaluation) -> None:
        try:
            evaluation.save(paths.record)
        except OSError as err:
            warn(f"{paths.record} could not be written ({err.strerror}); its evaluation is judged again")

    def _remove_export(self, paths: EvaluationLayout) -> None:
        if not self.settings.keep_exports:
            shutil.rmtree(paths.export, ignore_errors=True)

    # ------------------------------------------------------------------------------ resuming

    def resume_at(self, step: int, due: bool) -> None:
        """A run (re)starts after ``step`` (0: from scratch): evaluations of later checkpoints are of
        checkpoints it abandoned (removed); results logged after ``step`` are logged again; a job
        that ended without a record is started again; ``due``: ``step``'s checkpoint is one the run
        evaluates, started here if its launch was lost with the run that saved it. What a killed write
        of janus's record (or of a killed job's) left is removed."""
        for paths, evaluation in self.records():
            if evaluation.step > step:
                shutil.rmtree(paths.root, ignore_errors=True)
                note(f"removed {paths.root}: the evaluation of a checkpoint this run abandoned when it resumed from "
                     f"step {step}")
                continue
            remove_partials(paths.record)  # this process is the record's one writer
            if evaluation.state == DONE and evaluation.logged_step is not None and evaluation.logged_step > step:
                evaluation.logged_step = None  # its record went with the steps after the resumed one
                self._save(paths, evaluation)
            if evaluation.state == PENDING and self.verdict(paths, evaluation).how == "lost":
                evaluation.launches += 1
                evaluation.launched = utc_now()
                self._save(paths, evaluation)
                paths.job.unlink(missing_ok=True)  # the killed job's: the new one writes its own
                remove_partials(paths.job)
                note(f"the job of checkpoint {tag_name(evaluation.step)}'s evaluation ended without recording how "
                     "(killed with the run?): starting it again")
                self._start(paths, evaluation)
        if due and step > 0:
            self.launch(step)

    # --------------------------------------------------------------------------------- the end

    def running(self) -> list[int]:
        """The steps whose evaluation runs as a job (here or on another host), results not in yet."""
        return [evaluation.step for paths, evaluation in self.records()
                if evaluation.state == PENDING and self.verdict(paths, evaluation).local]

    def wait(self, step: int, progress: Callable[[int], None] | None = None) -> list[int]:
        """The end of the run (logged at ``step``): collect until no job runs or ``wait_s`` is over,
        telling ``progress`` how many of those running at the start have finished; returns the steps
        still running."""
        waited = len(self.running())
        deadline = time.monotonic() + self.settings.wait_s
        while True:
            left = self.running()
            self.collect(step)  # after running(): a job that ends in between is collected now, not missed
            if progress is not None:
                progress(waited - len(left))
            if not left:
                return []
            if time.monotonic() >= deadline:
                return self.running()
            time.sleep(min(POLL_S, deadline - time.monotonic()))

    def open_notes(self) -> list[str]:
        """One line for each evaluation still pending: what it waits for and how its results get in."""
        collect = f"`janus-train evals {self.layout.root}` collects its results"
        lines = []
        for paths, evaluation in self.records():
            if evaluation.state != PENDING:
                continue
            verdict, tag = self.verdict(paths, evaluation), tag_name(evaluation.step)
            if verdict.how == "submitted":
                lines.append(f"note: the evaluation of checkpoint {tag} was handed on (its command exited 0 without "
                             f"results); {collect} once {paths.results} exists")
            elif verdict.local:
                lines.append(f"note: stopped waiting for the evaluation of checkpoint {tag} after "
                             f"{self.settings.wait_s / 60:g} minutes (train.eval_wait_minutes); it runs on "
                             f"({self._where(paths)}); {collect}")
            elif verdict.state != PENDING:  # its job ended after the last collect, as the wait ran out
                lines.append(f"note: the evaluation of checkpoint {tag} ended as the run stopped waiting for it; "
                             f"{collect}")
            else:
                lines.append(f"warning: the job of checkpoint {tag}'s evaluation ended without recording how "
                             f"(killed?); running the training command again starts it again")
        return lines

    def _where(self, paths: EvaluationLayout) -> str:
        job = JobRecord.load(paths.job)
        return f"pid {job.pid} on host {job.host}, since {job.started}" if job is not None else "starting"

    # ------------------------------------------------------------------------------- listing

    def listing(self) -> list[str]:
        """One line per evaluation: its checkpoint, state and metrics, or what it waits for, or why it failed."""
        lines = []
        for paths, evaluation in self.records():
            tag = tag_name(evaluation.step)
            if evaluation.state == DONE:
                assert evaluation.metrics is not None
                shown = " ".join(f"{EVAL_PREFIX}{name} {value:.4g}" for name, value in evaluation.metrics.items())
                lines.append(f"{tag}  done     {shown}" + ("  (best)" if self._is_best(evaluation.step) else ""))
            elif evaluation.state == FAILED:
                lines.append(f"{tag}  failed   {evaluation.reason}")
            else:
                verdict = self.verdict(paths, evaluation)
                if verdict.state != PENDING:  # in, not yet collected (a run holds the directory)
                    lines.append(f"{tag}  pending  results in, collected by the run that holds {self.layout.root}")
                elif verdict.how == "submitted":
                    lines.append(f"{tag}  pending  handed on (its command exited 0); waiting for {paths.results}")
                elif verdict.how == "lost":
                    lines.append(f"{tag}  pending  lost: its job ended without recording how (killed?); running the "
                                 "training command again starts it again")
                else:
                    lines.append(f"{tag}  pending  {verdict.how} ({self._where(paths)}); output: {paths.log}")
        return lines

    def _is_best(self, step: int) -> bool:
        best = evaluated_best(self.layout)
        return best is not None and best.get("step") == step


def evaluations_of_run(layout: RunLayout, settings: TrainSettings, profile: Profile, log: ResultsLog | None,
                       env: Mapping[str, str] | None = None) -> Evaluations:
    """A run's evaluations as its settings make them (``log``: where collected results go)."""
    return Evaluations(layout, EvalSettings.of(settings, profile), log, eval_best(layout, settings), env)

