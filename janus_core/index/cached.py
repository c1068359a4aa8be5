"""A stored dataset index, reused while the dataset's files are unchanged.

``IndexStore(directory).get(builder)`` returns the index ``builder`` would build:

1. it takes the cheap fingerprint of the sources (:mod:`janus_core.index.fingerprint`: path,
   size and ``mtime_ns`` of every file, one ``stat`` each) and, when the stored entry for this
   dataset and these settings has the same fingerprint, materialises the stored columns
   (:mod:`janus_core.index.columns`) without opening a source file;
2. otherwise it rebuilds, reusing the image checks (size, content hash) of every image whose size
   and mtime are those of the stored entry, so only new or changed images are read and hashed;
   the images to read are checked by ``processes`` worker processes, then the builder assembles
   the index (texts are always re-read: they are small);
3. and stores the result atomically (a half-written entry is never read: ``meta.json`` is
   written last, into a temporary folder that is then renamed into place).

Entries are keyed by the dataset's resolved path and the settings that shape an index (format,
image root, history, subinstruction rule, image-check mode) plus the model's schema; a folder
holds one entry per key. A store that cannot be written (read-only cache) still serves the index,
built without saving it. A precompute keeps its store in the cache (``CacheLayout.index_store``);
bare datasets (``janus-cache index`` / ``plan``) use :func:`user_index_dir`.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import os
import pickle
import shutil
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from janus_core.index.annotations import AnnotationBuilder
from janus_core.index.columns import (
    FORMAT_VERSION,
    ColumnWriter,
    decode_column,
    distinct_text_column,
    encode_column,
    read_columns,
    read_meta,
    schema_tag,
    write_columns,
)
from janus_core.index.episode_folders import EpisodeFolderBuilder
from janus_core.index.files import FRAME_NAME, Builder, ImageInfo, Problem, inspect_image
from janus_core.index.fingerprint import SourceFiles, annotation_entry, scan_episode_folders, scan_files
from janus_core.index.identity import IDENTITY_RULE, EpisodeIdentity, StreamedIdentities, episode_identities
from janus_core.index.lazy import read_lazy
from janus_core.index.model import DatasetIndex
from janus_core.index.sources import DataSource, combine, combined_rows
from janus_core.plural import plural
from janus_core.system.files import atomic_directory
from janus_core.system.processes import start_worker

INDEX_CACHE_ENV = "JANUS_INDEX_CACHE"
"""Environment variable naming the store of bare datasets' indexes (see :func:`user_index_dir`)."""

SOURCES_FILE = "sources.npz"
RACY_NS = 2_000_000_000
"""A file modified this close to (or after) the scan may change again within its timestamp's
granularity (coarse kernel clocks, network filesystems) without a new size or mtime: it is stored
as unknown, so the next run rebuilds and reads it again (as git treats racily clean files)."""
PREFILL_CHUNK = 256
"""Images per task of the worker processes that check new or changed images."""
PREFILL_MIN_FILES = 2048
"""Fewer images to check than this are checked in the builder's threads (starting processes costs ~1 s)."""


