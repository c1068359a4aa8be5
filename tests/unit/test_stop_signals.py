"""Preemption, in this process and a fork of it: the first stop signal is a
request and the second ends the process at once, a signal repeated at once is the same request, and
only the configured signals stop a run (the launches that stop and resume for real are
tests/e2e/test_preemption.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from helpers.profiles import write_test_profile
from janus_core.profile import ProfileError, load_profile
from janus_train.config import load_train_settings
from janus_train.loop.preemption import Preemption


def write_profile(path: Path, **train: object) -> Path:
    """The tiny profile with ``train`` overrides."""
    write_test_profile(path)
    data = yaml.safe_load(path.read_text())
    data["train"].update(train)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run_child(signals: tuple[str, ...], sends: list[int], apart_s: float = 0.3) -> tuple[int, str]:
    """A forked process arms ``signals`` (a repeat within 0.2 s is the same request) and sends itself
    ``sends``, ``apart_s`` apart, then exits 0 reporting what it received: (its wait status as a
    shell reports it, its report)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            preemption = Preemption(signals, same_request_s=0.2).arm()
            for number in sends:
                os.kill(os.getpid(), number)
                time.sleep(apart_s)
            os.write(write, f"{preemption.received} {preemption.agreed()} {preemption.stopped_by}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        report = f.read()
    return (128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)), report


def test_the_first_stop_signal_is_a_request_and_the_second_ends_the_process_at_once() -> None:
    code, report = run_child(("SIGTERM", "SIGUSR1"), [signal.SIGUSR1])
    assert (code, report) == (0, "SIGUSR1 True SIGUSR1")
    code, report = run_child(("SIGTERM", "SIGUSR1"), [signal.SIGUSR1, signal.SIGTERM])
    assert (code, report) == (128 + signal.SIGTERM, "")


def test_a_signal_repeated_at_once_is_the_same_request() -> None:
    """SLURM's SIGTERM at a preemption reaches a rank directly and, a moment later, from its launcher."""
    assert run_child(("SIGTERM",), [signal.SIGTERM, signal.SIGTERM], apart_s=0.01) == (0, "SIGTERM True SIGTERM")


def test_only_the_configured_signals_stop_the_run(tmp_path: Path) -> None:
    """train.stop_signals: SIGUSR2 alone; SIGUSR1 then keeps its default action (it ends the process
    without a checkpoint) and a signal janus cannot forward is refused in one line."""
    settings = load_train_settings(load_profile(str(write_profile(tmp_path / "p.yaml", stop_signals=["SIGUSR2"]))))
    assert settings.stop_signals == ("SIGUSR2",)
    assert run_child(settings.stop_signals, [signal.SIGUSR2]) == (0, "SIGUSR2 True SIGUSR2")
    assert run_child(settings.stop_signals, [signal.SIGUSR1])[0] == 128 + signal.SIGUSR1
    assert load_train_settings(load_profile("tiny")).stop_signals == ("SIGTERM", "SIGINT", "SIGUSR1")
    with pytest.raises(ProfileError, match=r"setting 'train.stop_signals' is 'SIGKILL'; expected one of SIGTERM, "
                                           r"SIGINT, SIGUSR1, SIGUSR2"):
        load_train_settings(load_profile(str(write_profile(tmp_path / "q.yaml", stop_signals=["SIGKILL"]))))
