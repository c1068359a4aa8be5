"""The dataset index: an immutable, ordered list of episodes, frames and training samples.

``build_index`` reads one of two input formats: an episode-folder root
(:mod:`janus_core.index.episode_folders`) or a ``.json`` / ``.jsonl`` annotation file
(:mod:`janus_core.index.annotations`). Texts follow :mod:`janus_core.index.texts`, the
subinstruction of a frame :mod:`janus_core.index.subinstructions`; problems go to the index's
report (:mod:`janus_core.index.problems`) instead of passing silently. With ``cache_dir`` the
index is stored in columns and reused while the sources are unchanged
(:mod:`janus_core.index.cached`).

``build_sources_index`` combines several named sources into one index
(:mod:`janus_core.index.sources`): what precompute, verify and the trainer's dataset check build.
Each episode's identity (:mod:`janus_core.index.identity`) is what a cache records of it, and
:mod:`janus_core.index.changes` compares a cache's episodes with the dataset now.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from janus_core.index.annotations import ANNOTATION_FIELDS, AnnotationBuilder
from janus_core.index.cached import (
    PREFILL_MIN_FILES,
    IndexStore,
    StoredIndex,
    StoredSources,
    load_stored,
    user_index_dir,
)
from janus_core.index.changes import (
    CachedRows,
    DatasetChanges,
    EpisodeChange,
    append_order_problem,
    dataset_changes,
)
from janus_core.index.episode_folders import (
    LANDMARK_FIELD,
    MILESTONES_FILE,
    SPATIAL_FIELD,
    EpisodeFolderBuilder,
)
from janus_core.index.files import IMAGE_SUFFIXES, Builder, content_hash
from janus_core.index.identity import EpisodeIdentity, episode_identities, episode_identity
from janus_core.index.model import (
    ACTION_IDS,
    ACTIONS,
    DatasetIndex,
    DatasetSummary,
    Episode,
    Frame,
    Sample,
    parse_action,
    source_identity,
)
from janus_core.index.problems import DatasetError, DatasetReport, Reason, ReportEntry
from janus_core.index.sources import (
    DataSource,
    ImageRoots,
    adopt_names,
    combine,
    describe,
    parse_sources,
    prefixes_keys,
    source_values,
    with_image_roots,
)
from janus_core.index.subinstructions import (
    DEFAULT_SUBINSTRUCTION_RULE,
    SUBINSTRUCTION_RULES,
    SubinstructionRule,
    parse_rule,
    subinstruction_for,
)
from janus_core.index.texts import normalise_text
from janus_core.windows import DEFAULT_HISTORY

__all__ = [
    "ACTIONS",
    "ACTION_IDS",
    "ANNOTATION_FIELDS",
    "CachedRows",
    "DataSource",
    "ImageRoots",
    "with_image_roots",
    "adopt_names",
    "DatasetChanges",
    "EpisodeChange",
    "EpisodeIdentity",
    "append_order_problem",
    "build_sources_index",
    "store_sources_index",
    "StoredSources",
    "dataset_changes",
    "describe",
    "episode_identities",
    "episode_identity",
    "parse_sources",
    "prefixes_keys",
    "source_values",
    "DEFAULT_SUBINSTRUCTION_RULE",
    "IMAGE_SUFFIXES",
    "LANDMARK_FIELD",
    "MILESTONES_FILE",
    "SPATIAL_FIELD",
    "SUBINSTRUCTION_RULES",
    "DatasetError",
    "DatasetIndex",
    "DatasetReport",
    "DatasetSummary",
    "Episode",
    "Frame",
    "IndexStore",
    "Reason",
    "ReportEntry",
    "Sample",
    "StoredIndex",
    "SubinstructionRule",
    "IndexOptions",
    "build_index",
    "build_stored_index",
    "load_stored",
    "user_index_dir",
    "content_hash",
    "normalise_text",
    "parse_action",
    "source_identity",
    "subinstruction_for",
]


@dataclass(frozen=True)
class IndexOptions:
    """How a dataset is indexed: the keyword options every builder below takes.

    ``history``: history frames per window (episode-folder format; an annotation record's window is
    its image list). ``image_root``: base of annotation image paths (default: the annotation file's
    folder; a single annotation source). ``strict``: any reported problem is a ``DatasetError``.
    ``check_images``: read every image fully and verify it (PNG: chunk CRCs up to a complete IEND;
    JPEG and others: a full decode) and record its sha256; when false only the header is read, which
    finds non-images but not truncated files. ``workers``: threads for the per-frame work (default: a
    few per core). ``progress``: show a progress bar of the per-file checks on stderr.
    ``subinstruction_rule``: ``reference`` (default) or ``janus``, see
    :mod:`janus_core.index.subinstructions` (episode folders only; an annotation record names its own
    subinstruction). ``processes``: worker processes that check images when many are new (through a
    store of indexes).
    """

    history: int = DEFAULT_HISTORY
    image_root: Path | str | None = None
    strict: bool = False
    check_images: bool = True
    workers: int | None = None
    progress: bool = False
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE
    processes: int = 1

    def builder(self, source: Path | str, image_root: Path | str | None = None) -> Builder:
        """The builder of one source's index (``image_root``: its own, instead of the options')."""
        image_root = image_root if image_root is not None else self.image_root
        source, history = Path(source), self.history
        if isinstance(history, bool) or not isinstance(history, int) or history < 1:
            raise ValueError(f"history must be a positive int, got {history!r}")
        rule = parse_rule(self.subinstruction_rule).value
        if not source.exists():
            raise FileNotFoundError(f"dataset {source} does not exist")
        threads = self.workers if self.workers is not None else min(16, 4 * (os.cpu_count() or 1))
        if source.is_dir():
            if image_root is not None:
                raise DatasetError(f"{source}: an image root applies to annotation files, not to an episode-folder "
                                   "root")
            if (source / MILESTONES_FILE).exists():
                raise DatasetError(
                    f"{source} is a single episode folder (it holds {MILESTONES_FILE}); pass the folder "
                    f"that contains the episode folders, here {source.parent}"
                )
            builder: Builder = EpisodeFolderBuilder(source, history, self.check_images, threads, rule)
        elif source.suffix.lower() in (".json", ".jsonl"):
            root = Path(image_root) if image_root is not None else source.parent
            builder = AnnotationBuilder(source, root, history, self.check_images, threads, rule)
        else:
            raise DatasetError(f"{source}: expected an episode-folder root or a .json/.jsonl annotation file")
        builder.progress = self.progress
        return builder

    def check_strict(self, index: DatasetIndex, source: Path | str) -> None:
        if self.strict and index.report.entries:
            raise DatasetError(index.report.strict_message(source), index.report)


def build_index(source: Path | str, *, cache_dir: Path | str | None = None, **options: Any) -> DatasetIndex:
    """Index an episode-folder root, or a ``.json`` / ``.jsonl`` annotation file, with the keyword
    :class:`IndexOptions`. ``cache_dir``: a folder of stored indexes (:class:`IndexStore`): the
    index is reused from it while the dataset's files keep their sizes and mtimes, else rebuilt
    reading only new or changed images, and stored.

    Raises ``FileNotFoundError`` for a missing source, ``DatasetError`` for an unusable one or,
    with ``strict``, for any reported problem.
    """
    if cache_dir is not None:
        return build_stored_index(source, cache_dir, **options).index
    opts = IndexOptions(**options)
    index = opts.builder(source).build()
    opts.check_strict(index, source)
    return index


def build_stored_index(source: Path | str, cache_dir: Path | str, **options: Any) -> StoredIndex:
    """:func:`build_index` through the store in ``cache_dir``; also says where the index is
    stored and whether it was reused (other processes then read it with :func:`load_stored`)."""
    opts = IndexOptions(**options)
    stored = IndexStore(cache_dir).get(opts.builder(source), processes=opts.processes)
    opts.check_strict(stored.index, source)
    return stored


def build_sources_index(
    sources: Sequence[str | Path | DataSource] | str | Path,
    *,
    cache_dir: Path | str | None = None,
    on_stored: Callable[[StoredIndex], None] | None = None,
    recorded_names: Sequence[str] = (),
    **options: Any,
) -> DatasetIndex:
    """One index of several dataset sources (``NAME=PATH`` or bare paths, in order; a string may
    hold several separated by spaces), keyed as :mod:`janus_core.index.sources` says.
    ``recorded_names``: the source names of the cache the index is compared with (its manifest's):
    bare paths take them (:func:`~janus_core.index.sources.adopt_names`), so a moved dataset is the same.

    The keyword arguments are :func:`build_index`'s, except ``image_root``: the annotation files'
    image roots, ``NAME=DIR`` each or one bare ``DIR`` for a single source
    (:func:`~janus_core.index.sources.with_image_roots`); with ``cache_dir`` each source's index is stored there (an entry per dataset and settings)
    and ``on_stored`` sees each source's :class:`StoredIndex` (reused or rebuilt, and what it read).
    Raises ``DatasetError`` for unusable sources or names, or (``strict``) any problem.
    """
    parsed = _parsed_sources(sources, options.pop("image_root", None), recorded_names)
    opts = IndexOptions(**options)
    loose = replace(opts, strict=False)  # strict applies to the combined index
    if cache_dir is not None:
        # Stored and read lazily: a 612k-sample index as row objects is gigabytes.
        try:
            stored = _store_sources(parsed, cache_dir, loose, on_stored)
        except OSError:  # the store cannot be written: built in memory below
            pass
        else:
            index = stored.load()
            opts.check_strict(index, describe(parsed))
            return index
    if cache_dir is None:
        indexes = [loose.builder(source.path, source.image_root).build() for source in parsed]
    else:
        indexes = [stored.index for stored in _stored_sources(parsed, cache_dir, loose, on_stored=None)]
    index = combine(parsed, indexes)
    opts.check_strict(index, describe(parsed))
    return index


def store_sources_index(
    sources: Sequence[str | Path | DataSource] | str | Path,
    cache_dir: Path | str,
    *,
    on_stored: Callable[[StoredIndex], None] | None = None,
    prefill_min_files: int = PREFILL_MIN_FILES,
    recorded_names: Sequence[str] = (),
    **options: Any,
) -> StoredSources:
    """:func:`build_sources_index` kept in the store ``cache_dir`` as one combined entry, and where.

    How a job of many processes shares a large index: one process calls this, the others (and it)
    read the result with :meth:`StoredSources.load`, lazily, each making only the rows it uses.
    While the sources are unchanged nothing is combined and no row is made (the entry is reused).
    ``prefill_min_files``: new or changed images from which the ``processes`` check them.
    ``recorded_names``: as for :func:`build_sources_index`.
    """
    parsed = _parsed_sources(sources, options.pop("image_root", None), recorded_names)
    opts = IndexOptions(**options)
    stored = _store_sources(parsed, cache_dir, opts, on_stored, prefill_min_files)
    if opts.strict:
        opts.check_strict(stored.load(), describe(parsed))
    return stored


def _store_sources(parsed: Sequence[DataSource], cache_dir: Path | str, opts: IndexOptions,
                   on_stored: Callable[[StoredIndex], None] | None,
                   prefill_min_files: int = PREFILL_MIN_FILES) -> StoredSources:
    parts = _stored_sources(parsed, cache_dir, opts, on_stored, lazy=True, prefill_min_files=prefill_min_files)
    return IndexStore(cache_dir).combined(parsed, parts)


def _parsed_sources(sources: Sequence[str | Path | DataSource] | str | Path,
                    image_roots: ImageRoots, recorded_names: Sequence[str] = ()) -> tuple[DataSource, ...]:
    parsed = with_image_roots(parse_sources([sources] if isinstance(sources, (str, Path)) else sources),
                              image_roots)
    return adopt_names(parsed, tuple(recorded_names))


def _stored_sources(parsed: Sequence[DataSource], cache_dir: Path | str, opts: IndexOptions,
                    on_stored: Callable[[StoredIndex], None] | None, lazy: bool = False,
                    prefill_min_files: int = PREFILL_MIN_FILES) -> list[StoredIndex]:
    """Each source's index through the store in ``cache_dir`` (``lazy``: a reused one is read lazily)."""
    parts = []
    for source in parsed:
        stored = IndexStore(cache_dir, prefill_min_files).get(opts.builder(source.path, source.image_root),
                                                             processes=opts.processes, lazy=lazy)
        if on_stored is not None:
            on_stored(stored)
        parts.append(stored)
    return parts
