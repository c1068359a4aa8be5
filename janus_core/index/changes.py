"""What changed, per episode, between the dataset a cache was built from and the dataset now.

The cache holds each episode's identity (``janus_core.index.identity``) and its frame and sample
tables; the dataset is indexed again. An episode is *unchanged* when its digest is equal,
*changed* when its digest differs (the first differing file is named: a source image whose path,
size or content changed, or the description JSON / milestones file / annotation record whose text
or action changed), *removed* when the dataset no longer has it, *added* when the cache lacks it.
``verify --data`` fails on any change; precompute appends added episodes and refuses the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from janus_core.index.identity import EpisodeIdentity, episode_identities
from janus_core.index.model import ACTIONS, DatasetIndex, Episode, Sample
from janus_core.index.sources import prefixes_keys
from janus_core.plural import plural

TEXT_FIELDS = ("instruction", "subinstruction", "description_2d", "description_3d")
"""Sample texts compared with the cache's samples table (its columns of the same names)."""


@dataclass(frozen=True)
class CachedRows:
    """The cache's frame and sample tables by episode: what the episodes were when it was built.

    ``frames``: episode id -> {frame key: (source path, width, height, content hash)};
    ``samples``: episode id -> {sample key: the texts of :data:`TEXT_FIELDS` and ``action`` (an id)}.
    """

    frames: Mapping[str, Mapping[str, tuple[str, int, int, str]]] = field(default_factory=dict)
    samples: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    failed: frozenset[str] = frozenset()
    """Samples left out at precompute (a window frame failed to decode): absent, not new."""

    @classmethod
    def of_tables(cls, frames: Mapping[str, Any], samples: Mapping[str, Any] | None,
                  failed: Iterable[str] = ()) -> CachedRows:
        """From the columns of the cache's ``frames`` and ``samples`` tables (None: not written
        yet) and its failed samples."""
        samples = samples if samples is not None else {name: [] for name in ("key", "episode_id", "action",
                                                                             *TEXT_FIELDS)}
        frame_rows: dict[str, dict[str, tuple[str, int, int, str]]] = {}
        for key, ep, path, w, h, sha in zip(frames["key"], frames["episode_id"], frames["source"],
                                            frames["source_width"], frames["source_height"],
                                            frames["source_sha256"], strict=True):
            frame_rows.setdefault(str(ep), {})[str(key)] = (str(path), int(w), int(h), str(sha))
        sample_rows: dict[str, dict[str, dict[str, Any]]] = {}
        columns = [samples[name] for name in TEXT_FIELDS]
        for key, ep, action, *texts in zip(samples["key"], samples["episode_id"], samples["action"], *columns,
                                           strict=True):
            sample_rows.setdefault(str(ep), {})[str(key)] = {**dict(zip(TEXT_FIELDS, texts, strict=True)),
                                                             "action": int(action)}
        return cls(frame_rows, sample_rows, frozenset(failed))


@dataclass(frozen=True)
class EpisodeChange:
    """A changed or removed episode, the file to look at, and what is different."""

    episode_id: str
    file: str
    detail: str

    def __str__(self) -> str:
        return f"episode {self.episode_id}: {self.detail}"


@dataclass(frozen=True)
class DatasetChanges:
    """Per-episode differences of a dataset from a cache (episodes in index / cache order)."""

    changed: tuple[EpisodeChange, ...] = ()
    removed: tuple[EpisodeChange, ...] = ()
    added: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.changed or self.removed or self.added)

    @property
    def refusals(self) -> tuple[EpisodeChange, ...]:
        """What an append cannot take: changed and removed episodes."""
        return self.changed + self.removed


def dataset_changes(stored: Sequence[EpisodeIdentity], index: DatasetIndex,
                    cached: Callable[[], CachedRows]) -> DatasetChanges:
    """Compare the cache's episodes (``stored``) with ``index``; ``cached`` reads the cache's
    tables, called only when an episode changed or is gone (to name the file)."""
    by_id = {e.episode_id: e for e in index.episodes}
    # A stored index carries its episodes' identities: reading every row again is a minute at 612k samples.
    now = {identity.episode_id: identity for identity in episode_identities(index)}
    stored_ids = {e.episode_id for e in stored}
    differing = [(old, by_id.get(old.episode_id)) for old in stored]
    differing = [(old, episode) for old, episode in differing
                 if episode is None or now[episode.episode_id] != old]
    rows = cached() if differing else CachedRows()
    changed = tuple(_changed(index, episode, rows) for _, episode in differing if episode is not None)
    removed = tuple(_removed(old, index, rows) for old, episode in differing if episode is None)
    added = tuple(e.episode_id for e in index.episodes if e.episode_id not in stored_ids)
    return DatasetChanges(changed, removed, added)


