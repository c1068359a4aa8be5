"""Several dataset sources in one index: ``r2r=data/r2r rxr=data/rxr.jsonl`` (or one bare path).

A source is an episode-folder root or an annotation file with a *name*: ``NAME=PATH``, or a bare
``PATH``, which is named after its folder (an annotation file: the folder of its images, i.e. its
image root, by default the file's own folder), so that an annotation file and the episode folders
it describes make the same cache; characters a name cannot hold (a space) become ``_``. Compared
with a cache (``verify --data``, ``train --data``, a precompute that resumes or appends), a bare
path takes the name the cache recorded for it (:func:`adopt_names`): a dataset that was copied,
moved or renamed is the same dataset, its identity follows its content (episode ids, texts, frame
hashes), not its folder's name. The combined index is
the sources' indexes one after the other, **in the order given**, each in its own canonical order
(episode folders sorted by name; see the input formats). That order is the cache's row order, so a
cache grows by appending (DAgger rounds): list the new round as a new source after the old ones
(or name its episodes to sort after the existing ones), and the appended cache equals a cache built
from scratch on the union.

Keys: with several sources, or a source given as ``NAME=PATH``, every episode id (and so every
frame and sample key) is prefixed with its source name, ``r2r/<episode>/<step>``, which keeps keys
unique across sources; a single bare path keeps the dataset's own keys (as caches of one dataset
always had). Every sample and episode records its source name either way (the sample table's
``source`` column). A cache meant to grow by further sources should name its first one.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from janus_core.index.model import DatasetIndex, DataSource, Episode, Frame, Sample
from janus_core.index.problems import DatasetError, DatasetReport, ReportEntry

SOURCE_NAME = re.compile(r"^[^\W_][\w.-]*$")
"""A source name: a path-safe word of letters (any script), digits, '_', '.' and '-' (it becomes the
first part of every key)."""
NOT_IN_NAME = re.compile(r"[^\w.-]+")
"""Characters of a folder name that a source name cannot hold (each run becomes one '_')."""


def parse_source(text: str) -> DataSource:
    """``NAME=PATH`` or a bare ``PATH`` (named after its folder; an annotation file after the folder
    it is in, see :func:`with_image_roots` for one with an image root elsewhere)."""
    name, sep, path = text.partition("=")
    if sep and SOURCE_NAME.match(name) and path:
        return DataSource(name, Path(path), named=True)
    if sep and not Path(text).exists():
        raise DatasetError(f"dataset source {text!r}: the name before '=' must be a word of letters, digits, "
                           "'_', '.' or '-', and a path must follow it")
    source = Path(text)
    name = _folder_name(source.parent if _is_annotation(source) else source)
    if not SOURCE_NAME.match(name):
        raise DatasetError(f"dataset source {text}: cannot name it after {name!r}; give it a name, NAME={text}")
    return DataSource(name, source)


def _one_source(text: str) -> bool:
    """Whether a command-line value is one source although it may hold spaces: an existing path, or
    ``NAME=`` and an existing path."""
    name, sep, path = text.partition("=")
    return Path(text).exists() or bool(sep and SOURCE_NAME.match(name) and path and Path(path).exists())


def parse_sources(values: Iterable[str | Path | DataSource]) -> tuple[DataSource, ...]:
    """The sources of command-line values, each one source or several separated by spaces (as in
    ``make precompute DATA="r2r=data/r2r rxr=data/rxr"``; quote a path with spaces among several,
    ``DATA='r2r="my data/r2r" rxr=data/rxr'``). A value that is an existing path (or ``NAME=`` and
    one) is one source, spaces and all. Names must be unique."""
    sources: list[DataSource] = []
    for value in values:
        if isinstance(value, DataSource):
            sources.append(value)
        elif isinstance(value, Path) or _one_source(value):
            sources.append(parse_source(str(value)))
        else:
            try:
                parts = shlex.split(value)
            except ValueError as err:  # an unclosed quote
                raise DatasetError(f"dataset sources {value!r}: {err}; quote each path with spaces once") from None
            sources.extend(parse_source(part) for part in parts)
    if not sources:
        raise DatasetError("no dataset source given")
    return _unique(sources)


def _unique(sources: Sequence[DataSource]) -> tuple[DataSource, ...]:
    """``sources``, whose names must differ."""
    seen: dict[str, DataSource] = {}
    for source in sources:
        if source.name in seen:
            raise DatasetError(f"dataset sources {seen[source.name]} and {source} have the same name "
                               f"{source.name!r}; name them, e.g. NAME={source.path}")
        seen[source.name] = source
    return tuple(sources)


def _is_annotation(path: Path) -> bool:
    return path.suffix.lower() in (".json", ".jsonl")


def _folder_name(path: Path) -> str:
    """A source name after a folder: its name, each run of characters a name cannot hold as '_'."""
    return NOT_IN_NAME.sub("_", path.resolve().name).strip("_.-")


def adopt_names(sources: tuple[DataSource, ...], recorded: Sequence[str]) -> tuple[DataSource, ...]:
    """The sources, each bare one named as the cache that ``recorded`` these source names (in order)
    named it: a bare path named after one of them keeps that name; any other takes the recorded
    name at its own position (a dataset copied, moved or renamed), unless another source has it.
    Sources beyond the recorded ones (an append) and named ones keep their names."""
    taken = {s.name for s in sources if s.named or s.name in recorded}
    adopted = []
    for position, source in enumerate(sources):
        if (not source.named and source.name not in recorded and position < len(recorded)
                and recorded[position] not in taken):
            taken.add(recorded[position])
            source = dataclasses.replace(source, name=recorded[position])
        adopted.append(source)
    return tuple(adopted)


ImageRoots = Path | str | Sequence[Path | str] | None
"""Image roots as a command gives them (``--image-root``, repeatable): ``NAME=DIR`` for the source
named NAME, or a bare ``DIR`` for the one source there is."""


def with_image_roots(sources: tuple[DataSource, ...], roots: ImageRoots) -> tuple[DataSource, ...]:
    """The sources with the image roots of their annotation files (``roots``: see :data:`ImageRoots`,
    named like the sources: ``rxr=/images/rxr``); a bare annotation source whose images lie under
    its root is named after that folder, as the episode folders there would be."""
    values = [] if roots is None else [roots] if isinstance(roots, (str, Path)) else list(roots)
    given: dict[str, Path] = {}
    for value in values:
        name, sep, folder = str(value).partition("=")
        if isinstance(value, str) and sep and SOURCE_NAME.match(name) and folder and not Path(value).exists():
            if name not in {s.name for s in sources}:
                raise DatasetError(f"--image-root {value}: no dataset source is named {name!r} (the sources: "
                                   f"{', '.join(s.name for s in sources)})")
            given[name] = Path(folder)
        elif len(sources) == 1:
            given[sources[0].name] = Path(value)
        else:
            raise DatasetError(f"--image-root {value}: an image root belongs to one annotation source, and there are "
                               f"{len(sources)} ({describe(sources)}); name it: --image-root NAME={value}")
    rooted = []
    for source in sources:
        root = given.get(source.name)
        if root is not None and not source.named and _is_annotation(source.path):
            name = _folder_name(root)
            if not SOURCE_NAME.match(name):
                raise DatasetError(f"dataset source {source.path}: cannot name it after its image root {root}; "
                                   f"give it a name, NAME={source.path}")
            source = dataclasses.replace(source, name=name)
        rooted.append(dataclasses.replace(source, image_root=root))
    return _unique(rooted)


def source_values(value: str | Path) -> list[str | Path]:
    """One command-line value naming a dataset, for :func:`parse_sources`: an existing path is one
    source (even with spaces or '=' in it); anything else may list several (``r2r=A rxr=B``)."""
    return [Path(value)] if Path(value).exists() else [str(value)]


def prefixes_keys(sources: Sequence[DataSource]) -> bool:
    """Whether keys carry their source's name (several sources, or one given a name)."""
    return len(sources) > 1 or any(s.named for s in sources)


