"""DeepSpeed's CPU communication op: built once into the environment, found by every start.

On a CPU machine DeepSpeed compiles its shared-memory op (two C++ files, ~70 CPU-seconds) the first
time a process joins its process group, with torch's ``cpp_extension``: into ``TORCH_EXTENSIONS_DIR``,
by default ``~/.cache/torch_extensions``, under torch's build lock (a ``lock`` file that every other
builder polls for as long as it exists) and with whatever ``ninja`` is first on ``PATH``. So a start
without the variable rebuilt the op for minutes, silently; a build killed midway left its ``lock``
behind and every later start waited for it forever; and a different ``ninja`` (the system's, the
environment's) could not read the other's build log and rebuilt everything. Every start goes
through :func:`load_cpu_comm_op` instead (``pipelines.distributed.init_distributed``, and
``make setup``, which runs this module), which:

* uses the environment's build: ``TORCH_EXTENSIONS_DIR`` defaults to ``<sys.prefix>/torch_extensions``
  (a value the user set stays);
* builds with the environment's own ``ninja`` (the ``ninja`` package DeepSpeed requires), whatever
  ``PATH`` holds;
* builds under janus's lock of the build directory (``janus_core.system.lock``: the kernel drops it
  when its holder dies), so a torch ``lock`` file found while holding it was left by a killed build:
  it is removed with one ``note:`` line;
* says in one line that a build starts and how long it takes (at once when there is no built op,
  after :data:`SLOW_LOAD_S` when loading turns into a rebuild), and a failed build in one ``error:``
  line naming the compiler's first error.

On CUDA machines NCCL needs no such op and nothing is built.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from janus_core.system.lock import DirectoryBusy, DirectoryLock, LockError

EXTENSIONS_VARIABLE = "TORCH_EXTENSIONS_DIR"
TORCH_BUILD_LOCK = "lock"
"""torch's build lock in an extension's build directory (``torch.utils.file_baton``)."""
BUILD_DURATION = "about 70 CPU-seconds of C++ compiling: under a minute on 2 free cores, a few minutes on a busy machine"
SLOW_LOAD_S = 10.0
"""Loading a built op takes well under a second; one that takes longer is being rebuilt."""
WAIT_NOTE_S = 10.0
"""How long a start waits for another process's build before it says so."""


class CommOpBuildFailed(RuntimeError):
    """The op could not be built; the one-line reason and fix."""


def environment_extensions() -> Path:
    """Where this environment keeps its torch extensions: ``TORCH_EXTENSIONS_DIR``, set to
    ``<sys.prefix>/torch_extensions`` when unset (before DeepSpeed or torch reads it)."""
    return Path(os.environ.setdefault(EXTENSIONS_VARIABLE, str(Path(sys.prefix) / "torch_extensions")))


def environment_ninja() -> Path | None:
    """The folder of the environment's own ``ninja`` (None when the package is missing)."""
    try:
        import ninja
    except ImportError:
        return None
    return Path(ninja.BIN_DIR) if ninja.BIN_DIR and (Path(ninja.BIN_DIR) / "ninja").is_file() else None


@contextlib.contextmanager
def ninja_of_the_environment() -> Iterator[None]:
    """``PATH`` with the environment's ``ninja`` first, for the block (torch runs ``ninja`` from it)."""
    folder, before = environment_ninja(), os.environ.get("PATH")
    if folder is not None:
        os.environ["PATH"] = os.pathsep.join([str(folder), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = before


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def build_lock(directory: Path, announce_wait: bool) -> DirectoryLock:
    """janus's lock of the build directory, waited for while another process builds there."""
    waited_since, said = time.monotonic(), False
    while True:
        try:
            return DirectoryLock.acquire(directory, purpose="building DeepSpeed's CPU communication op")
        except DirectoryBusy as busy:
            if announce_wait and not said and time.monotonic() - waited_since > WAIT_NOTE_S:
                say(f"note: waiting for another process's build of DeepSpeed's CPU communication op: {busy}")
                said = True
            time.sleep(0.2)


def first_error_line(output: str) -> str:
    """The compiler's first error in a failed build's output (else its last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    found = next((line for line in lines if "error" in line.lower() and not line.startswith("Error building")), None)
    return found or (lines[-1] if lines else "no output")


@contextlib.contextmanager
def said_when_slow(line: str, seconds: float | None) -> Iterator[None]:
    """Say ``line`` if the block runs longer than ``seconds`` (None: never)."""
    if seconds is None:
        yield
        return
    timer = threading.Timer(seconds, say, args=(line,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def load_cpu_comm_op(announce_wait: bool = True) -> Any:
    """DeepSpeed's shared-memory op, built first if needed (see the module's docstring); None where
    DeepSpeed has no such op (a GPU accelerator, an unsupported CPU: plain gloo then). DeepSpeed
    keeps what this loads, so its own start-up finds it loaded. ``announce_wait``: this process
    says so when another one's build keeps it waiting (one process per node is enough)."""
    root = environment_extensions()
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().device_name() != "cpu":
        return None
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    comm = importlib.import_module("deepspeed.comm.torch")  # the package's own ``torch`` module
    if builder is None:
        return comm.build_shm_op()
    directory = root / builder.name
    try:
        lock = build_lock(directory, announce_wait)
    except LockError:  # a build folder this user cannot write: only a finished build loads from it
        return comm.build_shm_op()
    with lock:
        stale = directory / TORCH_BUILD_LOCK
        if stale.exists():
            stale.unlink()
            say(f"note: removed {stale}, left by a build of DeepSpeed's CPU communication op that was killed "
                "(no process builds it now)")
        building = (f"note: building DeepSpeed's CPU communication op in {directory} (once per environment; "
                    f"{BUILD_DURATION}; `make setup` builds it ahead)")
        built = (directory / f"{builder.name}.so").is_file()
        if not built:
            say(building)
        try:
            # DeepSpeed print()s "... built successfully" on every start: kept aside.
            with ninja_of_the_environment(), said_when_slow(building, SLOW_LOAD_S if built else None), \
                    contextlib.redirect_stdout(io.StringIO()):
                return comm.build_shm_op()
        except (RuntimeError, OSError, ImportError, subprocess.SubprocessError) as err:  # a compiler's output,
            output = getattr(err, "output", None) or str(err)                           # or a missing tool
            if isinstance(output, bytes):
                output = output.decode(errors="replace")
            raise CommOpBuildFailed(
                f"DeepSpeed's CPU communication op could not be built in {directory}: {first_error_line(output)}; "
                "it needs a C++ compiler (g++) and Python's headers (e.g. python3-dev)") from None


def main() -> int:
    """``make setup``'s step: build the op into the environment now, not at a first training start."""
    try:
        import deepspeed  # noqa: F401  (training extra; absent in a cache-only install)
    except ImportError:
        print("cpu_comm_op: deepspeed is not installed; skipping (install the 'train' extra to train)")
        return 0
    start = time.perf_counter()
    try:
        op = load_cpu_comm_op()
    except CommOpBuildFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    state = "ready" if op is not None else "not needed or not supported here (plain gloo)"
    print(f"cpu_comm_op: DeepSpeed's CPU communication op {state} in {time.perf_counter() - start:.1f}s "
          f"({os.environ[EXTENSIONS_VARIABLE]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
