"""The problem report of an index: why an input was reported, where, and which sample it costs.

Problems never pass silently: each becomes a :class:`ReportEntry` in the index's
:class:`DatasetReport`; the default policy skips what is affected, ``strict=True`` raises
:class:`DatasetError` after collecting them all.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

STRICT_MESSAGE_ENTRIES = 3
"""Entries named in a strict-mode error's one-line message (all of them are in ``error.report``)."""


class Reason(enum.StrEnum):
    """Why an input was reported (and, unless strict, skipped)."""

    MISSING_MILESTONES = "missing_milestones"
    INVALID_MILESTONES = "invalid_milestones"
    MALFORMED_JSON = "malformed_json"
    MISSING_FRAME_JSON = "missing_frame_json"
    EMPTY_DESCRIPTION = "empty_description"
    UNKNOWN_ACTION = "unknown_action"
    BAD_FRAME_NAME = "bad_frame_name"
    NOT_AN_IMAGE = "not_an_image"
    UNREADABLE_IMAGE = "unreadable_image"
    MISSING_IMAGE = "missing_image"
    DUPLICATE_STEP = "duplicate_step"
    MISSING_STEP = "missing_step"
    EMPTY_EPISODE = "empty_episode"
    BAD_WINDOW_FRAME = "bad_window_frame"
    NO_IMAGES = "no_images"
    MIXED_EPISODE_WINDOW = "mixed_episode_window"
    INVALID_RECORD = "invalid_record"
    DUPLICATE_ID = "duplicate_id"
    SYMLINK_LOOP = "symlink_loop"
    WINDOW_LENGTH = "window_length"


@dataclass(frozen=True, slots=True)
class ReportEntry:
    """One dataset problem: the file (and line, for JSONL) it is in, why, and the sample it costs."""

    file: str
    reason: Reason
    sample_key: str | None = None
    detail: str = ""
    line: int | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        sample = f" [sample {self.sample_key}]" if self.sample_key is not None else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{where}{sample}: {self.reason.value}{detail}"


@dataclass(frozen=True, slots=True)
class DatasetReport:
    """All problems found while indexing, in a deterministic order."""

    entries: tuple[ReportEntry, ...] = ()

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[ReportEntry]:
        return iter(self.entries)

    def counts(self) -> dict[str, int]:
        """Number of entries per reason, keyed by the reason's name, sorted by name."""
        counted = Counter(entry.reason.value for entry in self.entries)
        return dict(sorted(counted.items()))

    def by_reason(self, reason: Reason) -> tuple[ReportEntry, ...]:
        return tuple(entry for entry in self.entries if entry.reason is reason)

    def lines(self, limit: int | None = None) -> list[str]:
        shown = self.entries if limit is None else self.entries[:limit]
        out = [str(entry) for entry in shown]
        if limit is not None and len(self.entries) > limit:
            out.append(f"... and {len(self.entries) - limit} more")
        return out

    def strict_message(self, source: Path | str) -> str:
        """The one-line error of strict mode: counts per reason and the first few entries."""
        first = "; ".join(str(entry) for entry in self.entries[:STRICT_MESSAGE_ENTRIES])
        more = len(self) - STRICT_MESSAGE_ENTRIES
        tail = f"; and {more} more" if more > 0 else ""
        counts = ", ".join(f"{reason} {count}" for reason, count in self.counts().items())
        return f"dataset {source} has {len(self)} problem(s) ({counts}) in strict mode: {first}{tail}"


class DatasetError(ValueError):
    """The dataset cannot be indexed (strict mode with problems, or an unusable source).

    ``str(error)`` is one line naming the first problems; ``error.report`` holds all of them.
    """

    def __init__(self, message: str, report: DatasetReport | None = None) -> None:
        super().__init__(message)
        self.report = report if report is not None else DatasetReport()
