"""Preemption: a stop signal ends a run at the next optimizer step, with a checkpoint.

A cluster stops a job with a signal (SLURM: SIGTERM at preemption or the time limit, or the signal
``#SBATCH --signal`` asks for before it); a user stops one with Ctrl-C (SIGINT). On any of the
run's ``train.stop_signals``, on any rank (the launcher forwards its own to every rank), the run
finishes the optimizer step it is in, saves a checkpoint like every other, and exits with
:data:`PREEMPTED_EXIT_CODE`; running the same command again resumes after that step.

The ranks must stop after the same step (a checkpoint is a collective): the handler only sets a
flag, and once per optimizer step the ranks all-reduce it with MAX (:meth:`Preemption.agreed`), so
a signal that reached one rank only stops all of them after the same step. A second signal ends
the process at once (its default action); the last complete checkpoint stays the resume point. A
repeat within :data:`SAME_REQUEST_S` is the same request: SLURM's SIGTERM at a preemption reaches
every process of the job, so a rank gets it directly and again from its launcher, which forwards it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType

from janus_core.system.processes import forks_die_with_this_process

PREEMPTED_EXIT_CODE = 75
"""Exit code of a run stopped by a stop signal after saving its checkpoint (sysexits.h's
EX_TEMPFAIL: try again later): a job script requeues the run on it (examples/slurm/train.sbatch)."""

SAME_REQUEST_S = 2.0
"""A stop signal this soon after the first one repeats it (the launcher forwards a signal at once)."""

def signal_numbers(names: Iterable[str]) -> tuple[signal.Signals, ...]:
    return tuple(signal.Signals[name] for name in names)


@dataclass
class Preemption:
    """The stop signals of one process: :meth:`arm` installs the handler, :meth:`agreed` is the
    once-per-step agreement of all ranks."""

    signals: tuple[str, ...]
    received: str | None = None  # the first stop signal's name
    stopping: bool = False  # the ranks agreed to stop (set by :meth:`agreed`)
    stopped_by: str | None = None  # a signal that one of the ranks received, once they agreed
    same_request_s: float = SAME_REQUEST_S
    _first_at: float = field(default=0.0, repr=False)
    _pid: int = field(default=0, repr=False)
    _previous: dict[signal.Signals, object] = field(default_factory=dict, repr=False)

    def arm(self) -> "Preemption":
        """Handle the stop signals in this process (the main thread; forked loader workers inherit
        the handler and ignore it, so a signal sent to every process of a job spares them). As they
        ignore SIGTERM, every process forked from here on dies with this one instead (its parent-death
        signal): no worker outlives its rank, whatever it is blocked in."""
        forks_die_with_this_process()
        self._pid = os.getpid()
        for number in signal_numbers(self.signals):
            self._previous[number] = signal.signal(number, self._handle)
        return self

    def disarm(self) -> None:
        """Restore the handlers :meth:`arm` replaced (e.g. before the process exits)."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, number: int, _frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a forked loader worker: its rank decides
            return
        now = time.monotonic()
        if self.received is None:
            self.received, self._first_at = signal.Signals(number).name, now
        elif now - self._first_at > self.same_request_s:  # a second request: end at once, as by default
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)

    @property
    def requested(self) -> bool:
        return self.received is not None

    def agreed(self, device: object = "cpu") -> bool:
        """Whether any rank received a stop signal (every rank must call it, once per step; the same
        answer on every rank). One process needs no process group."""
        import torch
        import torch.distributed as dist

        mine = int(signal.Signals[self.received]) if self.received is not None else 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # The largest signal number any rank received (0: none): one small all-reduce per step.
            flag = torch.tensor([mine], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            mine = int(flag.item())
        if mine:
            self.stopping, self.stopped_by = True, signal.Signals(mine).name
        return self.stopping


def stopped_message(signal_name: str | None, step: int, checkpoint: str) -> str:
    """The one line of a run that stopped on a stop signal."""
    return (f"stopped by {signal_name} after step {step}: checkpoint {checkpoint} saved; run the same command "
            f"again to resume from step {step} (exit code {PREEMPTED_EXIT_CODE})")
