"""Real launches a test kills: the launch, the processes it started (Linux /proc) and which of
them outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from helpers.profiles import REPO_ROOT

GRACE_S = 10.0


RUN_TIMEOUT = 300


def parent_pids() -> dict[int, int]:
    """pid -> parent pid of every live process (Linux /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # The command name (field 2) may hold spaces: the fields after its ')' are plain.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended while we looked
                continue
            parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> set[int]:
    """Every live process started by ``pid``, directly or not."""
    parents = parent_pids()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def describe(pid: int) -> str:
    """``pid``, its parent and its command line, for assertion messages."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        command = "?"
    return f"{pid} (parent {parent_pids().get(pid, '?')}): {command[:200]}"


class Launch:
    """A real ``torchrun --nproc_per_node 2 -m MODULE ARGS`` in a session of its own (or the same
    through ``launcher``, e.g. janus's ``pipelines.launch``; ``env``: extra variables)."""

    def __init__(self, module: str, *args: str | Path, log: Path, launcher: str = "torch.distributed.run",
                 env: dict[str, str] | None = None) -> None:
        command = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node", "2",
                   "-m", module, *map(str, args)]
        self.log = log
        with open(log, "w") as out:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT,
                                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.started: set[int] = set()

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll ``condition`` (recording the launch's processes meanwhile) until it holds."""
        deadline = time.monotonic() + RUN_TIMEOUT
        while not condition():
            self.started |= descendants(self.process.pid)
            assert self.process.poll() is None, f"the launch ended before {what}:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            time.sleep(0.01)
        self.started |= descendants(self.process.pid)

    def ranks(self) -> list[int]:
        """The launcher's own children: the rank processes."""
        parents = parent_pids()
        return [pid for pid, parent in parents.items() if parent == self.process.pid]

    def kill_launcher(self) -> list[str]:
        """SIGKILL the launcher alone; the processes it had started that are still alive ``GRACE_S``
        later (pid, parent and command line)."""
        self.started |= descendants(self.process.pid)
        assert len(self.ranks()) == 2, f"expected 2 ranks, found {self.ranks()}"
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        return self.survivors()

    def survivors(self) -> list[str]:
        """The processes this launch had started that are still alive ``GRACE_S`` from now (pid,
        parent and command line; returns as soon as none is)."""
        deadline = time.monotonic() + GRACE_S
        while (survivors := [pid for pid in sorted(self.started) if alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return [describe(pid) for pid in survivors]

    def cleanup(self) -> None:
        """Kill whatever of this launch still runs (only after a failed test), by pid."""
        for pid in [self.process.pid, *sorted(self.started)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait()

