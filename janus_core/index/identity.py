"""The identity of each episode of a dataset: what a cache built from it depends on.

An episode's digest covers its source name and id, every frame (path, pixel size, file size,
content hash) and every sample (key, window, instruction, subinstruction, both descriptions,
action), in index order: what the cache stores, whichever file format the texts came from. A cache stores these per-episode digests (``janus_cache.store.manifest``)
so that a later run can tell, per episode, what is unchanged, changed, gone or new: the staleness
check of ``verify --data`` and the append rule of precompute (``janus_core.index.changes``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from janus_core.index.model import DatasetIndex, Episode, Frame, Sample


@dataclass(frozen=True, slots=True)
class EpisodeIdentity:
    """One episode as a cache records it: id, source, digest and its frame and sample counts."""

    episode_id: str
    source: str
    digest: str
    frames: int
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> EpisodeIdentity:
        try:
            return cls(str(data["episode_id"]), str(data["source"]), str(data["digest"]), int(data["frames"]),
                       int(data["samples"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: not an episode identity ({type(err).__name__}: {err})") from None


def episode_identity(index: DatasetIndex, episode: Episode) -> EpisodeIdentity:
    """The identity of one episode of ``index`` (one JSON line per item, so no field can pass for another)."""
    digest = hashlib.sha256()

    def line(*item: Any) -> None:
        digest.update(json.dumps(item, ensure_ascii=False).encode() + b"\n")

    # The samples' texts as trained on, whichever file format held them: an annotation file and
    # the episode folders of the same samples are the same dataset.
    line(*_episode_item(episode))
    for row in episode.frame_rows:
        line(*_frame_item(index.frames[row]))
    for row in episode.sample_rows:
        line(*_sample_item(index.samples[row]))
    return EpisodeIdentity(episode.episode_id, episode.source, digest.hexdigest(), len(episode.frame_rows),
                           len(episode.sample_rows))


def _episode_item(e: Episode) -> tuple[Any, ...]:
    return ("episode", e.source, e.episode_id)


def _frame_item(f: Frame) -> tuple[Any, ...]:
    return ("frame", f.key, f.relpath, f.width, f.height, f.nbytes, f.sha256 or "")


def _sample_item(s: Sample) -> tuple[Any, ...]:
    return ("sample", s.key, list(s.window), s.instruction, s.subinstruction, s.description_2d, s.description_3d,
            s.action)


class StreamedIdentities:
    """:func:`episode_identity` of every episode, from the index's frames and then its samples
    passing once in row order (as an index is written a chunk at a time): no row is read again.
    Usable when each episode's rows ascend (:meth:`applies`), so its lines come in the same order."""

    def __init__(self, episodes: Sequence[Episode]) -> None:
        self._episodes = episodes
        self._digests: dict[str, Any] = {}
        for episode in episodes:
            self._digests[episode.episode_id] = hashlib.sha256()
            self._line(episode.episode_id, _episode_item(episode))

    @staticmethod
    def applies(episodes: Sequence[Episode]) -> bool:
        return all(all(a < b for a, b in zip(rows, rows[1:])) for e in episodes
                   for rows in (e.frame_rows, e.sample_rows))

    def _line(self, episode_id: str, item: tuple[Any, ...]) -> None:
        self._digests[episode_id].update(json.dumps(item, ensure_ascii=False).encode() + b"\n")

    def add(self, table: str, rows: Sequence[Frame] | Sequence[Sample]) -> None:
        """The next rows of ``table`` (all frames before any sample)."""
        item = _frame_item if table == "frames" else _sample_item
        for row in rows:
            self._line(row.episode_id, item(row))  # type: ignore[arg-type]

    def identities(self) -> tuple[EpisodeIdentity, ...]:
        return tuple(EpisodeIdentity(e.episode_id, e.source, self._digests[e.episode_id].hexdigest(),
                                     len(e.frame_rows), len(e.sample_rows)) for e in self._episodes)


IDENTITY_RULE = 1
"""Version of the digest rule of :func:`episode_identity`: identities stored with an index
(``janus_core.index.cached``) under another rule are computed again."""


def episode_identities(index: DatasetIndex) -> tuple[EpisodeIdentity, ...]:
    """Every episode's identity, in index order (those stored with a stored index, when it has them:
    reading every row of a 612k-sample index again takes a minute)."""
    stored = getattr(index, "stored_identities", None)
    if stored is not None:
        return stored
    return tuple(episode_identity(index, episode) for episode in index.episodes)
