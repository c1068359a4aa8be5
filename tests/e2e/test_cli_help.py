"""The commands' help and version, as a user's terminal of 80 columns shows them: plain text (no
boxes) whose option help wraps in the width left beside the option, every command listed by its
whole first sentence, ``janus-train run --help-train`` naming the command a user types and both
bases, and ``--version`` on both commands."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.profiles import REPO_ROOT

BIN = Path(sys.executable).parent
BOX = set("╭╮╰╯│─")
COMMANDS = {"janus-cache": ("precompute", "verify", "sample-data", "index", "profile", "plan", "info"),
            "janus-train": ("run", "export", "show-sample")}


def shown(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / args[0]), *args[1:]], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "80"})


@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_a_programs_help_lists_every_command_by_its_whole_first_sentence(program: str) -> None:
    result = shown(program, "--help")
    assert result.returncode == 0, result.stderr
    assert not BOX & set(result.stdout), result.stdout
    listed = result.stdout.split("Commands:")[1].splitlines()[1:]
    for command in COMMANDS[program]:
        line = next(line for line in listed if line.split()[:1] == [command])
        assert line.rstrip().endswith(".") and not line.rstrip().endswith("..."), line


@pytest.mark.parametrize("command", [(p, c) for p, cs in sorted(COMMANDS.items()) for c in cs] +
                         [("janus-train", "run", "--help-train")], ids=" ".join)
def test_a_commands_help_is_plain_text_within_80_columns(command: tuple[str, ...]) -> None:
    result = shown(*command, *(() if command[-1] == "--help-train" else ("--help",)))
    assert result.returncode == 0, result.stderr
    assert not BOX & set(result.stdout), result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    # Each option's help starts beside it, in the left half of the line, not in a narrow last column.
    options = [line for line in result.stdout.splitlines() if line.startswith("  --") and "  " in line.strip()]
    assert options and all(len(line) - len(line.split("  ", 2)[-1].lstrip()) <= 40 for line in options)


def test_help_train_shows_the_training_options_as_janus_train_run_takes_them() -> None:
    result = shown("janus-train", "run", "--help-train")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: janus-train run [OPTIONS]")
    assert "python -m" not in result.stdout
    assert "Qwen2.5-VL or Qwen3-VL" in result.stdout


@pytest.mark.parametrize("program", sorted(COMMANDS))
def test_version_names_janus_and_its_version(program: str) -> None:
    result = shown(program, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"janus {importlib.metadata.version('janus')}")
    assert len(result.stdout.splitlines()) == 1
