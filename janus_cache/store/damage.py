"""Damaged stored data: the error every reader raises, and the zarr store that never reads a fill value.

Every chunk a reader decodes is checked: zarr chunks end in a crc32c (the ``crc32c`` codec, also
on every shard index), webdataset members carry their own crc32c
(:mod:`janus_cache.store.wds_store`). A failed check, an undecodable chunk, or a chunk whose file is
missing is a :class:`DamagedData` naming the file (and the sample, where the reader knows it), so
that no caller ever consumes damaged bytes and every message is one line.

zarr reads a missing shard file (or chunk) as the array's fill value. :class:`StrictLocalStore`
refuses that on the read side: only metadata (``zarr.json``) may be absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zarr.storage import LocalStore

from janus_cache.store.commit import StoreError
from janus_cache.store.layout import ZARR_ROOT_NAME
from janus_cache.store.stalls import reading

REPAIR_HINT = "re-run the precompute command that made the cache with --checksums all to repair it"
"""What a user does about damaged data: precompute rewrites every shard that fails its checks (a
resume trusts a shard by its commit record and size; --checksums all hashes every one)."""


class DamagedData(StoreError):
    """Stored bytes failed their check (checksum, decoding, missing file), told in one line.

    ``file`` is the damaged file, ``reason`` what is wrong with it, ``key`` the sample it was read
    for (when the reader knows it), ``samples`` how many samples the damage makes unreadable (a
    stream that cannot go on in a tar shard loses the rest of it). Picklable with its fields, so it
    survives a DataLoader worker.
    """

    def __init__(self, file: str | Path, reason: str, key: str | None = None, samples: int = 1) -> None:
        self.file, self.reason, self.key, self.samples = str(file), reason, key, samples
        sample = f" (read for sample {key})" if key else ""
        super().__init__(f"damaged cache data: {self.file}: {reason}{sample}; {REPAIR_HINT}")

    def for_sample(self, key: str) -> DamagedData:
        """The same damage, naming the sample it was read for."""
        return type(self)(self.file, self.reason, key, self.samples)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.file, self.reason, self.key, self.samples))


class MissingChunk(DamagedData):
    """A chunk or shard file of an array is missing (zarr would have read its fill value)."""

    def __init__(self, file: str | Path, reason: str = "file missing", key: str | None = None,
                 samples: int = 1) -> None:
        super().__init__(file, reason, key, samples)


def describe(err: BaseException) -> str:
    """A short reason for a failed decode: crc32c mismatch, blosc error..."""
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    if "checksum" in text.lower():
        return "checksum mismatch (crc32c)"
    return f"cannot be decoded ({type(err).__name__}: {text[:120]})"


class StrictLocalStore(LocalStore):
    """A read-only :class:`~zarr.storage.LocalStore` on which a missing chunk or shard is an error."""

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        with reading(f"{self.root}/{key}"):  # a read that stalls is named (janus_cache.store.stalls)
            buffer = await super().get(key, prototype, byte_range)
        if buffer is None and not key.endswith(ZARR_ROOT_NAME):
            raise MissingChunk(Path(self.root) / key)
        return buffer
