"""Copying a cache between a local directory and a prefix of a bucket: ``janus-cache push`` and ``pull``.

**Order.** What makes a cache complete is written last: first every data and metadata file (shard
files, ``zarr.json``, tables, ``episodes.json``, ``report.json``...), then the commit records, then
``checksums.json``, and ``manifest.json`` at the very end. A copy interrupted at any moment
therefore has no manifest (or, when it replaces an older cache, its old manifest was deleted
first), and is refused by every reader in one line instead of being read as complete. One PUT is
atomic in S3 (an object is whole or absent); locally each file is written to a temporary name,
fsynced and renamed.

**Checked on the way.** A push refuses a cache that is not finished or whose metadata or commit
records fail their checks, and hashes every file as it uploads it: a shard whose bytes differ from
its commit record's sha256 (or a metadata file from ``checksums.json``) is not uploaded and the
push ends in one line naming it. Every object carries the sha256 of its bytes as user metadata
(``x-amz-meta-sha256``), and obstore sends it with each PUT for the server to check. A pull checks
each download against the cache's own records (the remote commit records and ``checksums.json``,
read first) or the object's sha256, and ends with the local copy verified as ``janus-cache verify
--checksums all`` does.

**Resumable.** A file counts as already there when the other side holds it with the same size
and the same sha256: a remote object by its recorded sha256 (one HEAD, no download), a local file
hashed here. The cache's root ``zarr.json`` goes first, so a copy killed mid-way is known for an
unfinished janus cache and continued by the same command (a killed pull's half-written files are
removed). A finished copy is recognised from a listing and the two small files that complete it
(``manifest.json`` and ``checksums.json`` byte for byte): re-running it says there is nothing to do.

**In parallel.** Files go on ``threads`` threads (obstore's calls release the GIL), large ones in
multipart uploads of :data:`PART_BYTES`; a connection that drops is retried by obstore with backoff
and then once more per file (:data:`FILE_TRIES`) before the command ends in one line. Progress is
shown in bytes with rate and ETA by whatever ``progress`` the command gives (the CLI's bar).

One writer per destination: a push holds the prefix's lock object
(:class:`~janus_cache.store.remote.lock.PrefixLock`), a pull the local directory's lock
(:class:`~janus_core.system.lock.DirectoryLock`) and refuses a prefix a push is writing.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from janus_cache.store.checksums import metadata_problems, recorded_metadata
from janus_cache.store.commit import CommitRecord
from janus_cache.store.damage import REPAIR_HINT
from janus_cache.store.errors import StoreError
from janus_cache.store.layout import CHECKSUMS_NAME, COMMITS_DIR, INDEX_STORE_DIR, MANIFEST_NAME, ZARR_ROOT_NAME
from janus_cache.store.location import sha256_of
from janus_cache.store.open import load_manifest
from janus_cache.store.remote.client import bucket_store, remote_error
from janus_cache.store.remote.errors import EndpointUnreachable, RemoteError, is_connection_failure
from janus_cache.store.remote.lock import PrefixLock, holder_of
from janus_cache.store.remote.path import STREAM_CHUNK_BYTES, S3Path
from janus_core.system.disk_space import format_bytes, free_bytes, no_room_reason
from janus_core.system.files import PARTIAL_SUFFIX, atomic_file, atomic_write_bytes, remove_partials
from janus_core.system.lock import LOCK_NAME, DirectoryLock

SHA256_METADATA = "sha256"
"""The user metadata key of every pushed object: the sha256 of its bytes."""

DEFAULT_THREADS = 16
PART_BYTES = 16 << 20
"""Part size of a multipart upload (a file larger than this is uploaded in parts)."""
PART_CONCURRENCY = 4
"""Parts of one file in flight at once."""
FILE_TRIES = 2
"""Tries of one file whose transfer failed on the connection after obstore's own retries."""
FILE_RETRY_WAIT_S = 2.0

DATA, COMMITS, CHECKSUMS, MANIFEST = range(4)
"""The stages of a copy, in order: what makes a cache complete comes last."""


class TransferError(StoreError):
    """A push or pull that cannot be done as asked, in one line; nothing that was written is half."""


class ProgressDisplay(Protocol):
    """What a command shows progress with (``pipelines.distributed.Progress``)."""

    def phase(self, name: str, total: int, unit: str, done: int = 0) -> None: ...

    def update(self, done: int) -> None: ...

    def close(self) -> None: ...


