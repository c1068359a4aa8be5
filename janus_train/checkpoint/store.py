"""Checkpoints a resume can trust: save a tag, record its checksums, move ``latest``, verify, rotate.

A checkpoint directory holds one folder per saved step (``step00000020``, DeepSpeed's files of
every rank) and a ``latest`` file naming the tag a resume starts from. A kill can strike at any
moment of a save and a disk can damage a file later, so:

* ``latest`` moves only once a checkpoint is complete: after DeepSpeed's save has finished on all
  ranks (its closing barrier), the ranks hash the tag's files (each rank a share), rank 0 writes
  the digests and sizes to ``checksums.json`` inside the tag, then points ``latest`` at the tag.
  Both files are written to a temporary name and renamed, so each is either old or new, never half.
* a resume verifies the tag's recorded files (each rank hashes a share; the verdicts are gathered,
  so every rank decides alike). If ``latest`` is missing or empty, names no tag, or names a damaged,
  truncated or unrecorded one, the newest intact tag is used and one line says why.
* rotation (``save_total_limit``) never deletes the tag ``latest`` names, which is intact: it was
  recorded before ``latest`` moved, or verified by the resume that repointed ``latest``.
* a save that runs out of room (any rank, any of its files) ends every rank alike with one line
  (:class:`~janus_core.system.disk_space.NoRoom`): the partial tag is removed, ``latest`` keeps naming
  the previous checkpoint, and the same command resumes from it once there is room.

Every rank must call :meth:`Checkpoints.save` and :meth:`Checkpoints.resumable` (collectives);
with one process they need no process group.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from janus_core.system.disk_space import NoRoom, bytes_under, format_bytes, free_bytes, no_room_reason
from janus_core.system.files import atomic_write_bytes, remove_partials, sha256_file
from janus_train.run.layout import LATEST_FILE

CHECKSUMS_FILE = "checksums.json"
"""Inside each tag folder: sha256 and size of every other file of the tag (``{"files": {path: {...}}}``)."""

UNIVERSAL_SUFFIX = "_universal"
"""``<tag>_universal``: a tag converted for another number of processes (``janus_train.checkpoint.elastic``);
derived from its tag, so it goes when the tag goes."""

TAG_PATTERN = re.compile(r"^step(\d{8})$")


class NoIntactCheckpoint(ValueError):
    """The checkpoint directory holds checkpoints, and none of them is intact."""


def tag_name(step: int) -> str:
    """The tag of the checkpoint of optimizer step ``step``: ``step00000020``."""
    return f"step{step:08d}"


def tag_step(tag: str) -> int | None:
    """The step a tag names, or None for any other folder (e.g. another kind of checkpoint)."""
    match = TAG_PATTERN.match(tag)
    return int(match.group(1)) if match else None


def tag_files(tag_dir: Path) -> list[str]:
    """Every file of a tag (relative POSIX paths, sorted) except its checksum record."""
    return sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*")
                  if p.is_file() and p.name != CHECKSUMS_FILE)


def file_problem(tag_dir: Path, name: str, recorded: dict[str, Any]) -> str | None:
    """Why a recorded file of a tag does not match its record (None when it does)."""
    path = tag_dir / name
    if not path.is_file():
        return f"file {name}: missing"
    size = path.stat().st_size
    if size < recorded["bytes"]:
        return f"file {name}: truncated ({size} of {recorded['bytes']} bytes)"
    if size != recorded["bytes"]:
        return f"file {name}: {size} bytes, {recorded['bytes']} recorded"
    if sha256_file(path) != recorded["sha256"]:
        return f"file {name}: checksum"
    return None


def read_checksums(tag_dir: Path) -> dict[str, dict[str, Any]] | str:
    """The recorded files of a tag, or why there is no usable record."""
    path = tag_dir / CHECKSUMS_FILE
    if not tag_dir.is_dir():
        return "missing"
    if not path.is_file():
        return f"no {CHECKSUMS_FILE}: its save did not complete"
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files")
        for entry in files.values():
            if not isinstance(entry["sha256"], str) or not isinstance(entry["bytes"], int):
                raise ValueError("bad entry")
    except (OSError, ValueError, KeyError, TypeError):
        return f"file {CHECKSUMS_FILE}: unreadable"
    return files


def record_directory(tag_dir: Path) -> None:
    """One process: hash every file of ``tag_dir`` and write its ``checksums.json`` (e.g. a universal
    checkpoint, which rank 0 alone converts)."""
    files = {name: {"sha256": sha256_file(tag_dir / name), "bytes": (tag_dir / name).stat().st_size}
             for name in tag_files(tag_dir)}
    atomic_write_bytes(tag_dir / CHECKSUMS_FILE, (json.dumps({"files": files}, indent=1) + "\n").encode())


def directory_problem(tag_dir: Path) -> str | None:
    """One process: why ``tag_dir`` does not match its ``checksums.json`` (the first problem, files
    in name order), None when every recorded file does."""
    record = read_checksums(tag_dir)
    if isinstance(record, str):
        return record
    return next((problem for name in sorted(record)
                 if (problem := file_problem(tag_dir, name, record[name])) is not None), None)


@dataclass(frozen=True)
class Resumable:
    """The tag a resume loads and, when it is not the one ``latest`` named, the line that says why."""

    tag: str
    note: str | None = None

    @property
    def step(self) -> int:
        step = tag_step(self.tag)
        assert step is not None
        return step


class Checkpoints:
    """The checkpoint directory of a run, as seen by one of ``world`` ranks; ``pinned`` names the
    tags rotation keeps besides its own count (the run's evaluations': :func:`janus_train.evals.evaluations.pinned_tags`)."""

    def __init__(self, directory: Path, rank: int = 0, world: int = 1,
                 pinned: Callable[[], Collection[str]] | None = None) -> None:
        self.directory, self.rank, self.world = Path(directory), rank, world
        self.pinned = pinned

    # --------------------------------------------------------------------------- collectives

    def _group(self) -> Any:
        """``torch.distributed`` when this is one of several ranks of an initialised group, else None.
        Imported here: reading a run directory's checkpoints (a start-up check, ``janus-train``'s
        export) needs no torch, and a rank of several has it loaded already."""
        if self.world == 1:
            return None
        import torch.distributed as dist

        return dist if dist.is_available() and dist.is_initialized() else None

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if (dist := self._group()) is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _gather(self, value: Any) -> list[Any]:
        if (dist := self._group()) is None:
            return [value]
        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def _barrier(self) -> None:
        if (dist := self._group()) is not None:
            dist.barrier()

    # ------------------------------------------------------------------------------- reading

    def tags(self) -> list[str]:
        """Checkpoint tags on disk, newest step first."""
        if not self.directory.is_dir():
            return []
        found = [p.name for p in self.directory.iterdir() if p.is_dir() and tag_step(p.name) is not None]
        return sorted(found, key=lambda t: tag_step(t) or 0, reverse=True)

    def latest(self) -> str | None:
        """What ``latest`` names (stripped; "" when empty), or None when there is no such file."""
        path = self.directory / LATEST_FILE
        try:
            return path.read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError):
            return ""

    def damage(self, tag: str) -> str | None:
        """Why ``tag`` cannot be resumed from (None when every recorded file matches); each rank
        checks a share of the files, every rank gets the same verdict."""
        tag_dir = self.directory / tag
        record = self.from_main(read_checksums(tag_dir) if self.rank == 0 else None)
        if isinstance(record, str):
            return record
        names = sorted(record)
        mine = [problem for name in names[self.rank :: self.world]
                if (problem := file_problem(tag_dir, name, record[name])) is not None]
        problems = sorted(p for share in self._gather(mine) for p in share)
        return problems[0] if problems else None

    def resumable(self) -> Resumable | None:
        """The tag to resume from: the one ``latest`` names when intact, else the newest intact tag
        (with a one-line note); None when the directory holds no checkpoint at all. Raises
        :class:`NoIntactCheckpoint` when there are checkpoints and none is intact. Rank 0 repoints
        ``latest`` at a fallback, so an export or the next resume reads an intact tag."""
        latest, tags = self.from_main((self.latest(), self.tags()) if self.rank == 0 else None)
        if latest is None and not tags:
            return None
        if latest is None:
            first_problem = f"{self.directory / LATEST_FILE} is missing"
            candidates = tags
        elif latest == "":
            first_problem = f"{self.directory / LATEST_FILE} is empty"
            candidates = tags
        else:
            problem = self.damage(latest)
            if problem is None:
                return Resumable(latest)
            first_problem = (f"{self.directory / LATEST_FILE} names {latest!r}, which does not exist"
                             if problem == "missing" else f"checkpoint {latest} is damaged ({problem})")
            candidates = [t for t in tags if t != latest]
        seen = [first_problem]
        for tag in candidates:
            problem = self.damage(tag)
            if problem is None:
                if self.rank == 0:
                    atomic_write_bytes(self.directory / LATEST_FILE, tag.encode())
                self._barrier()
                return Resumable(tag, "; ".join(seen) + f"; resuming from {tag}")
            seen.append(f"checkpoint {tag} is damaged ({problem})")
        raise NoIntactCheckpoint(f"no intact checkpoint in {self.directory}: " + "; ".join(seen)
                                 + f" (move {self.directory} away to start afresh)")

    # ------------------------------------------------------------------------------- writing

    def save(self, engine: Any, tag: str, client_state: dict[str, Any], keep: int) -> None:
        """Save ``engine``'s checkpoint as ``tag``, record its checksums, then point ``latest`` at
        it and delete the oldest tags beyond ``keep`` (never the one ``latest`` names).

        A save that runs out of room (on any rank, at any of these writes) raises :class:`NoRoom`
        on every rank alike, with one line: the partial tag is removed and ``latest`` still names
        the previous checkpoint, from which the same command resumes once there is room."""
        reason = self.write_tag(engine, tag, client_state)
        if reason is None:
            reason = self.record(tag)
        if reason is None:
            reason = self.on_main(lambda: self._commit(tag, keep))
        if reason is not None:
            raise NoRoom(self.from_main(self._give_up(tag, reason) if self.rank == 0 else None))

    def write_tag(self, engine: Any, tag: str, client_state: dict[str, Any]) -> str | None:
        """DeepSpeed's save of every rank's files into a fresh folder ``tag`` (a leftover of that
        name is removed first); why there was no room on any rank (every rank alike; None: written).
        Also the best checkpoint's save (``janus_train.checkpoint.best``)."""
        # Rank 0 makes the tag's folder itself: DeepSpeed's own mkdir only logs a failure.
        reason = self.on_main(lambda: self._fresh_folder(self.directory / tag))
        return reason if reason is not None else self._save_files(engine, tag, client_state)

    def on_main(self, write: Any) -> str | None:
        """Rank 0's ``write()``; why there was no room for it (every rank alike; None: written)."""
        return self.from_main(self._main_writes(write) if self.rank == 0 else None)

    def rerun_hint(self) -> str:
        """Rank 0, after a write ran out of room: how the same command goes on once there is room."""
        latest = self.latest()
        if latest and isinstance(read_checksums(self.directory / latest), dict):
            return f"{LATEST_FILE} still names {latest}: free space and run the same command again to resume from it"
        return "no checkpoint is kept yet: free space and run the same command again"

    @staticmethod
    def _fresh_folder(tag_dir: Path) -> None:
        if tag_dir.exists():
            # Left by a killed save or a run abandoned at an earlier resume: never mixed with new files.
            shutil.rmtree(tag_dir)
        tag_dir.mkdir(parents=True)

    def _save_files(self, engine: Any, tag: str, client_state: dict[str, Any]) -> str | None:
        """DeepSpeed's save of every rank's files; why there was no room on any rank (None: saved)."""
        try:
            # DeepSpeed would write ``latest`` before any checksum exists; it ends with a barrier, so
            # every rank's files are complete when the hashing starts.
            engine.save_checkpoint(str(self.directory), tag=tag, client_state=client_state, save_latest=False)
            mine = None
        except Exception as err:
            mine = no_room_reason(err, self.directory / tag)
            if mine is None:
                raise
            # DeepSpeed's collectives all come before its writes, and the save ends with a barrier
            # that the other ranks wait in: meet them there, so every rank reaches the exchange.
            self._barrier()
        return next((reason for reason in self._gather(mine) if reason is not None), None)

    def _main_writes(self, write: Any) -> str | None:
        """Rank 0's ``write()``; why there was no room (None: written). Other errors propagate."""
        try:
            write()
        except OSError as err:
            reason = no_room_reason(err, self.directory)
            if reason is None:
                raise
            return reason
        return None

    def _commit(self, tag: str, keep: int) -> None:
        atomic_write_bytes(self.directory / LATEST_FILE, tag.encode())
        self.rotate(keep)

    def _give_up(self, tag: str, reason: str) -> str:
        """Rank 0, after a save ran out of room: remove the partial tag (its room is the user's
        again) and say in one line what a checkpoint takes, what is free and how the run goes on."""
        tag_dir = self.directory / tag
        written = bytes_under(tag_dir)
        shutil.rmtree(tag_dir, ignore_errors=True)
        remove_partials(self.directory / LATEST_FILE)
        latest = self.latest()
        record = read_checksums(self.directory / latest) if latest else "none"
        if isinstance(record, dict):
            takes = f"a checkpoint of this run takes {format_bytes(sum(e['bytes'] for e in record.values()))}"
        else:
            takes = f"this checkpoint needs more than the {format_bytes(written)} written before the disk filled"
        return (f"{tag_dir}: no room left saving checkpoint {tag} ({reason}): the disk has "
                f"{format_bytes(free_bytes(self.directory))} free and {takes}; the partial checkpoint was removed, "
                f"{self.rerun_hint()}")

    def record(self, tag: str) -> str | None:
        """Hash the tag's files (each rank a share) and have rank 0 write ``checksums.json``; why
        there was no room for it (every rank alike; None: written)."""
        tag_dir = self.directory / tag
        names = self.from_main(tag_files(tag_dir) if self.rank == 0 else None)
        mine = {name: {"sha256": sha256_file(tag_dir / name), "bytes": (tag_dir / name).stat().st_size}
                for name in names[self.rank :: self.world]}
        shares = self._gather(mine)
        reason = None
        if self.rank == 0:
            files = {name: entry for share in shares for name, entry in share.items()}
            reason = self._main_writes(lambda: atomic_write_bytes(
                tag_dir / CHECKSUMS_FILE, (json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n").encode()))
        return self.from_main(reason)

    def rotate(self, keep: int) -> list[str]:
        """Keep the tag ``latest`` names and the ``keep`` - 1 tags before it, and the ``pinned`` ones
        before it; delete the rest (rank 0, after a save). A tag newer than ``latest`` is a leftover of
        a run abandoned at a resume (damaged, or never completed) and goes too. Returns the deleted tags."""
        tags = self.tags()
        latest = self.latest()
        latest_step = tag_step(latest) if latest else None
        if latest_step is None or latest not in tags:
            return []  # nothing known intact: delete nothing
        kept = {latest} | set([t for t in tags if (tag_step(t) or 0) < latest_step][: max(0, keep - 1)])
        if self.pinned is not None:
            kept |= {t for t in self.pinned() if (tag_step(t) or 0) < latest_step}
        deleted = [tag for tag in tags if tag not in kept]
        for tag in deleted:
            shutil.rmtree(self.directory / tag, ignore_errors=True)
            shutil.rmtree(self.directory / (tag + UNIVERSAL_SUFFIX), ignore_errors=True)
        return deleted
