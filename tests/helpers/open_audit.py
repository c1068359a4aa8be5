"""Run a janus command line in this process and record every file it opens for reading.

``python tests/helpers/open_audit.py LOG -- janus-cache precompute DATA --out CACHE ...`` runs the command
(the installed entry point's own function, in this process), ``... LOG -- python -c CODE`` a
snippet of Python, under a Python audit hook (PEP 578):
the interpreter raises an ``open`` event for every ``open()``/``os.open()`` of any library (zarr's
store, hashlib readers, numpy), so the set of files read is observed at the OS boundary, not
guessed from the code. One line per file opened for reading (not for writing) goes to LOG at exit.
"""

from __future__ import annotations

import atexit
import os
import sys

READ_FLAGS = os.O_RDONLY
WRITE_MODES = frozenset("wax+")


def main() -> None:
    log, separator, *command = sys.argv[1:]
    assert separator == "--" and command, __doc__
    opened: set[str] = set()

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode, flags = args
        reading = (mode is None and (flags & (os.O_WRONLY | os.O_RDWR)) == READ_FLAGS) or (
            isinstance(mode, str) and not WRITE_MODES & set(mode))
        if reading:
            opened.add(os.path.abspath(os.fsdecode(path)))

    def write_log() -> None:
        with open(log, "w", encoding="utf-8") as f:
            f.write("".join(f"{path}\n" for path in sorted(opened)))

    atexit.register(write_log)
    sys.addaudithook(hook)
    program, *arguments = command
    if program == "python" and arguments[:1] == ["-c"] and len(arguments) == 2:
        exec(compile(arguments[1], "<open_audit -c>", "exec"), {"__name__": "__main__"})  # noqa: S102
        return
    if program != "janus-cache":
        raise SystemExit(f"open_audit: unknown program {program!r}")
    from pipelines.cache_cli import main as entry

    sys.argv = [program, *arguments]
    entry()


if __name__ == "__main__":
    main()
