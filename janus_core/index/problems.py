"""The problem report of an index: why an input was reported, where, and which sample it costs.

Problems never pass silently: each becomes a :class:`ReportEntry` in the index's
:class:`DatasetReport`; the default policy skips what is affected, ``strict=True`` raises
:class:`DatasetError` after collecting them all.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from janus_core.plural import plural

STRICT_MESSAGE_ENTRIES = 3
"""Entries named in a strict-mode error's one-line message (all of them are in ``error.report``)."""
SUMMARY_PROBLEMS = 20
"""Problems listed by name in a summary (the rest are counted)."""


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

    def summary_lines(self, full_report: str) -> list[str]:
        """The problem summary ``index``, ``plan`` and ``precompute`` print (:func:`problem_lines`)."""
        first = tuple(str(entry) for entry in self.entries[:SUMMARY_PROBLEMS])
        return problem_lines(self.counts(), first, len(self), full_report)

    def to_dict(self) -> dict[str, Any]:
        """Every entry, as ``report.json``'s ``dataset_problems`` lists them (also ``--report FILE``)."""
        return {"dataset_problems": [{"file": e.file, "reason": str(e.reason), "sample": e.sample_key,
                                      "detail": e.detail, "line": e.line} for e in self.entries]}

    def strict_message(self, source: Path | str) -> str:
        """The one-line error of strict mode: counts per reason and the first few entries."""
        first = "; ".join(str(entry) for entry in self.entries[:STRICT_MESSAGE_ENTRIES])
        more = len(self) - STRICT_MESSAGE_ENTRIES
        tail = f"; and {more} more" if more > 0 else ""
        counts = ", ".join(f"{reason} {count}" for reason, count in self.counts().items())
        return f"dataset {source} has {plural(len(self), 'problem')} ({counts}) in strict mode: {first}{tail}"


def problem_lines(counts: Mapping[str, int], first: Sequence[str], total: int, full_report: str | None) -> list[str]:
    """The one problem summary of a dataset: the count per reason, the first problems by file name
    and where the full report goes (``full_report``; None: not said), or that there is none."""
    if not total:
        return ["  problems          none"]
    lines = [f"  problems          {total} (skipped, by reason):"]
    lines.extend(f"    {reason:<22}{count}" for reason, count in counts.items())
    lines.extend(f"    {problem}" for problem in first)
    if total > len(first):
        lines.append(f"    ... and {total - len(first)} more")
    if full_report:
        lines.append(f"    full report: {full_report}")
    return lines


class DatasetError(ValueError):
    """The dataset cannot be indexed (strict mode with problems, or an unusable source).

    ``str(error)`` is one line naming the first problems; ``error.report`` holds all of them.
    """

    def __init__(self, message: str, report: DatasetReport | None = None) -> None:
        super().__init__(message)
        self.report = report if report is not None else DatasetReport()
