"""Every path of a training run directory, named once.

A run directory (``--out RUN``, ``make train RUN=...``) holds::

    profile.yaml         the resolved profile of the latest start: every setting after defaults,
                         environment variables, extends and --set (pass it back as --profile)
    run.json             one entry per start: the command line, janus version and git commit,
                         package versions, the caches' manifest digests, the base model trained
                         (qwen.path's model_type; none recorded: Qwen2.5-VL), the resolved settings
                         (janus_train.run.provenance); one that cannot be read is kept aside as
                         run.json.damaged-<time> when the next start begins a new one
    train.log            rank 0's console output, appended across resumes
    launcher.log         torchrun's own report of a failed launch (make train; pipelines.launch)
    metrics.jsonl        one JSON record per logged step, each with its wall-clock "time"
    tensorboard/         the same records as TensorBoard events
    wandb/               Weights & Biases' files (with train.wandb_project)
    checkpoints/latest   the tag a resume starts from
    checkpoints/step00000020/ ...  DeepSpeed's files of a step, with checksums.json
                                   (and <tag>_universal/ for a resume on another world size)
    checkpoints/best/    the best checkpoint by train.best_metric (with validation)
    export/              the end-of-run export (transformers-loadable weights + janus heads)
    evals/stepNNNNNNNN/  one external evaluation of a checkpoint (train.eval_command; janus_train.evals):
                         evaluation.json (janus's record), job.json (its job's), eval.log (the job's and
                         the command's output), export/ (what janus wrote for it), results.json (its metrics)
    .janus.lock          the run's writer lock (janus_core.system.lock)

Leaf module: nothing but paths, so every part of the trainer and the CLIs can name them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest"
"""Inside the checkpoints folder: the tag a resume starts from."""
BEST_TAG = "best"
"""Inside the checkpoints folder: the best checkpoint by ``train.best_metric``."""
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
EXPORT_DIR = "export"
TRAIN_LOG = "train.log"
LAUNCHER_LOG = "launcher.log"
PROFILE_FILE = "profile.yaml"
RUN_FILE = "run.json"
TAG_GLOB = "step*"
EVALS_DIR = "evals"
EVALUATION_FILE = "evaluation.json"
"""Inside an evaluation's folder: janus's record of it (:mod:`janus_train.evals.record`)."""
EVAL_JOB_FILE = "job.json"
"""Inside an evaluation's folder: its job's record (started, ended, exit code)."""
EVAL_LOG = "eval.log"
EVAL_EXPORT_DIR = "export"
EVAL_RESULTS_FILE = "results.json"
"""Inside an evaluation's folder: the JSON object of metrics its command writes (write-then-rename)."""


@dataclass(frozen=True)
class EvaluationLayout:
    """The paths of one checkpoint's external evaluation: ``RUN/evals/stepNNNNNNNN/``."""

    root: Path

    @property
    def record(self) -> Path:
        return self.root / EVALUATION_FILE

    @property
    def job(self) -> Path:
        return self.root / EVAL_JOB_FILE

    @property
    def log(self) -> Path:
        return self.root / EVAL_LOG

    @property
    def export(self) -> Path:
        return self.root / EVAL_EXPORT_DIR

    @property
    def results(self) -> Path:
        return self.root / EVAL_RESULTS_FILE

    @property
    def run(self) -> RunLayout:
        """The run directory it belongs to."""
        return RunLayout(self.root.parent.parent)


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def latest(self) -> Path:
        return self.checkpoints / LATEST_FILE

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST_TAG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def export(self) -> Path:
        return self.root / EXPORT_DIR

    @property
    def train_log(self) -> Path:
        return self.root / TRAIN_LOG

    @property
    def launcher_log(self) -> Path:
        return self.root / LAUNCHER_LOG

    @property
    def profile(self) -> Path:
        return self.root / PROFILE_FILE

    @property
    def run_file(self) -> Path:
        return self.root / RUN_FILE

    def damaged_run_file(self, stamp: str) -> Path:
        """Where a ``run.json`` that cannot be read is kept aside (``run.json.damaged-<stamp>``)."""
        return self.root / f"{RUN_FILE}.damaged-{stamp}"

    @property
    def evals(self) -> Path:
        return self.root / EVALS_DIR

    def evaluation(self, tag: str) -> EvaluationLayout:
        """The folder of the external evaluation of checkpoint ``tag`` (``stepNNNNNNNN``)."""
        return EvaluationLayout(self.evals / tag)

    def has_checkpoint(self) -> bool:
        """Whether the run has saved a checkpoint (what a resume or an export would read)."""
        return self.latest.is_file() or any(self.checkpoints.glob(TAG_GLOB))
