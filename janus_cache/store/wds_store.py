"""webdataset cache: tar shards of whole samples, for streaming.

A webdataset cache directory is the zarr group of :mod:`janus_cache.store.zarr_group` (frames
once per frame row and the tables: the tars are assembled from them, and verify re-derives from
them) plus, per window variant and resolution, ``wds/<variant>/<resolution>/`` (every path is
named in :mod:`janus_cache.store.layout`):

``layout.json``
    sample count, samples per shard, shapes and dtypes (written once, by the preparing process).
``shard-000000.tar``, ...
    ``samples_per_shard`` consecutive samples each, written with webdataset's ``TarWriter``.

Each sample is three tar members named ``<encoded key>.<extension>``:

``frames.blosc``
    the ``history + 1`` window frames, uint8 ``[history + 1, H, W, 3]``, blosc-zstd compressed
    (lossless; the same codec settings as the zarr frames);
``feature.blosc``
    the feature ``[N, 2C]``: bf16 as its uint16 bits (or float32), blosc-zstd (the zarr settings);
``json``
    ``{"key", "row", "resolution", "variant", "meta", "frames": {shape, dtype},
    "feature": {shape, dtype, stored_dtype}, "crc32c": {member: crc32c}, "json_crc32c"}``: the tar
    is self-describing, no zarr needed to read it. ``crc32c`` holds the checksums of the two other
    members' bytes, ``json_crc32c`` that of this JSON without that field (sorted keys), so every
    byte of a sample is checked when it is read.

Cached ViT features (``cache.vit_features``) are not in the tars: they stay once per frame in the
zarr group (``vit/<resolution>``), and a reader opened with ``vit_features=True`` gives each sample
its window's rows from there (:func:`with_vit_features`).

Reading streams each tar shard of the rank and worker in order and checks every sample: its
members' checksums, its row (the shard's next one) and, at the end of the shard, that every
sample was there (a damaged tar header ends Python's tar reader early and silently). Damage is a
:class:`~janus_cache.store.damage.DamagedData` naming the tar file and sample.

Key encoding: webdataset splits a member name into key and extension at the first ``.`` of its
base name, and ``/`` would make directories. Sample keys are therefore percent-encoded
(RFC 3986 style, as :func:`urllib.parse.quote` with no safe characters) and ``.`` is encoded as
``%2E`` too, leaving only ``A-Z a-z 0-9 _ - ~ %`` in member names; :func:`decode_key` inverts it
and the JSON member carries the original key as well.

Every shard is written to a temporary name, fsynced, renamed into place and then committed
(:mod:`janus_cache.store.commit`). Tar headers carry fixed mtime, owner and mode, so equal
content gives byte-identical shards.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import google_crc32c
import numpy as np
import torch
import webdataset
from webdataset import gopen, tariterators

from janus_cache.store import split
from janus_cache.store.commit import (
    CommitRecord,
    ShardCheck,
    StoreError,
    check_shard,
    commit_shard,
    shard_plan,
    uncommit,
    uncommit_array,
)
from janus_cache.store.compression import (
    FEATURES_COMPRESSION,
    FRAMES_COMPRESSION,
    decode,
)
from janus_cache.store.damage import DamagedData, describe
from janus_cache.store.features import from_stored, stored_dtype, to_stored
from janus_cache.store.layout import (
    SAMPLES_TABLE,
    WDS_LAYOUT_NAME,
    WINDOW_ROWS_COLUMN,
    CacheLayout,
    frames_array,
    vit_array,
    wds_samples,
    wds_shard_name,
    wds_variant,
)
from janus_cache.store.location import cache_location, open_binary
from janus_cache.store.remote import wds as _s3_urls  # noqa: F401 - registers webdataset's s3:// handler
from janus_cache.store.remote.errors import RemoteError
from janus_cache.store.remote.path import is_s3_url
from janus_cache.store.records import CacheSample, SampleMeta
from janus_cache.store.stalls import reading
from janus_cache.store.zarr_group import PlannedShard, ZarrGroup, _check_name
from janus_cache.store.zarr_group_writer import VariantWriter
from janus_core.system.files import atomic_file, atomic_write_bytes, remove_partials

FRAMES_MEMBER = "frames.blosc"
FEATURE_MEMBER = "feature.blosc"
META_MEMBER = "json"
CRC_FIELD = "crc32c"
JSON_CRC_FIELD = "json_crc32c"


def crc32c(data: bytes) -> int:
    return int(google_crc32c.value(data))


def _header_bytes(header: dict[str, Any]) -> bytes:
    return json.dumps(header, sort_keys=True).encode()


def encode_key(key: str) -> str:
    """Sample key -> tar member base name (see the module docstring)."""
    return quote(key, safe="").replace(".", "%2E")


def decode_key(name: str) -> str:
    """Inverse of :func:`encode_key`."""
    return unquote(name)


@dataclass(frozen=True)
class WdsLayout:
    """What the shards of one variant and resolution hold."""

    variant: str
    resolution: str
    n_samples: int
    samples_per_shard: int
    window_frames: int
    frame_shape: tuple[int, int, int]
    feature_shape: tuple[int, int]
    feature_dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "frame_shape", tuple(int(x) for x in self.frame_shape))
        object.__setattr__(self, "feature_shape", tuple(int(x) for x in self.feature_shape))
        stored_dtype(self.feature_dtype)
        if self.samples_per_shard < 1:
            raise ValueError(f"samples_per_shard must be positive, got {self.samples_per_shard}")

    def plan(self) -> list[range]:
        return shard_plan(self.n_samples, self.samples_per_shard)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, indent=1) + "\n"

    @classmethod
    def read(cls, directory: Path) -> WdsLayout:
        path = directory / WDS_LAYOUT_NAME
        try:
            return cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise StoreError(f"{directory} holds no webdataset shards (no {WDS_LAYOUT_NAME})") from None
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{path} is not a valid webdataset layout: {exc}") from exc


def planned_tar_shards(root: Path, layout: WdsLayout) -> list[PlannedShard]:
    """The tar shards ``layout`` plans, each with its rows and file."""
    array = wds_samples(layout.variant, layout.resolution)
    paths = CacheLayout(root)
    return [PlannedShard(array, i, rows, paths.wds_shard(layout.variant, layout.resolution, i))
            for i, rows in enumerate(layout.plan())]


def check_planned(root: Path, planned: list[PlannedShard], verify: bool) -> list[ShardCheck]:
    return [check_shard(root, p.array, p.shard, p.rows, p.file, verify) for p in planned]


class WdsCacheWriter(VariantWriter):
    """Writes a webdataset cache for the window variant named ``variant``.

    Frames and tables go to the cache's zarr group exactly as for the zarr format; samples go to
    tar shards. Implements :class:`janus_cache.store.CacheWriter`.
    """

    format = "wds"

    def samples_array_path(self, resolution: str) -> str:
        return wds_samples(self.variant, resolution)

    def _directory(self, resolution: str) -> Path:
        return self.root / self.samples_array_path(resolution)

    def layout(self, resolution: str) -> WdsLayout:
        return WdsLayout.read(self._directory(resolution))

    def shard_path(self, resolution: str, shard: int) -> Path:
        return CacheLayout(self.root).wds_shard(self.variant, resolution, shard)

    def prepare_samples(self, resolution: str, feature_shape: tuple[int, int], feature_dtype: str,
                        samples_per_shard: int, grow: bool = False) -> None:
        """Record the shard layout of ``resolution`` (its frames must be prepared first). With
        ``grow`` (appending), a layout that differs only in having fewer samples is extended: full
        tar shards are kept, a partially filled last one is uncommitted (rewritten whole)."""
        _check_name("resolution", resolution)
        n_samples = self._sample_rows_checked()
        window = self._column_array(SAMPLES_TABLE, WINDOW_ROWS_COLUMN)
        frames = self._array(frames_array(resolution))
        layout = WdsLayout(
            variant=self.variant, resolution=resolution, n_samples=n_samples,
            samples_per_shard=int(samples_per_shard), window_frames=int(window.shape[1]),
            frame_shape=tuple(frames.shape[1:]), feature_shape=tuple(feature_shape), feature_dtype=feature_dtype,
        )
        directory = self._directory(resolution)
        file = directory / WDS_LAYOUT_NAME
        if file.is_file():
            try:
                existing = WdsLayout.read(directory)
            except StoreError:  # damaged: rewritten below; each tar shard still answers to its record
                existing = layout
            if grow and existing.n_samples < layout.n_samples \
                    and dataclasses.replace(existing, n_samples=layout.n_samples) == layout:
                if existing.n_samples % existing.samples_per_shard:
                    uncommit(self.root, self.samples_array_path(resolution),
                             existing.n_samples // existing.samples_per_shard)
                atomic_write_bytes(file, layout.to_json().encode())
                return
            if existing != layout:
                raise StoreError(f"{directory} holds shards of layout {existing}; asked for {layout} (if {file} was "
                                 "edited, rebuild the cache: precompute --overwrite)")
            if file.read_bytes() != layout.to_json().encode():
                atomic_write_bytes(file, layout.to_json().encode())
                self._repaired(f"{file.relative_to(self.root).as_posix()} (damaged or edited)")
            return
        uncommit_array(self.root, self.samples_array_path(resolution))
        atomic_write_bytes(file, layout.to_json().encode())

    def sample_shard_plan(self, resolution: str) -> list[range]:
        return self.layout(resolution).plan()

    def _planned_sample_shards(self, resolution: str) -> list[PlannedShard]:
        return planned_tar_shards(self.root, self.layout(resolution))

    def committed_sample_shards(self, resolution: str, verify: bool = True) -> set[int]:
        return {c.shard for c in check_planned(self.root, self._planned_sample_shards(resolution), verify) if c.ok}

    def planned_shards(self) -> list[PlannedShard]:
        """The zarr arrays' shards, then the tar shards of every resolution."""
        # Auditing means every shard on disk, so here (and only here) the resolutions are listed.
        base = CacheLayout(self.root).path(wds_variant(self.variant))
        resolutions = sorted(p.name for p in base.iterdir() if (p / WDS_LAYOUT_NAME).is_file()) if base.is_dir() else []
        return super().planned_shards() + [p for r in resolutions for p in self._planned_sample_shards(r)]

    def write_samples_shard(self, resolution: str, shard: int, features: torch.Tensor | np.ndarray,
                            window_frames: np.ndarray | None = None) -> CommitRecord:
        """Write tar shard ``shard``: one sample per row of the shard.

        ``features`` is ``[rows, N, 2C]``; ``window_frames`` uint8 ``[rows, history + 1, H, W, 3]``
        (the frames the features were computed from). Without ``window_frames`` the windows are
        read from the cache's frames array.
        """
        layout = self.layout(resolution)
        plan = layout.plan()
        if not 0 <= shard < len(plan):
            raise StoreError(f"{self.samples_array_path(resolution)} has {len(plan)} shards; there is no shard {shard}")
        rows = plan[shard]
        name = f"{self.samples_array_path(resolution)}#{shard}"
        stored = to_stored(features, layout.feature_dtype)
        if stored.shape != (len(rows), *layout.feature_shape):
            raise StoreError(f"shard {name} needs features {(len(rows), *layout.feature_shape)}, got {stored.shape}")
        if window_frames is None:
            window_frames = self._read_windows(resolution, rows)
        frames = np.asarray(window_frames.cpu() if isinstance(window_frames, torch.Tensor) else window_frames)
        expected = (len(rows), layout.window_frames, *layout.frame_shape)
        if frames.shape != expected or frames.dtype != np.uint8:
            raise StoreError(f"shard {name} needs uint8 window frames {expected}, got {frames.dtype} {frames.shape}")

        final = self.shard_path(resolution, shard)
        uncommit(self.root, self.samples_array_path(resolution), shard)
        final.unlink(missing_ok=True)
        remove_partials(final)
        with atomic_file(final) as stream:
            self._write_tar(stream, layout, rows, frames, stored)
        return commit_shard(self.root, self.samples_array_path(resolution), shard, rows, final)

    def _read_windows(self, resolution: str, rows: range) -> np.ndarray:
        window = self._column_array(SAMPLES_TABLE, WINDOW_ROWS_COLUMN)[rows.start:rows.stop]
        frames = self.frames(resolution, window.reshape(-1))
        return frames.reshape(*window.shape, *frames.shape[1:])

    def _write_tar(self, stream: io.BufferedWriter, layout: WdsLayout, rows: range, frames: np.ndarray,
                   features: np.ndarray) -> None:
        writer = webdataset.TarWriter(stream, encoder=False, mtime=0, user="janus", group="janus",
                                      mode=0o444, format="PAX_FORMAT")
        try:
            for i, row in enumerate(rows):
                key, meta = self.sample_meta_row(row)
                header = {
                    "key": key,
                    "row": row,
                    "resolution": layout.resolution,
                    "variant": layout.variant,
                    "meta": meta,
                    "frames": {"shape": list(frames.shape[1:]), "dtype": "uint8"},
                    "feature": {"shape": list(features.shape[1:]), "dtype": layout.feature_dtype,
                                "stored_dtype": features.dtype.name},
                }
                payloads = {FRAMES_MEMBER: FRAMES_COMPRESSION.encode(frames[i]),
                            FEATURE_MEMBER: FEATURES_COMPRESSION.encode(features[i])}
                header[CRC_FIELD] = {member: crc32c(data) for member, data in payloads.items()}
                header[JSON_CRC_FIELD] = crc32c(_header_bytes(header))
                writer.write({"__key__": encode_key(key), **payloads, META_MEMBER: _header_bytes(header)})
        finally:
            writer.close()


