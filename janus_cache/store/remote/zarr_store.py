"""zarr's view of a cache in a bucket: zarr-python 3's ``ObjectStore`` over obstore's ``S3Store``,
read-only, strict, and keeping each shard's index.

* **Strict**: a chunk or shard object that is missing is a
  :class:`~janus_cache.store.damage.MissingChunk` naming its URL (zarr would read the fill value),
  as :class:`~janus_cache.store.damage.StrictLocalStore` does on disk; every chunk is still checked
  by its crc32c codec, so a remote read is checked exactly as a local one.
* **One GET per chunk**: zarr reads one inner chunk of a sharded array with two requests, a suffix
  range for the shard's index and the chunk's range, and does not keep the index. The index of an
  object does not change while it is read (a cache in a bucket changes only by a push, and a push
  into a cache being trained from is documented as unsafe), so this store keeps each shard's index
  bytes once per process (a reader, a DataLoader worker): every later chunk of the shard costs one
  ranged GET. The indexes are bounded by :data:`INDEX_CACHE_BYTES` (the oldest go first).
* **Counted**: GETs and bytes received, for the benchmark (:data:`REQUESTS`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from zarr.abc.store import SuffixByteRequest
from zarr.storage import ObjectStore

from janus_cache.store.damage import MissingChunk
from janus_cache.store.layout import ZARR_ROOT_NAME
from janus_cache.store.remote.client import bucket_store, remote_error
from janus_cache.store.remote.path import S3Path

INDEX_CACHE_BYTES = 256 << 20
"""Shard indexes kept per process at most: 16 bytes per inner chunk plus 4, so ~16 MB holds the
indexes of 1,000 shards of 1,000 frames; a training cache's are far fewer bytes."""


@dataclass
class RequestCount:
    """GET requests and body bytes this process made through the remote zarr stores."""

    gets: int = 0
    bytes: int = 0
    index_hits: int = 0
    """Shard-index reads answered from the kept indexes (no request)."""


REQUESTS = RequestCount()


class StrictObjectStore(ObjectStore):  # type: ignore[type-arg]
    """A read-only zarr ``ObjectStore`` of one cache root in a bucket (see the module docstring)."""

    def __init__(self, root: S3Path) -> None:
        super().__init__(bucket_store(root.bucket, root.key), read_only=True)
        self.root = root
        self._indexes: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._index_bytes = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a remote zarr store belongs to the process that made it (obstore's clients do not "
                        "cross processes): reopen the cache in the new process")

    def _kept_index(self, key: str, suffix: int) -> bytes | None:
        with self._lock:
            found = self._indexes.get((key, suffix))
            if found is not None:
                self._indexes.move_to_end((key, suffix))
                REQUESTS.index_hits += 1
            return found

    def _keep_index(self, key: str, suffix: int, data: bytes) -> None:
        with self._lock:
            if (key, suffix) in self._indexes:
                return
            self._indexes[(key, suffix)] = data
            self._index_bytes += len(data)
            while self._index_bytes > INDEX_CACHE_BYTES and self._indexes:
                _, dropped = self._indexes.popitem(last=False)
                self._index_bytes -= len(dropped)

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        suffix = byte_range.suffix if isinstance(byte_range, SuffixByteRequest) else None
        if suffix is not None and (kept := self._kept_index(key, suffix)) is not None:
            return prototype.buffer.from_bytes(kept)
        try:
            buffer = await super().get(key, prototype, byte_range)
        except Exception as err:  # noqa: BLE001 - a connection or credential failure: one line
            raise remote_error(err, str(self.root / key)) from None
        if buffer is None:
            if key.endswith(ZARR_ROOT_NAME):
                return None
            raise MissingChunk(self.root / key)
        REQUESTS.gets += 1
        REQUESTS.bytes += len(buffer)
        if suffix is not None:
            self._keep_index(key, suffix, buffer.to_bytes())
        return buffer


_STORES: dict[tuple[int, S3Path], StrictObjectStore] = {}


def remote_zarr_store(root: S3Path) -> StrictObjectStore:
    """The process's zarr store of the cache at ``root`` (one per process: its shard indexes are kept
    across every array and reader of the cache in the process)."""
    key = (os.getpid(), root)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = StrictObjectStore(root)
    return store
