"""Every command in the README and docs/ runs as written from the repository root after
``make setup``. The commands are read from the documents' shell code blocks
(```` ```bash ```` and untagged blocks; json/python blocks hold no commands), one per line, a line
ending in ``\\`` joined with the next. The rules, each a test below:

1. **On the PATH as written.** ``make setup`` puts janus's executables in ``.venv/bin`` and no
   further: a line calls them as ``.venv/bin/janus-cache``, ``.venv/bin/janus-train`` and
   ``.venv/bin/torchrun``, never by the bare name.
2. **Short commands run.** ``janus-cache sample-data``, ``index``, ``plan``, ``info`` and any
   ``--help`` run, in document order, each document's lines in one scratch folder that stands for
   the repository root (``.venv`` linked into it, so relative output stays out of the clone); an
   absolute ``/tmp/...`` path is moved into that folder. They must exit 0.
3. **Long commands name what exists.** Everything else (precompute, verify, train, export,
   show-sample: minutes to hours, each run by its own tests; ``make`` targets; ``sbatch`` jobs;
   paths of a user's cluster such as ``/data``) is not run: its executable and subcommand must
   exist and every ``--option`` it names must be one that the subcommand's ``--help`` lists (a
   ``make`` target must be one the Makefile defines, an ``sbatch`` script a file of the clone).
   Other lines (``grep``/``cat`` of a user's run, the README's module diagram, a listing of a
   run directory) are not commands of janus and are left alone (:data:`LAUNCHERS`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from helpers.profiles import REPO_ROOT

DOCUMENTS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
VENV_BIN = ".venv/bin/"
EXECUTABLES = ("janus-cache", "janus-train", "torchrun")
SHORT_SUBCOMMANDS = {"janus-cache": ("sample-data", "index", "plan", "info")}
NOT_COMMAND_BLOCKS = ("json", "python", "yaml", "text")
LAUNCHERS = ("make", "sbatch")
"""Lines starting with these or with a janus executable are commands; other lines of a block (grep
or cat of a user's run, diagrams, file listings) are not janus's and are left alone."""
TIMEOUT_S = 600


@dataclass(frozen=True)
class Command:
    document: Path
    line: int
    text: str

    @property
    def words(self) -> list[str]:
        return shlex.split(self.text, comments=True)

    @property
    def program(self) -> str:
        return self.words[0] if self.words else ""

    @property
    def janus(self) -> str | None:
        """The janus executable this line calls (``janus-cache``, ...), None for make, sbatch, grep..."""
        name = self.program.removeprefix(VENV_BIN)
        return name if name in EXECUTABLES else None

    @property
    def is_short(self) -> bool:
        words = self.words
        if self.janus is None or "--help" in words:
            return self.janus is not None
        return len(words) > 1 and words[1] in SHORT_SUBCOMMANDS.get(self.janus, ())

    def __str__(self) -> str:
        return f"{self.document.relative_to(REPO_ROOT)}:{self.line}: {self.text}"


def code_block_commands(document: Path) -> list[Command]:
    """The command lines of ``document``'s shell code blocks (comment-only lines left out)."""
    commands, fence, pending, start = [], None, "", 0
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            continue
        if fence is None or fence in NOT_COMMAND_BLOCKS or (not pending and not stripped):
            continue
        start = start if pending else number
        pending += stripped.removesuffix("\\").strip() + " "
        if stripped.endswith("\\"):
            continue
        text, pending = pending.strip(), ""
        first = text.split()[0]
        if first.removeprefix(VENV_BIN) in EXECUTABLES or first in LAUNCHERS:
            commands.append(Command(document, start, text))
    return commands


ALL_COMMANDS = [command for document in DOCUMENTS for command in code_block_commands(document)]


def test_the_documents_have_commands_of_every_kind() -> None:
    """The extraction itself: it sees the README's first steps, a long command and a make target."""
    texts = [c.text for c in ALL_COMMANDS]
    assert any(t.startswith(".venv/bin/janus-cache sample-data ") for t in texts), texts
    assert any(t.startswith(".venv/bin/janus-cache precompute ") for t in texts), texts
    assert any(t.startswith("make demo") for t in texts), texts
    assert any(c.document.parent.name == "docs" for c in ALL_COMMANDS)


def test_every_janus_command_calls_its_executable_in_the_venv() -> None:
    bare = [str(c) for c in ALL_COMMANDS if c.program in EXECUTABLES]
    assert not bare, "bare names are not on the PATH after `make setup`; write .venv/bin/NAME:\n" + "\n".join(bare)
    for command in ALL_COMMANDS:
        if command.janus is not None:
            assert (REPO_ROOT / command.program).is_file(), command


def sandbox_words(command: Command, sandbox: Path) -> list[str]:
    """The command's words with absolute /tmp paths moved into ``sandbox``."""
    return [re.sub(r"^/tmp/", f"{sandbox}/tmp/", word) for word in command.words]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda d: d.name)
def test_the_short_commands_run_as_written(document: Path, tmp_path: Path) -> None:
    short = [c for c in code_block_commands(document) if c.is_short]
    if document.name == "README.md":
        assert len(short) >= 4, short  # sample-data, index, plan, plan --report
    sandbox = tmp_path / "clone"
    sandbox.mkdir()
    (sandbox / ".venv").symlink_to(REPO_ROOT / ".venv")
    (sandbox / "tmp").mkdir()
    for command in short:
        result = subprocess.run(sandbox_words(command, sandbox), cwd=sandbox, capture_output=True, text=True,
                                timeout=TIMEOUT_S, env={**os.environ, "HOME": str(tmp_path / "home")})
        assert result.returncode == 0, f"{command}\nexit {result.returncode}:\n{(result.stdout + result.stderr)[-3000:]}"