def append_order_problem(stored: Sequence[EpisodeIdentity], index: DatasetIndex) -> str | None:
    """Why appending the index's new episodes after the cache's rows would not give the rows a
    from-scratch build of the index gives (None when it would): the cached episodes must come
    first, in the same order, and every sample of theirs before any sample of a new episode."""
    old_ids = [e.episode_id for e in stored]
    now = [e.episode_id for e in index.episodes]
    if now[: len(old_ids)] != old_ids:
        old = set(old_ids)
        position = next(i for i, (a, b) in enumerate(zip(now, old_ids)) if a != b)
        first_new = next((e for e in now[: len(old_ids)] if e not in old), now[position])
        later_old = next((e for e in now[position:] if e in old), old_ids[position])
        return (f"new episode {first_new} comes before cached episode {later_old} in the dataset's order "
                "(sources in the order given, then each source's own order), so appending cannot equal a "
                "build from scratch; list new episodes as a new source after the others, or rebuild with --overwrite")
    old_rows = [row for e in index.episodes[: len(old_ids)] for row in e.sample_rows]
    new_rows = [row for e in index.episodes[len(old_ids):] for row in e.sample_rows]
    if old_rows and new_rows and min(new_rows) < max(old_rows):
        sample = index.samples[min(new_rows)]
        return (f"sample {sample.key} of new episode {sample.episode_id} ({sample.record}) comes before samples "
                "of cached episodes in the annotation order, so appending cannot equal a build from scratch; "
                "put new records after the old ones, or rebuild with --overwrite")
    return None


def _changed(index: DatasetIndex, episode: Episode, cached: CachedRows) -> EpisodeChange:
    """The first file of ``episode`` that differs from the cache's tables, and how."""
    ep = episode.episode_id
    findings: list[tuple[str, str]] = []
    live_frames = {index.frames[row].key for row in episode.frame_rows}
    for row in episode.frame_rows:
        frame = index.frames[row]
        was = cached.frames.get(ep, {}).get(frame.key)
        if was is None:
            findings.append((str(frame.path), f"new source file {frame.path} (frame {frame.key})"))
            continue
        what = []
        if was[0] != frame.relpath:
            what.append(f"path {was[0]} -> {frame.relpath}")
        if was[1:3] != (frame.width, frame.height):
            what.append(f"size {was[1]}x{was[2]} -> {frame.width}x{frame.height}")
        if was[3] != (frame.sha256 or ""):
            what.append(f"content hash {was[3][:12]} -> {(frame.sha256 or '')[:12]}")
        if what:
            findings.append((str(frame.path), f"changed source file {frame.path} ({', '.join(what)})"))
    for key, was in cached.frames.get(ep, {}).items():
        if key not in live_frames:
            gone = _source_file(index, episode.source, was[0])
            findings.append((gone, f"source file {gone} (frame {key}) is gone from the dataset"))
    live_samples = set()
    for row in episode.sample_rows:
        sample = index.samples[row]
        live_samples.add(sample.key)
        was_sample = cached.samples.get(ep, {}).get(sample.key)
        if was_sample is None:
            if sample.key in cached.failed:
                continue
            findings.append((sample.record, f"new sample {sample.key} ({sample.record})"))
            continue
        for name in TEXT_FIELDS:
            if was_sample[name] != getattr(sample, name):
                file = _text_file(episode, sample, name)
                findings.append((file, f"{name} of sample {sample.key} changed in {file}"))
                break
        else:
            if was_sample["action"] != sample.action_id:
                findings.append((sample.record, f"action of sample {sample.key} changed from "
                                 f"{ACTIONS[was_sample['action']]} to {sample.action} ({sample.record})"))
    for key in cached.samples.get(ep, {}):
        if key not in live_samples:
            findings.append((key, f"sample {key} is gone from the dataset"))
    if not findings:
        return EpisodeChange(ep, episode.texts_file or str(episode.path),
                             f"changed (its windows or sample order differ; episode folder {episode.path})")
    file, detail = findings[0]
    more = f" (and {plural(len(findings) - 1, 'more change')})" if len(findings) > 1 else ""
    return EpisodeChange(ep, file, detail + more)


def _text_file(episode: Episode, sample: Sample, name: str) -> str:
    """The file a sample's text ``name`` comes from: an episode's milestones file holds its
    instruction and subinstructions; descriptions (and annotation records) are per sample."""
    if name in ("instruction", "subinstruction") and episode.texts_file:
        return episode.texts_file
    return sample.record


def _removed(old: EpisodeIdentity, index: DatasetIndex, cached: CachedRows) -> EpisodeChange:
    """A cached episode the dataset no longer has: its folder, and the index's reason when it
    reported one (e.g. its milestones file became unreadable)."""
    files = sorted(was[0] for was in cached.frames.get(old.episode_id, {}).values())
    folder = _source_file(index, old.source, files[0].rsplit("/", 1)[0]) if files else old.episode_id
    reason = next((str(e) for e in index.report if e.file == folder or e.file.startswith(folder + "/")), None)
    why = f"; the index reports {reason}" if reason else ""
    return EpisodeChange(old.episode_id, folder, f"gone from the dataset (its frames were under {folder}){why}")


def _source_file(index: DatasetIndex, source: str, relpath: str) -> str:
    """A path of the frames table (relative, prefixed with the source name when keys are) as a
    path under its source's root, where the index knows the source."""
    roots = {s.name: s.path for s in index.sources}
    root = roots.get(source)
    if root is None:
        return relpath
    if prefixes_keys(index.sources) and relpath.startswith(f"{source}/"):
        relpath = relpath[len(source) + 1:]
    return str((root if root.is_dir() else root.parent) / relpath)
