"""Session artifacts built once per test run, even when pytest-xdist runs several workers.

`make test` runs two workers; a session fixture is per worker, so each worker would build its own
copy of a precomputed cache or a trained run. :func:`shared_folder` is a folder every worker of
the run sees (pytest-xdist's documented pattern: the parent of each worker's base temp folder)
and :func:`build_once` builds a path in it under a file lock; a ``.done`` marker written after
the build means a worker that failed mid-build leaves nothing another takes for finished.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``name`` in the folder this run's xdist workers share (a plain ``mktemp`` without xdist)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.mktemp(name)
    folder = tmp_path_factory.getbasetemp().parent / "shared" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def build_once(target: Path, build: Callable[[Path], object]) -> Path:
    """``target`` (a file or folder) after ``build(target)`` ran once in this test run, with
    ``target`` absent before it."""
    done = target.with_name(f"{target.name}.done")
    with FileLock(str(target.with_name(f"{target.name}.lock"))):
        if not done.is_file():
            if target.is_dir():  # left by a build that failed
                shutil.rmtree(target)
            target.unlink(missing_ok=True)
            build(target)
            done.touch()
    return target