def describe(sources: Sequence[DataSource]) -> str:
    """The sources as a user writes them (``r2r=data/r2r rxr=data/rxr``)."""
    return " ".join(str(s) for s in sources)


@dataclass(frozen=True)
class _Renaming:
    """How one source's rows become rows of the combined index: keys prefixed with the source's
    name (when names prefix keys), rows shifted past the sources before it."""

    source: DataSource
    prefix: bool
    frame_offset: int
    sample_offset: int

    def named(self, text: str) -> str:
        return f"{self.source.name}/{text}" if self.prefix else text

    def frame(self, f: Frame) -> Frame:
        return dataclasses.replace(f, row=f.row + self.frame_offset, episode_id=self.named(f.episode_id),
                                   relpath=self.named(f.relpath))

    def sample(self, s: Sample) -> Sample:
        return dataclasses.replace(
            s, row=s.row + self.sample_offset, key=self.named(s.key), episode_id=self.named(s.episode_id),
            source=self.source.name, window_rows=tuple(r + self.frame_offset for r in s.window_rows))

    def episode(self, e: Episode) -> Episode:
        return dataclasses.replace(
            e, episode_id=self.named(e.episode_id), source=self.source.name,
            frame_rows=tuple(r + self.frame_offset for r in e.frame_rows),
            sample_rows=tuple(r + self.sample_offset for r in e.sample_rows))

    def entry(self, e: ReportEntry) -> ReportEntry:
        return e if e.sample_key is None else dataclasses.replace(e, sample_key=self.named(e.sample_key))


