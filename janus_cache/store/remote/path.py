"""``S3Path``: a place in a bucket, ``s3://BUCKET/KEY``, read like a read-only :class:`pathlib.Path`.

The store's readers name a cache's files relative to its root (``root / "manifest.json"``) and
read them with ``read_text``, ``read_bytes``, ``is_file``, ``stat``, ``iterdir``, ``glob`` and
``open``; an ``S3Path`` root answers those with obstore requests (a GET, a HEAD, a LIST), so the
checks that run on a local cache (its metadata checksums, its commit records, every chunk's
crc32c) run unchanged on a bucket. There is no writing through it: a cache in a bucket is written
by ``janus-cache push`` (:mod:`janus_cache.transfer`) and read in place.

Keys use ``/`` as directories do; a "directory" is a key prefix that some object lies under. The
value itself is plain data (picklable, hashable, no connection): I/O goes through
:func:`janus_cache.store.remote.client.bucket_store` of the process that does it.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from janus_cache.store.remote.client import bucket_store, remote_error
from janus_cache.store.remote.errors import ObjectMissing, RemoteError
from janus_core.system.files import HASH_BLOCK

SCHEME = "s3://"
STREAM_CHUNK_BYTES = HASH_BLOCK
"""A streamed GET (a tar shard, a shard being hashed) hands its body over in pieces of this size
(the block a local file is hashed in)."""


def is_s3_url(text: object) -> bool:
    return isinstance(text, str) and text.startswith(SCHEME)


@dataclass(frozen=True)
class ObjectStat:
    """What ``stat()`` of an object says: a regular file of ``st_size`` bytes."""

    st_size: int
    st_mode: int = stat.S_IFREG | 0o444


@dataclass(frozen=True, slots=True)
class S3Path:
    """``s3://bucket/key``; ``key`` has no leading or trailing ``/`` (``""``: the bucket's root)."""

    bucket: str
    key: str = ""

    def __post_init__(self) -> None:
        if not self.bucket or "/" in self.bucket:
            raise ValueError(f"{SCHEME}{self.bucket}: an S3 URL is s3://BUCKET/PREFIX")
        key = "/".join(part for part in self.key.split("/") if part)
        if any(part in (".", "..") for part in key.split("/")):
            raise ValueError(f"{SCHEME}{self.bucket}/{self.key}: '.' and '..' are not keys of a bucket")
        object.__setattr__(self, "key", key)

    @classmethod
    def parse(cls, text: str) -> S3Path:
        """``s3://BUCKET[/PREFIX]`` (a ValueError naming the text otherwise)."""
        if not is_s3_url(text):
            raise ValueError(f"{text!r} is not an S3 URL (s3://BUCKET/PREFIX)")
        bucket, _, key = text[len(SCHEME):].partition("/")
        return cls(bucket, key)

    # -- pure path operations --------------------------------------------------------------------

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.key}" if self.key else f"{SCHEME}{self.bucket}"

    def __repr__(self) -> str:
        return f"S3Path({str(self)!r})"

    def __truediv__(self, other: str | PurePosixPath) -> S3Path:
        return S3Path(self.bucket, posixpath.join(self.key, str(other)) if self.key else str(other))

    def joinpath(self, *others: str) -> S3Path:
        path = self
        for other in others:
            path = path / other
        return path

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> S3Path:
        return S3Path(self.bucket, self.key.rsplit("/", 1)[0] if "/" in self.key else "")

    def with_name(self, name: str) -> S3Path:
        return self.parent / name

    def relative_to(self, other: S3Path) -> PurePosixPath:
        if other.bucket != self.bucket or not (other.key == "" or self.key == other.key
                                               or self.key.startswith(other.key + "/")):
            raise ValueError(f"{self} is not under {other}")
        return PurePosixPath(self.key[len(other.key):].lstrip("/") or ".")

    def as_posix(self) -> str:
        return str(self)

    def absolute(self) -> S3Path:
        return self

    def resolve(self) -> S3Path:
        return self

    # -- requests ----------------------------------------------------------------------------------

    def _store(self) -> Any:
        return bucket_store(self.bucket)

    def _failed(self, err: BaseException) -> RemoteError:
        return remote_error(err, str(self))

    def read_bytes(self) -> bytes:
        import obstore

        try:
            return bytes(obstore.get(self._store(), self.key).bytes())
        except Exception as err:  # noqa: BLE001 - every obstore failure becomes one line
            raise self._failed(err) from None

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def head(self) -> dict[str, Any] | None:
        """The object's size, ETag and user metadata (``{"size", "e_tag", "metadata"}``), or None
        when there is no object at this key."""
        import obstore

        try:
            result = obstore.get(self._store(), self.key, options={"head": True})
        except Exception as err:  # noqa: BLE001
            failure = self._failed(err)
            if isinstance(failure, ObjectMissing):
                return None
            raise failure from None
        meta = result.meta
        return {"size": int(meta["size"]), "e_tag": meta.get("e_tag"), "metadata": dict(result.attributes)}

    def stat(self) -> ObjectStat:
        found = self.head()
        if found is None:
            raise ObjectMissing(f"{self} does not exist")
        return ObjectStat(found["size"])

    def is_file(self) -> bool:
        return self.key != "" and self.head() is not None

    def is_dir(self) -> bool:
        """Whether any object lies under this key (a prefix holding nothing does not exist in S3)."""
        import obstore

        prefix = self.key + "/" if self.key else None
        try:
            for chunk in obstore.list(self._store(), prefix, chunk_size=1):
                return bool(chunk)
        except Exception as err:  # noqa: BLE001
            raise self._failed(err) from None
        return False

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def iterdir(self) -> Iterator[S3Path]:
        """The objects and the "directories" right under this key, in key order."""
        import obstore

        prefix = self.key + "/" if self.key else None
        try:
            listed = obstore.list_with_delimiter(self._store(), prefix)
        except Exception as err:  # noqa: BLE001
            raise self._failed(err) from None
        keys = [str(p) for p in listed["common_prefixes"]] + [str(o["path"]) for o in listed["objects"]]
        for key in sorted(keys):
            yield S3Path(self.bucket, key)

    def walk_objects(self) -> Iterator[tuple[str, int]]:
        """Every object under this key, recursively: ``(key relative to this one, size)``, in key order."""
        import obstore

        prefix = self.key + "/" if self.key else None
        try:
            for chunk in obstore.list(self._store(), prefix, chunk_size=1000):
                for meta in chunk:
                    yield str(meta["path"])[len(prefix or ""):], int(meta["size"])
        except Exception as err:  # noqa: BLE001
            raise self._failed(err) from None

    def glob(self, pattern: str) -> Iterator[S3Path]:
        """The objects under this key whose relative keys match ``pattern`` segment by segment
        (``*`` within one segment; no ``**``)."""
        parts = pattern.split("/")
        for relative, _ in self.walk_objects():
            segments = relative.split("/")
            if len(segments) == len(parts) and all(fnmatch.fnmatchcase(s, p) for s, p in zip(segments, parts)):
                yield self / relative

    def open(self, mode: str = "rb", buffering: int = STREAM_CHUNK_BYTES) -> io.BufferedReader:
        """The object's bytes as a stream, from one GET (a read-only binary file)."""
        if mode not in ("r", "rb"):
            raise ValueError(f"{self} opens for reading ('rb') only, not {mode!r}")
        return io.BufferedReader(ObjectReader(self), buffer_size=max(buffering, io.DEFAULT_BUFFER_SIZE))


class ObjectReader(io.RawIOBase):
    """A raw, forward-only reader of one object's body (one streamed GET, started on first read)."""

    def __init__(self, path: S3Path) -> None:
        super().__init__()
        self.path = path
        self._chunks: Iterator[Any] | None = None
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _next_chunk(self) -> bool:
        import obstore

        try:
            if self._chunks is None:
                result = obstore.get(self.path._store(), self.path.key)
                self._chunks = iter(result.stream(min_chunk_size=STREAM_CHUNK_BYTES))
            self._pending = memoryview(next(self._chunks))
        except StopIteration:
            return False
        except Exception as err:  # noqa: BLE001
            raise remote_error(err, str(self.path)) from None
        return True

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        while not self._pending:
            if not self._next_chunk():
                return 0
        n = min(len(target), len(self._pending))
        target[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n
