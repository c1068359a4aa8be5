"""The completeness check: keys are unique and windows point at frames that decoded; (wds) each
tar shard holds exactly the samples of its rows; with a dataset index, every indexed sample is
present exactly once (samples the cache's ``report.json`` lists as failed at precompute excepted),
no extra keys, the same windows and the same source files (path, size, content hash), and every
episode's identity (``episodes.json``: frames, texts, actions) equal to the dataset's: an edited
description, instruction or image fails naming the episode and the file.

The comparison is made on columns, never on a row object per sample: the cache's key, window and
source columns and the index's (a stored index is read lazily, ``janus_core.index.lazy``) are
matched as :class:`~janus_core.index.text_keys.TextKeys` arrays, so at 612k samples it holds a few
hundred MB, not the whole index as Python objects (gigabytes); rows are made only to name what differs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from janus_cache.keys import dataset_identity
from janus_cache.store import DatasetIdentity, ManifestError, StoreError
from janus_cache.store.layout import FRAMES_TABLE, REPORT_NAME, SAMPLES_TABLE, WINDOW_ROWS_COLUMN, CacheLayout
from janus_cache.store.location import CacheLocation, is_remote
from janus_cache.store.manifest import read_episodes
from janus_cache.store.open import OpenedCache
from janus_cache.store.wds_store import FEATURE_MEMBER, FRAMES_MEMBER, META_MEMBER, decode_key, planned_tar_shards
from janus_cache.verify.cache import open_checked, wds_reader
from janus_cache.verify.results import COMPLETENESS, LISTED, CheckResult, guarded, listed, result, short, timer
from janus_cache.work_units import read_frame_failures
from janus_core.index import (
    DEFAULT_SUBINSTRUCTION_RULE,
    CachedRows,
    DatasetIndex,
    build_sources_index,
    dataset_changes,
    episode_identities,
    source_values,
    store_sources_index,
    user_index_dir,
)
from janus_core.index.text_keys import TextKeys, differs
from janus_core.plural import plural

SAMPLE_MEMBERS = frozenset({FRAMES_MEMBER, FEATURE_MEMBER, META_MEMBER})
"""The members every sample of a tar shard has."""


@guarded(COMPLETENESS)
def check_completeness(root: Path | str, index: DatasetIndex | None) -> CheckResult:
    """Unique keys and valid windows; with ``index`` (built with the cache's history), the cache
    against the dataset: samples, windows and source files.

    Samples that the cache's ``report.json`` lists as failed at precompute (a window frame could
    not be decoded) are expected to be absent; they are counted in the detail, not as problems.
    """
    with timer() as elapsed:
        cache = open_checked(root, COMPLETENESS)
        if isinstance(cache, CheckResult):
            return cache
        problems: list[str] = []
        # Every key is always present (stable --json layout); the dataset ones stay empty without an index.
        data: dict[str, Any] = {"dataset_compared": index is not None, "missing": [], "extra": [],
                                "failed_at_precompute": [], "changed_windows": [], "changed_sources": [],
                                "new_sources": [], "changed_episodes": [], "removed_episodes": [],
                                "added_episodes": [], "dataset_identity_matches": None}
        try:  # only the columns compared: a table's text columns as strings are ~1 GB at 612k rows
            sample_keys, frame_keys = cache.keys(SAMPLES_TABLE), cache.keys(FRAMES_TABLE)
            window_rows = np.asarray(cache.group.read_column(SAMPLES_TABLE, WINDOW_ROWS_COLUMN))
        except Exception as err:  # noqa: BLE001 - unreadable tables are the finding
            return result(COMPLETENESS, [f"cannot read the tables: {type(err).__name__}: {err}"],
                          "tables unreadable", elapsed(), **data)
        sample_column, frame_column = TextKeys.of(sample_keys), TextKeys.of(frame_keys)
        _duplicates(sample_column, "sample", problems, data)
        _duplicates(frame_column, "frame", problems, data)
        _window_frames_exist(cache, sample_keys, frame_keys, window_rows, problems)
        if cache.format == "wds":
            _tar_members(cache, sample_keys, problems)
        detail = f"{plural(len(sample_keys), 'sample')}, {plural(len(frame_keys), 'frame')}"
        if index is None:
            detail += "; dataset comparison skipped (pass --data)"
        else:
            failed = cache.failed_samples()
            _against_index(cache, index, sample_column, frame_column, window_rows, failed, problems, data)
            detail += f" against {len(index.samples)} indexed samples of {index.source}"
            if failed:
                detail += f" ({len(failed)} failed at precompute, listed in {REPORT_NAME})"
        return result(COMPLETENESS, problems, detail, elapsed(), **data)


def _duplicates(keys: TextKeys, kind: str, problems: list[str], data: dict[str, Any]) -> None:
    repeated = keys.repeated()
    data[f"duplicate_{kind}s"] = repeated
    if repeated:
        problems.append(f"{plural(len(repeated), f'{kind} key', 'appears')} more than once: {listed(repeated)}")


def _window_frames_exist(cache: OpenedCache, sample_keys: Sequence[str], frame_keys: Sequence[str],
                         window_rows: np.ndarray, problems: list[str]) -> None:
    if window_rows.size == 0:
        return
    outside = np.flatnonzero(((window_rows < 0) | (window_rows >= len(frame_keys))).any(axis=1))
    if outside.size:
        keys = [sample_keys[i] for i in outside]
        problems.append(f"{plural(len(keys), 'sample', 'has')} window rows outside the {plural(len(frame_keys), 'frame')}: "
                        f"{listed(keys)}")
    for resolution in cache.manifest.resolutions:
        failed = read_frame_failures(cache.root, resolution)
        if not failed:
            continue
        uses_failed = np.isin(window_rows, list(failed)).any(axis=1)
        for i in np.flatnonzero(uses_failed)[:LISTED]:
            row = next(int(r) for r in window_rows[i] if int(r) in failed)
            problems.append(f"sample {sample_keys[i]} uses frame {frame_keys[row]} ({resolution}), which failed to "
                            f"decode at precompute: {failed[row]}")


def _tar_members(cache: OpenedCache, sample_keys: Sequence[str], problems: list[str]) -> None:
    """Each sample's three members in the tar shard of its row, every key once."""
    for resolution in cache.manifest.resolutions:
        try:
            reader = wds_reader(cache, resolution)
        except StoreError:
            continue  # schema reports a missing layout
        seen: Counter[str] = Counter()
        for planned in planned_tar_shards(cache.root, reader.layout):
            if not planned.file.is_file():
                continue  # integrity reports a missing shard
            where = planned.file.relative_to(cache.root)
            want = {sample_keys[r] for r in planned.rows if r < len(sample_keys)}
            members: dict[str, set[str]] = {}
            try:
                for raw in reader.raw_samples(planned.shard):
                    members.setdefault(decode_key(raw["__key__"]), set()).update(
                        k for k in raw if not k.startswith("__"))
            except Exception as err:  # noqa: BLE001 - an unreadable tar is the finding
                problems.append(f"tar shard {where} cannot be listed: {err}")
                continue
            seen.update(members.keys())
            missing = sorted(want - set(members))
            extra = sorted(set(members) - want)
            partial = sorted(k for k, exts in members.items() if k in want and exts != SAMPLE_MEMBERS)
            if missing:
                problems.append(f"tar shard {where} lacks samples {listed(missing)}")
            if extra:
                problems.append(f"tar shard {where} holds samples of other rows or unknown keys: {listed(extra)}")
            if partial:
                problems.append(f"tar shard {where} has samples without all of {sorted(SAMPLE_MEMBERS)}: "
                                f"{listed(partial)}")
        repeated = sorted(k for k, n in seen.items() if n > 1)
        if repeated:
            problems.append(f"samples in more than one tar shard: {listed(repeated)}")