class _Quiet:
    def phase(self, name: str, total: int, unit: str, done: int = 0) -> None:
        pass

    def update(self, done: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class TransferReport:
    """What a push or pull did."""

    source: str
    destination: str
    files: int = 0
    """Files the cache holds."""
    bytes: int = 0
    sent_files: int = 0
    sent_bytes: int = 0
    deleted: int = 0
    seconds: float = 0.0
    verified: str = ""

    @property
    def nothing_to_do(self) -> bool:
        return self.sent_files == 0 and self.deleted == 0

    def summary(self, verb: str) -> str:
        if self.nothing_to_do:
            return (f"nothing to do: {self.destination} already holds the cache {self.source} "
                    f"({self.files} files, {format_bytes(self.bytes)})" + (f"; {self.verified}" if self.verified else ""))
        rate = self.sent_bytes / max(self.seconds, 1e-9)
        kept = self.files - self.sent_files
        return (f"{verb} {self.sent_files} files ({format_bytes(self.sent_bytes)}) from {self.source} to "
                f"{self.destination} in {self.seconds:.1f} s ({format_bytes(rate)}/s)"
                + (f"; {kept} files were already there intact" if kept else "")
                + (f"; removed {self.deleted} files the cache no longer holds" if self.deleted else "")
                + (f"; {self.verified}" if self.verified else ""))


# ---------------------------------------------------------------------------------- what is copied


def stage_of(name: str) -> int:
    if name == MANIFEST_NAME:
        return MANIFEST
    if name == CHECKSUMS_NAME:
        return CHECKSUMS
    if name.startswith(COMMITS_DIR + "/"):
        return COMMITS
    return DATA


def is_content(name: str) -> bool:
    """Whether a file belongs to the cache (not its lock, its stored dataset index or a partial write)."""
    return not (name == LOCK_NAME or name.split("/", 1)[0] == INDEX_STORE_DIR or name.endswith(PARTIAL_SUFFIX))


def local_files(root: Path) -> dict[str, int]:
    """Every file of the cache at ``root`` (relative ``/`` name -> bytes)."""
    found: dict[str, int] = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root).replace(os.sep, "/")
            if is_content(relative):
                found[relative] = os.stat(path).st_size
    return found


def remote_files(root: S3Path) -> dict[str, int]:
    """Every object of the cache at ``root`` (relative name -> bytes), from one listing."""
    return {name: size for name, size in root.walk_objects() if is_content(name)}


def recorded_digests(records: dict[str, bytes], checksums: dict[str, str] | None) -> dict[str, str]:
    """File name -> the sha256 the cache itself records for it: every shard file by its commit
    record (``records``: record name -> bytes), every metadata file by ``checksums.json``."""
    digests = dict(checksums or {})
    for name, data in records.items():
        record = CommitRecord.from_json(data.decode("utf-8"), source=name)
        digests[record.file] = record.sha256
    return digests


def _in_stage(files: Iterable[str], stage: int) -> list[str]:
    return sorted(name for name in files if stage_of(name) == stage)


# ---------------------------------------------------------------------------------- the engine


class _Bytes:
    """Bytes moved so far, from every thread (the progress display reads it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def _run_all(work: Callable[[str], Any], names: Sequence[str], threads: int, moved: _Bytes,
             progress: ProgressDisplay) -> dict[str, Any]:
    """``work(name)`` for every name on ``threads`` threads, progress updated twice a second; the
    first failure stops what has not started and is raised once the running ones ended."""
    results: dict[str, Any] = {}
    if not names:
        return results
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(names))), thread_name_prefix="janus-transfer") as pool:
        futures: dict[Future[Any], str] = {pool.submit(work, name): name for name in names}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                progress.update(moved.value)
                for future in done:
                    results[futures[future]] = future.result()
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return results


def _tries(action: Callable[[], Any], where: str) -> Any:
    """``action()``, tried again once after a connection failure that obstore's retries did not mend."""
    for attempt in range(FILE_TRIES):
        try:
            return action()
        except RemoteError as err:
            if attempt + 1 == FILE_TRIES or not isinstance(err, EndpointUnreachable):
                raise
        except StoreError:  # the cache's own refusal (a checksum), not the network's
            raise
        except Exception as err:  # noqa: BLE001
            if attempt + 1 == FILE_TRIES or not is_connection_failure(err):
                raise remote_error(err, where) from None
        time.sleep(FILE_RETRY_WAIT_S * (attempt + 1))
    raise AssertionError("unreachable")


