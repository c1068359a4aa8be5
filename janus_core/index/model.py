"""The index data model: an immutable, ordered list of episodes, frames and training samples.

Rows are positions in ``DatasetIndex.frames`` / ``.samples``; a frame's ``index`` is its id within
its episode (what windows refer to); a sample's ``key`` is unique in the index. The builders of
the input formats (``episode_folders``, ``annotations``) produce this model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from janus_core.index.problems import SUMMARY_PROBLEMS, DatasetReport, problem_lines
from janus_core.index.subinstructions import DEFAULT_SUBINSTRUCTION_RULE

ACTIONS: tuple[str, ...] = ("STOP", "MOVE_FORWARD", "TURN_LEFT", "TURN_RIGHT")
"""Action names; the position is the action id: the integer code of annotation files and the class
of the action head (the reference JanusVLN ids: STOP 0, MOVE_FORWARD 1, TURN_LEFT 2, TURN_RIGHT 3)."""

ACTION_IDS: dict[str, int] = {name: i for i, name in enumerate(ACTIONS)}
"""Action name -> action id (the inverse of ``ACTIONS``)."""


def parse_action(value: object) -> str | None:
    """An action name from a label or an int code; ``None`` when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return ACTIONS[value] if 0 <= value < len(ACTIONS) else None
    if isinstance(value, str) and value in ACTIONS:
        return value
    return None


@dataclass(frozen=True, slots=True)
class DataSource:
    """One dataset source of an index: its name, its path, and whether the name was given
    (``NAME=PATH``); :mod:`janus_core.index.sources` parses and combines them."""

    name: str
    path: Path
    named: bool = False
    image_root: Path | None = None
    """An annotation file's image root when its images lie elsewhere (default: the file's folder)."""

    def __str__(self) -> str:
        return f"{self.name}={self.path}" if self.named else str(self.path)


@dataclass(frozen=True, slots=True)
class Frame:
    """One source image. ``index`` is its id within the episode (what windows refer to)."""

    row: int
    episode_id: str
    index: int
    step: int
    action: str | None
    path: Path
    relpath: str
    width: int
    height: int
    nbytes: int
    sha256: str | None = None

    @property
    def key(self) -> str:
        return f"{self.episode_id}/{self.index}"


@dataclass(frozen=True, slots=True)
class Sample:
    """One training sample: the current frame, its history window, the texts and the action."""

    row: int
    key: str
    episode_id: str
    step: int
    window: tuple[int, ...]
    window_rows: tuple[int, ...]
    instruction: str
    subinstruction: str
    description_2d: str
    description_3d: str
    action: str
    source: str = ""
    """Name of the dataset source the sample comes from (``janus_core.index.sources``)."""
    record: str = field(default="", compare=False)
    """Where the sample's own texts and action were read: its frame's description JSON (episode
    folders) or ``file:line`` of its annotation record; named when they change."""

    @property
    def action_id(self) -> int:
        return ACTION_IDS[self.action]

    @property
    def frame_index(self) -> int:
        """Index of the current frame (the last window entry) within the episode."""
        return self.window[-1]


@dataclass(frozen=True, slots=True)
class Episode:
    """One episode: its folder, texts (episode-folder format) and the rows of its frames/samples."""

    episode_id: str
    path: Path
    instruction: str | None
    subinstructions: tuple[str, ...]
    checkpoints: tuple[int, ...]
    frame_rows: tuple[int, ...]
    sample_rows: tuple[int, ...]
    source: str = ""
    """Name of the dataset source the episode comes from (``janus_core.index.sources``)."""
    texts_file: str = field(default="", compare=False)
    """The file holding the episode's instruction and subinstructions (episode folders:
    ``milestones_result.json``; empty for annotation files, whose records hold them)."""