def _against_index(cache: OpenedCache, index: DatasetIndex, sample_keys: TextKeys, frame_keys: TextKeys,
                   window_rows: np.ndarray, failed: Mapping[str, str], problems: list[str],
                   data: dict[str, Any]) -> None:
    indexed = TextKeys.of(index.iter_text("samples", "key"))
    cached_row = indexed.rows_in(sample_keys)  # index sample -> cache row (-1: not cached)
    index_row = sample_keys.rows_in(indexed)  # cache row -> index sample (-1: not indexed)
    missing = [k for k in indexed.texts(np.flatnonzero(cached_row < 0)) if k not in failed]
    extra = sample_keys.texts(np.flatnonzero(index_row < 0))
    data.update(missing=missing, extra=extra, failed_at_precompute=sorted(failed))
    if missing:
        problems.append(f"{plural(len(missing), 'indexed sample')} missing from the cache: {listed(missing)}")
    if extra:
        problems.append(f"{plural(len(extra), 'cached sample')} not in the dataset index: {listed(extra)}")
    failed_keys = sorted(failed)
    both = [k for k, row in zip(failed_keys, TextKeys.of(failed_keys).rows_in(sample_keys), strict=True) if row >= 0]
    if both:
        problems.append(f"{plural(len(both), 'sample', 'is')} cached although {REPORT_NAME} lists them as failed: "
                        f"{listed(both)}")
    index_frames = _index_frame_keys(index)
    data["changed_windows"] = _changed_windows(index, index_row, sample_keys, frame_keys, index_frames,
                                               window_rows, problems)
    _changed_sources(cache, index, frame_keys, index_frames, problems, data)

    episodes = episode_identities(index)
    identity = dataset_identity(index, episodes)
    _changed_episodes(cache, index, failed, problems, data)
    if identity != cache.manifest.dataset:
        differences = [
            f"{name}: cache has {getattr(cache.manifest.dataset, name)!r}, dataset has {getattr(identity, name)!r}"
            for name in ("sources", "n_episodes", "n_frames", "n_samples", "subinstruction_rule", "digest")
            if getattr(cache.manifest.dataset, name) != getattr(identity, name)
        ]
        problems.append("dataset identity differs from the manifest's (" + "; ".join(differences) + ")")
    data["dataset_identity_matches"] = identity == cache.manifest.dataset


