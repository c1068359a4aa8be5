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
from pathlib import Path

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
    adopt_names,
    combine,
    describe,
    named_after_image_root,
    parse_sources,
    prefixes_keys,
    source_values,
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


def build_index(
    source: Path | str,
    *,
    history: int = DEFAULT_HISTORY,
    image_root: Path | str | None = None,
    strict: bool = False,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
    cache_dir: Path | str | None = None,
    processes: int = 1,
) -> DatasetIndex:
    """Index an episode-folder root, or a ``.json`` / ``.jsonl`` annotation file.

    ``history``: history frames per window (episode-folder format; an annotation record's
    window is its image list). ``image_root``: base of annotation image paths (default: the
    annotation file's folder). ``check_images``: read every image fully and verify it (PNG:
    chunk CRCs up to a complete IEND; JPEG and others: a full decode) and record its sha256;
    when false only the header is read, which finds non-images but not truncated files.
    ``workers``: threads for the per-frame work (default: a few per core). ``progress``: show a
    progress bar of the per-file checks on stderr. ``subinstruction_rule``: ``reference``
    (default) or ``janus``, see :mod:`janus_core.index.subinstructions` (episode folders only;
    an annotation record names its own subinstruction). ``cache_dir``: a folder of stored
    indexes (:class:`IndexStore`): the index is reused from it while the dataset's files keep
    their sizes and mtimes, else rebuilt reading only new or changed images, and stored.
    ``processes``: worker processes that check images when many are new (with ``cache_dir``).

    Raises ``FileNotFoundError`` for a missing source, ``DatasetError`` for an unusable one or,
    with ``strict``, for any reported problem.
    """
    if cache_dir is not None:
        return build_stored_index(
            source, cache_dir, history=history, image_root=image_root, strict=strict, check_images=check_images,
            workers=workers, progress=progress, subinstruction_rule=subinstruction_rule, processes=processes,
        ).index
    index = _builder(source, history, image_root, check_images, workers, progress, subinstruction_rule).build()
    _check_strict(index, source, strict)
    return index


def build_stored_index(
    source: Path | str,
    cache_dir: Path | str,
    *,
    history: int = DEFAULT_HISTORY,
    image_root: Path | str | None = None,
    strict: bool = False,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
    processes: int = 1,
) -> StoredIndex:
    """:func:`build_index` through the store in ``cache_dir``; also says where the index is
    stored and whether it was reused (other processes then read it with :func:`load_stored`)."""
    builder = _builder(source, history, image_root, check_images, workers, progress, subinstruction_rule)
    stored = IndexStore(cache_dir).get(builder, processes=processes)
    _check_strict(stored.index, source, strict)
    return stored


def _check_strict(index: DatasetIndex, source: Path | str, strict: bool) -> None:
    if strict and index.report.entries:
        raise DatasetError(index.report.strict_message(source), index.report)


def _builder(source: Path | str, history: int, image_root: Path | str | None, check_images: bool,
             workers: int | None, progress: bool, subinstruction_rule: str) -> Builder:
    source = Path(source)
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise ValueError(f"history must be a positive int, got {history!r}")
    rule = parse_rule(subinstruction_rule).value
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
        builder: Builder = EpisodeFolderBuilder(source, history, check_images, threads, rule)
    elif source.suffix.lower() in (".json", ".jsonl"):
        root = Path(image_root) if image_root is not None else source.parent
        builder = AnnotationBuilder(source, root, history, check_images, threads, rule)
    else:
        raise DatasetError(f"{source}: expected an episode-folder root or a .json/.jsonl annotation file")
    builder.progress = progress
    return builder


