"""``python -m pipelines.launch [--launcher-log FILE] TORCHRUN_ARGS...``: torchrun, with its own
report of a failure in a log file instead of the console.

When a rank fails, janus's rank prints its one ``error:`` line, and then torchrun itself (the
launcher, this process) logs a 30-50 line ``ChildFailedError`` report and a traceback of its own
after it, so the last thing a user reads is the launcher's dump. Here torchrun runs in this process
(``torch.distributed.run``, the same code as the ``torchrun`` script, so the ranks remain this
process's children and die with it), its loggers write to ``FILE`` (created only when something
is logged; default: a new file in the temporary folder) and a failure ends with one line naming
the failed rank, its exit code and the log. The launcher creates no folder: while ``FILE``'s folder
does not exist (a run directory its ranks have not made yet, ``RUN/launcher.log``), the report goes
to the temporary folder and moves into ``FILE`` at the end if the ranks made it, so a start the ranks
refuse leaves no run directory behind. The ranks' own output is not touched: their stdout/stderr
remain the console's.

Signals: the first SIGTERM, SIGINT, SIGUSR1 or SIGUSR2 (the stop signals a run may choose,
``janus_train.loop.preemption``) is forwarded to every rank and the launcher waits for them, however long
their checkpoint takes (torchrun's own handler would SIGKILL them 30 s later); a training run then
stops after its current step with a checkpoint and exit code 75 (its rank 0 says where it will
resume). A second signal stops the ranks at once, as torchrun does.

Under ``make`` (``make train``: the launcher is make's child), make passes on a SIGTERM itself, but
a SIGINT or SIGHUP sent to make alone would not reach the ranks: make only waits for its child.
:class:`MakeWatch` notices it (make's handler restores the signal's default action, which /proc
shows) and a make that died (re-parenting the launcher), and stops the ranks as if the launcher had
received the signal (SIGINT; SIGTERM for the others). GNU make takes SIGUSR1 to toggle its debug
output, invisibly: send SIGUSR1 to the launcher (``pipelines.launch``) instead.

Exit code: 0 on success; 75 when the ranks stopped on a stop signal with a checkpoint; the first
failed rank's exit code (128 + N when it died of signal N); 1 when the launcher itself fails.

A stop with a checkpoint is no failure, but torchrun reports it as one ("FAILED ... exitcode: 75",
kept in the log with a closing line that says it was a clean stop) and under ``make`` so does make
(``make: *** [...] Error 75``, and make exits 2: GNU make has no other exit code for a failed
recipe). Under make the launcher therefore says in one line, just before make's, that the run
stopped cleanly and how it resumes; a job script that requeues on exit code 75 runs the launcher (or
``janus-train run``) itself, as ``examples/slurm/train.sbatch`` does.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipelines.frozen_imports import frozen_imports
from pipelines.parent_death import LAUNCHER_PID_VARIABLE

# What this module imports at its top is the standard library's and the launch layer's own (a few
# ms); janus's stop-signal facts and torch load in main(), where a Ctrl-C is one line.

LOG_OPTION = "--launcher-log"
LOGGER = "torch.distributed"
"""Every torchrun logger (the elastic agent, its process handling, the rendezvous) is under it."""


def default_log() -> Path:
    return Path(tempfile.gettempdir()) / f"janus-launcher-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


def split_arguments(argv: list[str]) -> tuple[Path, list[str]]:
    """(log file, torchrun's arguments): ``--launcher-log FILE`` must come first."""
    if argv[:1] == [LOG_OPTION]:
        if len(argv) < 2:
            raise SystemExit(f"error: {LOG_OPTION} needs a file")
        return Path(argv[1]), argv[2:]
    if argv[:1] and argv[0].startswith(f"{LOG_OPTION}="):
        return Path(argv[0].split("=", 1)[1]), argv[1:]
    return default_log(), argv


def usable_log(path: Path) -> Path:
    """``path`` when its folder exists, else a file in the temporary folder: the launcher creates no
    run directory (a start its ranks refuse leaves none behind); :meth:`ReportFile.settle` moves the
    report into ``path`` once the ranks made its folder."""
    return path if path.parent.is_dir() and not path.is_dir() else default_log()


class ReportFile(logging.FileHandler):
    """torchrun's log file (opened on the first record). A write that fails (a full disk) is
    remembered for the closing line instead of logging's "--- Logging error ---" traceback."""

    def __init__(self, path: Path, wanted: Path | None = None) -> None:
        super().__init__(path, delay=True)
        self.path = path
        self.wanted = wanted or path
        """Where the report belongs (RUN/launcher.log), when its folder did not exist yet at the start."""
        self.failure: OSError | None = None
        self.attempted = 0  # bytes of every record and report meant for the file

    def emit(self, record: logging.LogRecord) -> None:
        self.attempted += len(self.format(record).encode()) + 1
        super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if self.failure is None and isinstance(error, OSError):
            self.failure = error

    def append(self, text: str) -> None:
        """Add ``text`` (e.g. torchrun's failure report) after the records."""
        self.attempted += len(text.encode())
        try:
            with open(self.path, "a") as f:
                f.write(text)
        except OSError as err:
            self.failure = self.failure or err

    def close(self) -> None:
        try:
            super().close()
        except OSError as err:  # its last flush, on a full disk
            self.failure = self.failure or err

    def settle(self) -> None:
        """Close the file and move what it holds where it belongs, if the ranks made that folder."""
        self.close()
        if self.path == self.wanted or not self.path.is_file() or usable_log(self.wanted) != self.wanted:
            return
        try:
            with open(self.wanted, "a") as f:  # after an earlier start's report, as the log is appended
                f.write(self.path.read_text())
            self.path.unlink()
        except OSError:
            return  # the report stays where it is, and the closing line names it there
        self.path = self.wanted

    def where(self, what: str = "torchrun's report") -> str:
        """Where ``what`` is, or the one-line reason it could not be written (bytes and the fix)."""
        if self.failure is None:
            return f"{what}: {self.path}"
        from janus_core.system.disk_space import format_bytes

        free = shutil.disk_usage(self.path.parent).free if self.path.parent.is_dir() else 0
        return (f"{what} could not be written to {self.path} ({self.failure.strerror or self.failure}): the disk has "
                f"{format_bytes(free)} free and the report needs {format_bytes(self.attempted)}; free space there "
                f"or pass {LOG_OPTION} FILE on another disk")


def log_to_file(path: Path, wanted: Path | None = None) -> ReportFile:
    """Route torchrun's loggers to ``path`` (opened on the first record; ``wanted``: where it moves
    to, see :func:`usable_log`) instead of stderr.

    Call after importing torch: its import gives ``torch.distributed`` a console handler of its own.
    """
    handler = ReportFile(path, wanted)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger(LOGGER)
    for console in list(logger.handlers):
        logger.removeHandler(console)
    logger.addHandler(handler)
    logger.propagate = False
    return handler


def child_pids() -> list[int]:
    """This process's children (the ranks), from every thread's /proc children list (Linux)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*"):
        try:
            pids += [int(pid) for pid in (task / "children").read_text().split()]
        except OSError:
            continue
    return pids


class Forwarder:
    """The launcher's handler of the stop signals: the first is forwarded to the ranks (which stop
    after their step with a checkpoint) and the launcher goes on waiting for them; a second one,
    or one before any rank started, stops the launch as torchrun's own handler does."""

    def __init__(self) -> None:
        self.forwarded: str | None = None

    def arm(self) -> None:
        from janus_train.config import STOP_SIGNAL_CHOICES
        from janus_train.loop.preemption import signal_numbers

        for number in signal_numbers(STOP_SIGNAL_CHOICES):
            signal.signal(number, self.handle)

    def handle(self, number: int, _frame: object) -> None:
        from torch.distributed.elastic.multiprocessing.api import SignalException

        sigval = signal.Signals(number)
        ranks = child_pids()
        if self.forwarded is not None or not ranks:
            raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)
        self.forwarded = sigval.name
        logging.getLogger(LOGGER).warning("forwarded %s to the ranks %s; waiting for them", sigval.name, ranks)
        for pid in ranks:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass


