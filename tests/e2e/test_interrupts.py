"""A Ctrl-C is one line, never a traceback, and the same command resumes afterwards.

A terminal's Ctrl-C is a SIGINT to its foreground process group: here the launcher's group (a
launch in a session of its own; torchrun starts its ranks in sessions of their own and the
launcher passes the signal on), and a one-process ``janus-cache precompute`` with its decode
workers. Real processes throughout (``pipelines.launch`` of 2 training ranks, ``janus-cache``).
A Ctrl-C once a training run trains is a stop with a checkpoint: tests/e2e/test_preemption.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.processes import RUN_TIMEOUT, Launch, parent_pids
from helpers.profiles import REPO_ROOT, file_digests
from helpers.shared_runs import TinyTraining
from helpers.sources import janus_cache_in_process

INTERRUPTED = 128 + signal.SIGINT


def spawned_workers(pid: int) -> list[int]:
    """The worker processes ``pid`` spawned (not multiprocessing's resource tracker)."""
    def command(child: int) -> str:
        try:
            return Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""
    return [child for child, parent in parent_pids().items()
            if parent == pid and "spawn_main" in command(child) and "resource_tracker" not in command(child)]


def mapped(pid: int, library: str) -> bool:
    """Whether process ``pid`` has loaded ``library`` (a shared library of an import)."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def importing_torch(pid: int) -> bool:
    """A rank past its interpreter's start-up and its launch layer's first lines (it loads torch),
    still far from its first step."""
    return mapped(pid, "libtorch")


def past_start_up(pid: int) -> bool:
    """A worker past the first lines of janus it runs (it goes on to load numpy, which Python's own
    start-up and multiprocessing's do not)."""
    return mapped(pid, "_multiarray_umath")


def test_a_ctrl_c_while_the_training_ranks_start_is_one_launcher_line(
        tiny_training: TinyTraining, tmp_path: Path) -> None:
    """Both ranks still importing torch (before their stop-signal handler exists): they end at once
    and silently, and the launcher says so in one line (before: a KeyboardInterrupt traceback from
    each rank, then "rank 1 was killed by signal 2"). (Within its interpreter's own start-up, the
    first tenth of a second, a rank cannot be kept from Python's own message.)"""
    log = tmp_path / "console.log"
    launch = Launch("pipelines.train", "--out", tmp_path / "run", "--cache", tiny_training.fp32_cache, "--profile",
                    tiny_training.fp32_profile, "--no-export", log=log, launcher="pipelines.launch")
    try:
        launch.wait_until(lambda: len(launch.ranks()) == 2 and all(map(importing_torch, launch.ranks())),
                          "both ranks import torch")
        os.killpg(launch.process.pid, signal.SIGINT)
        launch.process.wait(timeout=RUN_TIMEOUT)
    finally:
        if launch.process.poll() is None:
            launch.cleanup()
    printed = log.read_text()
    assert launch.process.returncode == INTERRUPTED, printed
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed, printed
    lines = printed.strip().splitlines()
    assert lines[-1].startswith("launcher: stopped by SIGINT: the ranks ended at once, keeping what they had "
                                "committed; run the same command again to resume; torchrun's report: "), printed
    assert not [line for line in lines if line.startswith(("error:", "warning:"))], printed


def test_a_ctrl_c_to_a_one_process_precompute_as_it_decodes_is_one_line_and_the_same_command_resumes(
        sample_dataset: Path, small_shards_profile: Path, small_shards_cache, tmp_path: Path) -> None:
    """``janus-cache precompute --workers 2`` as its decode workers decode: one line, exit code 130,
    no worker's traceback or warning (before: none of janus's, a worker's KeyboardInterrupt
    traceback); the same command then finishes the cache, equal to an uninterrupted one."""
    out, log = tmp_path / "cache", tmp_path / "console.log"
    command = ["precompute", str(sample_dataset), "--out", str(out), "--profile", str(small_shards_profile),
               "--workers", "2"]
    with open(log, "w") as console:
        process = subprocess.Popen([str(Path(sys.executable).parent / "janus-cache"), *command], cwd=REPO_ROOT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=console,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        # The frames phase, its 2 decode workers past their start-up (the first tenth of a second of a
        # worker's interpreter, before any janus line runs, is Python's own).
        while not ("[frames]" in log.read_text() and len(workers := spawned_workers(process.pid)) == 2
                   and all(map(past_start_up, workers))):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=RUN_TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    time.sleep(0.5)  # a worker's last words, if any, arrive after its parent's
    printed = log.read_text()
    assert process.returncode == INTERRUPTED, printed
    assert "Traceback" not in printed and "Warning" not in printed, printed
    assert printed.strip().splitlines()[-1] == ("stopped by SIGINT: the shards committed so far are kept; run the "
                                                "same command again to resume"), printed

    resumed = janus_cache_in_process(*command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert file_digests(out) == file_digests(small_shards_cache("zarr"))
