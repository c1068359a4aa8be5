"""The dataset index: an immutable, ordered list of episodes, frames and training samples.

Two input formats are read (see ``build_index``):

**Episode folders** (the main format): ``<root>/<episode_id>/milestones_result.json`` plus
``step_<n>_<ACTION>.<png|jpg|jpeg>`` frames, each with a ``.json`` of the same stem holding
``landmark_description`` (2-D) and ``spatial_description`` (3-D).

* Episodes are the sub-folders of the root in code-point order of their names; hidden folders and
  plain files at the root are ignored. Frames are ordered by their numeric step.
* A frame's ``index`` (the id that windows use) is its step number. Steps must run 0..n-1 without
  holes: a missing step, like an unreadable image or two files with the same step, makes that
  frame unusable, and every sample whose window contains it is skipped and reported. (The
  reference code used the position in the sorted file list, which silently shifts every later
  window when a frame is lost; we refuse to build such windows instead.)
* A frame whose description JSON is missing or empty, or whose action is unknown, is not a
  sample, but its pixels are fine, so it stays a history frame of later samples.
* Subinstruction of frame f: subinstruction i covers frames ``checkpoint[i-1]+1 .. checkpoint[i]``;
  frames after the last checkpoint get the last subinstruction.
* Sample key: ``"<episode_id>/<step>"``.

**Annotation file** (``.json`` holding a list of records, or ``.jsonl`` with one record a line):
each record is one sample with ``id``, instruction, subinstruction, the two descriptions, an
action (name or int code) and ``images`` (paths relative to the image root, the current view
last). Field aliases are listed in ``_ANNOTATION_FIELDS``.

* Sample key: ``str(id)``, which must be unique (a repeated id is reported, the first one kept).
* The window is the record's image list, in order. A frame is one distinct image path; its
  episode is the folder of that path relative to the image root (``"."`` for the root itself),
  and its index is its position among that folder's referenced images, ordered by the step in
  a ``step_<n>_...`` file name, then by name. All images of a record must lie in one episode.

Problems never pass silently: each becomes a ``ReportEntry`` (file, reason, sample key, detail)
in the index's ``DatasetReport``; the default policy skips what is affected, ``strict=True``
raises ``DatasetError`` after collecting them all.
"""

from __future__ import annotations

import abc
import enum
import hashlib
import io
import json
import os
import posixpath
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

from PIL import Image, UnidentifiedImageError
from tqdm import tqdm

from janus_cache.windows import DEFAULT_HISTORY, window_frames

ACTIONS: tuple[str, ...] = ("STOP", "MOVE_FORWARD", "TURN_LEFT", "TURN_RIGHT")
"""Action labels; the position is the integer code used by annotation files and the action head."""

MILESTONES_FILE = "milestones_result.json"
IMAGE_SUFFIXES: tuple[str, ...] = (".png", ".jpg", ".jpeg")
LANDMARK_FIELD = "landmark_description"
SPATIAL_FIELD = "spatial_description"

# A file that starts like a frame and has an image suffix is a frame candidate; anything that does
# not then match the full pattern is reported, never ignored.
_FRAME_NAME = re.compile(r"^step_(\d+)_([A-Za-z0-9_]+)\.(?i:png|jpe?g)$")
_FRAME_STEM = re.compile(r"^step_(\d+)_")
_PNG_IEND = b"\x00\x00\x00\x00IEND\xaeB`\x82"
_T = TypeVar("_T")
_R = TypeVar("_R")
_STRICT_MESSAGE_ENTRIES = 3
_SUMMARY_PROBLEMS = 20


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