def _index_frame_keys(index: DatasetIndex) -> TextKeys:
    """The index's frame keys (``episode_id/index``, as ``Frame.key``) from its columns, in row order."""
    numbers = index.int_column("frames", "index").tolist()
    return TextKeys.of(f"{ep}/{i}" for ep, i in zip(index.iter_text("frames", "episode_id"), numbers, strict=True))


def _changed_episodes(cache: OpenedCache, index: DatasetIndex, failed: Mapping[str, str], problems: list[str],
                      data: dict[str, Any]) -> None:
    """Per episode: changed (naming the file), removed or new, against the cache's episode table.

    Findings go first: they name what the user edited, the frame and sample findings follow."""
    try:
        stored = read_episodes(cache.root)
    except ManifestError as err:
        problems.insert(0, str(err))
        return
    if stored is None:
        problems.insert(0, f"{cache.layout.episodes} is missing: the cache cannot be compared per episode")
        return
    recorded = DatasetIdentity.compute(stored, cache.manifest.dataset.subinstruction_rule,
                                       cache.manifest.dataset.sources)
    found: list[str] = []
    if recorded != cache.manifest.dataset:
        found.append(f"{cache.layout.episodes} does not match the manifest's dataset identity (edited?)")
    changes = dataset_changes(stored, index, lambda: CachedRows.of_tables(cache.table(FRAMES_TABLE),
                                                                          cache.table(SAMPLES_TABLE), failed))
    found += [f"changed {change}" for change in changes.changed[:LISTED]]
    if len(changes.changed) > LISTED:
        found.append(f"... {len(changes.changed)} episodes in all changed")
    found += [str(change) for change in changes.removed[:LISTED]]
    if changes.added:
        found.append(f"{plural(len(changes.added), 'episode')} of the dataset {'is' if len(changes.added) == 1 else 'are'} "
                     f"not in the cache: {listed(changes.added)} "
                     "(precompute again to append them)")
    data.update(changed_episodes=[{"episode": c.episode_id, "file": c.file, "detail": c.detail}
                                  for c in changes.changed],
                removed_episodes=[c.episode_id for c in changes.removed], added_episodes=list(changes.added))
    problems[:0] = found


