"""``make`` as a user runs it, what of its output the user reads, and the SLURM examples' folder."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from helpers.profiles import REPO_ROOT

TIMEOUT_S = 300


SLURM_DIR = REPO_ROOT / "examples" / "slurm"
"""The SLURM batch examples."""


def make_env() -> dict[str, str]:
    """This test's environment for a ``make`` of its own: under ``make test`` the outer make's flags
    and variables would reach it, so they are left out."""
    return {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}


def make(target: str, **variables: str | Path) -> subprocess.CompletedProcess[str]:
    """``make TARGET NAME=VALUE...`` in the repository, with this test's environment."""
    settings = [f"{name}={value}" for name, value in variables.items()]
    venv = Path(sys.prefix)
    return subprocess.run(["make", "--no-print-directory", target, f"VENV={venv}", *settings], cwd=REPO_ROOT,
                          env={**make_env(), "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=TIMEOUT_S)


def make_command(target: str, **variables: str | Path) -> list[str]:
    """The module and its arguments (the words after ``-m``) of the torchrun command that ``make
    TARGET NAME=VALUE...`` runs, read from make's dry run (``NPROC`` is torchrun's, not the module's)."""
    settings = [f"{name}={value}" for name, value in {"NPROC": "8", **variables}.items()]
    dry = subprocess.run(["make", "-n", "-s", target, f"VENV={Path(sys.prefix)}", "TORCHRUN_ARGS=", *settings],
                         cwd=REPO_ROOT, env=make_env(), capture_output=True, text=True, timeout=60, check=True).stdout
    # make runs torchrun through pipelines.launch (its failure report into a log file): the module
    # is the one after torchrun's --nproc_per_node.
    line = next(line for line in dry.replace("\\\n", " ").splitlines() if "pipelines.launch" in line)
    words = shlex.split(line)
    return words[words.index("-m", words.index("--nproc_per_node")) + 1:]


def set_options(*settings: str) -> list[str]:
    """Profile overrides (``KEY=VALUE`` each, the words of ``make``'s ``SET=``) as the commands' own
    options, as the Makefile passes them on: ``--set KEY=VALUE`` each."""
    return [option for setting in settings for option in ("--set", setting)]


def janus_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """What the user reads, without make's own echo of the commands and its closing line."""
    lines = (result.stdout + result.stderr).splitlines()
    return [line for line in lines if not line.startswith(("make: ***", str(Path(sys.prefix))))
            and "-m pipelines." not in line]


def assert_one_error_line(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exactly one ``error:`` line, holding each of ``expected``; no traceback; under a launcher,
    only its one pointer line after it."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output and "ChildFailedError" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    for text in expected:
        assert text in errors[0], errors[0]
    after = janus_lines(result)[janus_lines(result).index(errors[0]) + 1:]
    assert all(line.startswith("launcher: ") for line in after) and len(after) <= 1, output
    return errors[0]

