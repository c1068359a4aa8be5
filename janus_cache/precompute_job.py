"""The precompute job: the cache's contract for building one resolution of a cache.

A :class:`PrecomputeJob` is plain single-process code with five steps, run in this order:

1. ``prepare()`` (one process, before any shard): refuse a directory that is not a cache and a
   cache made with other keyed settings, measure the plan, refuse when the disk is too small,
   delete what a killed run left half-written, write the frames table, create the frames
   array and write the manifest (no shard table yet) and the per-episode identities;
2. ``frame_shard(i)`` for every frame shard (any process, each shard written by exactly one);
3. ``prepare_features()`` (one process, after every frame shard): the samples table (samples
   whose window frames all decoded) and the feature storage;
4. ``feature_shards(shards)`` for every sample shard (any process, each shard by exactly one);
5. ``finish()`` (one process, after every shard): the final manifest with its shard table and
   ``report.json``.

Which process runs which shard, barriers and progress displays belong to the caller
(``pipelines/precompute.py``). The units of work themselves are in :mod:`janus_cache.precompute`.

**Appending.** A cache whose dataset identity differs from the index's is *appended to* when the
index only adds episodes after the cache's ones (``janus_cache.index.changes``): the tables are
rewritten with the new rows after the old ones, the arrays grow, and only the new rows' shards are
written; full shards of the old rows stay byte for byte as they are, and a partially filled last
shard is rewritten whole (recomputed from its sources, as a build from scratch computes it). The
result equals a cache built from scratch on the whole dataset. A changed or removed episode, or
new episodes that would land before old ones, is refused in one line naming it and its file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import numpy as np

from janus_cache.index import (
    CachedRows,
    DatasetIndex,
    Sample,
    append_order_problem,
    dataset_changes,
    episode_identities,
    prefixes_keys,
)
from janus_cache.lock import LOCK_NAME
from janus_cache.encoder import WindowEncoder
from janus_cache.plan import Plan, format_bytes, make_plan
from janus_cache.precompute import (
    check_windows,
    committed_count,
    frame_shape,
    frame_table,
    read_frame_failures,
    sample_table,
    usable_samples,
    wanted_manifest,
    window_variant,
    write_feature_shards,
    write_frame_shard,
)
from janus_cache.profile import CacheSettings
from janus_cache.resolution import Resolution
from janus_cache.store import CacheWriter, DatasetIdentity, Manifest, open_writer, read_manifest, write_manifest
from janus_cache.store.commit import atomic_write_bytes, read_record, verify_shard
from janus_cache.store.layout import EPISODES_NAME, MANIFEST_NAME, REPORT_NAME, ZARR_ROOT_NAME, frames_array
from janus_cache.store.manifest import check_compatible, merge_manifests, read_episodes, write_episodes


class PrecomputeError(RuntimeError):
    """A refusal or failure with a one-line reason for the user."""


def disk_usage(path: Path) -> int:
    """Bytes of every file under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def free_space_problem(directory: Path, free_bytes: int, needed_bytes: float) -> str | None:
    """The sentence saying that ``directory`` is too small, or None when ``needed_bytes`` fit."""
    if needed_bytes <= free_bytes:
        return None
    return f"{directory} has {format_bytes(free_bytes)} free, the plan needs {format_bytes(needed_bytes)} more"


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


def remove_partials(root: Path) -> None:
    """Delete temporary files of atomic writes that a killed run left behind.

    Shard files are cleaned when their shard is rewritten, but a run killed while writing a
    commit record, the manifest or zarr metadata leaves a stray ``*.partial`` that no shard
    rewrite owns. Runs before any shard writer starts.
    """
    for leftover in Path(root).rglob("*.partial"):
        leftover.unlink(missing_ok=True)


def cache_contents(out: Path) -> list[Path]:
    """The entries of the cache directory ``out``, less the lock file of the run writing it (which
    ``--overwrite`` must not delete: the run holds it)."""
    return [entry for entry in out.iterdir() if entry.name != LOCK_NAME]


@dataclass(frozen=True)
class Prepared:
    """What ``prepare()`` decided: the manifest written, the measured plan, warnings to show."""

    manifest: Manifest
    plan: Plan
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """What the run does beyond a plain build or resume (e.g. the episodes it appends)."""


@dataclass(frozen=True)
class Outcome:
    """What a finished precompute wrote: sample counts, failures and the cache's size."""

    out: Path
    samples: int
    frames: int
    dropped: dict[str, str]
    skipped_while_indexing: dict[str, int]
    bytes_on_disk: int

    @property
    def written(self) -> int:
        return self.samples - len(self.dropped)

    def format(self, seconds: float) -> str:
        """The summary printed at the end of a run (failed samples in dataset order, at most 5)."""
        lines = [
            f"precompute done in {seconds:.1f} s: {self.written} samples ({self.written / max(seconds, 1e-9):.2f}/s), "
            f"{self.frames} frames, {self.bytes_on_disk / 1e6:.1f} MB in {self.out}"
        ]
        if self.skipped_while_indexing:
            lines.append("  skipped while indexing: " + ", ".join(
                f"{n} {reason}" for reason, n in sorted(self.skipped_while_indexing.items())))
        if self.dropped:
            lines.append(f"  {len(self.dropped)} samples failed (their frames could not be decoded); "
                         f"see {self.out / REPORT_NAME}")
            lines.extend(f"    {key}: {reason}" for key, reason in list(self.dropped.items())[:5])
        return "\n".join(lines)


