"""Python's cyclic garbage collector in janus's commands: paused while they import, then frozen.

torch, transformers and DeepSpeed leave ~600,000 long-lived objects behind, and every full
collection of CPython's collector walks all of them (~0.2 s on a 2-core VM): six times while a
training rank imports them, once more in DeepSpeed's ZeRO-3 set-up (its own ``gc.collect()``), and
in every forked loader worker, where the walk also writes to each page it touches (copy-on-write).
This is the ``gc`` module's own recipe for it: import with the collector paused, and freeze
(``gc.freeze``) what was imported before the work starts and before any worker is forked; the
collector still collects everything made after that.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_imports() -> Iterator[None]:
    """Run the block (a command's heavy imports) with the collector paused, then freeze every object
    made so far; the collector is on again afterwards if it was before, however the block ends."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        freeze_imported()
        if was_enabled:
            gc.enable()


def freeze_imported() -> None:
    """Move every object made so far (a command's imports) out of the collector's view for good."""
    gc.freeze()