class DatasetError(ValueError):
    """The dataset cannot be indexed (strict mode with problems, or an unusable source).

    ``str(error)`` is one line naming the first problems; ``error.report`` holds all of them.
    """

    def __init__(self, message: str, report: DatasetReport | None = None) -> None:
        super().__init__(message)
        self.report = report if report is not None else DatasetReport()


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

    @property
    def action_id(self) -> int:
        return ACTIONS.index(self.action)

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

    def format(self) -> str:
        lines = [
            f"dataset {self.source} ({self.source_format})",
            f"  episodes          {self.episodes}",
            f"  frames            {self.frames}",
            f"  samples           {self.samples}",
            f"  images per sample {self.images_per_sample}"
            + (f" (lengths {self.window_lengths})" if len(self.window_lengths) > 1 else ""),
        ]
        if self.skipped:
            lines.append(f"  problems          {self.problems_total} (skipped, by reason):")
            lines.extend(f"    {reason:<22}{count}" for reason, count in self.skipped.items())
            lines.extend(f"    {problem}" for problem in self.problems)
            if self.problems_total > len(self.problems):
                lines.append(f"    ... and {self.problems_total - len(self.problems)} more")
        else:
            lines.append("  problems          none")
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

    def source_identity(self) -> tuple[tuple[str, int, int, int], ...]:
        """Per frame, in row order: (relative path, width, height, file size in bytes)."""
        return tuple((f.relpath, f.width, f.height, f.nbytes) for f in self.frames)

    def summary(self) -> DatasetSummary:
        lengths = Counter(len(s.window) for s in self.samples)
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
            problems=tuple(str(entry) for entry in self.report.entries[:_SUMMARY_PROBLEMS]),
            problems_total=len(self.report),
        )


def source_identity(index: DatasetIndex) -> tuple[tuple[str, int, int, int], ...]:
    """Per-frame (relative path, width, height, byte size): the dataset identity a manifest keys on."""
    return index.source_identity()


def content_hash(data: bytes) -> str:
    """Content hash of a frame file's bytes (sha256, hex): the one definition used everywhere."""
    return hashlib.sha256(data).hexdigest()


def frame_content_hash(path: Path) -> str:
    """sha256 (hex) of a file's bytes, read in chunks; equals ``content_hash(path.read_bytes())``."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def parse_action(value: object) -> str | None:
    """An action name from a label or an int code; ``None`` when it is neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return ACTIONS[value] if 0 <= value < len(ACTIONS) else None
    if isinstance(value, str) and value in ACTIONS:
        return value
    return None


def build_index(
    source: Path | str,
    *,
    history: int = DEFAULT_HISTORY,
    image_root: Path | str | None = None,
    strict: bool = False,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
) -> DatasetIndex:
    """Index an episode-folder root, or a ``.json`` / ``.jsonl`` annotation file.

    ``history``: history frames per window (episode-folder format; an annotation record's
    window is its image list). ``image_root``: base of annotation image paths (default: the
    annotation file's folder). ``check_images``: read every image fully and verify it (PNG:
    chunk CRCs up to a complete IEND; JPEG and others: a full decode) and record its sha256;
    when false only the header is read, which finds non-images but not truncated files.
    ``workers``: threads for the per-frame work (default: a few per core). ``progress``: show a
    progress bar of the per-file checks on stderr.

    Raises ``FileNotFoundError`` for a missing source, ``DatasetError`` for an unusable one or,
    with ``strict``, for any reported problem.
    """
    source = Path(source)
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise ValueError(f"history must be a positive int, got {history!r}")
    if not source.exists():
        raise FileNotFoundError(f"dataset {source} does not exist")
    threads = workers if workers is not None else min(16, 4 * (os.cpu_count() or 1))
    if source.is_dir():
        if image_root is not None:
            raise DatasetError(f"{source}: image_root applies to annotation files, not to an episode-folder root")
        if (source / MILESTONES_FILE).exists():
            raise DatasetError(
                f"{source} is a single episode folder (it holds {MILESTONES_FILE}); pass the folder "
                f"that contains the episode folders, here {source.parent}"
            )
        builder: _Builder = _EpisodeFolderBuilder(source, history, check_images, threads)
    elif source.suffix.lower() in (".json", ".jsonl"):
        root = Path(image_root) if image_root is not None else source.parent
        builder = _AnnotationBuilder(source, root, history, check_images, threads)
    else:
        raise DatasetError(f"{source}: expected an episode-folder root or a .json/.jsonl annotation file")
    builder.progress = progress
    index = builder.build()
    if strict and index.report.entries:
        raise DatasetError(_strict_message(source, index.report), index.report)
    return index


