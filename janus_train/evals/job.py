"""The job of one checkpoint's evaluation, detached from the training run:
``python -m janus_train.evals.job RUN/evals/stepNNNNNNNN``.

Rank 0 starts it (:mod:`janus_train.evals.evaluations`) in a session of its own with its output
going to the folder's ``eval.log``, so neither a stop signal to the run nor the run's end stops it
(the end of the cluster job that runs it does: on SLURM, submit the evaluation with ``sbatch``). It

1. holds the folder's lock while it runs, so a resumed run or ``janus-train evals`` sees it running
   (and, once the lock is free without an end record, that it was killed);
2. writes ``job.json`` (host, pid, start);
3. exports the checkpoint for the evaluator in the evaluation's format into ``export/`` (janus's own
   export, with the profile the run recorded), so training never waits for an export either;
4. runs the command under ``/bin/sh``, its output appended to ``eval.log``;
5. records how it ended in ``job.json``: the command's exit code, or why it did not run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

from janus_core.system.lock import DirectoryLock
from janus_train.checkpoint.store import tag_name
from janus_train.evals.record import Evaluation, JobRecord
from janus_train.run.layout import EvaluationLayout
from janus_train.run.provenance import utc_now

SHELL = "/bin/sh"


def write_export(paths: EvaluationLayout, evaluation: Evaluation) -> None:
    """The checkpoint of ``evaluation`` exported as its format into ``export/`` (a leftover of a
    killed job is replaced), with the run's recorded profile."""
    from janus_train.checkpoint.export import export_as
    from janus_train.config import load_train_settings
    from janus_train.run.provenance import run_profile

    assert evaluation.export is not None
    run = paths.run
    profile = run_profile(run.root, None, default=None)
    settings = load_train_settings(profile)
    shutil.rmtree(paths.export, ignore_errors=True)
    print(f"[janus] exporting checkpoint {tag_name(evaluation.step)} as {evaluation.export} to {paths.export}",
          flush=True)
    export_as(evaluation.export, run.checkpoints, paths.export, profile, settings, profile.vggt.path,
              tag=tag_name(evaluation.step))


def end(job: JobRecord, paths: EvaluationLayout, exit_code: int | None = None, error: str | None = None) -> int:
    job.ended, job.exit_code, job.error = utc_now(), exit_code, error
    job.save(paths.job)
    print(f"[janus] {error or f'the command exited with code {exit_code}'}", flush=True)
    return 0 if error is None and exit_code == 0 else 1


def run(folder: Path) -> int:
    """The job of the evaluation in ``folder``; its exit code (0: the command exited 0)."""
    paths = EvaluationLayout(folder)
    evaluation = Evaluation.load(paths.record)
    with DirectoryLock.acquire(folder, purpose=f"the evaluation job of checkpoint {tag_name(evaluation.step)}"):
        job = JobRecord.me(os.getpid())
        job.save(paths.job)
        if evaluation.export is not None:
            try:
                write_export(paths, evaluation)
            except Exception as err:  # any failure is this evaluation's, told in one line; the rest in eval.log
                traceback.print_exc()
                return end(job, paths, error=f"janus could not write the {evaluation.export} export of checkpoint "
                                             f"{tag_name(evaluation.step)} for it ({type(err).__name__}: {err})")
        print(f"[janus] running: {evaluation.command}", flush=True)
        try:
            code = subprocess.call([SHELL, "-c", evaluation.command], stdin=subprocess.DEVNULL)
        except OSError as err:
            return end(job, paths, error=f"its command could not start ({SHELL}: {err.strerror})")
        # Killed by a signal: the exit status a shell reports for it.
        return end(job, paths, exit_code=128 - code if code < 0 else code)


def main() -> None:
    raise SystemExit(run(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