def checked_header(raw: dict[str, Any], row: int | None = None) -> dict[str, Any]:
    """The JSON header of a raw sample after checking every member's crc32c, the key and (given)
    the row; damage is a :class:`DamagedData` naming the tar file and the sample."""
    where = str(raw.get("__url__", "<stream>"))
    key = decode_key(str(raw.get("__key__")))
    missing = [m for m in (META_MEMBER, FRAMES_MEMBER, FEATURE_MEMBER) if m not in raw]
    if missing:
        raise DamagedData(where, f"sample lacks the member(s) {missing}", key)
    try:
        header = json.loads(raw[META_MEMBER])
        stored_crc = header.pop(JSON_CRC_FIELD)
        json_ok = crc32c(_header_bytes(header)) == stored_crc
        member_crc = {m: int(header[CRC_FIELD][m]) for m in (FRAMES_MEMBER, FEATURE_MEMBER)}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise DamagedData(where, f"member {raw.get('__key__')}.{META_MEMBER} {describe(err)}", key) from None
    if not json_ok:
        raise DamagedData(where, f"member {raw.get('__key__')}.{META_MEMBER} fails its crc32c", key)
    bad = [f"{raw['__key__']}.{m}" for m, crc in member_crc.items() if crc32c(raw[m]) != crc]
    if bad:
        raise DamagedData(where, f"member(s) {', '.join(bad)} fail their crc32c", key)
    if header.get("key") != key:
        raise DamagedData(where, f"sample {key!r} holds the header of {header.get('key')!r}", key)
    if row is not None and header.get("row") != row:
        raise DamagedData(where, f"sample {key!r} is row {header.get('row')}, the shard's next row is {row}", key)
    return header