def _strict_message(source: Path, report: DatasetReport) -> str:
    first = "; ".join(str(entry) for entry in report.entries[:_STRICT_MESSAGE_ENTRIES])
    more = len(report) - _STRICT_MESSAGE_ENTRIES
    tail = f"; and {more} more" if more > 0 else ""
    counts = ", ".join(f"{reason} {count}" for reason, count in report.counts().items())
    return f"dataset {source} has {len(report)} problem(s) ({counts}) in strict mode: {first}{tail}"


# ---------------------------------------------------------------------------------------------
# Per-file work (runs in a thread pool: file reads, hashing and zlib release the GIL)


@dataclass(frozen=True, slots=True)
class _ImageInfo:
    width: int
    height: int
    nbytes: int
    sha256: str | None


@dataclass(frozen=True, slots=True)
class _Problem:
    reason: Reason
    detail: str


def _inspect_image(path: Path, full: bool) -> _ImageInfo | _Problem:
    """Size, file size and (if ``full``) sha256 of an image, or why it is unusable."""
    try:
        if full:
            data = path.read_bytes()
            nbytes = len(data)
            opened = Image.open(io.BytesIO(data))
        else:
            nbytes = path.stat().st_size
            opened = Image.open(path)
    except FileNotFoundError:
        return _Problem(Reason.MISSING_IMAGE, "file does not exist")
    except IsADirectoryError:
        return _Problem(Reason.NOT_AN_IMAGE, "is a directory")
    except UnidentifiedImageError:
        return _Problem(Reason.NOT_AN_IMAGE, "not a readable image format")
    except (OSError, SyntaxError, ValueError) as err:
        return _Problem(Reason.UNREADABLE_IMAGE, f"{type(err).__name__}: {err}")
    try:
        with opened as image:
            width, height = image.size
            if full:
                if image.format == "PNG":
                    # verify() checks every chunk's CRC (cheap, no decode) but accepts a file whose
                    # IEND chunk is cut short, so the exact IEND tail is checked as well.
                    image.verify()
                    if not data.endswith(_PNG_IEND):
                        return _Problem(Reason.UNREADABLE_IMAGE, "truncated PNG (no complete IEND chunk)")
                else:
                    # JPEG's verify() is a no-op; only a decode notices a truncated file.
                    image.load()
    except (OSError, SyntaxError, ValueError, EOFError) as err:
        return _Problem(Reason.UNREADABLE_IMAGE, f"{type(err).__name__}: {err}")
    if width <= 0 or height <= 0:
        return _Problem(Reason.UNREADABLE_IMAGE, f"empty image {width}x{height}")
    return _ImageInfo(width, height, nbytes, content_hash(data) if full else None)


@dataclass(frozen=True, slots=True)
class _Descriptions:
    landmark: str
    spatial: str


def _read_json(path: Path) -> tuple[Any, _Problem | None]:
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a byte-order mark
    except FileNotFoundError:
        return None, _Problem(Reason.MISSING_FRAME_JSON, "file does not exist")
    except (OSError, UnicodeDecodeError) as err:
        return None, _Problem(Reason.MALFORMED_JSON, f"cannot read: {type(err).__name__}: {err}")
    try:
        return json.loads(text), None
    except json.JSONDecodeError as err:
        return None, _Problem(Reason.MALFORMED_JSON, f"line {err.lineno} column {err.colno}: {err.msg}")


def _read_descriptions(path: Path) -> _Descriptions | _Problem:
    data, problem = _read_json(path)
    if problem is not None:
        return problem
    if not isinstance(data, dict):
        return _Problem(Reason.EMPTY_DESCRIPTION, f"expected a JSON object, got {type(data).__name__}")
    empty = [name for name in (LANDMARK_FIELD, SPATIAL_FIELD) if not _nonblank(data.get(name))]
    if empty:
        return _Problem(Reason.EMPTY_DESCRIPTION, "missing or empty " + " and ".join(empty))
    return _Descriptions(data[LANDMARK_FIELD], data[SPATIAL_FIELD])