def caught_signals(pid: int) -> int | None:
    """The mask of signals process ``pid`` handles (/proc's SigCgt; None when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    except (OSError, ValueError):
        return None
    return None


class MakeWatch(threading.Thread):
    """Passes on to this launcher the stop signals that its parent ``make`` received and keeps."""

    PERIOD_S = 0.2
    GRACE_S = 0.5  # a Ctrl-C reaches make and the launcher alike: the launcher's own comes first

    def __init__(self, forwarder: Forwarder, parent: int) -> None:
        super().__init__(daemon=True, name="make-watch")
        self.forwarder, self.parent = forwarder, parent

    @staticmethod
    def parent_is_make() -> bool:
        try:
            return Path(f"/proc/{os.getppid()}/comm").read_text().strip() in ("make", "gmake")
        except OSError:
            return False

    # make's signal -> the one the launcher acts on as its own.
    WATCHED = {signal.SIGINT: signal.SIGINT, signal.SIGHUP: signal.SIGTERM, signal.SIGQUIT: signal.SIGTERM}

    def run(self) -> None:
        caught = caught_signals(self.parent) or 0
        watched = {sig: own for sig, own in self.WATCHED.items() if caught & (1 << (sig - 1))}
        while True:
            time.sleep(self.PERIOD_S)
            now = caught_signals(self.parent)
            if os.getppid() != self.parent:  # make died: stop the ranks as on SIGTERM
                number = signal.SIGTERM
            elif now is not None and (lost := [own for sig, own in watched.items() if not now & (1 << (sig - 1))]):
                number = lost[0]  # make's handler ran: it now waits for its child
            else:
                continue
            time.sleep(self.GRACE_S)
            if self.forwarder.forwarded is None:
                os.kill(os.getpid(), number)  # this launcher's own handler, in its main thread
            return


def handled_by_torchrun(signals: str) -> str:
    """torchrun's ``--signals-to-handle`` without the stop signals, which :class:`Forwarder` handles."""
    from janus_train.config import STOP_SIGNAL_CHOICES

    return ",".join(name.strip() for name in signals.split(",") if name.strip() not in STOP_SIGNAL_CHOICES)