class _CheckedFile(io.RawIOBase):
    """A local file read for upload, hashed as it is read; at its end its size and sha256 must be
    the expected ones, else the read fails (and with it the upload: the object never appears)."""

    def __init__(self, path: Path, size: int, sha256: str, moved: _Bytes) -> None:
        super().__init__()
        self.path, self.size, self.sha256, self.moved = path, size, sha256, moved
        self.problem: str | None = None
        self._file = open(path, "rb")
        self._hash = hashlib.sha256()
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        if n:
            self._hash.update(memoryview(buffer)[:n])
            self.read_bytes += n
            self.moved.add(n)
            return n
        if self.read_bytes != self.size:
            self.problem = f"has {self.read_bytes} bytes, the cache records {self.size} (changed while pushed?)"
        elif self._hash.hexdigest() != self.sha256:
            self.problem = f"fails its checksum: sha256 {self._hash.hexdigest()}, the cache records {self.sha256}"
        if self.problem is not None:
            raise ValueError(f"{self.path} {self.problem}")
        return 0

    def close(self) -> None:
        self._file.close()
        super().close()


# ---------------------------------------------------------------------------------- push


def _check_pushable(source: Path) -> None:
    """A push sends finished caches only: a manifest, metadata matching ``checksums.json``, every
    planned shard committed with its file at the recorded size (the bytes are hashed as they go)."""
    from janus_cache.verify.integrity import check_integrity

    load_manifest(source)
    problems = metadata_problems(source)
    if problems:
        raise TransferError(f"refusing to push {source}: {problems[0]}")
    integrity = check_integrity(source, checksums="none")
    if not integrity.passed:
        raise TransferError(f"refusing to push {source}, it is not a finished cache: {integrity.problems[0]}")


def _remote_digests(root: S3Path, names: Sequence[str], threads: int) -> dict[str, str | None]:
    """The sha256 each object records in its metadata (None: none), one HEAD each."""
    def digest(name: str) -> str | None:
        found = _tries(lambda: (root / name).head(), str(root / name))
        return None if found is None else found["metadata"].get(SHA256_METADATA)

    return _run_all(digest, names, threads, _Bytes(), _Quiet())


def _same_bytes(local: Path, remote: S3Path) -> bool:
    """Whether a small file (the manifest, checksums.json) is the same on both sides."""
    try:
        return local.read_bytes() == remote.read_bytes()
    except FileNotFoundError:
        return False


