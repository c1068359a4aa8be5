"""Compression settings of stored frames and features: one definition for both cache formats.

Both formats compress with zstd inside blosc. Blosc's shuffle filter regroups the bytes
(``shuffle``) or bits (``bitshuffle``) of neighbouring values before zstd sees them. The settings
below are measured by ``benchmarks/bench_store.py`` (ratio, MB/s per core):

* frames (uint8, rendered sample episodes): no shuffle. Bitshuffle compresses half as well
  (pad644, level 5: 13.9x vs 6.9x); byte shuffle is a no-op on 1-byte values. Level 5 is ~8 %
  smaller than level 3 at ~210 MB/s, far above what decoding PNG/JPEG sources delivers.
* features (bf16 stored as uint16): byte shuffle, level 3. It splits each value into a
  sign/exponent byte (which compresses well) and a mantissa byte; bitshuffle does worse on
  bf16: 1.93x vs 2.30x on the tiny encoder's features, 1.31x vs 1.36x on N(0, 1) values of
  VGGT-1B shape, and level 5 costs 2x the encode time for at most 5 % fewer bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import numcodecs
import numpy as np
from zarr.codecs import BloscCodec, BloscShuffle, Crc32cCodec

Shuffle = Literal["noshuffle", "shuffle", "bitshuffle"]

_NUMCODECS_SHUFFLE: dict[str, int] = {
    "noshuffle": numcodecs.Blosc.NOSHUFFLE,
    "shuffle": numcodecs.Blosc.SHUFFLE,
    "bitshuffle": numcodecs.Blosc.BITSHUFFLE,
}


@dataclass(frozen=True)
class Compression:
    """A blosc configuration: compressor name, level (1-9) and shuffle filter."""

    cname: str
    clevel: int
    shuffle: Shuffle

    def __post_init__(self) -> None:
        if self.shuffle not in _NUMCODECS_SHUFFLE:
            raise ValueError(f"shuffle must be one of {sorted(_NUMCODECS_SHUFFLE)}, got {self.shuffle!r}")
        if not 0 <= self.clevel <= 9:
            raise ValueError(f"blosc clevel must be in 0..9, got {self.clevel}")

    def zarr_codec(self) -> BloscCodec:
        """The zarr v3 codec (its typesize follows the array's dtype)."""
        return BloscCodec(cname=self.cname, clevel=self.clevel, shuffle=BloscShuffle[self.shuffle])

    def zarr_codecs(self) -> tuple[BloscCodec, Crc32cCodec]:
        """The bytes-to-bytes codecs of every chunk: blosc, then a crc32c of the compressed bytes, so
        that every chunk read is checked (zarr's sharding codec checks its shard index the same way)."""
        return (self.zarr_codec(), Crc32cCodec())

    def encode(self, array: np.ndarray) -> bytes:
        """Compress the bytes of a C-contiguous array (the element size drives the shuffle)."""
        codec = numcodecs.Blosc(cname=self.cname, clevel=self.clevel, shuffle=_NUMCODECS_SHUFFLE[self.shuffle])
        return bytes(codec.encode(np.ascontiguousarray(array)))

    def to_dict(self) -> dict[str, str | int]:
        return {"cname": self.cname, "clevel": self.clevel, "shuffle": self.shuffle}


def decode(data: bytes, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
    """Decompress a blosc buffer produced by :meth:`Compression.encode` into a new writable array."""
    out = np.empty(shape, dtype=np.dtype(dtype))
    # Blosc's 16-byte header stores the uncompressed size at bytes 4..8; blosc would silently
    # fill only part of a larger destination, so the sizes are compared first.
    if len(data) < 16:
        raise ValueError(f"blosc buffer of {len(data)} bytes is shorter than a blosc header")
    (nbytes,) = struct.unpack_from("<I", data, 4)
    if nbytes != out.nbytes:
        raise ValueError(f"blosc buffer holds {nbytes} bytes, expected {out.nbytes} for {out.dtype} {tuple(shape)}")
    numcodecs.blosc.decompress(data, out)
    return out


FRAMES_COMPRESSION = Compression(cname="zstd", clevel=5, shuffle="noshuffle")
"""uint8 frames (zarr ``frames/<resolution>`` and the webdataset ``frames`` members)."""

FEATURES_COMPRESSION = Compression(cname="zstd", clevel=3, shuffle="shuffle")
"""VGGT features, bf16 stored as uint16 (or float32)."""

TABLES_COMPRESSION = Compression(cname="zstd", clevel=5, shuffle="shuffle")
"""Sample and frame tables (integers and UTF-8 bytes)."""