def user_index_dir() -> Path:
    """Where indexes of bare datasets are kept: ``$JANUS_INDEX_CACHE``, else
    ``$XDG_CACHE_HOME/janus/index``, else ``~/.cache/janus/index``."""
    if os.environ.get(INDEX_CACHE_ENV):
        return Path(os.environ[INDEX_CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "janus" / "index"


@dataclass(frozen=True)
class IndexParams:
    """Everything besides the source files that decides an index."""

    source: Path
    source_format: str
    image_root: Path | None
    history: int
    subinstruction_rule: str
    check_images: bool

    @classmethod
    def of(cls, builder: Builder) -> "IndexParams":
        common = (builder.history, builder.subinstruction_rule, builder.check_images)
        if isinstance(builder, EpisodeFolderBuilder):
            return cls(builder.root, "episodes", None, *common)
        if isinstance(builder, AnnotationBuilder):
            return cls(builder.file, "annotations", builder.image_root, *common)
        raise TypeError(f"no stored index for a {type(builder).__name__}")

    @property
    def base(self) -> Path:
        """The folder the index's relative paths start from."""
        return self.image_root if self.image_root is not None else self.source

    def describe(self) -> dict[str, Any]:
        return {
            "source": str(self.source.resolve()),
            "format": self.source_format,
            "image_root": str(self.image_root.resolve()) if self.image_root is not None else None,
            "history": self.history,
            "subinstruction_rule": self.subinstruction_rule,
            "check_images": self.check_images,
            "schema": schema_tag(),
            "version": FORMAT_VERSION,
        }

    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:20]


@dataclass
class StoredIndex:
    """An index from a store, and how it was obtained."""

    index: DatasetIndex
    entry: Path
    """The store entry (folder) holding it."""
    fingerprint: str
    """Digest of the sources' paths, sizes and mtimes it was built from."""
    reused: bool
    """True when the stored columns were read (no source file opened)."""
    saved: bool
    """True when the entry now holds this index (false: the store could not be written)."""
    files: int
    """Source files in the fingerprint."""
    checked: int = 0
    """Images read and checked (hashed) by this call; 0 when reused."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Time per part: fingerprint, load or check + build, save."""

    def describe(self) -> str:
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        how = "reused the stored index" if self.reused else f"indexed, {plural(self.checked, 'image')} read and hashed"
        how += "" if self.saved else f", not stored ({self.entry.parent} is not writable)"
        return f"index of {self.index.source}: {how} ({self.files} source files; {parts})"


def load_stored(entry: Path, fingerprint: str, source: Path | str, image_root: Path | str | None = None,
                lazy: bool = False) -> DatasetIndex:
    """The index stored in ``entry`` by :meth:`IndexStore.get`, which must still have ``fingerprint``
    (how the other processes of a job read what one of them built, instead of receiving a pickle).
    ``lazy``: frames and samples made when asked for (:mod:`janus_core.index.lazy`), for a
    process that reads only its own shards' rows."""
    meta = read_meta(entry)
    if meta is None or meta.get("fingerprint") != fingerprint:
        raise ValueError(f"{entry}: the stored index changed or is incomplete; build the index again")
    source = Path(source)
    base = Path(image_root) if image_root is not None else source.parent if meta["format"] == "annotations" \
        else source
    return read_lazy(entry, meta, source, base) if lazy else read_columns(entry, meta, source, base)


COMBINED_PREFIX = "sources-"
"""Name prefix of the store entries holding the combined index of several sources (one per list of sources)."""
IDENTITIES_FILE = "identities.json"
"""The episodes' identities (``janus_core.index.identity``) in a combined entry: what a precompute
compares with its cache, stored so that a resume does not read every row to compute them."""
COMBINED_BASE = Path("/")
"""What a combined entry's paths are stored relative to: its sources have bases of their own."""


@dataclass(frozen=True)
class StoredSources:
    """Where the combined index of a list of sources is stored (:meth:`IndexStore.combined`): the
    handle a job passes to its processes, each of which reads the columns it needs lazily."""

    entry: Path
    fingerprint: str
    """Digest of the sources' names and their own entries' fingerprints."""
    source: str
    """The index's ``source`` (the sources as a user writes them)."""
    reused: bool
    """True when the stored combined index was current (nothing combined or written)."""

    def load(self) -> DatasetIndex:
        """The combined index, read lazily (raises ValueError when the entry changed since)."""
        meta = read_meta(self.entry)
        if meta is None or meta.get("fingerprint") != self.fingerprint:
            raise ValueError(f"{self.entry}: the stored index changed or is incomplete; build the index again")
        identities = tuple(EpisodeIdentity.from_dict(item, str(self.entry / IDENTITIES_FILE))
                           for item in json.loads((self.entry / IDENTITIES_FILE).read_text()))
        return read_lazy(self.entry, meta, Path(self.source), COMBINED_BASE, identities)


def _inspect_chunk(args: tuple[list[str], bool]) -> list[ImageInfo | Problem]:
    paths, full = args
    return [inspect_image(Path(p), full) for p in paths]


class IndexStore:
    """A folder of stored indexes, one entry per dataset and settings (see the module docstring)."""

    def __init__(self, directory: Path | str, prefill_min_files: int = PREFILL_MIN_FILES) -> None:
        self.directory = Path(directory)
        self.prefill_min_files = prefill_min_files

    def entry(self, params: IndexParams) -> Path:
        return self.directory / params.key()

    def get(self, builder: Builder, processes: int = 1, lazy: bool = False) -> StoredIndex:
        """The index of ``builder``'s dataset: the stored one when the sources are unchanged, else
        built (new or changed images checked in ``processes`` worker processes) and stored.
        ``lazy``: a stored index is read lazily (:mod:`janus_core.index.lazy`), not materialised."""
        params = IndexParams.of(builder)
        entry = self.entry(params)
        meta = read_meta(entry)
        seconds: dict[str, float] = {}
        scanned_at = time.time_ns()
        start = time.perf_counter()
        sources = self._fingerprint(builder, params, entry if meta is not None else None)
        fingerprint = sources.digest() if sources is not None else ""
        seconds["fingerprint"] = time.perf_counter() - start
        if meta is not None and sources is not None and meta.get("fingerprint") == fingerprint:
            start = time.perf_counter()
            try:
                index = (read_lazy if lazy else read_columns)(entry, meta, params.source, params.base)
            except (OSError, ValueError, KeyError, EOFError, TypeError, pickle.UnpicklingError) as err:
                # a damaged entry is rebuilt below
                print(f"warning: stored index {entry} is unreadable ({err}); rebuilding it", file=sys.stderr)
            else:
                seconds["load"] = time.perf_counter() - start
                return StoredIndex(index, entry, fingerprint, True, True, len(sources), 0, seconds)

        start = time.perf_counter()
        builder.known = self._known_images(entry, meta, params)
        checked = self._prefill(builder, params.base, sources, processes)
        if isinstance(builder, EpisodeFolderBuilder) and sources is not None:
            sources = sources.without_racy(scanned_at - RACY_NS)
            fingerprint, n_files = sources.digest(), len(sources)
            handed: list[SourceFiles] = [sources]
            del sources  # written first, then let go: 1.26M paths are ~200 MB while the rows are built
            built = self._build_in_chunks(builder, entry, params, handed, fingerprint, lazy)
            if built is not None:
                seconds["build"] = time.perf_counter() - start
                return StoredIndex(built, entry, fingerprint, False, True, n_files,
                                   checked + len(builder.inspected), seconds)
            builder.entries.clear()  # the store cannot be written: built in memory below, not kept
            sources = self._fingerprint(builder, params, None)
        index = builder.build()
        checked += len(builder.inspected)
        seconds["build"] = time.perf_counter() - start
        if isinstance(builder, AnnotationBuilder):  # its images are known only now
            sources = scan_files(params.base, builder.referenced, builder.threads, [annotation_entry(params.source)])
        assert sources is not None
        sources = sources.without_racy(scanned_at - RACY_NS)
        fingerprint = sources.digest()
        start = time.perf_counter()
        saved = self._save(index, entry, params, sources, fingerprint)
        seconds["save"] = time.perf_counter() - start
        return StoredIndex(index, entry, fingerprint, False, saved, len(sources), checked, seconds)

    # ------------------------------------------------------------------------- fingerprint

    def _fingerprint(self, builder: Builder, params: IndexParams, entry: Path | None) -> SourceFiles | None:
        """The sources' fingerprint; for an annotation file, of the images the stored entry names
        (None when there is no entry: its images are known only after the build)."""
        if params.source_format == "episodes":
            return scan_episode_folders(params.source, builder.threads)
        if entry is None:
            return None
        try:
            with np.load(entry / SOURCES_FILE, allow_pickle=False) as stored:
                relpaths = decode_column("text", {k: stored[k] for k in ("codes", "utf8", "offsets")}, params.base)
        except (OSError, ValueError, KeyError):
            return None
        annotation = annotation_entry(params.source)
        return scan_files(params.base, [r for r in relpaths if r != annotation[0]], builder.threads, [annotation])

    # ---------------------------------------------------------------------------- reuse

    def _known_images(self, entry: Path, meta: dict[str, Any] | None, params: IndexParams
                      ) -> dict[str, tuple[int, int, ImageInfo | Problem]]:
        """Image checks of the stored entry, by path, with the size and mtime they were made at."""
        if meta is None or meta.get("schema") != schema_tag():
            return {}
        try:
            with np.load(entry / SOURCES_FILE, allow_pickle=False) as stored:
                arrays = {k: stored[k] for k in stored.files}
            relpaths = decode_column("text", {k: arrays[k] for k in ("codes", "utf8", "offsets")}, params.base)
            stats = dict(zip(relpaths, zip(arrays["sizes"].tolist(), arrays["mtimes"].tolist(), strict=True),
                             strict=True))
            kinds = meta["kinds"]["frames"]

            def column(name: str) -> list[Any]:
                parts = {}
                for fname in os.listdir(entry):
                    if fname.startswith(f"frames.{name}.") and fname.endswith(".npy"):
                        parts[fname.split(".")[2]] = np.load(entry / fname, allow_pickle=False)
                return decode_column(kinds[name], parts, params.base)

            rows = zip(column("relpath"), column("width"), column("height"), column("nbytes"), column("sha256"),
                       strict=True)
        except (OSError, ValueError, KeyError):
            return {}
        known: dict[str, tuple[int, int, ImageInfo | Problem]] = {}
        for relpath, width, height, nbytes, sha in rows:
            stat = stats.get(relpath)
            if stat is not None and stat[0] == nbytes:
                known[str(params.base / relpath)] = (stat[0], stat[1], ImageInfo(width, height, nbytes, sha))
        return known

    def _prefill(self, builder: Builder, base: Path, sources: SourceFiles | None, processes: int) -> int:
        """Check the new or changed frame images of an episode-folder dataset in worker processes
        (the builder then finds them known); the number of images checked."""
        if sources is None or processes <= 1 or not isinstance(builder, EpisodeFolderBuilder):
            return 0
        # Files to check as positions in ``sources`` (a tuple of path and stats per file is ~200 B at 612k files).
        prefix = str(base / "x")[:-1]  # str(base / rel) is prefix + rel, for base "." too
        todo: list[int] = []
        for i, (rel, size, mtime) in enumerate(zip(sources.relpaths, sources.sizes.tolist(), sources.mtimes.tolist(),
                                                   strict=True)):
            if size >= 0 and FRAME_NAME.match(rel.rpartition("/")[2]):
                hit = builder.known.get(prefix + rel)
                if hit is None or hit[:2] != (size, mtime):
                    todo.append(i)
        if len(todo) < self.prefill_min_files:
            return 0
        chunks = [todo[i:i + PREFILL_CHUNK] for i in range(0, len(todo), PREFILL_CHUNK)]
        bar = tqdm(total=len(todo), desc="indexing", unit=" images", disable=not builder.progress,
                   mininterval=0.5 if sys.stderr.isatty() else 30.0, file=sys.stderr)
        with bar, ProcessPoolExecutor(
                max_workers=processes, mp_context=get_context("spawn"), initializer=start_worker,
                initargs=(os.getpid(),)) as pool:
            jobs = (([prefix + sources.relpaths[i] for i in chunk], builder.check_images) for chunk in chunks)
            for chunk, results in zip(chunks, pool.map(_inspect_chunk, jobs), strict=True):
                for i, info in zip(chunk, results, strict=True):
                    builder.known[prefix + sources.relpaths[i]] = (int(sources.sizes[i]), int(sources.mtimes[i]), info)
                bar.update(len(chunk))
        return len(todo)

    # ------------------------------------------------------------------------- combined

    def combined(self, sources: Sequence[DataSource], parts: list[StoredIndex]) -> StoredSources:
        """The combined index of ``sources`` stored as ``parts`` (in order): reused while every
        part's fingerprint is the one it was combined from, else the parts' indexes combined
        (:func:`~janus_core.index.sources.combine`, written a chunk of rows at a time) are stored,
        replacing the combined index of any other list of sources (a store serves one job's
        sources). Raises OSError when it cannot be written."""
        names = [(s.name, s.named) for s in sources]
        described = [[name, named, part.entry.name, part.fingerprint] for (name, named), part in
                     zip(names, parts, strict=True)]
        key = hashlib.sha256(json.dumps([[n, d] for n, d, _, _ in described] + [
            [p.entry.name for p in parts], schema_tag(), FORMAT_VERSION, IDENTITY_RULE]).encode()).hexdigest()[:20]
        fingerprint = hashlib.sha256(json.dumps(described).encode()).hexdigest()
        entry = self.directory / f"{COMBINED_PREFIX}{key}"
        meta = read_meta(entry)
        if meta is not None and meta.get("fingerprint") == fingerprint:
            return StoredSources(entry, fingerprint, meta["source"], True)
        indexes = [part.index for part in parts]
        index = combine(sources, indexes, rows=False)  # episodes and report; the rows go a chunk at a time
        with atomic_directory(entry) as tmp:
            writer = ColumnWriter(tmp, COMBINED_BASE)
            # The identities as the rows pass (reading the written rows again maps all of them into memory).
            streamed = StreamedIdentities(index.episodes) if StreamedIdentities.applies(index.episodes) else None
            for table, rows in combined_rows(sources, indexes):
                writer.add(table, rows)
                if streamed is not None:
                    streamed.add(table, rows)
            writer.finish(index, {"fingerprint": fingerprint, "source": str(index.source), "schema": schema_tag(),
                                  "version": FORMAT_VERSION})
            del writer
            if streamed is not None:
                identities = [identity.to_dict() for identity in streamed.identities()]
            else:
                written = read_meta(tmp)
                assert written is not None
                identities = [identity.to_dict() for identity in
                              episode_identities(read_lazy(tmp, written, index.source, COMBINED_BASE))]
            (tmp / IDENTITIES_FILE).write_text(json.dumps(identities, ensure_ascii=False))
        for other in self.directory.glob(f"{COMBINED_PREFIX}*"):  # another list of sources (before an append)
            if other != entry:
                shutil.rmtree(other, ignore_errors=True)
        return StoredSources(entry, fingerprint, str(index.source), False)

    # ----------------------------------------------------------------------------- save

    def _build_in_chunks(self, builder: EpisodeFolderBuilder, entry: Path, params: IndexParams,
                         handed: list[SourceFiles], fingerprint: str, lazy: bool) -> DatasetIndex | None:
        """Build the index a chunk of episodes at a time straight into the store entry (its rows
        are never all in memory: a 612k-sample index took gigabytes as row objects), then read it
        back (lazily with ``lazy``); None when the store cannot be written. ``handed``: the
        sources' fingerprint, written first and dropped (the caller keeps no reference)."""
        sources = handed.pop()
        try:
            with atomic_directory(entry) as tmp:
                np.savez(tmp / SOURCES_FILE, sizes=sources.sizes, mtimes=sources.mtimes,
                         **distinct_text_column(sources.relpaths))  # sorted, distinct paths
                del sources
                writer = ColumnWriter(tmp, params.base)
                episodes = []
                for chunk_episodes, frames, samples in builder.build_chunks():
                    episodes += chunk_episodes
                    writer.add("frames", frames)
                    writer.add("samples", samples)
                writer.finish(builder.index_of(tuple(episodes)), {**params.describe(), "fingerprint": fingerprint})
        except OSError:  # e.g. a read-only cache
            return None
        del writer, episodes
        builder.known = {}  # the image checks are in the entry now
        _return_freed_memory()
        meta = read_meta(entry)
        assert meta is not None
        return (read_lazy if lazy else read_columns)(entry, meta, params.source, params.base)

    def _save(self, index: DatasetIndex, entry: Path, params: IndexParams, sources: SourceFiles,
              fingerprint: str) -> bool:
        try:
            with atomic_directory(entry) as tmp:
                _kind, arrays = encode_column(list(sources.relpaths), params.base)
                np.savez(tmp / SOURCES_FILE, sizes=sources.sizes, mtimes=sources.mtimes, **arrays)
                write_columns(index, tmp, params.base, {**params.describe(), "fingerprint": fingerprint})
            return True
        except OSError:  # e.g. a read-only cache: the index is served, only not kept
            return False


def _return_freed_memory() -> None:
    """Hand the heap freed by a build back to the system (glibc keeps it otherwise, and the
    combining that follows would start from the build's peak)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
