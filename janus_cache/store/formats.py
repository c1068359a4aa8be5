"""The cache formats, declared once: each one's name, what it is for, and its writer and reader.

A manifest names its format, :func:`~janus_cache.store.open_writer` and
:func:`~janus_cache.store.open_cache` pick the writer and reader from here, and the precompute
command line takes its ``--format`` choices from :data:`FORMATS`. The classes are named rather
than imported: they read and write tensors (torch), which a manifest or a command's help must not
load; the store package imports them on first use (its one lazy import, ``janus_cache.store``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CacheFormat:
    """One cache format: its name in manifests and on the command line, and its classes."""

    name: str
    purpose: str
    """What it is for, in a few words (``--format`` help)."""
    streaming: bool
    """Whether it is read as a stream (webdataset tars) rather than row by row at random."""
    writer: str
    reader: str

    def writer_class(self) -> type[Any]:
        return getattr(importlib.import_module(__package__), self.writer)

    def reader_class(self) -> type[Any]:
        return getattr(importlib.import_module(__package__), self.reader)


CACHE_FORMATS: tuple[CacheFormat, ...] = (
    CacheFormat("zarr", "random access", False, "ZarrCacheWriter", "ZarrCacheReader"),
    CacheFormat("wds", "streaming", True, "WdsCacheWriter", "WdsCacheReader"),
)
"""Every format a cache can be written in; the first is the default."""

FORMATS: tuple[str, ...] = tuple(f.name for f in CACHE_FORMATS)
DEFAULT_FORMAT = FORMATS[0]
FORMATS_HELP = " or ".join(f"{f.name} ({f.purpose})" for f in CACHE_FORMATS)
"""The formats as a command line's help names them."""


def cache_format(name: str) -> CacheFormat:
    """The format called ``name``; an unknown name is a ValueError naming the known ones."""
    for candidate in CACHE_FORMATS:
        if candidate.name == name:
            return candidate
    raise ValueError(f"cache format must be one of {', '.join(FORMATS)}, got {name!r}")
