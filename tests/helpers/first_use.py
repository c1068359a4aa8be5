"""The command a new user exports a run with (the run itself: ``tiny_run`` in helpers.shared_runs)."""

from __future__ import annotations

import sys
from pathlib import Path

JANUS_TRAIN = Path(sys.executable).parent / "janus-train"