def _changed_windows(index: DatasetIndex, index_row: np.ndarray, sample_keys: TextKeys, frame_keys: TextKeys,
                     index_frames: TextKeys, window_rows: np.ndarray, problems: list[str]) -> list[str]:
    """Samples whose cached window is not the dataset's: the same frames, by key, in the same order."""
    n_frames = len(frame_keys)
    if window_rows.ndim != 2 or not len(window_rows):
        return []
    usable = (index_row >= 0) & ((window_rows >= 0) & (window_rows < n_frames)).all(axis=1)  # else reported elsewhere
    rows = np.flatnonzero(usable)
    live, lengths_match = _index_windows(index, index_row[rows], window_rows.shape[1])
    # Frames compared by key: an index frame as the first cache row of its key, a cached window's rows likewise.
    as_cached = np.append(index_frames.rows_in(frame_keys), -2)  # -2: padding of a window of another length
    first_of_key = frame_keys.rows_in(frame_keys)
    same = lengths_match & (as_cached[live] == first_of_key[window_rows[rows]]).all(axis=1)
    changed = sample_keys.texts(rows[~same])
    for row in rows[~same][:LISTED]:
        stored = frame_keys.texts(window_rows[row])
        live_keys = index_frames.texts(index.samples[int(index_row[row])].window_rows)
        problems.append(f"sample {sample_keys.text(int(row))}: cached window {stored} differs from the dataset's "
                        f"{live_keys}")
    if len(changed) > LISTED:
        problems.append(f"... {len(changed)} samples in all have a different window")
    return changed


