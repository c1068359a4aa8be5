"""Where a training run's metric records go: ``metrics.jsonl``, one console line, TensorBoard and,
when the profile asks for it, Weights & Biases.

Only the main process logs (the records are already averaged over all ranks). The console line
of a step holds what a person watching a run needs: step/total, epoch, the loss and its parts,
LR, samples/s, the share of the step spent waiting for data and the ETA; everything else is in
``metrics.jsonl``. Every record carries ``time``, the wall-clock time it was written: ISO 8601 in
UTC with milliseconds (``2026-01-31T12:00:00.123+00:00``). Rank 0's console (what it prints,
stdout and stderr) is also appended to ``train.log`` (:class:`ConsoleCopy`).

A record that does not fit on the disk (``metrics.jsonl`` or TensorBoard's events) ends every rank
alike with one line (:func:`write_alike`), as a checkpoint save does: ``metrics.jsonl`` is cut
back to its last whole record and the checkpoints are untouched, so the same command resumes from
``latest`` once there is room.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from janus_core.system.disk_space import NoRoom, format_bytes, free_bytes, no_room_reason
from janus_core.system.files import atomic_file
from janus_train.checkpoint.store import Checkpoints
from janus_train.data.val_metric_names import EVAL_PREFIX
from janus_train.run.layout import RunLayout
from janus_train.run.provenance import utc_now

TIME_FIELD = "time"
"""The wall-clock time of a record: ISO 8601, UTC (:func:`utc_now`)."""

EVAL_STEP = "eval_step"
"""An evaluation's record: the step of the checkpoint it evaluated, the x axis of its ``eval/`` metrics."""


class WandbMissing(ValueError):
    """The profile enables Weights & Biases but the package is not installed."""


def check_wandb(project: str, source: Path | str) -> None:
    """A one-line error when ``project`` is set (``train.wandb_project``) and wandb is not installed."""
    if not project:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise WandbMissing(f"{source}: setting 'train.wandb_project' is {project!r} but the wandb package is not "
                           "installed: install the wandb extra (make setup EXTRAS=train,test,wandb), or leave the "
                           "setting empty") from None