@dataclass(frozen=True, slots=True)
class DatasetSummary:
    """What the CLI prints about an index."""

    source: str
    source_format: str
    history: int
    episodes: int
    frames: int
    samples: int
    images_per_sample: int
    window_lengths: dict[int, int]
    skipped: dict[str, int]
    problems: tuple[str, ...]
    problems_total: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "format": self.source_format,
            "history": self.history,
            "episodes": self.episodes,
            "frames": self.frames,
            "samples": self.samples,
            "images_per_sample": self.images_per_sample,
            "window_lengths": {str(k): v for k, v in self.window_lengths.items()},
            "skipped": dict(self.skipped),
            "problems": list(self.problems),
            "problems_total": self.problems_total,
        }

    def format(self, full_report: str | None = None) -> str:
        """The summary ``janus-cache index`` prints (``full_report``: where every problem is listed)."""
        lines = [
            f"dataset {self.source} ({self.source_format})",
            f"  episodes          {self.episodes}",
            f"  frames            {self.frames}",
            f"  samples           {self.samples}",
            f"  images per sample {self.images_per_sample}"
            + (f" (lengths {self.window_lengths})" if len(self.window_lengths) > 1 else ""),
        ]
        lines.extend(problem_lines(self.skipped, self.problems, self.problems_total, full_report))
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class DatasetIndex:
    """The immutable, ordered index. Rows are positions in ``frames`` / ``samples``."""

    source: Path
    source_format: str
    history: int
    episodes: tuple[Episode, ...]
    frames: tuple[Frame, ...]
    samples: tuple[Sample, ...]
    report: DatasetReport
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE
    """How episode-folder samples got their subinstruction (see ``janus_core.index.subinstructions``)."""
    sources: tuple[DataSource, ...] = ()
    """The named sources this index combines, in order; empty for an index of one path built by
    ``build_index``."""
    _samples_by_key: dict[str, int] = field(init=False, repr=False, compare=False)
    _episodes_by_id: dict[str, int] = field(init=False, repr=False, compare=False)
    _frame_rows: dict[tuple[str, int], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_samples_by_key", {s.key: s.row for s in self.samples})
        object.__setattr__(self, "_episodes_by_id", {e.episode_id: i for i, e in enumerate(self.episodes)})
        object.__setattr__(self, "_frame_rows", {(f.episode_id, f.index): f.row for f in self.frames})

    def sample(self, key: str) -> Sample:
        try:
            return self.samples[self._samples_by_key[key]]
        except KeyError:
            raise KeyError(f"no sample with key {key!r} in {self.source}") from None

    def episode(self, episode_id: str) -> Episode:
        try:
            return self.episodes[self._episodes_by_id[episode_id]]
        except KeyError:
            raise KeyError(f"no episode {episode_id!r} in {self.source}") from None

    def frames_of(self, episode_id: str) -> tuple[Frame, ...]:
        return tuple(self.frames[row] for row in self.episode(episode_id).frame_rows)

    def samples_of(self, episode_id: str) -> tuple[Sample, ...]:
        return tuple(self.samples[row] for row in self.episode(episode_id).sample_rows)

    def frame(self, episode_id: str, index: int) -> Frame:
        try:
            return self.frames[self._frame_rows[(episode_id, index)]]
        except KeyError:
            raise KeyError(f"no usable frame {index} in episode {episode_id!r} of {self.source}") from None

    def window(self, sample: Sample) -> tuple[Frame, ...]:
        """The frames of a sample's window, oldest first, the current view last."""
        return tuple(self.frames[row] for row in sample.window_rows)

    def int_column(self, table: str, name: str) -> np.ndarray:
        """Field ``name`` of every row of ``table`` (``"frames"``, ``"samples"``) as an int64 array:
        one value per row, or a 2-D array for a tuple field whose tuples have one length (windows).
        A stored index answers from its columns without making a row (``janus_core.index.lazy``)."""
        rows = getattr(self, table)
        values = [getattr(r, name) for r in rows]
        return np.array(values, dtype=np.int64) if values else np.zeros(0, dtype=np.int64)

    def text_column(self, table: str, name: str) -> list[Any]:
        """Field ``name`` of every row of ``table`` as a list (texts, ``None`` where absent)."""
        return list(self.iter_text(table, name))

    def iter_text(self, table: str, name: str) -> Iterator[Any]:
        """:meth:`text_column` a row at a time: a stored index decodes each value when it is asked
        for, so a column of 612k distinct texts (keys, paths, hashes) is never a list at once."""
        return (getattr(r, name) for r in getattr(self, table))

    def source_identity(self) -> tuple[tuple[str, int, int, int], ...]:
        """Per frame, in row order: (relative path, width, height, file size in bytes)."""
        return tuple((f.relpath, f.width, f.height, f.nbytes) for f in self.frames)

    def window_lengths(self) -> Counter[int]:
        """Samples per window length (a stored index counts them from its columns)."""
        return Counter(len(s.window) for s in self.samples)

    def summary(self) -> DatasetSummary:
        lengths = self.window_lengths()
        return DatasetSummary(
            source=str(self.source),
            source_format=self.source_format,
            history=self.history,
            episodes=len(self.episodes),
            frames=len(self.frames),
            samples=len(self.samples),
            images_per_sample=max(lengths) if lengths else self.history + 1,
            window_lengths=dict(sorted(lengths.items())),
            skipped=self.report.counts(),
            problems=tuple(str(entry) for entry in self.report.entries[:SUMMARY_PROBLEMS]),
            problems_total=len(self.report),
        )


def source_identity(index: DatasetIndex) -> tuple[tuple[str, int, int, int], ...]:
    """Per-frame (relative path, width, height, byte size): the dataset identity a manifest keys on."""
    return index.source_identity()
