"""The unit tier starts no process: no CLI, no torchrun, no make (those tests live in tests/e2e/).

Every test here runs in this interpreter, so the tier's time is the code's, not start-ups'. A test
that starts a subprocess fails at once, naming the command, rather than slowing the tier unnoticed.
(multiprocessing's own workers, e.g. a DataLoader's or a store's two writers, are not subprocesses
of this kind and stay allowed.)
"""

from __future__ import annotations

import subprocess

import pytest


class StartsAProcess(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        raise StartsAProcess(f"a unit test started a process ({args!r}): move it to tests/e2e/")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