def decode_sample(raw: dict[str, Any], row: int | None = None) -> CacheSample:
    """A raw webdataset sample (member extension -> bytes) -> the cache's :class:`CacheSample`, every
    member checked (:func:`checked_header`)."""
    header = checked_header(raw, row)
    where = f"{raw.get('__url__', '<stream>')} member {raw.get('__key__')!r}"
    try:
        frames = decode(raw[FRAMES_MEMBER], header["frames"]["dtype"], tuple(header["frames"]["shape"]))
        spec = header["feature"]
        stored = decode(raw[FEATURE_MEMBER], spec["stored_dtype"], tuple(spec["shape"]))
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        raise DamagedData(str(raw.get("__url__", "<stream>")), describe(err), header.get("key")) from None
    return CacheSample(
        key=header["key"],
        row=int(header["row"]),
        frames=frames,
        feature=from_stored(stored, spec["dtype"]),
        meta=SampleMeta.from_row(header["meta"], where),
    )


def read_shard(path: str, rows: range, keep: AbstractSet[int] | None = None) -> Iterator[CacheSample | DamagedData]:
    """The samples of one tar shard holding rows ``rows``, checked; damage is yielded, not raised:
    a damaged sample as one :class:`DamagedData`, and where the tar itself cannot be read on (or
    ends early) one more standing for every sample not read.

    ``keep``: only these rows are decoded and yielded (e.g. a training stream without the held-out
    episodes); the others are passed over unread, and damage counts only the kept samples it costs."""
    read = 0

    def unread() -> int:  # kept samples the stream still owes after ``read``
        return sum(1 for row in rows[read:] if keep is None or row in keep)

    try:
        # A local file, or an s3:// URL through the handler janus_cache.store.remote.wds registers; a stalled
        # read names its tar (janus_cache.store.stalls).
        with reading(path), (gopen(path, "rb") if is_s3_url(path) else open(path, "rb")) as stream:
            members = ({**m, "__url__": path} for m in tariterators.tar_file_iterator(stream))
            for raw in tariterators.group_by_keys(members):
                if read >= len(rows):
                    yield DamagedData(path, f"holds more than its {len(rows)} samples")
                    return
                row = rows.start + read
                read += 1
                if keep is not None and row not in keep:
                    continue
                try:
                    sample: CacheSample | DamagedData = decode_sample(raw, row)
                except DamagedData as err:
                    sample = err
                yield sample
    except RemoteError:  # the bucket's failure, not the tar's: one line of its own
        raise
    except Exception as err:  # noqa: BLE001 - an unreadable tar (missing, damaged header...)
        if unread():
            yield DamagedData(path, f"tar cannot be read after {read} of its {len(rows)} samples ({describe(err)})",
                              samples=unread())
        return
    if read < len(rows) and unread():
        yield DamagedData(path, f"holds {read} of its {len(rows)} samples (a tar header is damaged)",
                          samples=unread())