def _index_windows(index: DatasetIndex, rows: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The window rows of index samples ``rows`` as a [len(rows), width] matrix, and per row whether
    its window has ``width`` frames (a window of another length is padded with -1, which no frame
    matches)."""
    try:
        windows = index.int_column("samples", "window_rows")
    except ValueError:  # ragged (an annotation record of another length): numpy cannot shape it
        windows = None
    if windows is not None and (windows.ndim == 2 and windows.shape[1] == width or not len(windows)):
        return (windows[rows] if len(windows) else np.zeros((0, width), dtype=np.int64)), np.ones(len(rows), bool)
    matrix = np.full((len(rows), width), -1, dtype=np.int64)
    fits = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows.tolist()):  # only a dataset whose windows changed length gets here
        window = index.samples[row].window_rows
        fits[i] = len(window) == width
        matrix[i, :min(width, len(window))] = window[:width]
    return matrix, fits


def _changed_sources(cache: OpenedCache, index: DatasetIndex, frame_keys: TextKeys, index_frames: TextKeys,
                     problems: list[str], data: dict[str, Any]) -> None:
    """Source files: path, size and content hash of every frame; new files of the dataset."""
    group = cache.group
    cached_paths = TextKeys.of(group.read_column(FRAMES_TABLE, "source"))
    cached_hashes = TextKeys.of(group.read_column(FRAMES_TABLE, "source_sha256"))
    widths = np.asarray(group.read_column(FRAMES_TABLE, "source_width"))
    heights = np.asarray(group.read_column(FRAMES_TABLE, "source_height"))
    paths, hashes = TextKeys.of(index.iter_text("frames", "relpath")), TextKeys.of(index.iter_text("frames", "sha256"))
    index_widths, index_heights = index.int_column("frames", "width"), index.int_column("frames", "height")
    live = frame_keys.rows_in(index_frames)  # cache frame -> index frame (-1: gone)
    rows = np.flatnonzero(live >= 0)
    at = live[rows]
    differ = np.zeros(len(frame_keys), dtype=bool)
    differ[rows] = (differs(cached_paths, rows, paths, at) | differs(cached_hashes, rows, hashes, at)
                    | (widths[rows] != index_widths[at]) | (heights[rows] != index_heights[at]))
    differ |= live < 0
    reasons = {e.file: e.reason.value + (f": {e.detail}" if e.detail else "") for e in index.report}
    root = index.source if index.source.is_dir() else index.source.parent
    changed: list[str] = []
    for row in np.flatnonzero(differ).tolist():
        source, key = cached_paths.text(row), frame_keys.text(row)
        changed.append(source)
        if len(changed) > LISTED:
            continue
        if live[row] < 0:
            why = reasons.get(str(root / source), reasons.get(source, "not in the dataset index"))
            problems.append(f"source file {source} (frame {key}) is gone from the dataset: {why}")
        else:
            frame = index.frames[int(live[row])]
            problems.append(_source_change((source, int(widths[row]), int(heights[row]), cached_hashes.text(row)),
                                           (frame.relpath, frame.width, frame.height, frame.sha256 or ""), key))
    if len(changed) > LISTED:
        problems.append(f"... {len(changed)} source files in all differ from the cache's: {listed(changed)}")
    new = paths.texts(np.flatnonzero(index_frames.rows_in(frame_keys) < 0))
    if new:
        problems.append(f"{plural(len(new), 'source file')} of the dataset {'is' if len(new) == 1 else 'are'} not in the "
                        f"cache: {listed(new)}")
    data.update(changed_sources=changed, new_sources=new)


def _source_change(was: tuple[str, int, int, str], now: tuple[str, int, int, str], key: str) -> str:
    """How a frame's source (path, width, height, content hash) changed; empty when it did not."""
    what = []
    if was[0] != now[0]:
        what.append(f"path {was[0]} -> {now[0]}")
    if was[1:3] != now[1:3]:
        what.append(f"size {was[1]}x{was[2]} -> {now[1]}x{now[2]}")
    if was[3] != now[3]:
        what.append(f"content hash {short(was[3])} -> {short(now[3])}")
    return f"changed source file {was[0]} (frame {key}): {', '.join(what)}" if what else ""


def index_store_of(cache: CacheLocation) -> Path:
    """Where a dataset index compared with ``cache`` is kept: the cache's own index store, or for a
    cache in a bucket (read in place, never written) the user's index folder."""
    return user_index_dir() if is_remote(cache) else CacheLayout(cache).index_store


def dataset_indexes(data: Path | str, cache_history: int, live_history: int,
                    subinstruction_rule: str = DEFAULT_SUBINSTRUCTION_RULE,
                    cache_dir: Path | str | None = None, recorded_names: Sequence[str] = (), live: bool = True
                    ) -> tuple[DatasetIndex, DatasetIndex | None]:
    """The index completeness compares against (the cache's window history) and the one the live
    path reads windows from (the profile's); one index when the two agree.

    ``data`` names the dataset as precompute was given it: one path, or sources ``NAME=PATH ...``
    separated by spaces (``janus_core.index.sources``), so that the keys are the cache's.
    ``cache_dir``: the index store to reuse them from while the dataset is unchanged (see
    ``build_index``), and read lazily from there (:mod:`janus_core.index.lazy`): the comparison
    reads columns, so the index is never a row object per sample. ``recorded_names``: the cache's
    source names (its manifest's), which bare paths take, so that a copied, moved or renamed dataset
    compares as itself. ``live``: also the live path's index (None without it, when the histories differ)."""
    sources = source_values(data)
    index = _cache_history_index(sources, cache_history, subinstruction_rule, cache_dir, recorded_names)
    if live_history == cache_history:
        return index, index
    if not live:
        return index, None
    return index, build_sources_index(sources, history=live_history, subinstruction_rule=subinstruction_rule,
                                      cache_dir=cache_dir, recorded_names=recorded_names)


def _cache_history_index(sources: Sequence[str], history: int, subinstruction_rule: str,
                         cache_dir: Path | str | None, recorded_names: Sequence[str]) -> DatasetIndex:
    """The index of the cache's history: the combined entry of the cache's index store (what its
    precompute stored, so reused while the dataset is unchanged), read lazily; built in memory
    without a store, or when the store cannot be written (a read-only cache whose entry is stale)."""
    if cache_dir is not None:
        try:
            return store_sources_index(sources, cache_dir, history=history, subinstruction_rule=subinstruction_rule,
                                       recorded_names=recorded_names).load()
        except OSError:
            pass
    return build_sources_index(sources, history=history, subinstruction_rule=subinstruction_rule,
                               cache_dir=cache_dir, recorded_names=recorded_names)