def push(source: Path, destination: S3Path, threads: int = DEFAULT_THREADS,
         progress: ProgressDisplay | None = None, note: Callable[[str], None] = lambda line: None) -> TransferReport:
    """Copy the finished cache ``source`` to ``destination`` (see the module docstring)."""
    import obstore

    progress = progress or _Quiet()
    started = time.perf_counter()
    source = Path(source)
    load_manifest(source)  # not a cache at all: one line before the bucket is asked anything
    store = bucket_store(destination.bucket)
    # The lock first: the bucket's configuration (credentials, endpoint, bucket) fails here, at once.
    with PrefixLock.acquire(destination, purpose=f"janus-cache push of {source.resolve()}") as lock:
        if (takeover := lock.takeover_note()) is not None:
            note(f"note: {takeover}")
        files = local_files(source)
        report = TransferReport(str(source), str(destination), len(files), sum(files.values()))
        there = _tries(lambda: remote_files(destination), str(destination))
        if there and ZARR_ROOT_NAME not in there:
            raise TransferError(f"{destination} holds {len(there)} object(s) but no janus cache (no {ZARR_ROOT_NAME}): "
                                "push into an empty prefix, or one that holds a janus cache")
        extra = sorted(set(there) - set(files))
        finished = (not extra and all(there.get(n) == size for n, size in files.items())
                    and all(_same_bytes(source / n, destination / n) for n in (MANIFEST_NAME, CHECKSUMS_NAME)))
        if finished:  # said at once: nothing is sent, so the cache's own checks wait for a push that sends
            report.seconds = time.perf_counter() - started
            return report
        _check_pushable(source)
        records = {name: (source / name).read_bytes() for name in _in_stage(files, COMMITS)}
        digests = recorded_digests(records, recorded_metadata(source))
        # Whatever differs goes up; the local sha256 of files the cache records none for.
        candidates = sorted(n for n, size in files.items() if there.get(n) == size)
        unrecorded = [n for n in candidates if n not in digests]
        digests.update(_run_all(lambda n: sha256_of(source / n)[1], unrecorded, threads, _Bytes(), _Quiet()))
        remote = _remote_digests(destination, candidates, threads)
        todo = {n for n in files if not (n in remote and remote[n] is not None and remote[n] == digests.get(n))}
        if todo and MANIFEST_NAME in there:
            # From here until the end the prefix holds no complete cache (the manifest comes last).
            _tries(lambda: obstore.delete(store, (destination / MANIFEST_NAME).key), str(destination))
            todo.add(MANIFEST_NAME)
        moved = _Bytes()
        total = sum(files.values())
        already = total - sum(files[n] for n in todo)
        progress.phase("push", total, "B", already)
        moved.add(already)

        def upload(name: str) -> None:
            path, key = source / name, (destination / name).key
            expected = digests.get(name) or sha256_of(path)[1]

            def attempt() -> None:
                checked = _CheckedFile(path, files[name], expected, moved)
                try:
                    obstore.put(store, key, checked, attributes={SHA256_METADATA: expected},
                                use_multipart=files[name] > PART_BYTES, chunk_size=PART_BYTES,
                                max_concurrency=PART_CONCURRENCY)
                except Exception:  # noqa: BLE001 - the read's own refusal, or the network's (retried)
                    moved.add(-checked.read_bytes)
                    if checked.problem is not None:
                        raise TransferError(f"refusing to push {source}: {name} {checked.problem}; nothing was made "
                                            f"complete at {destination}; {REPAIR_HINT}") from None
                    raise
                finally:
                    checked.close()

            _tries(attempt, str(destination / name))

        if ZARR_ROOT_NAME in todo:  # first: it marks the prefix as a janus cache (unfinished until the manifest)
            _run_all(upload, [ZARR_ROOT_NAME], 1, moved, progress)
        for stage in (DATA, COMMITS):
            _run_all(upload, [n for n in _in_stage(todo, stage) if n != ZARR_ROOT_NAME], threads, moved, progress)
            lock.check()
        if extra:  # files of an older cache at this prefix that this one does not hold
            for batch in range(0, len(extra), 1000):
                keys = [(destination / n).key for n in extra[batch:batch + 1000]]
                _tries(lambda keys=keys: obstore.delete(store, keys), str(destination))
            report.deleted = len(extra)
        for stage in (CHECKSUMS, MANIFEST):
            lock.check()
            _run_all(upload, _in_stage(todo, stage), 1, moved, progress)
        progress.close()
        report.sent_files = len(todo)
        report.sent_bytes = sum(files[n] for n in todo)
    report.seconds = time.perf_counter() - started
    return report


# ---------------------------------------------------------------------------------- pull


def _download(source: S3Path, target: Path, size: int, expected: str | None, moved: _Bytes) -> None:
    """One object into ``target``, whole or not at all (:func:`~janus_core.system.files.atomic_file`):
    its size and sha256 (the cache's record, else the object's metadata) checked before it takes
    the name."""
    import obstore

    received = 0
    try:
        result = obstore.get(bucket_store(source.bucket), source.key)
        expected = expected or result.attributes.get(SHA256_METADATA)
        digest = hashlib.sha256()
        with atomic_file(target) as out:
            for chunk in result.stream(min_chunk_size=STREAM_CHUNK_BYTES):
                data = memoryview(chunk)
                out.write(data)
                digest.update(data)
                received += len(data)
                moved.add(len(data))
            if received != size:
                raise TransferError(f"{source} arrived with {received} bytes, the listing says {size}; run the pull "
                                    "again")
            if expected is not None and digest.hexdigest() != expected:
                raise TransferError(f"{source} fails its checksum on arrival: sha256 {digest.hexdigest()}, the cache "
                                    f"records {expected} (damaged in the bucket?); nothing was made complete at "
                                    f"{target.parent}")
    except BaseException as err:
        moved.add(-received)
        reason = no_room_reason(err, target.parent) if isinstance(err, OSError) else None
        if reason is not None:
            raise TransferError(f"{target.parent}: no room left pulling {source} ({reason}): the disk has "
                                f"{format_bytes(free_bytes(target.parent))} free; free space and run the pull again "
                                "(what arrived whole is kept)") from None
        raise


