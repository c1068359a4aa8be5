"""Each evaluation's state on disk, and what its folder says about how it is doing.

Three writers, one file each, so no two ever write the same file (all in ``RUN/evals/stepNNNNNNNN/``,
:class:`~janus_train.run.layout.EvaluationLayout`):

* ``evaluation.json``: janus's :class:`Evaluation` (rank 0 of the training run, or ``janus-train
  evals`` while no run holds the run directory): the command, the export, the state
  (``pending``, ``done``, ``failed``), the metrics and at which training step they were logged.
* ``job.json``: the job's :class:`JobRecord` (:mod:`janus_train.evals.job`): where and when it
  started, and once it ended its command's exit code or why it could not run it.
* ``results.json``: the evaluator's metrics, a JSON object whose numbers are the metrics (other
  values are ignored), written to a temporary name and renamed, so janus never reads half a file.

Every record is written to a temporary file and renamed
(:func:`~janus_core.system.files.atomic_write_bytes`). The job holds its folder's lock
(:mod:`janus_core.system.lock`) while it runs, so whoever reads the folder later (a resumed run,
another host) sees whether it still runs. :func:`judge` turns the three files and that into a
:class:`Verdict`.

How janus tells a scheduler-submitted evaluation from a local one: a job whose command **exited with
status 0 without having written results** handed the work to someone else (``sbatch`` returns at
once): it stays pending (``submitted``) and is not waited for at the end of a run; a job still running
is a local evaluation (``running``), waited for at the end.
"""

from __future__ import annotations

import json
import socket
from datetime import datetime
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from janus_core.system.files import atomic_write_bytes
from janus_core.system.lock import holder
from janus_train.run.layout import EvaluationLayout
from janus_train.run.provenance import utc_now

PENDING, DONE, FAILED = "pending", "done", "failed"
"""An evaluation's state: results not in yet; its metrics collected; over without metrics."""

START_GRACE_S = 60.0
"""A job that has not said it started this long after its launch is taken as never started."""

SHELL_CODES = {126: "the shell could not run the program", 127: "the shell found no such program"}


def _load(cls: type, path: Path) -> Any:
    """A record of ``cls`` from ``path``; unknown keys of a later janus ignored."""
    data = json.loads(path.read_text())
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _save(record: Any, path: Path) -> None:
    atomic_write_bytes(path, (json.dumps(asdict(record), indent=1) + "\n").encode())


@dataclass
class Evaluation:
    """janus's record of one checkpoint's evaluation (``evaluation.json``)."""

    step: int
    command: str
    """The command line as run (placeholders filled)."""
    export: str | None
    """The format janus exports for it (None: nothing)."""
    launched: str
    launches: int = 1
    """How often its job was started: more than once only when a resume found the job gone unfinished."""
    state: str = PENDING
    reason: str | None = None
    """Why it failed (one line)."""
    metrics: dict[str, float] | None = None
    logged_step: int | None = None
    """The training step at whose log its metrics went to the run's logs (None: not yet)."""
    best: bool = False
    """Whether its checkpoint became ``checkpoints/best`` when its metrics arrived."""

    @classmethod
    def load(cls, path: Path) -> Evaluation:
        return _load(cls, path)

    @property
    def launched_s(self) -> float:
        """Its (latest) launch as seconds since the epoch."""
        return datetime.fromisoformat(self.launched).timestamp()

    def save(self, path: Path) -> None:
        _save(self, path)


@dataclass
class JobRecord:
    """The job's record (``job.json``): written when it starts and again when it ends."""

    host: str
    pid: int
    started: str
    ended: str | None = None
    exit_code: int | None = None
    error: str | None = None
    """Why its command did not run (the export failed, the shell could not start)."""

    @classmethod
    def me(cls, pid: int) -> JobRecord:
        return cls(socket.gethostname(), pid, utc_now())

    @classmethod
    def load(cls, path: Path) -> JobRecord | None:
        try:
            return _load(cls, path)
        except (OSError, ValueError, TypeError):
            return None

    def save(self, path: Path) -> None:
        _save(self, path)


def read_results(path: Path) -> dict[str, float] | str | None:
    """The metrics in ``results.json`` (its numbers), why it is not a results file (one line), or
    None when there is none yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        return f"{path} cannot be read ({err})"
    hint = 'write a JSON object of metrics, e.g. {"SR": 0.61, "SPL": 0.55}, to a temporary file and rename it'
    try:
        data = json.loads(text)
    except ValueError as err:
        return f"{path} is not valid JSON ({err}); {hint}"
    if not isinstance(data, dict):
        return f"{path} holds a JSON {type(data).__name__}, not an object of metrics; {hint}"
    metrics = {str(name): float(value) for name, value in data.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool)}
    if not metrics:
        return f"{path} holds no number; {hint}"
    return metrics


@dataclass(frozen=True)
class Verdict:
    """What an evaluation's folder says now.

    ``state``: ``done`` (``metrics``), ``failed`` (``reason``) or ``pending`` with ``how``:
    ``starting`` / ``running`` (its job runs: a local evaluation), ``submitted`` (its command exited
    0 without results: a scheduler has it) or ``lost`` (its job ended without a record: killed)."""

    state: str
    how: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def local(self) -> bool:
        """A job running here or elsewhere that the run waits for at its end."""
        return self.state == PENDING and self.how in ("starting", "running")


def job_running(paths: EvaluationLayout) -> bool:
    """Whether the job of an evaluation holds its folder's lock (runs, on any host that shares it)."""
    return holder(paths.root) is not None


def judge(evaluation: Evaluation, paths: EvaluationLayout, running: bool, now_s: float, launched_s: float) -> Verdict:
    """The verdict on a pending ``evaluation`` from its folder: results first (a command may write
    them and fail after), then its job's end, then whether the job runs (``running``; a job not yet
    started counts as running for :data:`START_GRACE_S` after its launch at ``launched_s``)."""
    results = read_results(paths.results)
    log = f"its output: {paths.log}"
    if isinstance(results, dict):  # a NaN among them is logged as null and never becomes the best
        return Verdict(DONE, metrics=results)
    if isinstance(results, str):
        return Verdict(FAILED, reason=f"{results}; {log}")
    job = JobRecord.load(paths.job)
    if job is not None and job.ended is not None:
        if job.error is not None:
            return Verdict(FAILED, reason=f"{job.error}; {log}")
        if job.exit_code:
            meaning = SHELL_CODES.get(job.exit_code)
            return Verdict(FAILED, reason=f"its command exited with code {job.exit_code}"
                                          + (f" ({meaning})" if meaning else "") + f"; {log}")
        return Verdict(PENDING, how="submitted")
    if running:
        return Verdict(PENDING, how="running")
    if job is None and now_s - launched_s < START_GRACE_S:
        return Verdict(PENDING, how="starting")
    return Verdict(PENDING, how="lost")
