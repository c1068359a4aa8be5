"""What janus's commands do with their libraries' own output: one place for the chatter a user can
do nothing about.

DeepSpeed warns "Setting accelerator to CPU" at its first import unless the accelerator is named,
and its checkpoint converter print()s progress lines and draws tqdm bars (transformers one more)
on every export; the trainer's end-of-run export and ``janus-train export`` each print one summary
line instead.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator


def name_deepspeed_accelerator(device: str) -> None:
    """Name DeepSpeed's accelerator for a process computing on ``device`` (``cuda`` or ``cpu``) before
    DeepSpeed is first imported, which spares the process its detection warning; a value the user
    set stays."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device == "cuda" else "cpu")


@contextlib.contextmanager
def library_chatter_hidden(*one_line_errors: type[BaseException]) -> Iterator[None]:
    """Run the block with stdout and stderr kept aside. Should it fail, what it printed is shown
    before the error, except for ``one_line_errors``, whose one line says it all."""
    chatter = io.StringIO()
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            yield
    except one_line_errors:
        raise
    except BaseException:
        sys.stderr.write(chatter.getvalue())
        raise