def pull(source: S3Path, destination: Path, threads: int = DEFAULT_THREADS,
         progress: ProgressDisplay | None = None, note: Callable[[str], None] = lambda line: None) -> TransferReport:
    """Copy the cache at ``source`` into the local directory ``destination`` and verify the copy
    (see the module docstring)."""
    progress = progress or _Quiet()
    started = time.perf_counter()
    destination = Path(destination)
    manifest_bytes = _checked_source(source)
    with DirectoryLock.acquire(destination, exclusive=True, purpose=f"janus-cache pull of {source}") as lock:
        if (takeover := lock.takeover_note()) is not None:
            note(f"note: {takeover}")
        remove_partials(destination, under=True)  # what a killed pull was writing (never a whole file)
        there = _tries(lambda: remote_files(source), str(source))
        here = local_files(destination)
        if here and ZARR_ROOT_NAME not in here and MANIFEST_NAME not in here:
            raise TransferError(f"{destination} holds {len(here)} file(s) but no janus cache: pull into an empty or "
                                "new directory, or one that holds a janus cache")
        report = TransferReport(str(source), str(destination), len(there), sum(there.values()))
        extra = sorted(set(here) - set(there))
        if (not extra and all(here.get(n) == size for n, size in there.items())
                and (destination / MANIFEST_NAME).read_bytes() == manifest_bytes
                and _same_bytes(destination / CHECKSUMS_NAME, source / CHECKSUMS_NAME)):
            report.seconds = time.perf_counter() - started
            return report
        records = _run_all(lambda n: _tries((source / n).read_bytes, str(source / n)), _in_stage(there, COMMITS),
                           threads, _Bytes(), _Quiet())
        digests = recorded_digests(records, recorded_metadata(source))
        candidates = [n for n, size in there.items() if here.get(n) == size and stage_of(n) == DATA]
        unrecorded = [n for n in candidates if n not in digests]
        digests.update({n: d for n, d in _remote_digests(source, unrecorded, threads).items() if d is not None})
        local = _run_all(lambda n: sha256_of(destination / n)[1], [n for n in candidates if n in digests], threads,
                         _Bytes(), _Quiet())
        data = sorted(n for n in _in_stage(there, DATA) if local.get(n) is None or local[n] != digests.get(n))
        completing = [n for n in there if stage_of(n) != DATA]
        needed = sum(there[n] for n in data) + sum(there[n] for n in completing)
        if needed > free_bytes(destination):
            raise TransferError(f"{destination}: not enough room to pull {source}: {format_bytes(needed)} to write, "
                                f"{format_bytes(free_bytes(destination))} free; free space or pull elsewhere")
        # From here until the end the directory holds no complete cache (the manifest comes last).
        (destination / MANIFEST_NAME).unlink(missing_ok=True)
        moved = _Bytes()
        total = sum(there[n] for n in _in_stage(there, DATA))
        progress.phase("pull", total, "B", total - sum(there[n] for n in data))
        moved.add(total - sum(there[n] for n in data))

        def download(name: str) -> None:
            _tries(lambda: _download(source / name, destination / name, there[name], digests.get(name), moved),
                   str(source / name))

        if ZARR_ROOT_NAME in data:  # first: it marks the directory as a janus cache, which a killed pull continues
            _run_all(download, [ZARR_ROOT_NAME], 1, moved, progress)
        _run_all(download, [n for n in data if n != ZARR_ROOT_NAME], threads, moved, progress)
        for name, body in sorted(records.items()):
            _write_small(destination / name, body)
        for name in extra:
            (destination / name).unlink()
        _write_small(destination / CHECKSUMS_NAME, _tries((source / CHECKSUMS_NAME).read_bytes, str(source)))
        _write_small(destination / MANIFEST_NAME, manifest_bytes)
        progress.close()
        report.sent_files, report.sent_bytes, report.deleted = len(data) + len(completing), needed, len(extra)
    from janus_cache.verify.integrity import check_integrity  # (torch: only once there is a copy to verify)

    problems = metadata_problems(destination)
    integrity = check_integrity(destination, checksums="all")
    if problems or not integrity.passed:
        raise TransferError(f"pulled {source} into {destination}, but the copy fails its check: "
                            f"{(problems or integrity.problems)[0]}")
    report.verified = f"verified: {integrity.detail}"
    report.seconds = time.perf_counter() - started
    return report


def _checked_source(source: S3Path) -> bytes:
    """The manifest of the cache at ``source`` (a one-line error when there is none or a push is
    writing it)."""
    writer = holder_of(source)
    if writer is not None:
        raise TransferError(f"{source} is being written by {writer}; pull it when that push has ended")
    load_manifest(source)
    return (source / MANIFEST_NAME).read_bytes()


def _write_small(path: Path, data: bytes) -> None:
    try:
        atomic_write_bytes(path, data)
    except OSError as err:
        reason = no_room_reason(err, path.parent)
        if reason is None:
            raise
        raise TransferError(f"{path.parent}: no room left writing {path.name} ({reason}); free space and run the "
                            "pull again (what arrived whole is kept)") from None

