"""zarr's view of a cache in a bucket: zarr-python 3's ``ObjectStore`` over obstore's ``S3Store``,
read-only, strict, and keeping each shard's index.

* **Strict**: a chunk or shard object that is missing is a
  :class:`~janus_cache.store.damage.MissingChunk` naming its URL (zarr would read the fill value),
  as :class:`~janus_cache.store.damage.StrictLocalStore` does on disk; every chunk is still checked
  by its crc32c codec, so a remote read is checked exactly as a local one.
* **One GET per array read**: zarr reads the inner chunks of a sharded array with a suffix range
  for the shard's index and then one range per chunk, and does not keep the index. The index of an
  object does not change while it is read (a cache in a bucket changes only by a push, and a push
  into a cache being trained from is documented as unsafe), so this store keeps each shard's index
  bytes once per process (a reader, a DataLoader worker), bounded by :data:`INDEX_CACHE_BYTES` (the
  oldest go first); and before a read of several chunks of one shard (a window's frames, stored
  close together) :meth:`StrictObjectStore.read_ahead` fetches them with one ranged GET (or one per
  group of chunks more than :data:`READ_AHEAD_GAP` apart), from which zarr's per-chunk reads are
  then answered. Every chunk is still decoded and checked by zarr (its crc32c).
* **Counted**: GETs and bytes received, for the benchmark (:data:`REQUESTS`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
from zarr.abc.store import RangeByteRequest, SuffixByteRequest
from zarr.storage import ObjectStore

from janus_cache.store.damage import MissingChunk
from janus_cache.store.layout import ZARR_ROOT_NAME
from janus_cache.store.remote.client import bucket_store, remote_error
from janus_cache.store.remote.path import S3Path
from janus_cache.store.stalls import reading

INDEX_ENTRY_BYTES = 16
"""A shard index holds (offset, nbytes) as two little-endian uint64 per inner chunk, then a crc32c."""
CRC_BYTES = 4
EMPTY_CHUNK = 2 ** 64 - 1
"""The index entry of an inner chunk that was never written."""

READ_AHEAD = True
"""Whether a read of several chunks of a shard fetches them at once (the benchmark compares)."""
READ_AHEAD_GAP = 1 << 20
"""Chunks this close are fetched in one GET, the bytes between them too (object_store's own choice
for ranged reads: reading 1 MiB more costs less than another request's latency)."""

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
    window_hits: int = 0
    """Chunk reads answered from a read-ahead span (no request)."""


REQUESTS = RequestCount()


class StrictObjectStore(ObjectStore):  # type: ignore[type-arg]
    """A read-only zarr ``ObjectStore`` of one cache root in a bucket (see the module docstring)."""

    def __init__(self, root: S3Path) -> None:
        super().__init__(bucket_store(root.bucket, root.key), read_only=True)
        self.root = root
        self._indexes: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._index_bytes = 0
        self._windows: dict[str, list[tuple[int, bytes]]] = {}
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
        if isinstance(byte_range, RangeByteRequest) and (ahead := self._from_window(key, byte_range)) is not None:
            return prototype.buffer.from_bytes(ahead)
        try:
            with reading(f"{self.root}/{key}"):  # a read that stalls is named (janus_cache.store.stalls)
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


    def _from_window(self, key: str, wanted: RangeByteRequest) -> bytes | None:
        with self._lock:
            windows = list(self._windows.get(key, ()))
        for begin, data in windows:
            if begin <= wanted.start and wanted.end <= begin + len(data):
                REQUESTS.window_hits += 1
                return data[wanted.start - begin:wanted.end - begin]
        return None

    def _index(self, key: str, n_chunks: int) -> np.ndarray | None:
        """The ``(offset, nbytes)`` of each inner chunk of shard ``key`` (kept, or one suffix GET),
        or None when the shard is missing or its index fails its crc32c (zarr's own read then names
        the damage)."""
        import obstore

        suffix = INDEX_ENTRY_BYTES * n_chunks + CRC_BYTES
        data = self._kept_index(key, suffix)
        if data is None:
            try:
                data = bytes(obstore.get(self.store, key, options={"range": {"suffix": suffix}}).bytes())
            except FileNotFoundError:  # zarr's own read names the missing shard (MissingChunk)
                return None
            except Exception as err:  # noqa: BLE001
                raise remote_error(err, str(self.root / key)) from None
            REQUESTS.gets += 1
            REQUESTS.bytes += len(data)
            self._keep_index(key, suffix, data)
        body, crc = data[:-CRC_BYTES], int.from_bytes(data[-CRC_BYTES:], "little")
        if int(google_crc32c.value(body)) != crc:
            return None
        return np.frombuffer(body, dtype="<u8").reshape(n_chunks, 2)

    def read_ahead(self, array: Any, path: str, spans: list[tuple[int, int]]) -> None:
        """Fetch the bytes of the inner chunks that the row ranges ``spans`` of ``array`` (at
        ``path``) cover, per shard in as few ranged GETs as gaps of at most :data:`READ_AHEAD_GAP`
        allow (one for a window's frames, which lie close together), unless zarr reads the whole
        shard in one GET itself; :meth:`forget_read_ahead` drops them after the read."""
        import obstore

        if not READ_AHEAD or tuple(array.chunks[1:]) != tuple(array.shape[1:]):
            return  # only arrays chunked by rows alone
        shard_rows, chunk_rows = array.shards[0], array.chunks[0]
        n_chunks = shard_rows // chunk_rows
        wanted: dict[int, set[int]] = {}
        for start, stop in spans:
            for row in range(start - start % chunk_rows, stop, chunk_rows):
                wanted.setdefault(row // shard_rows, set()).add(row % shard_rows // chunk_rows)
        for shard, chunks in wanted.items():
            if len(chunks) < 2 or len(chunks) == n_chunks:
                continue  # one chunk: one GET anyway; every chunk: zarr reads the shard whole
            key = f"{path}/{array.metadata.encode_chunk_key((shard,) + (0,) * (array.ndim - 1))}"
            index = self._index(key, n_chunks)
            if index is None:
                continue
            used = sorted((int(o), int(o + n)) for o, n in index[sorted(chunks)] if o != EMPTY_CHUNK)
            merged: list[list[int]] = []
            for begin, end in used:
                if merged and begin - merged[-1][1] <= READ_AHEAD_GAP:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([begin, end])
            if not merged:
                continue
            try:
                with reading(f"{self.root}/{key}"):
                    parts = obstore.get_ranges(self.store, key, starts=[b for b, _ in merged],
                                               ends=[e for _, e in merged])
            except Exception as err:  # noqa: BLE001
                raise remote_error(err, str(self.root / key)) from None
            REQUESTS.gets += len(merged)
            REQUESTS.bytes += sum(e - b for b, e in merged)
            with self._lock:
                self._windows.setdefault(key, []).extend((b, bytes(part)) for (b, _), part in zip(merged, parts))

    def forget_read_ahead(self) -> None:
        with self._lock:
            self._windows.clear()


_STORES: dict[tuple[int, S3Path], StrictObjectStore] = {}


def remote_zarr_store(root: S3Path) -> StrictObjectStore:
    """The process's zarr store of the cache at ``root`` (one per process: its shard indexes are kept
    across every array and reader of the cache in the process)."""
    key = (os.getpid(), root)
    store = _STORES.get(key)
    if store is None:
        store = _STORES[key] = StrictObjectStore(root)
    return store
