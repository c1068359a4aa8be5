"""Where a training run's metric records go: ``metrics.jsonl``, one console line, TensorBoard and,
when the profile asks for it, Weights & Biases.

Only the main process logs (the records are already averaged over all ranks). The console line
of a step holds what a person watching a run needs: step/total, epoch, the loss and its parts,
LR, samples/s, the share of the step spent waiting for data and the ETA; everything else is in
``metrics.jsonl``.
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any


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
                           "installed (pip install wandb, or leave the setting empty)") from None


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

    def resume_at(self, step: int) -> None:
        """A run (re)starts after ``step`` (0: from scratch): records of later steps, written by a run
        killed before its next checkpoint, are dropped from ``metrics.jsonl`` (an atomic rewrite; a
        line cut short by the kill goes too) and hidden in TensorBoard, so each step is logged once."""
        self.purge_step = step + 1
        if not self.metrics_file.is_file():
            return
        kept = []
        for line in self.metrics_file.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(line + "\n")
        tmp = self.metrics_file.with_name(f".{self.metrics_file.name}.tmp")
        with open(tmp, "w") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.metrics_file)

    def step_done(self, step: int) -> None:
        """Call after every step (logged or not), so the ETA averages them all."""
        self.eta.update(step)

    def write(self, record: dict[str, Any]) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        clean = {name: finite_or_none(value) for name, value in record.items()}
        with open(self.metrics_file, "a") as f:
            f.write(json.dumps(clean, allow_nan=False) + "\n")
        print(step_line(clean, self.total_steps, self.eta.seconds_left(record["step_s"])), flush=True)
        scalars = {name: value for name, value in clean.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "step"}
        if self.tensorboard is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.tensorboard = False
            else:
                self.tensorboard = SummaryWriter(str(self.out_dir / "tensorboard"), purge_step=self.purge_step)
        if self.tensorboard:
            for name, value in scalars.items():
                self.tensorboard.add_scalar(name, value, record["step"])
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=record["step"])

    def close(self) -> None:
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