def read_shards(urls: Iterable[dict[str, Any]], plan: dict[str, range], damaged: str = "raise",
                keep: AbstractSet[int] | None = None) -> Iterator[CacheSample | DamagedData]:
    """webdataset pipeline stage: the checked samples of each shard URL (``plan``: URL -> rows;
    ``keep``: only these rows, see :func:`read_shard`). ``damaged="raise"`` raises the first
    :class:`DamagedData`, ``"yield"`` yields it in the stream (for a caller that skips and counts
    damaged samples)."""
    for url in urls:
        for item in read_shard(url["url"], plan[url["url"]], keep):
            if isinstance(item, DamagedData) and damaged == "raise":
                raise item
            yield item


def with_vit_features(samples: Iterable[CacheSample | DamagedData], group: ZarrGroup, resolution: str,
                      damaged: str = "raise") -> Iterator[CacheSample | DamagedData]:
    """webdataset pipeline stage: each sample with its window frames' cached ViT features read from
    the zarr group (chunks checked); damage is raised or yielded as ``damaged`` says."""
    for sample in samples:
        if isinstance(sample, CacheSample):
            try:
                sample = dataclasses.replace(
                    sample, vit_features=group.vit_features(resolution, sample.meta.window_rows))
            except DamagedData as err:
                if damaged == "raise":
                    raise err.for_sample(sample.key) from None
                sample = err.for_sample(sample.key)
        yield sample