def finite_or_none(value: Any) -> Any:
    """JSON has no NaN/inf: a non-finite float is written as null (metrics.jsonl stays strict JSON)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


def duration(seconds: float) -> str:
    """``H:MM:SS`` (whole seconds)."""
    return str(timedelta(seconds=max(0, round(seconds))))


class Eta:
    """Time left, from the average wall time of the steps this process has run so far (the first
    step, which builds caches and warms up, is left out once there are others)."""

    def __init__(self, total_steps: int) -> None:
        self.total_steps = total_steps
        self.first: tuple[int, float] | None = None  # (step, time) at the end of the first step
        self.latest: tuple[int, float] | None = None

    def update(self, step: int, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self.first is None:
            self.first = (step, now)
        self.latest = (step, now)

    def seconds_left(self, step_s: float) -> float:
        """``step_s`` (the last step's time) until there are two steps to average over."""
        if self.first is None or self.latest is None or self.latest[0] == self.first[0]:
            per_step = step_s
        else:
            per_step = (self.latest[1] - self.first[1]) / (self.latest[0] - self.first[0])
        step = self.latest[0] if self.latest is not None else 0
        return per_step * max(0, self.total_steps - step)


def step_line(record: dict[str, Any], total_steps: int, eta_s: float) -> str:
    """The console line of a logged record."""
    def number(name: str, fmt: str) -> str:
        value = record.get(name)
        return "nan" if value is None else format(value, fmt)

    line = (f"step {record['step']}/{total_steps} ep {record['epoch']} | loss {number('loss', '.4f')} "
            f"(tok {number('token_loss', '.4f')} act {number('action_loss', '.4f')}) "
            f"grad {number('grad_norm', '.3g')} | lr {record['lr']:.2e} | {record['samples_per_s']:.2f} samples/s "
            f"wait {100 * record['data_wait_share']:.0f}% | eta {duration(eta_s)}")
    if record.get("nonfinite_skips"):
        line += f" | non-finite skips {record['nonfinite_skips']}"
    if record.get("damaged_skips"):
        line += f" | damaged samples skipped {record['damaged_skips']}"
    if record.get("val_loss") is not None:
        # Action accuracy of the head and of the LM's ACTION: tokens.
        line += (f" | val loss {record['val_loss']:.4f} acc head {number('val_action_accuracy', '.2f')} "
                 f"lm {number('val_action_token_accuracy', '.2f')}" + (" (best)" if record.get("val_best") else ""))
    if "live_feature_max_abs" in record:
        line += (f" | live check: feature diff {record['live_feature_max_abs']:.3g}, "
                 f"loss rel diff {record['live_loss_rel_diff']:.3g}")
    return line


DASHBOARD_SECTIONS = ("val",)
"""Record names ``<section>_<metric>`` that a dashboard shows in a section of their own (``val/loss``);
every other name is a training metric (``train/loss``)."""


def dashboard_tag(name: str) -> str:
    """A record's name as TensorBoard and Weights & Biases show it: ``val_loss`` -> ``val/loss``,
    ``loss`` -> ``train/loss`` (the one place the tags are named; metrics.jsonl keeps the names)."""
    section, _, metric = name.partition("_")
    return f"{section}/{metric}" if section in DASHBOARD_SECTIONS and metric else f"train/{name}"


def quiet_tensorboard_thread_on_full_disk(directory: Path) -> None:
    """TensorBoard writes its events on a thread of its own, which on a full disk prints its
    traceback as it dies and hands the error on to the writer's next flush (:meth:`RunLog.write`
    turns that into the one line): that thread's no-room death stays quiet. Other threads' and
    other errors go to the hook there was."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        if (type(args.thread).__name__ == "_AsyncWriterThread" and args.exc_value is not None
                and no_room_reason(args.exc_value, directory) is not None):
            return
        previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def _logged_by(line: bytes, step: int) -> bool:
    """Whether a line of ``metrics.jsonl`` is a whole record of ``step`` or earlier."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step


def last_logged_step(metrics_file: Path) -> int:
    """The step of the last whole record of ``metrics.jsonl`` (0: none): where records added after a
    run ended (an evaluation's late results) go in its step order."""
    if not metrics_file.is_file():
        return 0
    for line in reversed(metrics_file.read_bytes().splitlines()):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return int(record["step"])
    return 0


class RunLog:
    """The main process's sinks for metric records; build it on rank 0 only."""

    def __init__(self, out_dir: Path, metrics_file: Path, total_steps: int, wandb_project: str = "",
                 run_config: dict[str, Any] | None = None) -> None:
        self.out_dir, self.metrics_file, self.total_steps = out_dir, metrics_file, total_steps
        self.eta = Eta(total_steps)
        self.tensorboard: Any = None
        self.purge_step: int | None = None  # TensorBoard hides events from this step on (a resume)
        self.wandb: Any = None
        if wandb_project:
            import wandb

            self.wandb = wandb.init(project=wandb_project, dir=str(out_dir), config=run_config or {},
                                    name=out_dir.name, resume="allow")
            # The evaluations' metrics on their own axis, the step of the checkpoint each evaluated.
            self.wandb.define_metric(EVAL_STEP)
            self.wandb.define_metric(f"{EVAL_PREFIX}*", step_metric=EVAL_STEP)
        self._wandb_evaluations: list[dict[str, Any]] = []  # each waiting for a W&B row of its own
        self._wandb_row = -1  # the last W&B step written

    def resume_at(self, step: int) -> None:
        """A run (re)starts after ``step`` (0: from scratch): records of later steps, written by a run
        killed before its next checkpoint, are dropped from ``metrics.jsonl`` (a line cut short by
        the kill goes too) and hidden in TensorBoard, so each step is logged once. Records are
        appended in step order, so those are the file's tail: it is cut off in place, which needs
        no room (the same command resumes on a disk that is still full); anything else is an
        atomic rewrite."""
        self.purge_step = step + 1
        if not self.metrics_file.is_file():
            return
        lines = self.metrics_file.read_bytes().splitlines(keepends=True)
        kept = [_logged_by(line, step) for line in lines]
        first_dropped = next((i for i, keep in enumerate(kept) if not keep), None)
        if first_dropped is None and (not lines or lines[-1].endswith(b"\n")):
            return
        if first_dropped is not None and not any(kept[first_dropped:]):
            os.truncate(self.metrics_file, sum(len(line) for line in lines[:first_dropped]))
            return
        with atomic_file(self.metrics_file) as f:
            f.writelines(line.rstrip(b"\r\n") + b"\n" for line, keep in zip(lines, kept) if keep)

    def step_done(self, step: int) -> None:
        """Call after every step (logged or not), so the ETA averages them all."""
        self.eta.update(step)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` to every sink; :class:`NoRoom` when a file sink ran out of room (a part
        of its line is cut off again, so ``metrics.jsonl`` holds whole records only)."""
        clean = {name: finite_or_none(value) for name, value in record.items()}
        clean.setdefault(TIME_FIELD, utc_now())
        line = self._append(clean)
        print(step_line(clean, self.total_steps, self.eta.seconds_left(record["step_s"])), flush=True)
        scalars = {dashboard_tag(name): value for name, value in clean.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step"}
        try:
            self._tensorboard_write(scalars, record["step"])
        except Exception as err:
            raise self._no_room(err, RunLayout(self.out_dir).tensorboard, record["step"], len(line.encode())) from None
        if self.wandb is not None:
            self.wandb.log(scalars, step=record["step"])
            self._wandb_row = record["step"]
            if self._wandb_evaluations:  # one evaluation per row: two in one row would overwrite each other
                self.wandb.log(self._wandb_evaluations.pop(0), step=self._wandb_row)

    def write_evaluation(self, step: int, eval_step: int, metrics: dict[str, float], best: bool | None) -> None:
        """Append an external evaluation's ``metrics`` of the checkpoint of ``eval_step``, logged at
        training step ``step`` (``metrics.jsonl`` stays in step order), as ``eval/<NAME>``: one console
        line, TensorBoard with ``eval_step`` as their step, W&B on the ``eval_step`` axis (in a row of
        its own, the next training row's or one after the last). ``best``: whether it became the best
        checkpoint (None: the best is not chosen by an evaluation). :class:`NoRoom` as :meth:`write`."""
        named = {f"{EVAL_PREFIX}{name}": finite_or_none(value) for name, value in metrics.items()}
        record: dict[str, Any] = {"step": step, EVAL_STEP: eval_step, **named}
        if best is not None:
            record["eval_best"] = best
        record[TIME_FIELD] = utc_now()
        line = self._append(record)
        shown = " ".join(f"{name} {'null' if value is None else format(value, '.4g')}" for name, value in named.items())
        print(f"evaluation of step {eval_step}: {shown}" + (" (best)" if best else ""), flush=True)
        scalars = {name: value for name, value in named.items() if value is not None}
        try:
            self._tensorboard_write(scalars, eval_step)
        except Exception as err:
            raise self._no_room(err, RunLayout(self.out_dir).tensorboard, step, len(line.encode())) from None
        if self.wandb is not None:
            self._wandb_evaluations.append({**scalars, EVAL_STEP: eval_step})

    def _append(self, record: dict[str, Any]) -> str:
        """Append ``record`` (finite values) to ``metrics.jsonl`` as one line, which it returns; on a
        full disk the part written is cut off again and :class:`NoRoom` raised."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, allow_nan=False) + "\n"
        written = self.metrics_file.stat().st_size if self.metrics_file.is_file() else 0
        try:
            with open(self.metrics_file, "a") as f:
                f.write(line)
        except OSError as err:
            if self.metrics_file.is_file():
                os.truncate(self.metrics_file, written)
            raise self._no_room(err, self.metrics_file, record["step"], len(line.encode())) from None
        return line

    def _tensorboard_write(self, scalars: dict[str, float], step: int) -> None:
        if self.tensorboard is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.tensorboard = False
            else:
                directory = RunLayout(self.out_dir).tensorboard
                quiet_tensorboard_thread_on_full_disk(directory)
                self.tensorboard = SummaryWriter(str(directory), purge_step=self.purge_step)
        if self.tensorboard:
            for name, value in scalars.items():
                self.tensorboard.add_scalar(name, value, step)
            self.tensorboard.flush()

    def _no_room(self, err: BaseException, path: Path, step: int, needed: int) -> BaseException:
        """The one-line :class:`NoRoom` when ``err`` means the disk is full; ``err`` itself otherwise."""
        reason = no_room_reason(err, self.out_dir)
        if reason is None:
            return err
        return NoRoom(f"{path}: no room left writing the metrics of step {step} ({reason}): the disk has "
                      f"{format_bytes(free_bytes(path))} free and the step's record needs {format_bytes(needed)}")

    def close(self) -> None:
        if self.tensorboard:
            try:
                self.tensorboard.close()
            except Exception as err:
                # After a full disk (said in its one line) the writer re-raises its failure.
                if no_room_reason(err, self.out_dir) is None:
                    raise
        if self.wandb is not None:
            for row in self._wandb_evaluations:  # after the last training row: each its own
                self._wandb_row += 1
                self.wandb.log(row, step=self._wandb_row)
            self.wandb.finish()


def write_alike(log: RunLog | None, record: dict[str, Any], checkpoints: Checkpoints) -> None:
    """Every rank calls it: rank 0 (the one holding ``log``) writes ``record``; a write that ran out
    of room raises :class:`NoRoom` on every rank alike, its line saying how the run goes on."""
    message = None
    if log is not None:
        try:
            log.write(record)
        except NoRoom as err:
            message = f"{err}; the checkpoints are unchanged, {checkpoints.rerun_hint()}"
    message = checkpoints.from_main(message)
    if message is not None:
        raise NoRoom(message)


class _Copy:
    """A console stream whose writes also go to a file (until the file fails, e.g. a full disk:
    the console matters more, and the metrics' own write says the disk is full)."""

    def __init__(self, stream: Any, file: Any) -> None:
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        if self.file is not None:
            try:
                self.file.write(text)
            except (OSError, ValueError):
                self.file = None
        return written

    def flush(self) -> None:
        self.stream.flush()
        if self.file is not None:
            try:
                self.file.flush()
            except (OSError, ValueError):
                self.file = None

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding... are the console's
        return getattr(self.stream, name)


class ConsoleCopy:
    """Rank 0's console (``sys.stdout`` and ``sys.stderr``) also appended to ``path`` (``train.log``)
    while it is open, so a run's output survives its terminal; a resume appends to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: Any = None
        self._streams: tuple[Any, Any] | None = None

    def __enter__(self) -> ConsoleCopy:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        except OSError:  # an unwritable run folder: the run's own writes say so in one line
            return self
        self._streams = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = _Copy(sys.stdout, self._file), _Copy(sys.stderr, self._file)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._streams is not None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            sys.stdout, sys.stderr = self._streams
            self._streams = None
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None
