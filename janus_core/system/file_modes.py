"""Files janus writes get the user's umask (0644 under umask 022), as a plain ``open()`` gives them.

Some writers create their file privately and rename it into place: safetensors 0.8 writes through
a 0600 temporary file, so an exported model nobody else on a shared cluster could read.
"""

from __future__ import annotations

import os
from pathlib import Path


def umask_mode() -> int:
    """The mode a new file gets from ``open()`` under this process's umask (0o644 under 022)."""
    try:  # Linux >= 4.7 says it without changing it (os.umask would, for an instant, for every thread)
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("Umask:"))
        mask = int(line.split()[1], 8)
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def give_umask_modes(directory: Path, since: float) -> None:
    """Every file under ``directory`` written since ``since`` (a ``time.time()``: janus's own, not
    a user's files beside them) gets :func:`umask_mode`."""
    mode = umask_mode()
    for path in Path(directory).rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= since:
            path.chmod(mode)