def _renamings(sources: Sequence[DataSource], indexes: Sequence[DatasetIndex]) -> list[_Renaming]:
    if len(sources) != len(indexes) or not sources:
        raise ValueError("combine needs one index per source")
    prefix = prefixes_keys(sources)
    renamings, frames, samples = [], 0, 0
    for source, index in zip(sources, indexes, strict=True):
        renamings.append(_Renaming(source, prefix, frames, samples))
        frames, samples = frames + len(index.frames), samples + len(index.samples)
    return renamings


COMBINE_CHUNK_ROWS = 8192
"""Rows of the combined index made at a time by :func:`combined_rows`."""


def combined_rows(sources: Sequence[DataSource], indexes: Sequence[DatasetIndex]
                  ) -> Iterator[tuple[str, list[Frame] | list[Sample]]]:
    """The combined index's frames, then its samples, :data:`COMBINE_CHUNK_ROWS` rows at a time as
    (table, rows): what :func:`combine` holds, made a chunk at a time from (lazily read) source indexes."""
    renamings = _renamings(sources, indexes)
    chunk = COMBINE_CHUNK_ROWS
    for table in ("frames", "samples"):
        for renaming, index in zip(renamings, indexes, strict=True):
            rows = getattr(index, table)
            rename = renaming.frame if table == "frames" else renaming.sample
            for first in range(0, len(rows), chunk):
                yield table, [rename(row) for row in rows[first:first + chunk]]


def combine(sources: Sequence[DataSource], indexes: Sequence[DatasetIndex], rows: bool = True) -> DatasetIndex:
    """One index of several sources' indexes, in the given order (keys prefixed as documented);
    without ``rows`` its frames and samples are left empty (:func:`combined_rows` makes them)."""
    renamings = _renamings(sources, indexes)
    episodes: list[Episode] = []
    frames: list[Frame] = []
    samples: list[Sample] = []
    entries: list[ReportEntry] = []
    for renaming, index in zip(renamings, indexes, strict=True):
        if rows:
            frames.extend(renaming.frame(f) for f in index.frames)
            samples.extend(renaming.sample(s) for s in index.samples)
        episodes.extend(renaming.episode(e) for e in index.episodes)
        entries.extend(renaming.entry(e) for e in index.report)
    formats = sorted({index.source_format for index in indexes})
    histories = {index.history for index in indexes}
    rules = {index.subinstruction_rule for index in indexes}
    assert len(histories) == 1 and len(rules) == 1, "sources of one index share history and subinstruction rule"
    return DatasetIndex(
        source=indexes[0].source if len(sources) == 1 else Path(describe(sources)),
        source_format="+".join(formats),
        history=indexes[0].history,
        episodes=tuple(episodes),
        frames=tuple(frames),
        samples=tuple(samples),
        report=DatasetReport(tuple(entries)),
        subinstruction_rule=indexes[0].subinstruction_rule,
        sources=tuple(sources),
    )
