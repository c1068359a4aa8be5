"""``s3://`` URLs for webdataset: a handler in its URL schemes (``webdataset.gopen.gopen_schemes``).

webdataset opens a shard URL through ``gopen``; it has no ``s3`` scheme of its own (only
``pipe:aws s3 cp ...``, a subprocess per shard, which its security switch refuses). Importing this
module registers :func:`gopen_s3`, which streams the object with one GET through the process's
obstore client (:meth:`~janus_cache.store.remote.path.S3Path.open`): the cache's tar shards (and
any webdataset pipeline given ``s3://`` URLs) stream from the bucket with the credentials of the
AWS configuration, and a failure is one line (:class:`~janus_cache.store.remote.errors.RemoteError`).
"""

from __future__ import annotations

from typing import Any, BinaryIO

from webdataset.gopen import gopen_schemes

from janus_cache.store.remote.path import S3Path

SCHEME = "s3"


def gopen_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> BinaryIO:
    """webdataset's handler signature: ``url`` opened for reading as a stream."""
    if mode != "rb":
        raise ValueError(f"{url}: objects in a bucket are read ('rb') here, not opened with {mode!r}; "
                         "janus-cache push writes them")
    return S3Path.parse(url).open("rb")  # type: ignore[return-value]


gopen_schemes[SCHEME] = gopen_s3