def _nonblank(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


# ---------------------------------------------------------------------------------------------
# Builders


class _Builder(abc.ABC):
    def __init__(self, history: int, check_images: bool, threads: int) -> None:
        self.history = history
        self.check_images = check_images
        self.threads = max(1, threads)
        self.entries: list[ReportEntry] = []
        self.progress = False

    def report(
        self, file: Path | str, reason: Reason, key: str | None = None, detail: str = "", line: int | None = None
    ) -> None:
        self.entries.append(ReportEntry(str(file), reason, key, detail, line))

    def inspect_images(self, paths: Sequence[Path]) -> list[_ImageInfo | _Problem]:
        return self.map(lambda p: _inspect_image(p, self.check_images), paths)

    def map(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        # Checking ~600k images takes minutes: show it (a bar on a terminal, sparse lines in logs).
        bar = tqdm(total=len(items), desc="indexing", unit=" files", disable=not self.progress,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0, file=sys.stderr)
        with bar:
            if self.threads == 1 or len(items) < 2:
                results = []
                for item in items:
                    results.append(fn(item))
                    bar.update()
                return results
            with ThreadPoolExecutor(max_workers=self.threads) as pool:
                results = []
                for result in pool.map(fn, items):
                    results.append(result)
                    bar.update()
                return results

    @abc.abstractmethod
    def build(self) -> DatasetIndex:
        """Scan the source, check every file and assemble the index (problems go to the report)."""


@dataclass
class _FrameFile:
    path: Path
    step: int
    action: str | None
    action_text: str


@dataclass
class _EpisodeScan:
    episode_id: str
    path: Path
    instruction: str
    subinstructions: tuple[str, ...]
    checkpoints: tuple[int, ...]
    by_step: dict[int, list[_FrameFile]]
    orphan_json: list[Path]


class _EpisodeFolderBuilder(_Builder):
    def __init__(self, root: Path, history: int, check_images: bool, threads: int) -> None:
        super().__init__(history, check_images, threads)
        self.root = root

    def build(self) -> DatasetIndex:
        folders = sorted(
            (entry.name for entry in os.scandir(self.root) if entry.is_dir() and not entry.name.startswith(".")),
        )
        scans = [scan for name in folders if (scan := self._scan_episode(name)) is not None]
        # One flat list of per-frame jobs over all episodes keeps the thread pool busy.
        jobs: list[_FrameFile] = [f for scan in scans for files in scan.by_step.values() for f in files]
        checked = self.map(
            lambda job: (
                _inspect_image(job.path, self.check_images),
                _read_descriptions(job.path.with_suffix(".json")),
            ),
            jobs,
        )
        per_file = {job.path: result for job, result in zip(jobs, checked, strict=True)}

        episodes: list[Episode] = []
        frames: list[Frame] = []
        samples: list[Sample] = []
        for scan in scans:
            episode = self._assemble(scan, per_file, frames, samples)
            if episode is not None:
                episodes.append(episode)
        return DatasetIndex(
            source=self.root,
            source_format="episodes",
            history=self.history,
            episodes=tuple(episodes),
            frames=tuple(frames),
            samples=tuple(samples),
            report=DatasetReport(tuple(self.entries)),
        )

    def _scan_episode(self, episode_id: str) -> _EpisodeScan | None:
        folder = self.root / episode_id
        milestones = folder / MILESTONES_FILE
        if not milestones.is_file():
            self.report(milestones, Reason.MISSING_MILESTONES, detail=f"episode {episode_id} skipped")
            return None
        data, problem = _read_json(milestones)
        if problem is not None:
            self.report(milestones, problem.reason, detail=f"{problem.detail}; episode {episode_id} skipped")
            return None
        texts = _parse_milestones(data)
        if isinstance(texts, str):
            self.report(milestones, Reason.INVALID_MILESTONES, detail=f"{texts}; episode {episode_id} skipped")
            return None
        instruction, subinstructions, checkpoints = texts

        by_step: dict[int, list[_FrameFile]] = {}
        stems: set[str] = set()
        jsons: list[str] = []
        for name in sorted(os.listdir(folder)):
            suffix = os.path.splitext(name)[1].lower()
            if not name.startswith("step_"):
                continue
            if suffix == ".json":
                jsons.append(name)
                continue
            if suffix not in IMAGE_SUFFIXES:
                continue
            match = _FRAME_NAME.match(name)
            if match is None:
                self.report(folder / name, Reason.BAD_FRAME_NAME, detail="expected step_<int>_<ACTION>.<png|jpg|jpeg>")
                continue
            step, action_text = int(match.group(1)), match.group(2)
            action = action_text if action_text in ACTIONS else None
            by_step.setdefault(step, []).append(_FrameFile(folder / name, step, action, action_text))
            stems.add(os.path.splitext(name)[0])
        orphans = [folder / name for name in jsons if os.path.splitext(name)[0] not in stems]
        return _EpisodeScan(
            episode_id, folder, instruction, subinstructions, checkpoints, dict(sorted(by_step.items())), orphans
        )

    def _assemble(
        self,
        scan: _EpisodeScan,
        per_file: Mapping[Path, tuple[_ImageInfo | _Problem, _Descriptions | _Problem]],
        frames: list[Frame],
        samples: list[Sample],
    ) -> Episode | None:
        ep = scan.episode_id
        if not scan.by_step:
            self.report(scan.path, Reason.EMPTY_EPISODE, detail=f"no step_<int>_<ACTION> frames; episode {ep} skipped")
            return None
        # Per step: the usable frame, or why that frame slot cannot be a window member.
        usable: dict[int, tuple[_FrameFile, _ImageInfo]] = {}
        unusable: dict[int, tuple[str, Reason]] = {}
        labels: dict[int, _Descriptions] = {}
        reported: set[str] = set()
        present = sorted(scan.by_step)
        # Holes in the step numbers: one entry per run of missing steps (a mistyped step_99999
        # must not produce 99999 entries); each missing slot makes the windows over it unusable.
        for before, after in pairwise([-1, *present]):
            if after - before < 2:
                continue
            first, last = before + 1, after - 1
            where = scan.path / f"step_{first:04d}_*"
            if first == last:
                self.report(where, Reason.MISSING_STEP, f"{ep}/{first}", f"no frame file for step {first}")
                reported.add(f"{ep}/{first}")
            else:
                self.report(where, Reason.MISSING_STEP, None, f"no frame files for steps {first}..{last}")
            unusable.update({step: (str(where), Reason.MISSING_STEP) for step in range(first, last + 1)})
        for step in present:
            key = f"{ep}/{step}"
            files = scan.by_step[step]
            if len(files) > 1:
                names = ", ".join(f.path.name for f in files)
                for f in files:
                    self.report(f.path, Reason.DUPLICATE_STEP, key, f"step {step} appears {len(files)} times: {names}")
                unusable[step] = (str(files[0].path), Reason.DUPLICATE_STEP)
                reported.add(key)
                continue
            frame_file = files[0]
            image, text = per_file[frame_file.path]
            if isinstance(image, _Problem):
                self.report(frame_file.path, image.reason, key, image.detail)
                unusable[step] = (str(frame_file.path), image.reason)
                reported.add(key)
            else:
                usable[step] = (frame_file, image)
            if frame_file.action is None:
                self.report(
                    frame_file.path,
                    Reason.UNKNOWN_ACTION,
                    key,
                    f"action {frame_file.action_text!r} is not one of {', '.join(ACTIONS)}",
                )
                reported.add(key)
            json_path = frame_file.path.with_suffix(".json")
            if isinstance(text, _Problem):
                self.report(json_path, text.reason, key, text.detail + "; frame kept as history only")
                reported.add(key)
            else:
                labels[step] = text
        for orphan in scan.orphan_json:
            match = _FRAME_STEM.match(orphan.name)
            key = f"{ep}/{int(match.group(1))}" if match else None
            self.report(orphan, Reason.MISSING_IMAGE, key, "frame description without an image file")

        if not usable:
            self.report(scan.path, Reason.EMPTY_EPISODE, detail=f"no usable frames; episode {ep} skipped")
            return None

        frame_rows: dict[int, int] = {}
        for step, (frame_file, image) in usable.items():
            row = len(frames)
            frame_rows[step] = row
            frames.append(
                Frame(
                    row=row,
                    episode_id=ep,
                    index=step,
                    step=step,
                    action=frame_file.action,
                    path=frame_file.path,
                    relpath=f"{ep}/{frame_file.path.name}",
                    width=image.width,
                    height=image.height,
                    nbytes=image.nbytes,
                    sha256=image.sha256,
                )
            )

        sample_rows: list[int] = []
        for step, (frame_file, _image) in usable.items():
            key = f"{ep}/{step}"
            if step not in labels or frame_file.action is None:
                continue
            window = window_frames(step, self.history)
            bad = next((i for i in window if i in unusable), None)
            if bad is not None:
                if key not in reported:
                    file, reason = unusable[bad]
                    self.report(file, Reason.BAD_WINDOW_FRAME, key, f"window frame {bad} is unusable ({reason.value})")
                continue
            row = len(samples)
            sample_rows.append(row)
            text = labels[step]
            samples.append(
                Sample(
                    row=row,
                    key=key,
                    episode_id=ep,
                    step=step,
                    window=window,
                    window_rows=tuple(frame_rows[i] for i in window),
                    instruction=scan.instruction,
                    subinstruction=subinstruction_for(step, scan.subinstructions, scan.checkpoints),
                    description_2d=text.landmark,
                    description_3d=text.spatial,
                    action=frame_file.action,
                )
            )
        return Episode(
            episode_id=ep,
            path=scan.path,
            instruction=scan.instruction,
            subinstructions=scan.subinstructions,
            checkpoints=scan.checkpoints,
            frame_rows=tuple(frame_rows.values()),
            sample_rows=tuple(sample_rows),
        )


def subinstruction_for(frame: int, subinstructions: Sequence[str], checkpoints: Sequence[int]) -> str:
    """Subinstruction i covers frames checkpoint[i-1]+1 .. checkpoint[i] (from 0 for i = 0);
    frames after the last checkpoint, and any beyond the listed subinstructions, get the last one."""
    if not subinstructions:
        raise ValueError("an episode needs at least one subinstruction")
    # Number of checkpoints strictly before this frame = the subinstruction it belongs to.
    i = sum(1 for cp in checkpoints if cp < frame)
    return subinstructions[min(i, len(subinstructions) - 1)]


def _parse_milestones(data: object) -> tuple[str, tuple[str, ...], tuple[int, ...]] | str:
    """The episode texts, or a description of what is wrong with them."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    instruction = data.get("instruction_text")
    if not _nonblank(instruction):
        return "instruction_text is missing or empty"
    subs = data.get("subinstructions")
    if not isinstance(subs, list) or not subs:
        return "subinstructions must be a non-empty list of strings"
    for i, sub in enumerate(subs):
        if not _nonblank(sub):
            return f"subinstructions[{i}] is missing or empty"
    raw = data.get("completion_checkpoints", [])
    if not isinstance(raw, list):
        return "completion_checkpoints must be a list"
    checkpoints: list[int] = []
    for i, item in enumerate(raw):
        value = item.get("checkpoint_frame_index") if isinstance(item, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"completion_checkpoints[{i}] has no non-negative integer checkpoint_frame_index"
        if checkpoints and value < checkpoints[-1]:
            return f"completion_checkpoints are not in order ({checkpoints[-1]} then {value})"
        checkpoints.append(value)
    return instruction, tuple(subs), tuple(checkpoints)  # type: ignore[return-value]


# Annotation records: the accepted names of each field, first match wins.
_ANNOTATION_FIELDS: dict[str, tuple[str, ...]] = {
    "instruction": ("instruction", "instruction_text", "full_instruction"),
    "subinstruction": ("subinstruction", "sub_instruction", "sub_instruction_text"),
    "description_2d": ("2D_description", "2d_description", "description_2d"),
    "description_3d": ("3D_description", "3d_description", "description_3d"),
    "action": ("action", "action_label"),
}


def _field(record: Mapping[str, Any], name: str) -> Any:
    for alias in _ANNOTATION_FIELDS[name]:
        if alias in record and record[alias] is not None:
            return record[alias]
    return None


@dataclass
class _Record:
    key: str
    where: str
    line: int | None
    texts: dict[str, str]
    action: str
    images: tuple[str, ...]


class _AnnotationBuilder(_Builder):
    def __init__(self, file: Path, image_root: Path, history: int, check_images: bool, threads: int) -> None:
        super().__init__(history, check_images, threads)
        self.file = file
        self.image_root = image_root
        self.seen_ids: dict[str, str] = {}

    def build(self) -> DatasetIndex:
        records = [r for r in (self._parse(raw, line, pos) for raw, line, pos in self._load()) if r is not None]

        # Frames: distinct image paths; index within an episode folder by step in the name, then name.
        relpaths = sorted({p for r in records for p in r.images})
        by_episode: dict[str, list[str]] = {}
        for rel in relpaths:
            by_episode.setdefault(posixpath.dirname(rel) or ".", []).append(rel)
        position: dict[str, tuple[str, int, int]] = {}
        for ep, members in by_episode.items():
            members.sort(key=_annotation_frame_order)
            for i, rel in enumerate(members):
                step = _name_step(posixpath.basename(rel))
                position[rel] = (ep, i, step if step is not None else i)
        checked = dict(zip(relpaths, self.inspect_images([self.image_root / rel for rel in relpaths]), strict=True))

        frames: list[Frame] = []
        frame_rows: dict[str, int] = {}
        episode_frames: dict[str, list[int]] = {}
        for ep in sorted(by_episode):
            for rel in by_episode[ep]:
                info = checked[rel]
                if isinstance(info, _Problem):
                    continue
                _ep, i, step = position[rel]
                row = len(frames)
                frame_rows[rel] = row
                episode_frames.setdefault(ep, []).append(row)
                name = posixpath.basename(rel)
                match = _FRAME_NAME.match(name)
                frames.append(
                    Frame(
                        row=row,
                        episode_id=ep,
                        index=i,
                        step=step,
                        action=parse_action(match.group(2)) if match else None,
                        path=self.image_root / rel,
                        relpath=rel,
                        width=info.width,
                        height=info.height,
                        nbytes=info.nbytes,
                        sha256=info.sha256,
                    )
                )

        samples: list[Sample] = []
        episode_samples: dict[str, list[int]] = {}
        for record in records:
            problems = {rel: p for rel in record.images if isinstance(p := checked[rel], _Problem)}
            if problems:
                for rel, problem in problems.items():
                    self.report(
                        self.image_root / rel,
                        problem.reason,
                        record.key,
                        f"{problem.detail}; image of the record at {record.where}",
                    )
                continue
            current = record.images[-1]
            ep, _i, step = position[current]
            if any(position[rel][0] != ep for rel in record.images):
                episodes = sorted({position[rel][0] for rel in record.images})
                self.report(
                    self.file,
                    Reason.MIXED_EPISODE_WINDOW,
                    record.key,
                    f"images come from several folders: {', '.join(episodes)}",
                    record.line,
                )
                continue
            row = len(samples)
            episode_samples.setdefault(ep, []).append(row)
            samples.append(
                Sample(
                    row=row,
                    key=record.key,
                    episode_id=ep,
                    step=step,
                    window=tuple(position[rel][1] for rel in record.images),
                    window_rows=tuple(frame_rows[rel] for rel in record.images),
                    instruction=record.texts["instruction"],
                    subinstruction=record.texts["subinstruction"],
                    description_2d=record.texts["description_2d"],
                    description_3d=record.texts["description_3d"],
                    action=record.action,
                )
            )
        episodes = tuple(
            Episode(
                episode_id=ep,
                path=self.image_root / ep,
                instruction=None,
                subinstructions=(),
                checkpoints=(),
                frame_rows=tuple(episode_frames[ep]),
                sample_rows=tuple(episode_samples.get(ep, ())),
            )
            for ep in sorted(episode_frames)
        )
        return DatasetIndex(
            source=self.file,
            source_format="annotations",
            history=self.history,
            episodes=episodes,
            frames=tuple(frames),
            samples=tuple(samples),
            report=DatasetReport(tuple(self.entries)),
        )

    def _load(self) -> Iterator[tuple[Any, int | None, int]]:
        """(raw record, JSONL line or None, position in the file) for every parseable record."""
        try:
            text = self.file.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(f"{self.file}: cannot read annotation file: {type(err).__name__}: {err}") from err
        if self.file.suffix.lower() == ".jsonl":
            position = 0
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as err:
                    self.report(self.file, Reason.MALFORMED_JSON, None, f"column {err.colno}: {err.msg}", number)
                    continue
                yield raw, number, position
                position += 1
            return
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            self.report(self.file, Reason.MALFORMED_JSON, None, f"{err.msg}; no records read", err.lineno)
            return
        if not isinstance(data, list):
            self.report(
                self.file, Reason.INVALID_RECORD, None, f"expected a JSON list of records, got {type(data).__name__}"
            )
            return
        for position, raw in enumerate(data):
            yield raw, None, position

    def _parse(self, raw: Any, line: int | None, position: int) -> _Record | None:
        where = f"{self.file}:{line}" if line is not None else f"{self.file} record {position}"
        detail_at = "" if line is not None else f" (record {position})"

        def bad(reason: Reason, key: str | None, detail: str) -> None:
            self.report(self.file, reason, key, detail + detail_at, line)

        if not isinstance(raw, dict):
            bad(Reason.INVALID_RECORD, None, f"expected a JSON object, got {type(raw).__name__}")
            return None
        rid = raw.get("id")
        if isinstance(rid, bool) or not isinstance(rid, (str, int)) or not str(rid).strip():
            bad(Reason.INVALID_RECORD, None, "missing or empty id")
            return None
        key = str(rid)
        if key in self.seen_ids:
            bad(Reason.DUPLICATE_ID, key, f"id {key!r} already used at {self.seen_ids[key]}; record skipped")
            return None
        self.seen_ids[key] = where
        texts: dict[str, str] = {}
        for name in ("instruction", "subinstruction"):
            value = _field(raw, name)
            if not _nonblank(value):
                bad(Reason.INVALID_RECORD, key, f"{name} ({' / '.join(_ANNOTATION_FIELDS[name])}) is missing or empty")
                return None
            texts[name] = value
        for name in ("description_2d", "description_3d"):
            value = _field(raw, name)
            if not _nonblank(value):
                bad(
                    Reason.EMPTY_DESCRIPTION,
                    key,
                    f"{name} ({' / '.join(_ANNOTATION_FIELDS[name])}) is missing or empty",
                )
                return None
            texts[name] = value
        raw_action = _field(raw, "action")
        action = parse_action(raw_action)
        if action is None:
            bad(
                Reason.UNKNOWN_ACTION,
                key,
                f"action {raw_action!r} is not one of {', '.join(ACTIONS)} or 0..{len(ACTIONS) - 1}",
            )
            return None
        images = raw.get("images")
        if not isinstance(images, list) or not images or not all(_nonblank(p) for p in images):
            bad(Reason.NO_IMAGES, key, "images must be a non-empty list of paths")
            return None
        normalised = tuple(posixpath.normpath(p.replace(os.sep, "/")) for p in images)
        return _Record(key, where, line, texts, action, normalised)


def _name_step(name: str) -> int | None:
    match = _FRAME_STEM.match(name)
    return int(match.group(1)) if match else None


def _annotation_frame_order(rel: str) -> tuple[bool, int, str]:
    step = _name_step(posixpath.basename(rel))
    return (step is None, step if step is not None else 0, rel)