class PrecomputeJob:
    """Build resolution ``resolution`` of the ``cache_format`` cache at ``out`` from ``index``.

    Every step is a pure function of the index, the settings and the shard number, so any split
    of the shards over processes gives the same cache, byte for byte.
    """

    def __init__(self, index: DatasetIndex, out: Path, cache_format: str, settings: CacheSettings,
                 resolution: Resolution, encoder: WindowEncoder) -> None:
        self.index = index
        self.out = Path(out)
        self.cache_format = cache_format
        self.settings = settings
        self.resolution = resolution
        self.encoder = encoder

    # ------------------------------------------------------------------------------ queries

    @cached_property
    def writer(self) -> CacheWriter:
        return open_writer(self.cache_format, self.out, window_variant(self.settings).name)

    @property
    def frames_array(self) -> str:
        return frames_array(self.resolution.name)

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

    def frames_done(self) -> int:
        """Frames in committed shards, roughly (counts commit files; for progress displays)."""
        return committed_count(self.out, self.frames_array) * self.settings.frames_per_shard

    def samples_done(self) -> int:
        """Samples in committed shards, roughly (counts commit files; for progress displays)."""
        return committed_count(self.out, self.samples_array) * self.settings.samples_per_shard

    def pending_frame_shards(self, shards: Iterable[int]) -> list[int]:
        """Those of ``shards`` that are not committed with a matching checksum (only they are hashed)."""
        return self._pending(self.frames_array, shards)

    def pending_feature_shards(self, shards: Iterable[int]) -> list[int]:
        """Those of ``shards`` that are not committed with a matching checksum (only they are hashed)."""
        return self._pending(self.samples_array, shards)

    def _pending(self, array: str, shards: Iterable[int]) -> list[int]:
        pending = []
        for shard in shards:
            record = read_record(self.out, array, shard)
            if record is None or verify_shard(self.out, record).problem is not None:
                pending.append(shard)
        return pending

    @cached_property
    def _usable(self) -> tuple[list[Sample], dict[str, str]]:
        # Read from the failure records on disk, so every process gets the same answer once every
        # frame shard is committed, whichever process decoded it.
        return usable_samples(self.index, read_frame_failures(self.out, self.resolution.name))

    @property
    def samples(self) -> list[Sample]:
        """Samples whose window frames all decoded (after every frame shard)."""
        return self._usable[0]

    @property
    def dropped(self) -> dict[str, str]:
        """Sample key -> why it is left out (after every frame shard)."""
        return self._usable[1]

    @cached_property
    def _sample_table(self) -> dict[str, Any]:
        return sample_table(self.samples, self.index.history)

    # -------------------------------------------------------------------------------- steps

    def prepare(self, overwrite: bool = False, force: bool = False,
                on_plan: Callable[[Plan], None] = lambda plan: None) -> Prepared:
        """Step 1 (one process): refusals, plan, free space, cleanup, frames table, manifest.

        ``overwrite`` deletes an earlier cache at ``out`` first; ``force`` starts although the
        plan needs more space than is free. ``on_plan`` sees the plan before the free-space check.
        """
        check_windows(self.index)
        episodes = episode_identities(self.index)
        wanted = wanted_manifest(self.index, self.settings, self.resolution, self.cache_format, self.encoder,
                                 episodes)
        out = self.out
        looks_like_cache = (out / ZARR_ROOT_NAME).exists() or (out / MANIFEST_NAME).exists()
        if out.exists() and any(cache_contents(out)) and not looks_like_cache:
            # Checked before --overwrite: it deletes the directory, which must be an earlier cache.
            raise PrecomputeError(f"{out} exists, is not empty and is not a janus cache; choose another --out")
        if overwrite and out.exists():
            # Before reading anything of the old cache: --overwrite must also work when it is damaged.
            for entry in cache_contents(out):
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        existing = read_manifest(out) if out.exists() else None
        notes: tuple[str, ...] = ()
        if existing is not None and existing.dataset != wanted.dataset:
            # Every other keyed field must be equal; the dataset may only have grown.
            same_rule = replace(existing.dataset, subinstruction_rule=wanted.dataset.subinstruction_rule)
            check_compatible(existing, replace(wanted, dataset=same_rule), source=str(out))
            notes = (self._check_append(existing),)
            existing = replace(existing, dataset=wanted.dataset)
        if existing is not None:
            check_compatible(existing, wanted, source=str(out))

        plan = make_plan(self.index, self.encoder, self.resolution, self.settings.vggt_batch)
        on_plan(plan)
        out.mkdir(parents=True, exist_ok=True)
        warning = check_free_space(out, plan.needed_bytes(self.cache_format) - disk_usage(out), force)
        remove_partials(out)
        # append/grow: the manifest's dataset identity was checked above, so a stored table or
        # array that is a prefix of this one can only be the old rows of an append (or of an
        # append interrupted before its manifest was written).
        self.writer.write_table("frames", frame_table(self.index), append=True)
        self.writer.prepare_frames(self.resolution.name, frame_shape(self.index, self.resolution),
                                   self.settings.frames_per_shard, grow=True)
        manifest = merge_manifests(existing, wanted) if existing is not None else wanted
        # The manifest first: a crash before the episode table leaves a manifest that equals the
        # dataset, so the next run writes the table without asking what changed.
        write_manifest(out, manifest)
        write_episodes(out, episodes)
        return Prepared(manifest, plan, (warning,) if warning else (), notes)

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
            more = f" (and {len(changes.refusals) - 1} more changed or removed episode(s))" \
                if len(changes.refusals) > 1 else ""
            raise PrecomputeError(f"{out} cannot take this dataset: {first}{more}; a cache only grows by new "
                                  f"episodes: restore {first.file} or rebuild with --overwrite")
        problem = append_order_problem(stored, index)
        if problem is not None:
            raise PrecomputeError(f"{out} cannot take this dataset: {problem}")
        others = sorted(set(existing.resolutions) - {self.resolution.name})
        if others:
            raise PrecomputeError(f"{out} also holds the resolution(s) {', '.join(others)}; appending updates one "
                                  "resolution, so the others would be left short: rebuild with --overwrite")
        if not changes.added:
            raise PrecomputeError(f"{out} was built from the same episodes in another form (dataset identity "
                                  "differs, no episode added or changed); rebuild it with --overwrite")
        added = [index.episode(e) for e in changes.added]
        return (f"appending {len(added)} new episode(s) ({sum(len(e.frame_rows) for e in added)} frames, "
                f"{sum(len(e.sample_rows) for e in added)} samples) after the cache's {len(stored)}")

    def frame_shard(self, shard: int, pool: Pool | None = None) -> dict[int, str]:
        """Step 2 (any process): decode, write and commit frame shard ``shard``, decoding in
        ``pool``'s worker processes when given; returns {frame row: reason} of frames that failed."""
        return write_frame_shard(self.writer, self.index, self.resolution, shard, pool)

    def prepare_features(self) -> None:
        """Step 3 (one process, after every frame shard): samples table and feature storage."""
        height, width = frame_shape(self.index, self.resolution)
        self.writer.write_table("samples", self._sample_table, append=True)  # append/grow: see prepare()
        self.writer.prepare_samples(self.resolution.name, self.encoder.feature_shape(height, width),
                                    self.settings.feature_dtype, self.settings.samples_per_shard, grow=True)

    def feature_shards(self, shards: Sequence[int],
                       on_done: Callable[[int, int], None] = lambda shard, n: None) -> None:
        """Step 4 (any process, after ``prepare_features()``): encode, write and commit the given
        sample shards; ``on_done(shard, n_samples)`` follows each commit."""
        write_feature_shards(self.writer, self.encoder, self.resolution.name, shards,
                             np.asarray(self._sample_table["window_rows"]), self.settings.vggt_batch, on_done)

    def finish(self) -> Outcome:
        """Step 5 (one process, after every shard): final manifest with its shard table, report.json."""
        current = read_manifest(self.out)
        if current is None:
            raise PrecomputeError(f"{self.out} has no {MANIFEST_NAME}: finish() runs after prepare()")
        index, dropped = self.index, self.dropped
        counts = dict(current.counts, samples_written=len(index.samples) - len(dropped), samples_failed=len(dropped))
        # Arrays of other resolutions keep their entries; this run's arrays get the table on disk.
        shards = {**current.shards, **self.writer.shard_table(verify=False)}
        write_manifest(self.out, replace(current, shards=shards, counts=counts))
        failed_frames = read_frame_failures(self.out, self.resolution.name)
        report = {
            "dataset_problems": [
                {"file": e.file, "reason": str(e.reason), "sample": e.sample_key, "detail": e.detail}
                for e in index.report
            ],
            "failed_frames": {index.frames[row].relpath: reason for row, reason in sorted(failed_frames.items())},
            "failed_samples": dict(sorted(dropped.items())),
        }
        atomic_write_bytes(self.out / REPORT_NAME, (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
        return Outcome(self.out, len(index.samples), len(index.frames), dropped, dict(index.report.counts()),
                       disk_usage(self.out))