class WdsCacheReader:
    """Streams the samples of one resolution and window variant of a webdataset cache, in shard
    order, as :class:`~janus_cache.store.records.CacheSample`.

    The reader reads exactly the ``resolution`` and ``variant`` it is given; open it through
    :func:`janus_cache.store.open_cache`, which checks them against the cache's manifest. Only
    committed shards are read; an incomplete cache is an error naming the missing shards.
    """

    format = "wds"

    def __init__(self, root: Path | str, resolution: str, variant: str, vit_features: bool = False) -> None:
        self.root = cache_location(root)
        _check_name("resolution", resolution)
        _check_name("variant", variant)
        self.resolution, self.variant = resolution, variant
        self.array = wds_samples(variant, resolution)
        self.layout = WdsLayout.read(self.root / self.array)
        # Cached ViT features stay once per frame in the zarr group (in the tars each frame would be
        # stored ~9 times: 5.4 MB per 644² frame); samples get their window's rows from there.
        self.vit_group = ZarrGroup(self.root, read_only=True) if vit_features else None
        if self.vit_group is not None and not self.vit_group.has_array(vit_array(resolution)):
            raise StoreError(f"cache {self.root} has no array {vit_array(resolution)!r}")

    def __len__(self) -> int:
        return self.layout.n_samples

    def check(self, verify: bool = True) -> list[ShardCheck]:
        """One check per planned shard (missing record, missing file, wrong checksum...)."""
        return check_planned(self.root, planned_tar_shards(self.root, self.layout), verify)

    def shard_paths(self, verify: bool = False) -> list[Path]:
        """Paths of all shards in order; StoreError naming every shard that is not committed.

        Without ``verify`` a shard counts when its commit record exists and matches the plan;
        with it, its checksum is checked too (reads every byte).
        """
        problems = [c for c in self.check(verify) if not c.ok]
        if problems:
            raise StoreError(f"webdataset cache {self.root} is incomplete: " + "; ".join(str(p) for p in problems))
        return [p.file for p in planned_tar_shards(self.root, self.layout)]

    def raw_samples(self, shard: int) -> Iterator[dict[str, Any]]:
        """The members of tar shard ``shard`` grouped by sample and not decoded, as webdataset
        groups them: ``{"__key__": encoded key, "__url__": path, extension: bytes}``. Reads the
        file whether or not it is committed (for checking its contents; :func:`decode_sample`
        decodes one)."""
        path = self.root / self.array / wds_shard_name(shard)
        with open_binary(path) as stream:
            members = ({**m, "__url__": str(path)} for m in tariterators.tar_file_iterator(stream))
            yield from tariterators.group_by_keys(members)

    def read_column(self, table: str, column: str) -> np.ndarray | list[str]:
        """One whole column of a table of the cache's zarr group (e.g. every sample's episode id)."""
        return ZarrGroup(self.root, read_only=True).read_column(table, column)

    def _shards_holding(self, rows: AbstractSet[int] | None) -> list[int]:
        """The tar shards holding at least one of ``rows`` (None: every shard), in order."""
        return [i for i, shard in enumerate(self.layout.plan()) if rows is None or any(r in rows for r in shard)]

    def rank_rows(self, rank: int, world: int, rows: AbstractSet[int] | None = None) -> list[int]:
        """The sample rows rank ``rank`` (of ``world``) streams from :meth:`dataset` given the same
        ``rows``, all its loader workers together (the stream's own split, without reading a shard)."""
        plan = self.layout.plan()
        mine = split.rank_and_worker_share(self._shards_holding(rows), rank, world)
        return [row for shard in mine for row in plan[shard] if rows is None or row in rows]

    def dataset(self, rank: int = 0, world: int = 1, damaged: str = "raise",
                rows: AbstractSet[int] | None = None) -> webdataset.DataPipeline:
        """The samples of rank ``rank`` (of ``world``) as a webdataset pipeline of CacheSamples,
        each checked (:func:`read_shard`).

        Shards are split once, by :func:`janus_cache.store.split.rank_and_worker_splitter`: this
        rank's share, then each DataLoader worker's share of it. Over all ranks and workers every
        sample is read exactly once. ``damaged``: ``"raise"`` the first :class:`DamagedData`, or
        ``"yield"`` it in the stream in place of the samples it stands for. ``rows``: only these
        sample rows (shards holding none of them are left out before the split; a shard's other
        rows are passed over unread); None: every row.
        """
        if damaged not in ("raise", "yield"):
            raise ValueError(f"damaged must be 'raise' or 'yield', got {damaged!r}")
        paths = [str(p) for p in self.shard_paths()]
        plan = dict(zip(paths, self.layout.plan()))
        keep = None if rows is None else frozenset(rows)
        stages = [
            webdataset.SimpleShardList([paths[i] for i in self._shards_holding(keep)]),
            partial(split.rank_and_worker_splitter, rank=rank, world=world),
            partial(read_shards, plan=plan, damaged=damaged, keep=keep),
        ]
        if self.vit_group is not None:
            stages.append(partial(with_vit_features, group=self.vit_group, resolution=self.resolution,
                                  damaged=damaged))
        return webdataset.DataPipeline(*stages)

    def shard(self, shard: int) -> Iterator[CacheSample]:
        """The samples of tar shard ``shard`` (no splitting), e.g. to check one shard."""
        paths = self.shard_paths()
        if not 0 <= shard < len(paths):
            raise StoreError(f"{self.array} has {len(paths)} shards; there is no shard {shard}")
        return read_shards([{"url": str(paths[shard])}], {str(paths[shard]): self.layout.plan()[shard]})

    def __iter__(self) -> Iterator[CacheSample]:
        return iter(self.dataset())
