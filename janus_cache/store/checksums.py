"""Checksums of a cache's metadata files: recorded with every manifest write, checked on open.

Chunks carry their own crc32c, tar members theirs, shard files their commit records; what is left
is metadata, which says how to read all of them: the manifest, ``report.json``, every ``zarr.json``
of the cache's zarr group (an edited ``"endian"`` reads every value wrong without failing a
chunk check) and every webdataset ``layout.json``. ``checksums.json`` records the sha256 of each::

    {"files": {"manifest.json": "<sha256>", "frames/pad644/zarr.json": "...", ...},
     "manifest_keyed": "<sha256 of the manifest's keyed fields>",
     "sha256": "<sha256 of the two fields above as sorted JSON>"}

The last field lets a damaged ``checksums.json`` be told from damaged metadata; ``manifest_keyed``
lets a precompute rebuild a damaged manifest when its own settings have exactly that digest. Listing the
metadata visits the zarr group's groups and arrays (never the chunk directories), so recording
and checking cost a few small files at any cache size.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from janus_cache.store.damage import REPAIR_HINT
from janus_cache.store.layout import (
    MANIFEST_NAME,
    REPORT_NAME,
    WDS_DIR,
    WDS_LAYOUT_NAME,
    ZARR_ROOT_NAME,
    CacheLayout,
)
from janus_cache.store.location import cache_location, sha256_of
from janus_core.system.files import atomic_write_bytes


def _digest(body: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def metadata_files(root: Path | str) -> list[str]:
    """Every metadata file of the cache at ``root``, relative to it, sorted."""
    root = cache_location(root)
    found = [name for name in (MANIFEST_NAME, REPORT_NAME) if (root / name).is_file()]

    def visit(directory: Path) -> None:
        meta = directory / ZARR_ROOT_NAME
        if not meta.is_file():
            return
        found.append(meta.relative_to(root).as_posix())
        try:
            is_array = json.loads(meta.read_text()).get("node_type") == "array"
        except (ValueError, AttributeError):
            is_array = False  # damaged: recorded as it is, and refused when checked
        if not is_array:  # an array's subdirectories are its chunks
            for child in sorted(p for p in directory.iterdir() if p.is_dir()):
                visit(child)

    visit(root)
    found += sorted(p.relative_to(root).as_posix() for p in root.glob(f"{WDS_DIR}/*/*/{WDS_LAYOUT_NAME}"))
    return sorted(found)


def record_metadata(root: Path | str, manifest_keyed: str) -> dict[str, str]:
    """Write ``checksums.json`` for the metadata files now on disk (``manifest_keyed``: the digest of
    the manifest's keyed fields); returns the recorded file digests."""
    root = cache_location(root)
    body: dict[str, object] = {"files": {name: sha256_of(root / name)[1] for name in metadata_files(root)},
                               "manifest_keyed": manifest_keyed}
    text = json.dumps({**body, "sha256": _digest(body)}, sort_keys=True, indent=1) + "\n"
    atomic_write_bytes(CacheLayout(root).checksums, text.encode())
    return dict(body["files"])  # type: ignore[call-overload]


def _recorded(root: Path | str) -> dict[str, object] | None:
    path = CacheLayout(cache_location(root)).checksums
    try:
        data = json.loads(path.read_text())
        body = {"files": {str(k): str(v) for k, v in data["files"].items()},
                "manifest_keyed": str(data["manifest_keyed"])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return body if data.get("sha256") == _digest(body) else None


def recorded_metadata(root: Path | str) -> dict[str, str] | None:
    """The recorded digests, or None when ``checksums.json`` is missing or damaged."""
    body = _recorded(root)
    return None if body is None else dict(body["files"])  # type: ignore[call-overload]


def recorded_manifest_keyed(root: Path | str) -> str | None:
    """The recorded digest of the manifest's keyed fields, or None when ``checksums.json`` is missing
    or damaged."""
    body = _recorded(root)
    return None if body is None else str(body["manifest_keyed"])


def changed_metadata(root: Path | str) -> list[str]:
    """Recorded metadata files that are missing or differ from their recorded sha256 (relative paths;
    every file when the record itself is missing or damaged)."""
    root = cache_location(root)
    recorded = recorded_metadata(root)
    if recorded is None:
        return metadata_files(root)
    return [name for name, digest in sorted(recorded.items())
            if not (root / name).is_file() or sha256_of(root / name)[1] != digest]


def metadata_problems(root: Path | str) -> list[str]:
    """One line per metadata file that does not match ``checksums.json`` (empty when all do)."""
    root = cache_location(root)
    path = CacheLayout(root).checksums
    recorded = recorded_metadata(root)
    if recorded is None:
        state = "is damaged" if path.exists() else "is missing (its precompute did not finish)"
        return [f"{path} {state}, so the cache's metadata cannot be checked; {REPAIR_HINT}"]
    problems = []
    for name, digest in sorted(recorded.items()):
        file = root / name
        if not file.is_file():
            problems.append(f"{file} is missing; {REPAIR_HINT}")
        elif sha256_of(file)[1] != digest:
            problems.append(f"{file} differs from the sha256 recorded when the cache was written (edited or "
                            f"damaged); {REPAIR_HINT}")
    return problems
