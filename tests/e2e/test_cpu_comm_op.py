"""Every training start uses the environment's build of DeepSpeed's CPU communication op
(``pipelines/cpu_comm_op.py``), through ``janus-train run`` as a user starts it:

* a start whose environment names no ``TORCH_EXTENSIONS_DIR`` loads the build ``make setup`` made in
  the environment, and builds nothing under the user's home;
* a torch build ``lock`` left by a killed build is removed with one ``note:`` line (it made every
  later start wait forever), and the op is loaded with the environment's own ``ninja``, never the
  one first on ``PATH`` (another ``ninja`` cannot read the build's log and rebuilt everything);
* a build that must happen says so in one line with its expected duration, and a failed one ends
  in one ``error:`` line naming the compiler's error.

The build itself is never run here (about 70 CPU-seconds): the environment's finished build is
copied, and a failing build fails at its first compile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.first_use import JANUS_TRAIN
from helpers.profiles import REPO_ROOT
from helpers.shared_runs import TinyTraining
from helpers.training import assert_succeeded

OP = "deepspeed_shm_comm"
ENVIRONMENT_BUILD = Path(sys.prefix) / "torch_extensions" / OP
START_TIMEOUT_S = 240
"""A one-step run takes well under a minute; a start waiting on a build lock would wait forever."""


def start_one_step(tiny_training: TinyTraining, out: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``janus-train run`` of one optimizer step on one process, in ``env``."""
    return subprocess.run(
        [str(JANUS_TRAIN), "run", "--out", str(out), "--profile", str(tiny_training.fp32_profile), "--cache",
         str(tiny_training.fp32_cache), "--nproc", "1", "--max-steps", "1", "--no-export"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S)


def user_environment(tmp_path: Path) -> dict[str, str]:
    """The test session's environment as a new user's shell has it: no TORCH_EXTENSIONS_DIR, a home of its own."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    env["HOME"] = str(tmp_path / "home")
    return env


def test_a_start_without_torch_extensions_dir_loads_the_environments_build(
        tiny_training: TinyTraining, tmp_path: Path) -> None:
    result = start_one_step(tiny_training, tmp_path / "run", user_environment(tmp_path))
    assert_succeeded(result)
    assert not (tmp_path / "home" / ".cache" / "torch_extensions").exists()
    assert "building DeepSpeed's CPU communication op" not in result.stderr
    assert (ENVIRONMENT_BUILD / f"{OP}.so").is_file()


def test_a_build_lock_left_by_a_killed_build_is_removed_in_one_line_and_the_build_reused(
        tiny_training: TinyTraining, tmp_path: Path) -> None:
    extensions = tmp_path / "extensions"
    build = Path(shutil.copytree(ENVIRONMENT_BUILD, extensions / OP))  # mtimes kept: up to date
    (build / ".janus.lock").unlink(missing_ok=True)
    (build / "lock").touch()  # what torch leaves when its build is killed
    library = (build / f"{OP}.so").stat().st_mtime_ns
    # A different ninja first on PATH, as a system's or another environment's would be: never used.
    other = tmp_path / "other-bin"
    other.mkdir()
    (other / "ninja").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'other-ninja-called'}\nexit 1\n")
    (other / "ninja").chmod(0o755)
    env = {**user_environment(tmp_path), "TORCH_EXTENSIONS_DIR": str(extensions),
           "PATH": f"{other}{os.pathsep}{os.environ['PATH']}"}

    result = start_one_step(tiny_training, tmp_path / "run", env)
    assert_succeeded(result)
    notes = [line for line in result.stderr.splitlines() if "lock" in line]
    assert notes == [f"note: removed {build / 'lock'}, left by a build of DeepSpeed's CPU communication op that "
                     "was killed (no process builds it now)"], result.stderr
    assert not (build / "lock").exists()
    assert not (tmp_path / "other-ninja-called").exists()
    assert (build / f"{OP}.so").stat().st_mtime_ns == library  # loaded, not rebuilt


def test_a_needed_build_is_said_in_one_line_and_a_failed_one_names_the_compilers_error(
        tiny_training: TinyTraining, tmp_path: Path) -> None:
    compiler = tmp_path / "c++"  # answers like g++, fails every compile as a machine without Python.h does
    compiler.write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -c ] && { echo 'shm.cpp:1:10: fatal error: "
                        "Python.h: No such file or directory' >&2; exit 1; }; done\nexec c++ \"$@\"\n")
    compiler.chmod(0o755)
    extensions = tmp_path / "extensions"
    env = {**user_environment(tmp_path), "TORCH_EXTENSIONS_DIR": str(extensions), "CXX": str(compiler)}

    result = start_one_step(tiny_training, tmp_path / "run", env)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.splitlines()
    building = [line for line in lines if "building DeepSpeed's CPU communication op" in line]
    assert building == [f"note: building DeepSpeed's CPU communication op in {extensions / OP} (once per "
                        "environment; about 70 CPU-seconds of C++ compiling: under a minute on 2 free cores, a "
                        "few minutes on a busy machine; `make setup` builds it ahead)"], result.stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == [f"error: DeepSpeed's CPU communication op could not be built in {extensions / OP}: "
                      "shm.cpp:1:10: fatal error: Python.h: No such file or directory; it needs a C++ compiler "
                      "(g++) and Python's headers (e.g. python3-dev)"], result.stderr
    assert "Traceback" not in result.stderr
