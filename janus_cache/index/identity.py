"""The identity of each episode of a dataset: what a cache built from it depends on.

An episode's digest covers its source name and id, every frame (path, pixel size, file size,
content hash) and every sample (key, window, instruction, subinstruction, both descriptions,
action), in index order: what the cache stores, whichever file format the texts came from. A cache stores these per-episode digests (``janus_cache.store.manifest``)
so that a later run can tell, per episode, what is unchanged, changed, gone or new: the staleness
check of ``verify --data`` and the append rule of precompute (``janus_cache.index.changes``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from janus_cache.index.model import DatasetIndex, Episode


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
    line("episode", episode.source, episode.episode_id)
    for row in episode.frame_rows:
        f = index.frames[row]
        line("frame", f.key, f.relpath, f.width, f.height, f.nbytes, f.sha256 or "")
    for row in episode.sample_rows:
        s = index.samples[row]
        line("sample", s.key, list(s.window), s.instruction, s.subinstruction, s.description_2d,
             s.description_3d, s.action)
    return EpisodeIdentity(episode.episode_id, episode.source, digest.hexdigest(), len(episode.frame_rows),
                           len(episode.sample_rows))


IDENTITY_RULE = 1
"""Version of the digest rule of :func:`episode_identity`: identities stored with an index
(``janus_cache.index.cached``) under another rule are computed again."""


def episode_identities(index: DatasetIndex) -> tuple[EpisodeIdentity, ...]:
    """Every episode's identity, in index order (those stored with a stored index, when it has them:
    reading every row of a 612k-sample index again takes a minute)."""
    stored = getattr(index, "stored_identities", None)
    if stored is not None:
        return stored
    return tuple(episode_identity(index, episode) for episode in index.episodes)
