"""``torchrun --standalone --nproc_per_node N -m MODULE ARGS`` for tests, with ranks that start in
milliseconds instead of seconds.

A rank of ``pipelines.train`` spends about 6 CPU-seconds importing torch, transformers and
DeepSpeed before it does anything, which is most of what a test run of the tiny model costs.
Here torch's own elastic agent (``torch.distributed.launcher.elastic_launch``: the launcher torchrun
is built on, with its c10d rendezvous, rank variables, failure handling and the command's error
files) runs in the test's process and starts each rank by forking multiprocessing's fork server,
which imported the commands once per test process (``set_forkserver_preload``). Each rank is a
fresh process of its own running the command's ``main()`` with the command line, working folder
and environment a real launch gives it; its stdout and stderr are collected as torchrun's console
would show them (rank 0's lines first). What only the launcher process can show (a signal to it, a
killed launcher, ``pipelines.launch``'s log) is tested on real launches (``helpers.processes``).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from helpers.profiles import REPO_ROOT

PRELOADED = ("pipelines.train", "pipelines.train_run", "pipelines.verify", "pipelines.precompute",
             "pipelines.precompute_run", "deepspeed")
"""What the fork server imports once: the commands (with the run halves of training and precompute)
and DeepSpeed."""

TIMEOUT_S = 300

_SERVER_ENV = dict(os.environ)
"""The environment as the fork server started with it (this module is preloaded there too), so a
rank can tell the agent's rank variables from the server's own."""


def _start_fork_server() -> None:
    """Start the fork server of this test process (once) with :data:`PRELOADED` imported. It imports
    DeepSpeed with the accelerator a CPU rank names before its own import (``DS_ACCELERATOR=cpu``),
    set for the server alone: this process's environment, which real launches inherit, stays."""
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload([__name__, *PRELOADED])
    saved = os.environ.get("DS_ACCELERATOR")
    os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["DS_ACCELERATOR"]
        else:
            os.environ["DS_ACCELERATOR"] = saved


def _rank_main(module: str, args: list[str], env: dict[str, str], cwd: str, pid_dir: str) -> None:
    """In the rank: the launch's environment plus the agent's rank variables, the command line and
    working folder of ``python -u -m MODULE ARGS``, then the command."""
    rank_vars = {name: value for name, value in os.environ.items() if _SERVER_ENV.get(name) != value}
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(rank_vars)
    os.chdir(cwd)
    # The fork server's children inherit its start method; a rank's own processes (loader workers)
    # start as a fresh interpreter's would (fork on Linux), not through a fork server of their own.
    multiprocessing.set_start_method(None, force=True)
    if "OMP_NUM_THREADS" in os.environ:  # OpenMP read the server's environment when torch loaded
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    Path(pid_dir, str(os.getpid())).touch()
    # ``python -u``, as torchrun starts a module: the torch redirect left fd 1 and 2 on the rank's files.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True, line_buffering=True)
    command = importlib.import_module(module)
    sys.argv = [command.__file__, *args]
    sys.orig_argv = [sys.executable, "-u", "-m", module, *args]  # what a run records as its command
    command.main()


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """The agent registers its own handlers for the stop signals in the process it runs in."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def forked_launch(module: str, *args: str | Path | int, nproc: int = 2, env: dict[str, str] | None = None,
                  timeout: float = TIMEOUT_S, kill_when: Callable[[], bool] | None = None,
                  ) -> subprocess.CompletedProcess[str]:
    """Run ``module`` on ``nproc`` ranks as ``torchrun --standalone`` would; returns what
    ``subprocess.run`` would for it (exit code 1 when a rank failed, as torchrun's).

    ``kill_when``: polled while the ranks run; once true, every rank is killed with SIGKILL at once,
    as a machine that fails kills them (exit code 1; an error when the ranks end before it holds)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _start_fork_server()
    argv = [str(arg) for arg in args]
    rank_env = {**os.environ, **(env or {})}
    if nproc > 1:  # torchrun's default for several processes on a node
        rank_env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="forked-ranks-") as work, _signal_handlers_kept():
        pid_dir = Path(work, "pids")
        pid_dir.mkdir()
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
            rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.05, start_method="forkserver",
            logs_specs=DefaultLogsSpecs(log_dir=str(Path(work, "logs")), redirects=Std.ALL))
        timed_out, killed, ended = threading.Event(), threading.Event(), threading.Event()

        def kill_ranks(why: threading.Event) -> None:
            why.set()
            for pid in pid_dir.iterdir():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid.name), signal.SIGKILL)

        def watch(condition: Callable[[], bool]) -> None:
            while not ended.wait(0.002):  # a shard's commit can come within milliseconds of the first
                if condition():
                    kill_ranks(killed)
                    return

        timer = threading.Timer(timeout, kill_ranks, (timed_out,))
        timer.start()
        # Polled only when asked for: a run to its end has no thread waking every 2 ms beside it.
        watcher = threading.Thread(target=watch, args=(kill_when,), daemon=True) if kill_when is not None else None
        if watcher is not None:
            watcher.start()
        report = ""
        try:
            elastic_launch(config, _rank_main)(module, argv, rank_env, str(REPO_ROOT), str(pid_dir))
            code = 0
        except ChildFailedError as failed:  # torchrun ends with this report (each rank's exit code)
            code, report = 1, f"{type(failed).__name__}: {failed}\n"
        finally:
            timer.cancel()
            ended.set()
            if watcher is not None:
                watcher.join()
        stdout, stderr = (
            "".join(path.read_text(errors="replace") for path in sorted(Path(work, "logs").rglob(f"{stream}.log")))
            for stream in ("stdout", "stderr"))
        stderr += report
    command = ["torchrun", "--standalone", f"--nproc_per_node={nproc}", "-m", module, *argv]
    if timed_out.is_set():
        raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
    if kill_when is not None and not killed.is_set():
        raise AssertionError(f"the ranks ended (exit code {code}) before they were to be killed:\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(command, code, stdout, stderr)
