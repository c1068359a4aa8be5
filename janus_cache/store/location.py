"""A cache's location: a local directory or a prefix in an S3 bucket, parsed once at the edge.

A command line's cache argument becomes a :data:`CacheLocation` with :func:`cache_location`
(``s3://BUCKET/PREFIX`` an :class:`~janus_cache.store.remote.path.S3Path`, anything else a
:class:`~pathlib.Path`) and is passed on as that type. The readers' few file operations that are
not ``Path`` methods (a string join and ``os.stat`` where tens of thousands of commit records are
read, the sha256 of a shard, opening a file to stream it) take either kind here.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from janus_cache.store.remote.path import S3Path, is_s3_url
from janus_core.system.files import sha256_stream

CacheLocation = Path | S3Path
"""Where a cache is: a local directory, or a prefix of a bucket (read in place)."""


def cache_location(value: str | os.PathLike[str] | S3Path) -> CacheLocation:
    """The typed location of a cache argument (``s3://…`` a bucket's prefix, else a local path)."""
    if isinstance(value, S3Path):
        return value
    if is_s3_url(value):
        return S3Path.parse(str(value))
    return Path(value)


def is_remote(location: object) -> bool:
    return isinstance(location, S3Path)


def join(root: str | os.PathLike[str] | S3Path, relative: str) -> str | S3Path:
    """``root/relative``: a plain string for a local root (cheaper than pathlib where a check reads
    one commit record per shard), an ``S3Path`` for a bucket's."""
    if isinstance(root, S3Path):
        return root / relative
    return os.path.join(root, relative)


def relative_name(file: str | os.PathLike[str] | S3Path, root: str | os.PathLike[str] | S3Path) -> str:
    """``file``'s name relative to ``root`` with ``/`` (as commit records name shard files)."""
    if isinstance(file, S3Path) and isinstance(root, S3Path):
        return file.relative_to(root).as_posix()
    return Path(os.path.relpath(file, root)).as_posix()


def regular_size(path: str | os.PathLike[str] | S3Path) -> int | None:
    """The byte size of the regular file (or object) at ``path``; None when there is none."""
    if isinstance(path, S3Path):
        found = path.head()
        return None if found is None else int(found["size"])
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def open_binary(path: str | os.PathLike[str] | S3Path) -> BinaryIO:
    """``path`` opened to read its bytes from the start (a local file, or one streamed GET)."""
    if isinstance(path, S3Path):
        return path.open("rb")  # type: ignore[return-value]
    return open(path, "rb")


def sha256_of(path: str | os.PathLike[str] | S3Path) -> tuple[int, str]:
    """``(byte size, sha256 hex digest)`` of the file or object at ``path``."""
    with open_binary(path) as stream:
        return sha256_stream(stream)
