"""The precompute job: the cache's contract for building one resolution of a cache.

A :class:`PrecomputeJob` is plain single-process code with five steps, run in this order:

1. ``prepare()`` (one process, before any shard): refuse a directory that is not a cache and a
   cache made with other keyed settings, measure the plan, refuse when the disk is too small,
   delete what a killed run left half-written, write the frames table, create the frames
   array and write the manifest (no shard table yet) and the per-episode identities;
2. ``frame_shard(i)`` for every frame shard (any process, each shard written by exactly one);
   with ``cache.vit_features``, then ``vit_shard(i)`` for every frame shard (the frozen ViT's
   output of the shard's stored frames, ``vit/<resolution>``);
3. ``prepare_features()`` (one process, after every frame shard): the samples table (samples
   whose window frames all decoded) and the feature storage;
4. ``feature_shards(shards)`` for every sample shard (any process, each shard by exactly one);
5. ``finish()`` (one process, after every shard): the final manifest with its shard table and
   ``report.json``.

Which process runs which shard, barriers and progress displays belong to the caller
(``pipelines/precompute_run.py``). The units of work themselves are in :mod:`janus_cache.work_units`.

**Appending.** A cache whose dataset identity differs from the index's is *appended to* when the
index only adds episodes after the cache's ones (``janus_core.index.changes``): the tables are
rewritten with the new rows after the old ones, the arrays grow, and only the new rows' shards are
written; full shards of the old rows stay byte for byte as they are, and a partially filled last
shard is rewritten whole (recomputed from its sources, as a build from scratch computes it). The
result equals a cache built from scratch on the whole dataset. A changed or removed episode, or
new episodes that would land before old ones, is refused in one line naming it and its file.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from janus_cache.keys import frame_shape, stored_frame_shape, wanted_manifest, window_variant
from janus_cache.plan import Plan, make_plan
from janus_cache.store import (
    CacheWriter,
    DatasetIdentity,
    Manifest,
    ManifestError,
    StoreError,
    open_writer,
    read_manifest,
    write_manifest,
)
from janus_cache.store.checksums import changed_metadata, recorded_manifest_keyed
from janus_cache.store.commit import hashed, read_record, verify_shard
from janus_cache.store.layout import (
    EPISODES_NAME,
    INDEX_STORE_DIR,
    MANIFEST_NAME,
    REPORT_NAME,
    ZARR_ROOT_NAME,
    CacheLayout,
    frames_array,
    is_table_array,
    vit_array,
)
from janus_cache.store.manifest import (
    SchemaVersionError,
    ShardEntry,
    check_compatible,
    keyed_digest,
    merge_manifests,
    read_episodes,
    write_episodes,
)
from janus_cache.work_units import (
    check_windows,
    frame_table,
    read_frame_failures,
    sample_table,
    usable_samples,
    vggt_frame_source,
    window_matrix,
    write_feature_shards,
    write_frame_shard,
    write_vit_shard,
)
from janus_core.bases import BASES, DEFAULT_BASE, QwenBase
from janus_core.index import (
    CachedRows,
    DatasetIndex,
    EpisodeIdentity,
    append_order_problem,
    dataset_changes,
    episode_identities,
    prefixes_keys,
)
from janus_core.plural import plural
from janus_core.profile import CacheSettings
from janus_core.qwen_vit import ViTEncoder
from janus_core.resolution import Resolution
from janus_core.system.disk_space import DISK_FULL_ERRNOS, bytes_under, disk_full_problem, free_space_problem
from janus_core.system.files import atomic_write_bytes, remove_partials
from janus_core.system.lock import LOCK_NAME
from janus_core.vggt.encoder import WindowEncoder


class PrecomputeError(RuntimeError):
    """A refusal or failure with a one-line reason for the user."""


F = TypeVar("F", bound=Callable[..., Any])


def check_free_space(directory: Path, needed_bytes: float, force: bool) -> str | None:
    """Refuse (:class:`PrecomputeError`) when the filesystem of ``directory`` has less free space
    than ``needed_bytes``. With ``force`` the run may start anyway (the plan is an estimate): the
    warning to show is returned instead."""
    problem = free_space_problem(directory, shutil.disk_usage(directory).free, needed_bytes)
    if problem is None:
        return None
    if not force:
        raise PrecomputeError(f"{problem}; free space or pass --force")
    return f"{problem}; starting anyway (--force)"


def _disk_full_is_one_line(doing: str) -> Callable[[F], F]:
    """A job step whose write runs out of room raises :class:`PrecomputeError` with
    :func:`disk_full_problem` instead of the bare OSError (every step commits whole shards only,
    so the cache is resumable as it is). ``doing`` names the step; ``{0}`` is its first argument."""

    def decorate(step: F) -> F:
        @functools.wraps(step)
        def wrapped(self: PrecomputeJob, *args: Any, **kwargs: Any) -> Any:
            try:
                return step(self, *args, **kwargs)
            except OSError as err:
                if err.errno not in DISK_FULL_ERRNOS:
                    raise
                raise PrecomputeError(disk_full_problem(self.out, err, doing.format(*args), self.planned_bytes)) \
                    from err

        return wrapped  # type: ignore[return-value]

    return decorate


def cache_contents(out: Path) -> list[Path]:
    """The entries of the cache directory ``out``, less the lock file of the run writing it (which
    ``--overwrite`` must not delete: the run holds it) and the stored dataset index (a memo of the
    dataset, valid whatever the cache holds, written before the cache is prepared)."""
    return [entry for entry in out.iterdir() if entry.name not in (LOCK_NAME, INDEX_STORE_DIR)]


def is_foreign_directory(out: Path) -> bool:
    """True when ``out`` exists, holds something and is not a janus cache: precompute refuses it
    and writes nothing there (not even the dataset index)."""
    looks_like_cache = (out / ZARR_ROOT_NAME).exists() or (out / MANIFEST_NAME).exists()
    return out.is_dir() and any(cache_contents(out)) and not looks_like_cache


def refuse_foreign_directory(out: Path) -> None:
    """Raise :class:`PrecomputeError` when ``out`` holds something that is not a janus cache."""
    if is_foreign_directory(out):
        raise PrecomputeError(f"{out} exists, is not empty and is not a janus cache; choose another --out")


@dataclass(frozen=True)
class Prepared:
    """What ``prepare()`` decided: the manifest written, the measured plan, warnings to show."""

    manifest: Manifest
    plan: Plan | None
    """None when the cache was found complete (nothing measured)."""
    warnings: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    """Metadata files and tables rewritten because they were damaged or edited (also in ``warnings``)."""
    notes: tuple[str, ...] = ()
    """What the run does beyond a plain build or resume (e.g. the episodes it appends)."""
    complete: bool = False
    """The cache already holds everything this job would write: nothing was prepared, nothing is to do."""


@dataclass(frozen=True)
class Outcome:
    """What a finished precompute wrote: sample counts, failures and the cache's size."""

    out: Path
    samples: int
    frames: int
    dropped: dict[str, str]
    skipped_while_indexing: dict[str, int]
    bytes_on_disk: int
    rewritten_shards: tuple[str, ...] = ()
    """Shard files that were committed before this run and rewritten by it (damaged, or their
    commit record was)."""
    extended_shards: tuple[str, ...] = ()
    """Partly filled shard files an append rewrote whole with the new rows after the old ones:
    the normal growth of a cache, not damage."""
    extended_tables: tuple[str, ...] = ()
    """Table files an append rewrote with the new rows after the old ones (growth, as above)."""
    repaired: tuple[str, ...] = ()
    """Metadata files and tables rewritten after ``prepare()`` (its own repairs were shown then)."""

    @property
    def written(self) -> int:
        return self.samples - len(self.dropped)

    def format(self, seconds: float, computed: int | None = None) -> str:
        """The summary printed at the end of a run (failed samples in dataset order, at most 5).
        ``computed``: the samples this run encoded (a resume, an append or a repair computes fewer
        than the cache holds); the rate counts only those."""
        computed = self.written if computed is None else computed
        rate = f"{computed / max(seconds, 1e-9):.2f}/s"
        done = (f"{plural(self.written, 'sample')} ({rate})" if computed == self.written else
                f"{plural(self.written, 'sample')}, {computed} computed by this run ({rate})")
        lines = [f"precompute done in {seconds:.1f} s: {done}, {plural(self.frames, 'frame')}, "
                 f"{self.bytes_on_disk / 1e6:.1f} MB in {self.out}"]
        if self.skipped_while_indexing:
            lines.append("  skipped while indexing: " + ", ".join(
                f"{n} {reason}" for reason, n in sorted(self.skipped_while_indexing.items())))
        if self.repaired:
            lines.append(f"  repaired: rewrote {', '.join(self.repaired)}")
        if self.extended_shards or self.extended_tables:
            lines.append(f"  extended {plural(len(self.extended_shards), 'partly filled shard')} and "
                         f"{plural(len(self.extended_tables), 'table file')} with the new rows"
                         + (": " + _first_ten(self.extended_shards) if self.extended_shards else ""))
        if self.rewritten_shards:
            lines.append(f"  repaired: rewrote {plural(len(self.rewritten_shards), 'shard')} that failed their commit "
                         f"records: " + _first_ten(self.rewritten_shards))
        if self.dropped:
            lines.append(f"  {plural(len(self.dropped), 'sample')} failed (their frames could not be decoded); "
                         f"see {self.out / REPORT_NAME}")
            lines.extend(f"    {key}: {reason}" for key, reason in list(self.dropped.items())[:5])
        return "\n".join(lines)


