"""Commit records: the single rule that decides whether a shard counts as written.

A shard is *committed* only when its commit record exists: a small JSON file written atomically
after the shard file itself was fully written and fsynced, holding the shard's row range, byte
size and the sha256 of the shard file's bytes. A crash at any instant therefore leaves each shard
either committed (record present, checksum matches) or not (record missing, or file different
from the record), and a resume rewrites exactly the shards that are not.

Records live in the cache directory at ``<cache>/commits/<array path>/<shard index>.json``
(:mod:`janus_cache.store.layout`), one file per shard, so any number of processes may commit different shards at the same time without
sharing a file. The shard *plan* (which rows form which shard) is :func:`shard_plan`; it depends
only on the item count and the shard size, never on how many processes write.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from janus_cache.store.errors import StoreError
from janus_cache.store.layout import CacheLayout, is_table_array
from janus_cache.store.layout import commit_record as commit_record_path
from janus_cache.store.location import cache_location, join, open_binary, regular_size, relative_name, sha256_of
from janus_core.system.files import atomic_write_bytes, fsync_path

CHECKSUM_MODES: tuple[str, ...] = ("all", "sample", "none")
"""Which committed shards a check hashes (the trust policy of resume and verify, see :func:`hashed`)."""

SAMPLE_STRIDE = 16
"""``sample`` mode hashes one shard in this many of each frame / feature / tar array."""


def hashed(checksums: str, array: str, shard: int, n_shards: int, seed: int = 0) -> bool:
    """Whether checksum mode ``checksums`` hashes shard ``shard`` of ``array`` (``n_shards`` shards).

    ``all`` hashes every shard and ``none`` none (a committed shard is then trusted by its commit
    record and its file's byte size: no payload byte is read). ``sample`` hashes every table column
    (metadata: small, and every row of the cache depends on it) and, of every other array, the
    shards ``i`` with ``i % 16 == seed % min(16, n_shards)``: one in 16, at least one per array,
    deterministic, and another subset for another ``seed``.
    """
    if checksums not in CHECKSUM_MODES:
        raise ValueError(f"checksums must be one of {', '.join(CHECKSUM_MODES)}, got {checksums!r}")
    if checksums == "sample" and not is_table_array(array):
        return shard % SAMPLE_STRIDE == seed % max(1, min(SAMPLE_STRIDE, n_shards))
    return checksums != "none"


def shard_plan(n_items: int, per_shard: int) -> list[range]:
    """Row ranges of the shards of ``n_items`` rows, ``per_shard`` rows each (the last may be short).

    Deterministic and independent of the number of processes: shard ``i`` always holds rows
    ``[i * per_shard, min((i + 1) * per_shard, n_items))``.

    >>> shard_plan(5, 2)
    [range(0, 2), range(2, 4), range(4, 5)]
    """
    if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 0:
        raise ValueError(f"n_items must be a non-negative int, got {n_items!r}")
    if isinstance(per_shard, bool) or not isinstance(per_shard, int) or per_shard < 1:
        raise ValueError(f"per_shard must be a positive int, got {per_shard!r}")
    return [range(start, min(start + per_shard, n_items)) for start in range(0, n_items, per_shard)]


# ----------------------------------------------------------------------------------------------
# commit records


@dataclass(frozen=True)
class CommitRecord:
    """Proof that shard ``shard`` of ``array`` (rows ``start:stop``) was completely written.

    ``array`` is the array's path inside the cache (e.g. ``frames/pad644``); ``file`` the shard
    file's path relative to the cache root; ``nbytes`` and ``sha256`` describe its bytes.
    """

    array: str
    shard: int
    start: int
    stop: int
    file: str
    nbytes: int
    sha256: str

    @property
    def rows(self) -> range:
        return range(self.start, self.stop)

    @property
    def name(self) -> str:
        """How messages name the shard: ``frames/pad644#3 (frames/pad644/c/3/0/0/0)``."""
        return f"{self.array}#{self.shard} ({self.file})"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "<record>") -> CommitRecord:
        try:
            data = json.loads(text)
            record = cls(
                array=str(data["array"]),
                shard=int(data["shard"]),
                start=int(data["start"]),
                stop=int(data["stop"]),
                file=str(data["file"]),
                nbytes=int(data["nbytes"]),
                sha256=str(data["sha256"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"commit record {source} is not a valid record: {exc!r}") from exc
        return record


@dataclass(frozen=True)
class ShardCheck:
    """Outcome of checking one planned shard: ``problem`` is None when the shard is good."""

    array: str
    shard: int
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def __str__(self) -> str:
        return f"{self.array}#{self.shard}: {'ok' if self.ok else self.problem}"


def read_record(root: Path, array: str, shard: int) -> CommitRecord | None:
    """The commit record of a shard, or None when the shard is not committed."""
    # Plain string paths: a start-up check reads one record per shard (tens of thousands), where
    # pathlib's parsing costs more than the read itself.
    path = join(root, commit_record_path(array, shard))
    try:
        with open_binary(path) as f:
            text = f.read().decode("utf-8")
    except FileNotFoundError:
        return None
    return CommitRecord.from_json(text, source=str(path))


def is_committed(root: Path, array: str, shard: int) -> bool:
    """Whether the shard's commit record exists (one ``stat``; for progress displays, which must
    not list the commit directory over and over)."""
    return CacheLayout(root).commit_record(array, shard).is_file()


def uncommit(root: Path, array: str, shard: int) -> None:
    """Remove a shard's record; called before rewriting the shard, so a crash leaves it uncommitted."""
    path = CacheLayout(root).commit_record(array, shard)
    if path.exists():
        path.unlink()
        fsync_path(path.parent)


def uncommit_array(root: Path, array: str) -> None:
    """Remove every record of ``array`` (used when the array is created afresh)."""
    directory = CacheLayout(root).commit_dir(array)
    if directory.is_dir():
        for record in directory.glob("*.json"):
            record.unlink()
        fsync_path(directory)


def commit_shard(root: Path, array: str, shard: int, rows: range, file: Path) -> CommitRecord:
    """Commit a shard whose file ``file`` is completely written (renamed into place).

    Fsyncs the file and its directory, checksums the bytes on disk, then writes the record
    atomically. Only after this returns does the shard count as written.
    """
    root = Path(root)
    file = Path(file)
    fsync_path(file)
    fsync_path(file.parent)
    nbytes, digest = sha256_of(file)
    record = CommitRecord(
        array=array,
        shard=shard,
        start=rows.start,
        stop=rows.stop,
        file=file.relative_to(root).as_posix(),
        nbytes=nbytes,
        sha256=digest,
    )
    atomic_write_bytes(CacheLayout(root).commit_record(array, shard), record.to_json().encode())
    return record


def verify_shard(root: Path, record: CommitRecord, checksum: bool = True) -> ShardCheck:
    """Check that the shard file of ``record`` exists and has exactly the recorded bytes
    (without ``checksum`` only its size is compared: cheap at any cache size)."""
    path = join(root, record.file)
    size = regular_size(path)
    if size is None:
        return ShardCheck(record.array, record.shard, f"shard {record.name} is missing its file {path}")
    nbytes, digest = sha256_of(path) if checksum else (size, record.sha256)
    if nbytes != record.nbytes:
        return ShardCheck(
            record.array,
            record.shard,
            f"shard {record.name} has {nbytes} bytes, its commit record says {record.nbytes} (truncated or rewritten)",
        )
    if digest != record.sha256:
        return ShardCheck(
            record.array,
            record.shard,
            f"shard {record.name} fails its checksum: sha256 {digest}, commit record says {record.sha256}",
        )
    return ShardCheck(record.array, record.shard)


def check_shard(root: Path, array: str, shard: int, rows: range, file: Path, verify: bool = True,
                checksum: bool = True) -> ShardCheck:
    """Whether planned shard ``shard`` of ``array`` (rows ``rows``, stored in ``file``) is committed.

    A shard is committed when its record exists and matches the plan (row range and file) and,
    with ``verify``, the file's bytes match the record's size and (``checksum``) sha256.
    """
    root = cache_location(root)
    try:
        record = read_record(root, array, shard)
    except StoreError as exc:
        return ShardCheck(array, shard, str(exc))
    return check_record(root, record, array, shard, rows, file, verify, checksum)


def check_record(root: Path, record: CommitRecord | None, array: str, shard: int, rows: range, file: Path,
                 verify: bool = True, checksum: bool = True) -> ShardCheck:
    """:func:`check_shard` for a record already read (None: the shard has none)."""
    if record is None:
        return ShardCheck(array, shard, f"shard {array}#{shard} is not committed (no commit record)")
    expected_file = relative_name(file, root)
    if (record.start, record.stop, record.file) != (rows.start, rows.stop, expected_file):
        return ShardCheck(
            array,
            shard,
            f"shard {record.name}: commit record is for rows {record.start}:{record.stop} in {record.file}, "
            f"the plan has rows {rows.start}:{rows.stop} in {expected_file}",
        )
    return verify_shard(root, record, checksum) if verify else ShardCheck(array, shard)