def clean_stop_line(signal_name: str | None, log: Path) -> str:
    """The launcher's line under make after the ranks stopped with a checkpoint (exit code 75)."""
    from janus_train.loop.preemption import PREEMPTED_EXIT_CODE

    on = f"on {signal_name}" if signal_name else "on a stop signal"
    return (f"launcher: the run stopped cleanly {on} with a checkpoint, to resume when the same command runs again; "
            f"make's 'Error {PREEMPTED_EXIT_CODE}' below is this clean stop, not a failure (torchrun's report: {log})")


def exit_code(code: int) -> int:
    """A rank's exit code as a shell reports it (a rank killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else (code or 1)


def main(argv: list[str] | None = None) -> int:
    wanted, torchrun_args = split_arguments(list(sys.argv[1:] if argv is None else argv))
    log = usable_log(wanted)
    try:
        with frozen_imports():
            from torch.distributed.elastic.multiprocessing.api import SignalException
            from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
            from torch.distributed.run import parse_args, run

            from janus_train.loop.preemption import PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:  # a Ctrl-C while torch loads: no rank has started yet
        print("launcher: stopped by SIGINT before any rank started; run the same command again", file=sys.stderr,
              flush=True)
        return 128 + signal.SIGINT

    handler = log_to_file(log, wanted)

    args = parse_args(torchrun_args)
    # torchrun registers its handlers when it starts the ranks; the stop signals stay this launcher's.
    args.signals_to_handle = handled_by_torchrun(args.signals_to_handle)
    forwarder = Forwarder()
    forwarder.arm()
    under_make = MakeWatch.parent_is_make()
    if under_make:
        MakeWatch(forwarder, os.getppid()).start()
    # The ranks are this process's children: told its pid, a rank notices a launcher that was
    # killed before the rank could arm its parent-death signal (``pipelines.parent_death``).
    os.environ[LAUNCHER_PID_VARIABLE] = str(os.getpid())
    try:
        run(args)
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        handler.append(err.format_msg() + "\n")
        handler.settle()
        if failure.exitcode == PREEMPTED_EXIT_CODE:  # stopped with a checkpoint: rank 0's line says where
            handler.append(f"exit code {PREEMPTED_EXIT_CODE} above is no failure: the ranks stopped cleanly on a stop "
                           "signal after saving a checkpoint; the same command resumes the run\n")
            if under_make:
                print(clean_stop_line(forwarder.forwarded, handler.path), file=sys.stderr, flush=True)
            return PREEMPTED_EXIT_CODE
        if forwarder.forwarded is not None and exit_code(failure.exitcode) == 128 + signal.Signals[forwarder.forwarded]:
            # The ranks ended on the signal passed on to them (still starting, or not a training
            # run): no traceback of theirs, one line here.
            print(f"launcher: stopped by {forwarder.forwarded}: the ranks ended at once, keeping what they had "
                  f"committed; run the same command again to resume; {handler.where()}", file=sys.stderr, flush=True)
            return exit_code(failure.exitcode)
        how = (f"was killed by signal {-failure.exitcode}" if failure.exitcode < 0
               else f"exited with code {failure.exitcode}")
        print(f"launcher: rank {rank} {how}; {handler.where()}", file=sys.stderr, flush=True)
        return exit_code(failure.exitcode)
    except SignalException as err:
        logging.getLogger(LOGGER).error("stopped by %s", err.sigval.name)
        handler.settle()
        print(f"launcher: stopped by {err.sigval.name}; {handler.where()}", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    except Exception as err:  # noqa: BLE001 - the launcher's own failure (e.g. a rendezvous): one line
        logging.getLogger(LOGGER).exception("torchrun failed")
        handler.settle()
        print(f"launcher: {type(err).__name__}: {err}; {handler.where('details')}", file=sys.stderr, flush=True)
        return 1
    finally:
        handler.settle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