def _first_ten(files: Sequence[str]) -> str:
    return ", ".join(files[:10]) + (f" and {len(files) - 10} more" if len(files) > 10 else "")


class PrecomputeJob:
    """Build resolution ``resolution`` of the ``cache_format`` cache at ``out`` from ``index``.

    Every step is a pure function of the index, the settings and the shard number, so any split
    of the shards over processes gives the same cache, byte for byte.
    """

    def __init__(self, index: DatasetIndex, out: Path, cache_format: str, settings: CacheSettings,
                 resolution: Resolution, encoder: WindowEncoder, vit: ViTEncoder | None = None,
                 base: QwenBase = DEFAULT_BASE) -> None:
        if settings.vit_features and vit is None:
            raise ValueError("cache.vit_features is set: the job needs the frozen ViT (vit=ViTEncoder...)")
        self.base = base
        """The base model whose frames the cache stores (``qwen.path``'s, :func:`janus_core.bases.cache_base`)."""
        self.index = index
        self.vit = vit if settings.vit_features else None
        self.out = Path(out)
        self.cache_format = cache_format
        self.settings = settings
        self.resolution = resolution
        self.encoder = encoder
        self.planned_bytes: float | None = None
        """The plan's size of the whole cache, for messages (set by ``prepare()``, or by the caller
        on processes that did not prepare)."""
        self._before: Manifest | None = None  # the manifest before this run (set by prepare)
        self._wanted: Manifest | None = None  # this run's settings as a manifest (set by prepare)
        self._repairs_shown = 0  # the writer's repairs that prepare() returned
        self._started = time.time()
        self._episodes: tuple[EpisodeIdentity, ...] | None = None  # this run's episode identities (set by prepare)

    # ------------------------------------------------------------------------------ queries

    @cached_property
    def writer(self) -> CacheWriter:
        return open_writer(self.cache_format, self.out, window_variant(self.settings).name)

    @property
    def frames_array(self) -> str:
        return frames_array(self.resolution.name)

    @property
    def vit_array(self) -> str:
        return vit_array(self.resolution.name)

    @property
    def n_vit_shards(self) -> int:
        """ViT-features shards of the cache (after ``prepare()``; 0 without ``cache.vit_features``)."""
        return len(self.writer.vit_shard_plan(self.resolution.name)) if self.vit is not None else 0

    @property
    def samples_array(self) -> str:
        return self.writer.samples_array_path(self.resolution.name)

    @property
    def n_frames(self) -> int:
        return len(self.index.frames)

    @property
    def n_frame_shards(self) -> int:
        """Frame shards of the cache (after ``prepare()``)."""
        return len(self.writer.frame_shard_plan(self.resolution.name))

    @property
    def n_feature_shards(self) -> int:
        """Sample shards of the cache (after ``prepare_features()``)."""
        return len(self.writer.sample_shard_plan(self.resolution.name))

    @property
    def frame_shard_rows(self) -> list[int]:
        """Frames in each frame shard (after ``prepare()``)."""
        return [len(rows) for rows in self.writer.frame_shard_plan(self.resolution.name)]

    @property
    def feature_shard_rows(self) -> list[int]:
        """Samples in each sample shard (after ``prepare_features()``)."""
        return [len(rows) for rows in self.writer.sample_shard_plan(self.resolution.name)]

    def pending_frame_shards(self, shards: Iterable[int], checksums: str = "none") -> list[int]:
        """Those of ``shards`` that are not committed, see :meth:`_pending`."""
        return self._pending(self.frames_array, shards, self.n_frame_shards, checksums)

    def pending_vit_shards(self, shards: Iterable[int], checksums: str = "none") -> list[int]:
        """Those of ``shards`` that are not committed, see :meth:`_pending`."""
        return self._pending(self.vit_array, shards, self.n_vit_shards, checksums)

    def pending_feature_shards(self, shards: Iterable[int], checksums: str = "none") -> list[int]:
        """Those of ``shards`` that are not committed, see :meth:`_pending`."""
        return self._pending(self.samples_array, shards, self.n_feature_shards, checksums)

    def _pending(self, array: str, shards: Iterable[int], n_shards: int, checksums: str) -> list[int]:
        """Shards without a commit record, or whose file differs from it: in size always, in sha256
        when ``checksums`` hashes the shard (:func:`~janus_cache.store.commit.hashed`). With
        ``none`` a resume with nothing to do reads no shard's bytes, only records and sizes."""
        pending = []
        for shard in shards:
            try:
                record = read_record(self.out, array, shard)
            except StoreError:  # a damaged commit record proves nothing: the shard is rewritten
                record = None
            checksum = hashed(checksums, array, shard, n_shards)
            if record is None or verify_shard(self.out, record, checksum).problem is not None:
                pending.append(shard)
        return pending

    @cached_property
    def _usable(self) -> tuple[np.ndarray, dict[str, str]]:
        # Read from the failure records on disk, so every process gets the same answer once every
        # frame shard is committed, whichever process decoded it.
        return usable_samples(self.index, read_frame_failures(self.out, self.resolution.name))

    @property
    def usable_rows(self) -> np.ndarray:
        """Index rows of the samples whose window frames all decoded (after every frame shard): the
        rows of the samples table, in order."""
        return self._usable[0]

    @property
    def dropped(self) -> dict[str, str]:
        """Sample key -> why it is left out (after every frame shard)."""
        return self._usable[1]

    # -------------------------------------------------------------------------------- steps

    @_disk_full_is_one_line("preparing the cache")
    def prepare(self, overwrite: bool = False, force: bool = False,
                on_plan: Callable[[Plan], None] = lambda plan: None, done_check: str | None = None) -> Prepared:
        """Step 1 (one process): refusals, plan, free space, cleanup, frames table, manifest.

        ``overwrite`` deletes an earlier cache at ``out`` first; ``force`` starts although the
        plan needs more space than is free. ``on_plan`` sees the plan before the free-space check.
        ``done_check`` (a ``checksums`` mode): a cache that already holds everything this job
        would write (:meth:`_complete`) is left as it is, before the plan measures anything, and
        the result says ``complete``.
        """
        check_windows(self.index)
        episodes = episode_identities(self.index)
        wanted = wanted_manifest(self.index, self.settings, self.resolution, self.cache_format, self.encoder,
                                 episodes, self.vit, self.base)
        self._started, self._wanted, self._episodes = time.time(), wanted, episodes
        out = self.out
        # Checked before --overwrite: it deletes the directory, which must be an earlier cache.
        refuse_foreign_directory(out)
        if overwrite and out.exists():
            # Before reading anything of the old cache: --overwrite must also work when it is damaged.
            for entry in cache_contents(out):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        existing, repairs = self._existing_manifest(wanted) if out.exists() else (None, [])
        if existing is not None:
            self._check_base(existing)
        notes: tuple[str, ...] = ()
        if existing is not None and existing.dataset != wanted.dataset:
            # Every other keyed field must be equal; the dataset may only have grown.
            same_rule = replace(existing.dataset, subinstruction_rule=wanted.dataset.subinstruction_rule)
            check_compatible(existing, replace(wanted, dataset=same_rule), source=str(out))
            notes = (self._check_append(existing),)
            # The manifest on disk keeps the old identity until finish() writes the grown one.
            existing = replace(existing, dataset=wanted.dataset)
        if existing is not None:
            check_compatible(existing, wanted, source=str(out))
        self._before = existing
        if done_check is not None and existing is not None and not (overwrite or notes or repairs) \
                and self._complete(existing, wanted, done_check):
            return Prepared(existing, None, complete=True)

        plan = make_plan(self.index, self.encoder, self.resolution, self.settings.vggt_batch, vit=self.vit,
                         base=self.base)
        self.planned_bytes = plan.needed_bytes(self.cache_format)
        on_plan(plan)
        out.mkdir(parents=True, exist_ok=True)
        warning = check_free_space(out, plan.needed_bytes(self.cache_format) - bytes_under(out), force)
        remove_partials(out, under=True)  # a killed run's half-written files and folders
        # append/grow: the manifest's dataset identity was checked above, so a stored table or
        # array that is a prefix of this one can only be the old rows of an append (or of an
        # append interrupted before its manifest was written).
        self.writer.write_table("frames", frame_table(self.index), append=True)
        self.writer.prepare_frames(self.resolution.name,
                                   stored_frame_shape(frame_shape(self.index, self.resolution), self.base),
                                   self.settings.frames_per_shard, grow=True)
        if self.vit is not None:
            entry = wanted.vit_features[self.resolution.name]
            self.writer.prepare_vit(self.resolution.name, entry.feature_shape, entry.dtype,
                                    self.settings.frames_per_shard, grow=True)
        # A new cache gets its manifest and episode table now (they mark the directory as this
        # cache); an existing one keeps its own until finish() writes the complete ones, so a failed
        # run (or an interrupted append) never leaves a worse manifest behind.
        manifest = existing if existing is not None else wanted
        if existing is None:
            write_manifest(out, manifest)
        if not notes:  # the manifest's identity is this dataset's: the same table (or a damaged one repaired)
            write_episodes(out, episodes)
        repairs += self.writer.repairs
        self._repairs_shown = len(self.writer.repairs)
        warnings = [warning] if warning else []
        if repairs:
            warnings.append(f"repaired {out}: rewrote {', '.join(repairs)}")
        return Prepared(manifest, plan, tuple(warnings), tuple(repairs), notes)

    def _complete(self, existing: Manifest, wanted: Manifest, checksums: str) -> bool:
        """Whether the cache holds everything this job would write: its manifest already is the one
        ``finish()`` would write (settings, dataset, resolutions, versions), every metadata file has
        its recorded sha256 and every shard of its shard table is committed (by ``checksums``, as a
        resume checks it: with ``none`` no frame or feature payload is read; tables are always
        hashed, as a run compares them with the index anyway)."""
        merged = merge_manifests(existing, wanted, source=str(self.out))
        if replace(merged, shards=existing.shards, counts=existing.counts) != existing:
            return False
        if any(existing.counts.get(name) != count for name, count in wanted.counts.items()):
            return False
        if not {self.frames_array, self.samples_array} <= set(existing.shards) or changed_metadata(self.out):
            return False
        return all(all(entry.committed and self._recorded_as(array, entry) for entry in entries)
                   and not self._pending(array, [entry.shard for entry in entries], len(entries),
                                         "all" if is_table_array(array) else checksums)
                   for array, entries in existing.shards.items())

    def _recorded_as(self, array: str, entry: ShardEntry) -> bool:
        """Whether a shard's commit record on disk is the one the manifest lists (a shard committed
        again since, e.g. rewritten by its writer, needs finish() to write the manifest anew)."""
        try:
            record = read_record(self.out, array, entry.shard)
        except StoreError:
            return False
        return record is not None and (record.sha256, record.nbytes) == (entry.sha256, entry.nbytes)

    def _check_base(self, existing: Manifest) -> None:
        """Refuse (one line) a cache whose frames are another base's: none of its frames or features
        would be reused, and mixing them would train one base on the other's frames."""
        if existing.base != self.base.model_type:
            made_for = BASES[existing.base].name
            raise PrecomputeError(f"{self.out} is a cache for {made_for} (its frames are {made_for}'s), the profile's "
                                  f"qwen.path is a {self.base.name} model: precompute into another --out, or rebuild "
                                  f"this cache with --overwrite")

    def _cached_rows(self) -> CachedRows:
        """The cache's frame and sample tables (what its episodes were), for naming changed files."""
        report = self.out / REPORT_NAME
        failed = json.loads(report.read_text()).get("failed_samples", {}) if report.is_file() else {}
        samples = self.writer.read_table("samples") if self.writer.has_table("samples") else None
        return CachedRows.of_tables(self.writer.read_table("frames"), samples, failed)

    def _check_append(self, existing: Manifest) -> str:
        """Refuse (:class:`PrecomputeError`, one line) unless the index only adds episodes after the
        cache's ones; the note to show when it does."""
        out, index = self.out, self.index
        stored = read_episodes(out)
        if stored is None:
            raise PrecomputeError(f"{out} was built from other data (dataset.digest differs) and has no "
                                  f"{EPISODES_NAME} telling its episodes; rebuild it with --overwrite")
        recorded = DatasetIdentity.compute(stored, existing.dataset.subinstruction_rule, existing.dataset.sources)
        if recorded != existing.dataset:
            raise PrecomputeError(f"{out / EPISODES_NAME} does not match the manifest's dataset identity "
                                  "(edited, or left by another run); rebuild the cache with --overwrite")
        new_sources = tuple(s.name for s in index.sources)
        old_sources = existing.dataset.sources
        if new_sources[: len(old_sources)] != old_sources:
            raise PrecomputeError(f"{out} was built from the sources {' '.join(old_sources)}, the dataset names "
                                  f"{' '.join(new_sources) or 'none'}: sources can only be added after the "
                                  "existing ones, in the same order")
        if stored and not stored[0].episode_id.startswith(f"{stored[0].source}/") and prefixes_keys(index.sources):
            raise PrecomputeError(f"{out} holds keys without a source name (built from the one unnamed source "
                                  f"{old_sources[0] if old_sources else '?'}); a cache that grows by sources needs "
                                  "named sources (NAME=PATH) from its first build: rebuild it with --overwrite")
        changes = dataset_changes(stored, index, self._cached_rows)
        if changes.refusals:
            first = changes.refusals[0]
            more = f" (and {plural(len(changes.refusals) - 1, 'more changed or removed episode')})" \
                if len(changes.refusals) > 1 else ""
            raise PrecomputeError(f"{out} cannot take this dataset: {first}{more}; a cache only grows by new "
                                  f"episodes: restore {first.file} or rebuild with --overwrite")
        problem = append_order_problem(stored, index)
        if problem is not None:
            raise PrecomputeError(f"{out} cannot take this dataset: {problem}")
        if self.resolution.name in existing.vit_features and self.vit is None:
            raise PrecomputeError(f"{out} holds ViT features at {self.resolution.name}, which appending without them "
                                  "would leave short; set cache.vit_features: true in the profile to append")
        others = sorted(set(existing.resolutions) - {self.resolution.name})
        if others:
            raise PrecomputeError(f"{out} also holds the resolution(s) {', '.join(others)}; appending updates one "
                                  "resolution, so the others would be left short: rebuild with --overwrite")
        if not changes.added:
            raise PrecomputeError(f"{out} was built from the same episodes in another form (dataset identity "
                                  "differs, no episode added or changed); rebuild it with --overwrite")
        added = [index.episode(e) for e in changes.added]
        return (f"appending {plural(len(added), 'new episode')} ({plural(sum(len(e.frame_rows) for e in added), 'frame')}, "
                f"{plural(sum(len(e.sample_rows) for e in added), 'sample')}) after the cache's {len(stored)}")

    def _existing_manifest(self, wanted: Manifest) -> tuple[Manifest | None, list[str]]:
        """The cache's manifest (None: none, or one to rebuild from this run's settings) and, when it
        was damaged or edited, the repair to report.

        A manifest that cannot be read, or that differs from the sha256 recorded for it, is
        repaired where ``checksums.json`` proves which keyed settings it had: kept when its own
        keyed fields still have the recorded digest (``finish()`` rewrites the rest), rebuilt from
        this run's when they do (a cache of exactly this resolution). Otherwise: a one-line error
        naming the file and the command that rebuilds the cache.
        """
        layout = CacheLayout(self.out)
        try:
            existing = read_manifest(self.out)
            problem = "differs from the sha256 recorded for it"
            damaged = existing is not None and MANIFEST_NAME in changed_metadata(self.out) and (
                recorded_manifest_keyed(self.out) is not None)
        except SchemaVersionError as err:
            raise PrecomputeError(str(err)) from None
        except ManifestError as err:
            existing, problem, damaged = None, str(err).removeprefix(f"{layout.manifest} "), True
        if not damaged:
            return existing, []
        recorded = recorded_manifest_keyed(self.out)
        if existing is not None and recorded == keyed_digest(existing):
            return existing, [f"{MANIFEST_NAME} (edited outside its keyed settings)"]
        if recorded is not None and recorded == keyed_digest(wanted):
            return None, [f"{MANIFEST_NAME} (damaged; rebuilt from this run's settings, which match the "
                            "digest recorded for it)"]
        raise PrecomputeError(
            f"{layout.manifest} is damaged ({problem}) and {layout.checksums.name} does not prove which settings it "
            f"had; rebuild the cache: re-run this precompute command with --overwrite"
        )

    @_disk_full_is_one_line("writing frame shard {0}")
    def frame_shard(self, shard: int, pool: Pool | None = None) -> dict[int, str]:
        """Step 2 (any process): decode, write and commit frame shard ``shard``, decoding in
        ``pool``'s worker processes when given; returns {frame row: reason} of frames that failed."""
        return write_frame_shard(self.writer, self.index, self.resolution, shard, pool, self.base)

    @_disk_full_is_one_line("writing ViT-features shard {0}")
    def vit_shard(self, shard: int) -> None:
        """Step 2b (any process, after frame shard ``shard`` is committed; ``cache.vit_features``):
        the frozen ViT's output of that shard's stored frames, written and committed."""
        if self.vit is None:
            raise PrecomputeError("vit_shard() needs cache.vit_features")
        write_vit_shard(self.writer, self.vit, self.resolution.name, shard)

    @_disk_full_is_one_line("writing the samples table")
    def prepare_features(self) -> None:
        """Step 3 (one process, after every frame shard): samples table and feature storage."""
        height, width = frame_shape(self.index, self.resolution)
        self.writer.write_table("samples", sample_table(self.index, self.usable_rows), append=True)  # append/grow: see prepare()
        self.writer.prepare_samples(self.resolution.name, self.encoder.feature_shape(height, width),
                                    self.settings.feature_dtype, self.settings.samples_per_shard, grow=True)

    @_disk_full_is_one_line("writing feature shards")
    def feature_shards(self, shards: Sequence[int],
                       on_done: Callable[[int, int], None] = lambda shard, n: None) -> None:
        """Step 4 (any process, after ``prepare_features()``): encode, write and commit the given
        sample shards; ``on_done(shard, n_samples)`` follows each commit."""
        write_feature_shards(self.writer, self.encoder, self.resolution.name, shards,
                             window_matrix(self.index)[self.usable_rows], self.settings.vggt_batch, on_done,
                             vggt_frame_source(self.index, self.resolution, self.base))

    @_disk_full_is_one_line("writing the manifest and report")
    def finish(self) -> Outcome:
        """Step 5 (one process, after every shard): final manifest with its shard table, report.json."""
        current = read_manifest(self.out)
        if current is None:
            raise PrecomputeError(f"{self.out} has no {MANIFEST_NAME}: finish() runs after prepare()")
        episodes = self._episodes if self._episodes is not None else episode_identities(self.index)
        wanted = self._wanted or wanted_manifest(self.index, self.settings, self.resolution, self.cache_format,
                                                 self.encoder, episodes, self.vit, self.base)
        if current.dataset != wanted.dataset:  # an append, checked by prepare(): the cache grew
            current = replace(current, dataset=wanted.dataset)
        index, dropped = self.index, self.dropped
        counts = dict(wanted.counts, samples_written=len(index.samples) - len(dropped), samples_failed=len(dropped))
        # Arrays of other resolutions keep their entries; this run's arrays get the table on disk.
        merged = merge_manifests(current, wanted, source=str(self.out))
        shards = {**merged.shards, **self.writer.shard_table(verify=False)}
        failed_frames = read_frame_failures(self.out, self.resolution.name)
        report = {
            "dataset_problems": [
                {"file": e.file, "reason": str(e.reason), "sample": e.sample_key, "detail": e.detail}
                for e in index.report
            ],
            "failed_frames": {index.frames[row].relpath: reason for row, reason in sorted(failed_frames.items())},
            "failed_samples": dict(sorted(dropped.items())),
        }
        # report.json first: the manifest write records the checksums of every metadata file.
        atomic_write_bytes(self.out / REPORT_NAME, (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
        write_manifest(self.out, replace(merged, shards=shards, counts=counts))
        # After the manifest: its identity is what the episode table must match.
        write_episodes(self.out, episodes)
        return Outcome(self.out, len(index.samples), len(index.frames), dropped, dict(index.report.counts()),
                       bytes_under(self.out), *self._rewritten_shards(shards),
                       repaired=tuple(self.writer.repairs[self._repairs_shown:]))

    def _rewritten_shards(self, now: Mapping[str, Sequence[ShardEntry]]) -> tuple[tuple[str, ...], ...]:
        """Shard files the manifest before this run listed as committed whose commit record this run
        wrote anew (its mtime is after the run's start): (those it repaired, then those an append
        extended, shards and tables: the shard holds more rows in the table ``now`` than before)."""
        if self._before is None:
            return (), (), ()
        layout, rewritten, extended, tables = CacheLayout(self.out), [], [], []
        for array, entries in sorted(self._before.shards.items()):
            grown = {e.shard for e in now.get(array, ()) for old in entries
                     if old.shard == e.shard and e.stop > old.stop}
            for entry in entries:
                if not entry.committed:
                    continue
                try:
                    if layout.commit_record(array, entry.shard).stat().st_mtime < self._started:
                        continue
                    record = read_record(self.out, array, entry.shard)
                except (OSError, StoreError):
                    continue
                if record is not None:
                    grew = tables if is_table_array(array) else extended
                    (grew if entry.shard in grown else rewritten).append(record.file)
        return tuple(rewritten), tuple(extended), tuple(tables)