@cache
def help_text(*program: str) -> str:
    result = subprocess.run([*program, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, f"{' '.join(program)} --help: exit {result.returncode}\n{result.stderr[-2000:]}"
    return result.stdout


def called_program(command: Command) -> tuple[tuple[str, ...], list[str]]:
    """(what answers ``--help`` for this line, the words after it)."""
    words = command.words
    if command.janus == "torchrun":  # the module it runs, as the same Python runs it
        module = words.index("-m")
        return (str(REPO_ROOT / VENV_BIN / "python"), "-m", words[module + 1]), words[module + 2:]
    return (str(REPO_ROOT / command.program), words[1]), words[2:]


LONG_JANUS = [c for c in ALL_COMMANDS if c.janus is not None and not c.is_short]


@pytest.mark.parametrize("command", LONG_JANUS, ids=str)
def test_a_long_janus_command_names_an_existing_subcommand_and_its_options(command: Command) -> None:
    program, rest = called_program(command)
    listed = set(re.findall(r"--[a-z][a-z0-9-]*", help_text(*program)))
    named = {m for word in rest for m in re.findall(r"^\[?(--[a-z][a-z0-9-]*)", word)}
    assert named <= listed, f"{command}: {sorted(named - listed)} not in `{' '.join(program)} --help`"


DEMO_PATH = re.compile(r"demo_out/[^\s`'\"),]*")
DEMO_FOLDERS = ("data", "cache", "run", "janusvln", "janus")
"""What ``make demo`` writes into its profile's folder ``demo_out/PROFILE`` (the Makefile's demo target)."""


def test_every_demo_path_in_the_documents_is_one_make_demo_writes() -> None:
    """A document's command that reuses the demo's results (``make train ... CACHE=demo_out/tiny/cache``)
    names the folder of a profile's demo: ``demo_out/PROFILE/{data,cache,run,...}``, so another
    profile's demo never takes it away."""
    profiles = {p.stem for p in (REPO_ROOT / "configs" / "profiles").glob("*.yaml")}
    named = {(document.name, path) for document in (*DOCUMENTS, REPO_ROOT / "benchmarks" / "results" / "README.md")
             for path in DEMO_PATH.findall(document.read_text())}
    assert named
    wrong = [f"{name}: {path}" for name, path in sorted(named)
             if (parts := path.rstrip("/").split("/"))[1] not in profiles or parts[2:3] not in ([], *([f] for f in DEMO_FOLDERS))]
    assert not wrong, "not a folder make demo writes (demo_out/PROFILE/...):\n" + "\n".join(wrong)
    assert "DEMO_DIR ?= $(DEMO_ROOT)/$(PROFILE)" in (REPO_ROOT / "Makefile").read_text()


def test_the_one_process_append_example_appends_to_the_cache_the_make_lines_build() -> None:
    """docs/precompute.md's DAgger round without make: the sources of the make line before it, in
    its order (an append refuses a source list that leaves one out), its cache and its profile."""
    commands = code_block_commands(REPO_ROOT / "docs" / "precompute.md")
    one = next(i for i, c in enumerate(commands) if c.text.startswith(".venv/bin/janus-cache precompute ")
               and "dagger1=" in c.text)
    make_line = next(c for c in reversed(commands[:one]) if c.words[:2] == ["make", "precompute"])
    settings = dict(w.split("=", 1) for w in make_line.words[2:] if "=" in w)
    words = commands[one].words
    sources = words[2:next(i for i, w in enumerate(words) if w.startswith("--"))]
    assert sources == shlex.split(settings["DATA"]), commands[one]
    assert words[words.index("--out") + 1] == settings["OUT"], commands[one]
    assert words[words.index("--profile") + 1] == settings["PROFILE"], commands[one]


OUTPUT_FILES = ("--json", "--report", "--record-outputs")
OUTPUT_FOLDERS = ("--out", "OUT=", "RUN=", "CACHE=")


def written_paths(command: Command) -> list[str]:
    """The files and folders a command writes, as it names them (a folder as ``FOLDER/x``)."""
    words, named = command.words, []
    for option, value in zip(words, words[1:]):
        if option in OUTPUT_FILES + OUTPUT_FOLDERS:
            named.append(value if option in OUTPUT_FILES else f"{value}/x")
    named += [f"{w.split('=', 1)[1]}/x" for w in words if w.startswith(OUTPUT_FOLDERS[1:])]
    return [path for path in named if path not in ("-", "-/x")]


def test_what_the_documents_commands_write_into_the_clone_is_ignored_by_git() -> None:
    """A command run as written from the repository root (``--json report.json``, ``--report
    problems.json``, ``OUT=cache``, ``RUN=runs/...``) leaves nothing that ``git status`` shows."""
    relative = sorted({(str(c), path) for c in ALL_COMMANDS for path in written_paths(c)
                       if not path.startswith(("/", "s3://"))})  # (a bucket is outside the clone)
    assert any(path == "report.json" for _, path in relative), relative
    shown = [f"{command}: {path}" for command, path in relative
             if subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT).returncode != 0]
    assert not shown, "written into the clone and not ignored by git:\n" + "\n".join(shown)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", (REPO_ROOT / "Makefile").read_text(), flags=re.M))


@pytest.mark.parametrize("command", [c for c in ALL_COMMANDS if c.program in ("make", "sbatch")], ids=str)
def test_a_make_or_sbatch_line_names_a_target_or_script_of_the_clone(command: Command) -> None:
    words = command.words
    if command.program == "make":
        targets = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
        assert targets and set(targets) <= make_targets(), command
    else:
        script = next(w for w in words[1:] if not w.startswith("-"))
        assert (REPO_ROOT / script).is_file(), command