def build_sources_index(
    sources: Sequence[str | Path | DataSource] | str | Path,
    *,
    history: int = DEFAULT_HISTORY,
    image_root: Path | str | None = None,
    strict: bool = False,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
    cache_dir: Path | str | None = None,
    processes: int = 1,
    on_stored: Callable[[StoredIndex], None] | None = None,
    recorded_names: Sequence[str] = (),
) -> DatasetIndex:
    """One index of several dataset sources (``NAME=PATH`` or bare paths, in order; a string may
    hold several separated by spaces), keyed as :mod:`janus_core.index.sources` says.
    ``recorded_names``: the source names of the cache the index is compared with (its manifest's):
    bare paths take them (:func:`~janus_core.index.sources.adopt_names`), so a moved dataset is the same.

    The keyword arguments are :func:`build_index`'s; ``image_root`` applies to a single annotation
    source; with ``cache_dir`` each source's index is stored there (an entry per dataset and settings)
    and ``on_stored`` sees each source's :class:`StoredIndex` (reused or rebuilt, and what it read).
    Raises ``DatasetError`` for unusable sources or names, or (``strict``) any problem.
    """
    parsed = _parsed_sources(sources, image_root, recorded_names)
    if cache_dir is not None:
        # Stored and read lazily: a 612k-sample index as row objects is gigabytes.
        try:
            stored = store_sources_index(parsed, cache_dir, history=history, image_root=image_root,
                                         check_images=check_images, workers=workers, progress=progress,
                                         subinstruction_rule=subinstruction_rule, processes=processes,
                                         on_stored=on_stored)
        except OSError:  # the store cannot be written: built in memory below
            pass
        else:
            index = stored.load()
            _check_strict(index, describe(parsed), strict)
            return index
    if cache_dir is None:
        indexes = [build_index(source.path, history=history, image_root=image_root, check_images=check_images,
                               workers=workers, progress=progress, subinstruction_rule=subinstruction_rule)
                   for source in parsed]
    else:
        indexes = [stored.index for stored in _stored_sources(
            parsed, cache_dir, history=history, image_root=image_root, check_images=check_images, workers=workers,
            progress=progress, subinstruction_rule=subinstruction_rule, processes=processes, on_stored=None)]
    index = combine(parsed, indexes)
    _check_strict(index, describe(parsed), strict)
    return index


def store_sources_index(
    sources: Sequence[str | Path | DataSource] | str | Path,
    cache_dir: Path | str,
    *,
    history: int = DEFAULT_HISTORY,
    image_root: Path | str | None = None,
    strict: bool = False,
    check_images: bool = True,
    workers: int | None = None,
    progress: bool = False,
    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
    processes: int = 1,
    on_stored: Callable[[StoredIndex], None] | None = None,
    prefill_min_files: int = PREFILL_MIN_FILES,
    recorded_names: Sequence[str] = (),
) -> StoredSources:
    """:func:`build_sources_index` kept in the store ``cache_dir`` as one combined entry, and where.

    How a job of many processes shares a large index: one process calls this, the others (and it)
    read the result with :meth:`StoredSources.load`, lazily, each making only the rows it uses.
    While the sources are unchanged nothing is combined and no row is made (the entry is reused).
    ``prefill_min_files``: new or changed images from which the ``processes`` check them.
    ``recorded_names``: as for :func:`build_sources_index`.
    """
    parsed = _parsed_sources(sources, image_root, recorded_names)
    parts = _stored_sources(parsed, cache_dir, history=history, image_root=image_root, check_images=check_images,
                            workers=workers, progress=progress, subinstruction_rule=subinstruction_rule,
                            processes=processes, on_stored=on_stored, lazy=True, prefill_min_files=prefill_min_files)
    stored = IndexStore(cache_dir).combined(parsed, parts)
    if strict:
        _check_strict(stored.load(), describe(parsed), strict)
    return stored


def _parsed_sources(sources: Sequence[str | Path | DataSource] | str | Path,
                    image_root: Path | str | None, recorded_names: Sequence[str] = ()) -> tuple[DataSource, ...]:
    parsed = named_after_image_root(parse_sources([sources] if isinstance(sources, (str, Path)) else sources),
                                    image_root)
    parsed = adopt_names(parsed, tuple(recorded_names))
    if image_root is not None and len(parsed) > 1:
        raise DatasetError(f"an image root applies to one annotation source, not to the {len(parsed)} sources "
                           f"{describe(parsed)}")
    return parsed


def _stored_sources(parsed: Sequence[DataSource], cache_dir: Path | str, *, history: int,
                    image_root: Path | str | None, check_images: bool, workers: int | None, progress: bool,
                    subinstruction_rule: str, processes: int, on_stored: Callable[[StoredIndex], None] | None,
                    lazy: bool = False, prefill_min_files: int = PREFILL_MIN_FILES) -> list[StoredIndex]:
    """Each source's index through the store in ``cache_dir`` (``lazy``: a reused one is read lazily)."""
    parts = []
    for source in parsed:
        builder = _builder(source.path, history, image_root, check_images, workers, progress, subinstruction_rule)
        stored = IndexStore(cache_dir, prefill_min_files).get(builder, processes=processes, lazy=lazy)
        if on_stored is not None:
            on_stored(stored)
        parts.append(stored)
    return parts
