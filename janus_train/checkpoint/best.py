"""The best checkpoint of a run by a validation metric: ``RUN/checkpoints/best/``, outside the
``save_total_limit`` rotation (which only removes ``step*`` tags) and never named by ``latest``
(a resume continues from the newest step, not from the best).

It is a DeepSpeed checkpoint like the others (``janus-train export RUN --tag best`` converts it)
plus ``best.json``: ``{"metric", "value", "step"}``. A better one is written as ``best.partial``
by all ranks, then swapped in by rank 0 (the old one renamed to ``best.old`` first), so a crash
leaves a complete best under one of the two names; reading falls back to ``best.old``. Since the
record is on disk, a resumed run keeps comparing against the best of its earlier part.

A better one that runs out of room (any rank, any file) ends every rank alike with one line
(:class:`~janus_core.system.disk_space.NoRoom`), as a step checkpoint's save does: ``best.partial`` is
removed, the kept best is left as it was, and the same command resumes from ``latest`` (the
step checkpoint before this validation) once there is room, validating and offering again.

By an external evaluation's metric (``train.best_metric: eval/SR``), the best is a step checkpoint
already saved: one process links its files into ``best.partial`` and swaps it in the same way
(:meth:`BestCheckpoint.adopt`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from janus_core.system.disk_space import NoRoom, bytes_under, format_bytes, free_bytes
from janus_core.system.files import replace_directory
from janus_train.checkpoint.store import Checkpoints, tag_name
from janus_train.data.val_metric_names import better
from janus_train.run.layout import BEST_TAG

BEST_FILE = "best.json"
_PARTIAL, _OLD = f"{BEST_TAG}.partial", f"{BEST_TAG}.old"


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def best_record(checkpoints: Path) -> dict[str, Any] | None:
    """The kept best's ``best.json`` in the checkpoint directory ``checkpoints`` (None: none kept)."""
    for tag in (BEST_TAG, _OLD):
        path = checkpoints / tag / BEST_FILE
        if path.is_file():
            return dict(json.loads(path.read_text()))
    return None


class BestCheckpoint:
    """Keeps ``checkpoints/best`` at the best ``metric`` seen (``mode``: the direction of an
    evaluation's metric, :func:`~janus_train.data.val_metric_names.better`); every rank builds one
    for validation, on the run's :class:`Checkpoints` (its directory, rank and world); one process
    builds one for an external evaluation's metric (:meth:`adopt`)."""

    def __init__(self, checkpoints: Checkpoints, metric: str, mode: str | None = None) -> None:
        self.saves, self.metric, self.mode = checkpoints, metric, mode
        self.checkpoints, self.rank = checkpoints.directory, checkpoints.rank

    @property
    def path(self) -> Path:
        return self.checkpoints / BEST_TAG

    def record(self) -> dict[str, Any] | None:
        """The kept best's ``best.json`` (None when there is none, or it was for another metric)."""
        record = best_record(self.checkpoints)
        return record if record is not None and record.get("metric") == self.metric else None

    def offer(self, engine: Any, step: int, metrics: dict[str, Any], client_state: dict[str, Any]) -> bool:
        """Save the engine as the best when ``metrics[metric]`` beats the kept one (all ranks call
        it with the same all-reduced metrics); returns whether it did. Out of room: :class:`NoRoom`
        on every rank, the kept best untouched."""
        value = metrics.get(self.metric)
        current = self.record()
        if value is None or not better(self.metric, value, None if current is None else current["value"], self.mode):
            return False
        reason = self.saves.write_tag(engine, _PARTIAL, client_state)
        if reason is None:
            best = {"metric": self.metric, "value": value, "step": step}
            reason = self.saves.on_main(lambda: self._swap_in(best))
        if reason is not None:
            raise NoRoom(self.saves.from_main(self._give_up(step, value, reason) if self.rank == 0 else None))
        return True

    def adopt(self, step: int, value: float) -> bool:
        """One process: make the saved checkpoint of ``step`` the best when ``value`` (an external
        evaluation's metric of it) beats the kept one; returns whether it did. Its files are hard
        links to the step's (a copy where the file system has none), so the two take the room of one
        and the step's rotation leaves the best whole. Raises OSError when the step's checkpoint is
        gone or the copy runs out of room (``best.partial`` removed, the kept best untouched)."""
        current = self.record()
        if not better(self.metric, value, None if current is None else current["value"], self.mode):
            return False
        partial = self.checkpoints / _PARTIAL
        shutil.rmtree(partial, ignore_errors=True)
        try:
            shutil.copytree(self.checkpoints / tag_name(step), partial, copy_function=_link_or_copy)
            self._swap_in({"metric": self.metric, "value": value, "step": step})
        except OSError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return True

    def _swap_in(self, best: dict[str, Any]) -> None:
        """Rank 0: the complete ``best.partial`` (with its ``best.json``) becomes ``best``."""
        partial, old = self.checkpoints / _PARTIAL, self.checkpoints / _OLD
        (partial / BEST_FILE).write_text(json.dumps(best) + "\n")
        replace_directory(partial, self.path, aside=old)

    def _give_up(self, step: int, value: float, reason: str) -> str:
        """Rank 0, after the save of a better one ran out of room: remove ``best.partial`` (its room
        is the user's again), keep the best there was, and say so in one line with the byte counts."""
        partial, old = self.checkpoints / _PARTIAL, self.checkpoints / _OLD
        written = bytes_under(partial)
        shutil.rmtree(partial, ignore_errors=True)
        if old.is_dir() and not self.path.exists():  # the swap stopped between its two renames
            os.replace(old, self.path)
        kept = self.record()
        if kept is None:
            takes = f"this checkpoint needs more than the {format_bytes(written)} written before the disk filled"
            kept_note = "no best checkpoint is kept yet"
        else:
            takes = f"the best checkpoint takes {format_bytes(bytes_under(self.path))}"
            kept_note = f"the best of step {kept['step']} ({self.metric} {kept['value']:.6g}) is kept as it was"
        return (f"{partial}: no room left saving the best checkpoint of step {step} ({self.metric} {value:.6g}) "
                f"({reason}): the disk has {format_bytes(free_bytes(self.checkpoints))} free and {takes}; the partial "
                f"best checkpoint was removed, {kept_note}; {self.saves.rerun_hint()}")
