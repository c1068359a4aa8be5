"""The best checkpoint of a run by a validation metric: ``RUN/checkpoints/best/``, outside the
``save_total_limit`` rotation (which only removes ``step*`` tags) and never named by ``latest``
(a resume continues from the newest step, not from the best).

It is a DeepSpeed checkpoint like the others (``janus-train export RUN --tag best`` converts it)
plus ``best.json``: ``{"metric", "value", "step"}``. A better one is written as ``best.partial``
by all ranks, then swapped in by rank 0 (the old one renamed to ``best.old`` first), so a crash
leaves a complete best under one of the two names; reading falls back to ``best.old``. Since the
record is on disk, a resumed run keeps comparing against the best of its earlier part.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist

from janus_train.validation import better

BEST_TAG = "best"
BEST_FILE = "best.json"
_PARTIAL, _OLD = f"{BEST_TAG}.partial", f"{BEST_TAG}.old"


class BestCheckpoint:
    """Keeps ``checkpoints/best`` at the best ``metric`` seen; every rank builds one (``rank``)."""

    def __init__(self, checkpoints: Path, metric: str, rank: int) -> None:
        self.checkpoints, self.metric, self.rank = Path(checkpoints), metric, rank

    @property
    def path(self) -> Path:
        return self.checkpoints / BEST_TAG

    def record(self) -> dict[str, Any] | None:
        """The kept best's ``best.json`` (None when there is none, or it was for another metric)."""
        for tag in (BEST_TAG, _OLD):
            path = self.checkpoints / tag / BEST_FILE
            if path.is_file():
                record = json.loads(path.read_text())
                return record if record.get("metric") == self.metric else None
        return None

    def offer(self, engine: Any, step: int, metrics: dict[str, Any], client_state: dict[str, Any]) -> bool:
        """Save the engine as the best when ``metrics[metric]`` beats the kept one (all ranks call
        it with the same all-reduced metrics); returns whether it did."""
        value = metrics.get(self.metric)
        current = self.record()
        if value is None or not better(self.metric, value, None if current is None else current["value"]):
            return False
        if self.rank == 0:
            shutil.rmtree(self.checkpoints / _PARTIAL, ignore_errors=True)
        dist.barrier()
        engine.save_checkpoint(str(self.checkpoints), tag=_PARTIAL, client_state=client_state, save_latest=False)
        dist.barrier()
        if self.rank == 0:
            partial, old = self.checkpoints / _PARTIAL, self.checkpoints / _OLD
            (partial / BEST_FILE).write_text(json.dumps({"metric": self.metric, "value": value, "step": step}) + "\n")
            shutil.rmtree(old, ignore_errors=True)
            if self.path.exists():
                os.replace(self.path, old)
            os.replace(partial, self.path)
            shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return True
