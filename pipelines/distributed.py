"""Ranks, the control channel between them, and a whole-job progress display on rank 0.

Precompute needs no tensor collectives, only barriers and small messages, so the control
channel is a gloo process group on every machine (GPU or not).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from janus_core.system.device import process_device
from janus_core.system.disk_space import format_bytes
from janus_core.system.lock import DirectoryLock
from janus_core.system.threads import usable_cores  # noqa: F401 - the trainer's loader note reads it here
from pipelines.cpu_comm_op import environment_extensions, load_cpu_comm_op
from pipelines.library_output import library_chatter_hidden, name_deepspeed_accelerator
from pipelines.parent_death import LAUNCHER_PID_VARIABLE, PARENT_VARIABLE

if TYPE_CHECKING:  # imported when a training rank joins its group: the light commands need no torch
    import torch

T = TypeVar("T")


class RankFailed(RuntimeError):
    """Another rank (or rank 0's shared step) failed; carries that rank's one-line reason."""


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls) -> Ranks:
        """Read torchrun's variables; a plain process is rank 0 of 1."""
        env = os.environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world=int(env.get("LOCAL_WORLD_SIZE", 1)),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


RANK_VARIABLES: tuple[str, ...] = (
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
"""What torchrun sets for each rank it starts (besides ``TORCHELASTIC_*``)."""


def environment_outside_ranks() -> dict[str, str]:
    """This process's environment less what makes a process one of torchrun's ranks (and one of
    janus's launcher's): for a process a rank starts that is no rank, e.g. an evaluation's job,
    whose command (a torchrun of its own, ``sbatch``) must start afresh."""
    dropped = (*RANK_VARIABLES, LAUNCHER_PID_VARIABLE, PARENT_VARIABLE)
    return {name: value for name, value in os.environ.items()
            if name not in dropped and not name.startswith("TORCHELASTIC_")}


LAUNCHER_GRACE_S = 30.0
"""How long a rank other than 0 waits, after a failure every rank meets alike, for the launcher to
end it once rank 0 has said why and exited."""


def init_distributed(kind: str, alloc_conf: str = "") -> torch.device:
    """Join the launcher's process group (NCCL on GPU, gloo on CPU) for a process computing on ``kind``
    (a profile's ``device``); returns this process's device.

    Idempotent, so the entry point calls it before building the parts (e.g. to run a start-up
    check on rank 0 and broadcast the verdict). ``alloc_conf`` is set as ``PYTORCH_CUDA_ALLOC_CONF``
    (unless already set) before CUDA initialises, when it still counts.
    """
    cuda = kind == "cuda"
    name_deepspeed_accelerator(kind)  # spares every rank DeepSpeed's detection warning
    environment_extensions()  # any op DeepSpeed builds goes into this environment
    if not cuda:  # the environment's build of DeepSpeed's CPU op, or a build said in one line
        load_cpu_comm_op(announce_wait=os.environ.get("LOCAL_RANK", "0") == "0")
    import deepspeed
    import torch

    if alloc_conf and cuda:
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", alloc_conf)
    # DeepSpeed print()s "... shm_comm_op built successfully" on every rank at every start.
    with library_chatter_hidden():
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    if not cuda:
        return torch.device("cpu")
    device = process_device(kind, int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def fail_alike(ranks: Ranks, message: str, code: int = 1) -> NoReturn:
    """End this rank over a failure every rank meets alike (a bad setting, a refused cache): rank 0
    prints the one ``error:`` line and exits with ``code``; the others wait for the launcher to end
    them. torchrun stops every rank as soon as one ends, so a quieter rank exiting first could cut
    rank 0 off before its line."""
    if ranks.is_main:
        print(f"error: {message}", file=sys.stderr, flush=True)
    elif ranks.world > 1:
        # The launcher ends this rank with SIGTERM to its process group: die of it at once, as a run's
        # stop-signal handler would outlive it and the loader workers' deaths raise a traceback here.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(LAUNCHER_GRACE_S)
    raise SystemExit(code)


class Control:
    """Barriers and rank-0 broadcasts; a no-op channel for a single process."""

    def __init__(self, ranks: Ranks, timeout_minutes: float = 120.0) -> None:
        self.ranks = ranks
        self.distributed = ranks.world > 1
        if self.distributed:
            # Imported with the first channel of several ranks: what a command checks before it (its
            # settings, fail_alike) needs no torch.
            import torch.distributed as dist

            self.dist = dist
            if not dist.is_initialized():
                dist.init_process_group("gloo", timeout=timedelta(minutes=timeout_minutes))

    def barrier(self) -> None:
        if self.distributed:
            self.dist.barrier()

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 and give every rank its result; a failure fails every rank alike."""
        payload: list[Any] = [None]
        if self.ranks.is_main:
            try:
                payload[0] = ("ok", fn())
            except Exception as err:  # noqa: BLE001 - re-raised on every rank below
                payload[0] = ("error", f"{type(err).__name__}: {err}" if not str(err) else str(err))
        if self.distributed:
            self.dist.broadcast_object_list(payload, src=0)
        status, value = payload[0]
        if status == "error":
            raise RankFailed(value)
        return value

    def gather(self, fn: Callable[[], T], plain: tuple[type[BaseException], ...] = (ValueError,)) -> list[T]:
        """Run ``fn`` on every rank and give every rank all results (rank order).

        A failure on any rank fails every rank alike (:class:`RankFailed`) with a one-line reason:
        the message of an exception of a ``plain`` type (a user-facing error) as is, of any other
        with its type named; the same reason on every rank once, else the lowest failing rank's,
        naming it. Every rank reaches the exchange (its own failure is caught), so no rank is left
        waiting in a barrier for one that died.
        """
        try:
            mine: tuple[str, Any] = ("ok", fn())
        except Exception as err:  # noqa: BLE001 - re-raised on every rank below
            mine = ("error", str(err) if isinstance(err, plain) and str(err) else f"{type(err).__name__}: {err}")
        parts: list[Any] = [mine]
        if self.distributed:
            parts = [None] * self.ranks.world
            self.dist.all_gather_object(parts, mine)
        errors = {rank: value for rank, (status, value) in enumerate(parts) if status == "error"}
        if len(errors) == len(parts) and len(set(errors.values())) == 1:
            raise RankFailed(next(iter(errors.values())))
        if errors:
            first = min(errors)
            others = f" (rank{'s' if len(errors) > 2 else ''} {', '.join(map(str, sorted(errors)[1:]))} failed too)" \
                if len(errors) > 1 else ""
            raise RankFailed(f"rank {first}: {errors[first]}{others}")
        return [value for _, value in parts]

    def close(self) -> None:
        if self.distributed and self.dist.is_initialized():
            # Every rank past its last exchange before any tears gloo down: a rank that destroys the
            # group while a peer still sends to it can abort at exit ("terminate called ...").
            with contextlib.suppress(Exception):
                self.dist.barrier()
            self.dist.destroy_process_group()


def lock_on_main(control: Control, directory: Path, exclusive: bool = True,
                 purpose: str = "") -> DirectoryLock | None:
    """Rank 0 takes ``directory``'s lock for the run (a writer's, or a reader's when not
    ``exclusive``; ``purpose`` names the run to whoever it refuses) and keeps it until it releases
    it or ends; other ranks get None.

    Held by rank 0 alone, as it is the rank that prepares and finishes: the other ranks end with
    it (every failure ends every rank) and with the launcher. A lock held elsewhere fails every
    rank alike (:class:`RankFailed`) with the one-line reason naming the holder.
    """
    from janus_cache.store.location import is_remote

    if is_remote(directory):
        # A bucket has no OS lock: its readers hold none, and its one writer (janus-cache push)
        # holds a lock object of its own (janus_cache.store.remote.lock).
        assert not exclusive, f"{directory}: a cache in a bucket is written by janus-cache push only"
        return None
    held: list[DirectoryLock] = []

    def take() -> None:
        held.append(DirectoryLock.acquire(directory, exclusive, purpose))
        note = held[0].takeover_note()
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)

    control.on_main(take)
    return held[0] if held else None


@contextlib.contextmanager
def job_on_directory(ranks: Ranks, directory: Path, exclusive: bool = True) -> Iterator[tuple[Control, Progress]]:
    """The frame of a job of every rank on one directory (the cache a precompute writes or a verify
    reads): the control channel, rank 0's progress display, and rank 0's lock on ``directory``
    (:func:`lock_on_main`), taken before the job reads or deletes anything; all three are released
    however the job ends. A writer's progress polls check its lock (:meth:`DirectoryLock.check`):
    a lock another process took after its file was deleted ends the job with one line."""
    control = Control(ranks)
    progress = Progress(enabled=ranks.is_main)
    lock = None
    try:
        lock = lock_on_main(control, directory, exclusive)
        if lock is not None and exclusive:
            progress.guard = lock.check  # a writer whose lock was taken from it stops at its next poll
        yield control, progress
    finally:
        progress.close()
        if lock is not None:
            lock.release()
        control.close()


class CommitTally:
    """Rows of a phase committed so far, counted from commit records without listing a directory.

    Knows every rank's pending shards (each rank writes its own in increasing order) and, per
    call, looks only at the next pending shard of each rank until it finds one without a record:
    O(shards + calls x ranks) over a phase, where listing the records at each call is O(shards^2).
    """

    def __init__(self, committed: Callable[[int], bool], shard_rows: Sequence[int],
                 pending_by_rank: Sequence[Sequence[int]]) -> None:
        self._committed = committed
        self._rows = shard_rows
        self._queues = [deque(pending) for pending in pending_by_rank]
        self.done = sum(shard_rows) - sum(shard_rows[s] for pending in pending_by_rank for s in pending)

    def __call__(self) -> int:
        for queue in self._queues:
            while queue and self._committed(queue[0]):
                self.done += self._rows[queue.popleft()]
        return self.done


class Progress:
    """One progress display for the whole job: a bar on a terminal, periodic log lines otherwise.

    The count is read from shared state (e.g. commit records on disk), so rank 0 shows the work
    of every rank, not only its own.
    """

    def __init__(self, enabled: bool, log_every: float = 10.0) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.log_every = log_every
        self._bar: Any = None
        self._phase = ""
        self._total = 0
        self._start = 0.0
        self._last_log = 0.0
        self._done = 0
        self._initial = 0
        self._last_poll = 0.0
        self._bytes = False
        self.guard: Callable[[], None] | None = None
        """Called at every poll (rank 0's, after each of its shards): raises to stop the job."""

    def phase(self, name: str, total: int, unit: str, done: int = 0) -> None:
        """Start a phase of ``total`` units (``unit``: e.g. ``frames``; ``B``: bytes, shown scaled
        as kB/MB/GB with their rate), ``done`` of them already done before this run."""
        self.close()
        done = min(done, total)
        self._phase, self._total, self._done, self._initial = name, total, done, done
        self._bytes = unit == "B"
        self._start = self._last_log = time.perf_counter()
        if not self.enabled:
            return
        if self.tty:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=done, desc=name, unit=unit if self._bytes else f" {unit}",
                             unit_scale=self._bytes, unit_divisor=1000, dynamic_ncols=True)
        else:
            resumed = f", {self._amount(done)} already done" if done else ""
            amount = self._amount(total) if self._bytes else f"{total} {unit}"
            print(f"[{name}] {amount}{resumed}", file=sys.stderr, flush=True)

    def _amount(self, n: float) -> str:
        return format_bytes(n) if self._bytes else f"{n:.0f}"

    def _rate(self, per_second: float) -> str:
        """A rate per second; under 100 with a decimal (a slow phase reads 0.4/s, not 0/s)."""
        return self._amount(per_second) if self._bytes or per_second >= 100 else f"{per_second:.1f}"

    def update(self, done: int) -> None:
        done = min(done, self._total)
        if not self.enabled or done <= self._done:
            return
        if self._bar is not None:
            self._bar.update(done - self._done)
        self._done = done
        now = time.perf_counter()
        if not self.tty and (now - self._last_log >= self.log_every or done == self._total):
            self._last_log = now
            rate = (done - self._initial) / max(now - self._start, 1e-9)
            eta = (self._total - done) / rate if rate > 0 else float("inf")
            print(
                f"[{self._phase}] {self._amount(done)}/{self._amount(self._total)} "
                f"({100 * done / max(self._total, 1):.0f}%) {self._rate(rate)}/s, ETA {eta:.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def poll(self, count: Callable[[], int], force: bool = False) -> None:
        """Update from shared state: ``count`` (e.g. listing commit records) is only called on
        the displaying rank, at most twice a second unless ``force``; other ranks pay nothing.
        The :attr:`guard` runs first (on the displaying rank)."""
        if not self.enabled:
            return
        if self.guard is not None:
            self.guard()
        now = time.perf_counter()
        if force or now - self._last_poll >= 0.5:
            self._last_poll = now
            self.update(count())

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
