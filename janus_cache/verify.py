"""Verify a cache: complete, intact, current, and equal to what the live path computes.

Five checks, each a plain single-process function returning a :class:`CheckResult`:

``schema`` (:func:`check_schema`)
    The manifest is present and valid; the frame arrays, feature arrays (or webdataset layout)
    and tables exist with the shapes and dtypes the manifest says; the precompute finished.
``integrity`` (:func:`check_integrity`)
    Every planned shard has a commit record matching the plan, its file exists with the recorded
    size and (``checksums``) its sha256 matches. Each bad shard is named with the frame or sample
    keys it holds.
``completeness`` (:func:`check_completeness`)
    Keys are unique and windows point at frames that decoded; with a dataset index, every indexed
    sample is present exactly once (samples the cache's ``report.json`` lists as failed at
    precompute excepted), no extra keys, the same windows, and the same source files (path, size,
    content hash); changed files are listed by name.
``freshness`` (:func:`check_freshness`)
    The keyed fingerprints (encoder weights, resolution and preprocessing, window variant,
    feature dtype) equal those of a profile; every differing field is named with both values.
``live`` (:class:`LiveChecker`, :func:`live_result`)
    For chosen samples, recompute from the source images with the profile's live path: uint8
    frames and Qwen ``pixel_values`` must be bit-identical, VGGT features and the fused image
    embeddings within the tolerances below.

Splitting work over processes is the caller's business (``pipelines/verify.py``): the integrity
and live checks take an explicit list of shards or sample rows and return picklable per-item
findings, which :func:`integrity_result` and :func:`live_result` turn into one result.

The trainer calls :func:`check_cache_for_training` (schema + freshness) at start-up.
"""

from __future__ import annotations

import functools
import json
import math
import random
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
import zarr
from zarr.storage import LocalStore

from janus_cache.dataset import DatasetIndex, build_index
from janus_cache.encoder import WindowEncoder, encoder_fingerprint
from janus_cache.imaging import FrameError, load_frame, qwen_pixel_values
from janus_cache.precompute import (
    dataset_identity,
    preprocessing,
    read_frame_failures,
    window_variant,
)
from janus_cache.profile import Profile, load_profile
from janus_cache.resolution import Resolution
from janus_cache.store import Manifest, ManifestError, StoreError, read_manifest
from janus_cache.store.commit import read_record, sha256_file
from janus_cache.store.layout import FRAMES_GROUP, REPORT_NAME, TABLES_GROUP, WDS_DIR, CacheLayout
from janus_cache.store.layout import WDS_LAYOUT_NAME as LAYOUT_NAME
from janus_cache.store.layout import features_array as features_array_path
from janus_cache.store.layout import frames_array as frames_array_path
from janus_cache.store.layout import wds_samples as wds_array_path
from janus_cache.store.layout import wds_shard_name as shard_name
from janus_cache.store.records import CacheSample
from janus_cache.store.manifest import (
    FieldDiff,
    ResolutionEntry,
    keyed_differences,
    library_versions,
    version_differences,
)
from janus_cache.store.wds_store import (
    FEATURE_MEMBER,
    FRAMES_MEMBER,
    META_MEMBER,
    WdsLayout,
    decode_key,
    decode_sample,
    encode_key,
    planned_tar_shards,
)
from janus_cache.store.layout import FRAMES_TABLE, KEY_COLUMN, SAMPLES_TABLE, WINDOW_ROWS_COLUMN
from janus_cache.store.zarr_store import PlannedShard, ZarrCacheReader, ZarrGroup
from janus_cache.vggt import CUDA_AUTOCAST_DTYPE

SCHEMA, INTEGRITY, COMPLETENESS, FRESHNESS, LIVE = "schema", "integrity", "completeness", "freshness", "live"
CHECK_NAMES: tuple[str, ...] = (SCHEMA, INTEGRITY, COMPLETENESS, FRESHNESS, LIVE)
"""Every check, in the order they run and are reported."""

CHECKSUM_MODES: tuple[str, ...] = ("all", "sample", "none")
CHECKSUM_SAMPLE_FRACTION = 0.05
"""``--checksums sample`` hashes this fraction (at least one) of each frame / feature / tar array's
shards, chosen with the seed; table columns are small and always hashed. Every other shard still
has its commit record, file and byte size checked."""

DEFAULT_LIVE_SAMPLES = 4
DEFAULT_SEED = 0
REPORT_SCHEMA_VERSION = 1
"""Version of the ``--json`` report layout (docs/verify.md); bumped when a key changes meaning."""


LISTED = 8
"""Keys or files named per problem line before "and N more"."""


# ----------------------------------------------------------------------------------------------
# results


@dataclass
class CheckResult:
    """Outcome of one check. ``problems`` are one line each; ``data`` is the machine-readable part
    of the ``--json`` report (keys per check in docs/verify.md). A ``skipped`` check did not run
    (its ``detail`` says why) and counts neither as passed nor as failed."""

    name: str
    passed: bool
    detail: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    skipped: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.passed else "fail")

    @property
    def failed(self) -> bool:
        return not self.passed and not self.skipped

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "detail": self.detail,
            "problems": list(self.problems),
            "seconds": round(self.seconds, 4),
            "data": self.data,
        }


def _result(name: str, problems: list[str], detail: str, seconds: float, **data: Any) -> CheckResult:
    return CheckResult(name, not problems, detail, problems, seconds, data=data)


def skipped(name: str, reason: str) -> CheckResult:
    """A check that did not run, with the reason (e.g. "needs --data")."""
    return CheckResult(name, False, reason, skipped=True)


def crashed(name: str, err: BaseException, seconds: float = 0.0) -> CheckResult:
    """A check that could not finish: damaged data can make any reader raise, and that is a finding."""
    reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return CheckResult(name, False, "could not finish", [f"cannot check: {reason}"], seconds)


F = TypeVar("F", bound=Callable[..., CheckResult])


def _guarded(name: str) -> Callable[[F], F]:
    """Turn an exception raised while reading a damaged cache into a failed ``name`` result."""

    def wrap(check: F) -> F:
        @functools.wraps(check)
        def guarded(*args: Any, **kwargs: Any) -> CheckResult:
            started = time.perf_counter()
            try:
                return check(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - reported as this check's failure
                return crashed(name, err, time.perf_counter() - started)

        return guarded  # type: ignore[return-value]

    return wrap


class CacheVerificationError(RuntimeError):
    """A cache failed checks; the message is the one line ``janus-cache verify`` prints for it."""

    def __init__(self, cache: Path | str, results: Sequence[CheckResult]) -> None:
        self.results = list(results)
        super().__init__(failure_message(cache, self.results))


def failure_message(cache: Path | str, results: Sequence[CheckResult]) -> str:
    """One line naming every failed check and its first problem (empty when none failed)."""
    failed = [r for r in results if r.failed]
    if not failed:
        return ""
    reasons = "; ".join(f"{r.name}: {r.problems[0] if r.problems else r.detail}" for r in failed)
    return f"cache {cache} failed {', '.join(r.name for r in failed)}: {reasons}"


def _listed(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _short(digest: str) -> str:
    return digest[:12] + "…" if len(digest) > 12 else digest


@contextmanager
def _timer() -> Iterator[Callable[[], float]]:
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


# ----------------------------------------------------------------------------------------------
# an opened cache


class CacheProblem(RuntimeError):
    """The cache cannot be opened for checking (no or invalid manifest); names the file."""


class OpenedCache:
    """Read-only view of a cache for the checks: manifest, zarr group, tables (read once)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise CacheProblem(f"{self.root} is not a directory")
        try:
            manifest = read_manifest(self.root)
        except ManifestError as err:
            raise CacheProblem(str(err)) from None
        if manifest is None:
            raise CacheProblem(f"{self.root} has no manifest.json (not a janus cache, or precompute never started)")
        self.manifest: Manifest = manifest
        self.group = ZarrGroup(self.root, read_only=True)
        self._tables: dict[str, dict[str, Any]] = {}

    @property
    def format(self) -> str:
        return self.manifest.format

    @property
    def variant(self) -> str:
        return self.manifest.window.name

    def samples_array(self, resolution: str, variant: str | None = None) -> str:
        """Where the per-sample data of ``resolution`` lives: a zarr array or a tar directory."""
        variant = variant or self.variant
        if self.format == "wds":
            return wds_array_path(variant, resolution)
        return features_array_path(variant, resolution)

    def table(self, name: str) -> dict[str, Any]:
        if name not in self._tables:
            self._tables[name] = self.group.read_table(name)
        return self._tables[name]

    def keys(self, table: str) -> list[str]:
        return list(self.table(table)[KEY_COLUMN])

    def readable_keys(self, table: str) -> list[str] | None:
        """The table's keys, or None when a damaged table cannot be read (names messages only)."""
        try:
            return self.keys(table)
        except Exception:  # noqa: BLE001 - the damage itself is reported by the check that reads it
            return None

    def name_of(self, table: str, row: int) -> str:
        """The key of ``row`` for messages, or ``row N`` when the keys cannot be read."""
        keys = self.readable_keys(table)
        return keys[row] if keys is not None and 0 <= row < len(keys) else f"row {row}"

    def wds_layout(self, resolution: str, variant: str | None = None) -> WdsLayout:
        return WdsLayout.read(self.root / wds_array_path(variant or self.variant, resolution))

    def array(self, path: str) -> Any:
        """A zarr array of the cache opened read-only (for its shape, dtype and attributes)."""
        if not (self.root / path / "zarr.json").is_file():
            raise StoreError(f"cache {self.root} has no array {path!r}")
        return zarr.open_array(LocalStore(self.root, read_only=True), path=path, mode="r", zarr_format=3)

    def report(self) -> dict[str, Any] | None:
        """The precompute's report.json, or None when it is missing."""
        path = self.root / REPORT_NAME
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as err:
            raise CacheProblem(f"{path} is not valid JSON: {err}") from None

    def failed_samples(self) -> dict[str, str]:
        report = self.report() or {}
        return dict(report.get("failed_samples", {}))


def _open(root: Path | str, name: str) -> OpenedCache | CheckResult:
    try:
        return OpenedCache(root)
    except CacheProblem as err:
        return CheckResult(name, False, "cannot open the cache", [str(err)])


# ----------------------------------------------------------------------------------------------
# 1. schema


@_guarded(SCHEMA)
def check_schema(root: Path | str) -> CheckResult:
    """Manifest, arrays, layouts and tables present with the shapes and dtypes the manifest says."""
    with _timer() as elapsed:
        cache = _open(root, SCHEMA)
        if isinstance(cache, CheckResult):
            cache.seconds = elapsed()
            return cache
        problems: list[str] = []
        m = cache.manifest
        n_frames, n_samples = _schema_tables(cache, problems)
        for name, entry in m.resolutions.items():
            _schema_frames(cache, name, entry, n_frames, problems)
            if cache.format == "wds":
                _schema_wds(cache, name, entry, n_samples, problems)
            else:
                _schema_features(cache, name, entry, n_samples, problems)
        if not m.resolutions:
            problems.append(f"{cache.root}/manifest.json lists no resolution")
        if not m.shards or "samples_written" not in m.counts:
            problems.append(
                f"{cache.root}/manifest.json has no final shard table: the precompute that made this cache "
                "did not finish (run the same precompute command again to resume)"
            )
        if not (cache.root / REPORT_NAME).is_file():
            problems.append(f"{cache.root} has no {REPORT_NAME}: the precompute that made this cache did not finish")
        detail = (
            f"{m.format} cache, variant {cache.variant}, resolutions {', '.join(m.resolutions)}, "
            f"{n_frames} frames, {n_samples} samples, features {m.feature_dtype} (stored {m.stored_dtype})"
        )
        return _result(SCHEMA, problems, detail, elapsed(), format=m.format, variant=cache.variant,
                       resolutions=list(m.resolutions), n_frames=n_frames, n_samples=n_samples,
                       feature_dtype=m.feature_dtype)


def _schema_tables(cache: OpenedCache, problems: list[str]) -> tuple[int, int]:
    """Row counts of the frames and samples tables (-1 when unreadable), checked against the manifest."""
    counts = {FRAMES_TABLE: -1, SAMPLES_TABLE: -1}
    expected = {FRAMES_TABLE: cache.manifest.counts.get("frames"),
                SAMPLES_TABLE: cache.manifest.counts.get("samples_written")}
    for table in (FRAMES_TABLE, SAMPLES_TABLE):
        try:
            columns = cache.group.table_columns(table)
            counts[table] = cache.group.table_rows(table)
        except (StoreError, OSError, ValueError, KeyError) as err:
            problems.append(f"{table} table: {err}")
            continue
        if columns.get(KEY_COLUMN) != "utf8":
            problems.append(f"{table} table of {cache.root} has no text column {KEY_COLUMN!r}")
        for column, kind in columns.items():
            _schema_column(cache, table, column, kind, counts[table], problems)
        if expected[table] is not None and counts[table] != expected[table]:
            problems.append(f"{table} table has {counts[table]} rows, the manifest counts {expected[table]}")
    if counts[SAMPLES_TABLE] >= 0:
        path = f"{TABLES_GROUP}/{SAMPLES_TABLE}/{WINDOW_ROWS_COLUMN}"
        want = (counts[SAMPLES_TABLE], cache.manifest.window.frames)
        try:
            rows = cache.array(path)
            if tuple(rows.shape) != want or np.dtype(rows.dtype).kind not in "iu":
                problems.append(f"{path} is {rows.dtype} {tuple(rows.shape)}, expected integer {want}")
        except (StoreError, OSError, ValueError) as err:
            problems.append(f"{path}: {err}")
    return counts[FRAMES_TABLE], counts[SAMPLES_TABLE]


def _schema_column(cache: OpenedCache, table: str, column: str, kind: str, n_rows: int, problems: list[str]) -> None:
    """A numeric column has ``n_rows`` rows of its dtype; a text column ``n_rows + 1`` offsets."""
    base = f"{TABLES_GROUP}/{table}/{column}"
    want = {f"{base}/offsets": (n_rows + 1, "int64"), f"{base}/utf8": (None, "uint8")} if kind == "utf8" else {
        base: (n_rows, kind)}
    for path, (rows, dtype) in want.items():
        try:
            array = cache.array(path)
        except Exception as err:  # noqa: BLE001 - damaged metadata is the finding
            problems.append(f"{path}: cannot be opened: {type(err).__name__}: {err}")
            continue
        if (rows is not None and array.shape[0] != rows) or str(np.dtype(array.dtype)) != dtype:
            problems.append(f"{path} is {array.dtype} {tuple(array.shape)}, the {table} table says {dtype} "
                            f"with {rows if rows is not None else 'any number of'} rows")


def _schema_frames(cache: OpenedCache, name: str, entry: ResolutionEntry, n_frames: int, problems: list[str]) -> None:
    path = frames_array_path(name)
    try:
        array = cache.array(path)
    except (StoreError, OSError, ValueError) as err:
        problems.append(f"{path}: {err}")
        return
    want = (n_frames, *entry.frame_shape)
    if tuple(array.shape) != want or np.dtype(array.dtype) != np.uint8:
        problems.append(f"{path} is {array.dtype} {tuple(array.shape)}, the manifest says uint8 {want}")


def _schema_features(cache: OpenedCache, name: str, entry: ResolutionEntry, n_samples: int,
                     problems: list[str]) -> None:
    m = cache.manifest
    path = cache.samples_array(name)
    try:
        array = cache.array(path)
    except (StoreError, OSError, ValueError) as err:
        problems.append(f"{path}: {err}")
        return
    want = (n_samples, *entry.feature_shape)
    if tuple(array.shape) != want or np.dtype(array.dtype) != np.dtype(m.stored_dtype):
        problems.append(f"{path} is {array.dtype} {tuple(array.shape)}, the manifest says {m.stored_dtype} {want}")
    logical = array.attrs.get("logical_dtype")
    if logical != m.feature_dtype:
        problems.append(f"{path} has logical_dtype {logical!r}, the manifest says {m.feature_dtype!r}")


def _schema_wds(cache: OpenedCache, name: str, entry: ResolutionEntry, n_samples: int, problems: list[str]) -> None:
    m = cache.manifest
    try:
        layout = cache.wds_layout(name)
    except StoreError as err:
        problems.append(str(err))
        return
    want = {
        "n_samples": n_samples,
        "window_frames": m.window.frames,
        "frame_shape": tuple(entry.frame_shape),
        "feature_shape": tuple(entry.feature_shape),
        "feature_dtype": m.feature_dtype,
        "samples_per_shard": m.layout.samples_per_shard,
    }
    where = cache.root / wds_array_path(cache.variant, name) / LAYOUT_NAME
    for key, value in want.items():
        if getattr(layout, key) != value:
            problems.append(f"{where}: {key} is {getattr(layout, key)!r}, the manifest says {value!r}")


# ----------------------------------------------------------------------------------------------
# 2. integrity


@dataclass(frozen=True)
class ShardTarget:
    """One planned shard to check (picklable, so a list of them can be split over processes)."""

    array: str
    shard: int
    start: int
    stop: int
    file: str
    hashed: bool
    manifest_sha256: str = ""

    @property
    def name(self) -> str:
        return f"{self.array}#{self.shard} ({self.file})"


@dataclass(frozen=True)
class ShardFinding:
    """What checking one :class:`ShardTarget` found: None when the shard is good."""

    target: ShardTarget
    problem: str | None


@dataclass(frozen=True)
class IntegrityPlan:
    """The shards to check and the problems found while planning (e.g. an array that is gone)."""

    checksums: str
    targets: list[ShardTarget]
    problems: list[str]


def _planned(cache: OpenedCache, problems: list[str]) -> list[PlannedShard]:
    """Every shard the cache should hold, committed or not: the arrays of the manifest's shard
    table (of the arrays on disk when the precompute did not finish) and the tar layouts' shards.
    An array that is gone or cannot be opened is a problem naming what it held."""
    contents = _Contents(cache)
    listed = {a: e for a, e in cache.manifest.shards.items() if not a.startswith(WDS_DIR + "/")}
    try:
        paths = list(listed) if cache.manifest.shards else cache.group.array_paths()
    except (OSError, ValueError) as err:
        problems.append(f"cannot list the arrays of {cache.root}: {err}")
        paths = []
    planned: list[PlannedShard] = []
    for path in paths:
        entries = listed.get(path, ())
        held = contents.describe(path, range(entries[0].start, entries[-1].stop)) if entries else "unknown rows"
        if not cache.group.has_array(path):
            problems.append(f"array {path} ({len(entries)} shards in the manifest) is missing from the cache; "
                            f"it held {held}")
            continue
        try:
            plan = cache.group.array_shard_plan(path)
            planned += [PlannedShard(path, i, rows, cache.group.shard_file(path, i)) for i, rows in enumerate(plan)]
        except Exception as err:  # noqa: BLE001 - any failure to open the array is a finding
            problems.append(f"array {path} cannot be opened ({type(err).__name__}: {err}); it holds {held}")
            continue
        if entries and len(plan) != len(entries):
            problems.append(f"array {path} has {len(plan)} shards, the manifest's shard table lists {len(entries)}")
    if cache.format == "wds":
        for name in cache.manifest.resolutions:
            try:
                planned += planned_tar_shards(cache.root, cache.wds_layout(name))
            except StoreError as err:
                problems.append(str(err))
    return planned


def plan_integrity(root: Path | str, checksums: str = "all", seed: int = DEFAULT_SEED) -> IntegrityPlan:
    """Which shards to check and which to hash (see :data:`CHECKSUM_SAMPLE_FRACTION`)."""
    if checksums not in CHECKSUM_MODES:
        raise ValueError(f"checksums must be one of {CHECKSUM_MODES}, got {checksums!r}")
    cache = OpenedCache(root)
    problems: list[str] = []
    planned = _planned(cache, problems)
    by_array: dict[str, list[PlannedShard]] = {}
    for p in planned:
        by_array.setdefault(p.array, []).append(p)
    manifest_sha = {(a, e.shard): e.sha256 for a, entries in cache.manifest.shards.items() for e in entries
                    if e.committed}
    hashed = _choose_hashed(by_array, checksums, seed)
    targets = [
        ShardTarget(p.array, p.shard, p.rows.start, p.rows.stop, p.file.relative_to(cache.root).as_posix(),
                    (p.array, p.shard) in hashed, manifest_sha.get((p.array, p.shard), ""))
        for p in planned
    ]
    return IntegrityPlan(checksums, targets, problems)


def _choose_hashed(by_array: Mapping[str, list[PlannedShard]], checksums: str, seed: int) -> set[tuple[str, int]]:
    if checksums == "none":
        return set()
    chosen: set[tuple[str, int]] = set()
    rng = random.Random(seed)
    for array in sorted(by_array):
        shards = [p.shard for p in by_array[array]]
        if checksums == "sample" and not array.startswith(TABLES_GROUP + "/"):
            shards = rng.sample(shards, max(1, math.ceil(CHECKSUM_SAMPLE_FRACTION * len(shards))))
        chosen.update((array, s) for s in shards)
    return chosen


def check_shard(root: Path | str, target: ShardTarget) -> ShardFinding:
    """Commit record present and matching the plan, file present with the recorded size and
    (``target.hashed``) sha256, and the record agreeing with the manifest's shard table."""
    root = Path(root)
    try:
        record = read_record(root, target.array, target.shard)
    except StoreError as err:
        return ShardFinding(target, f"unreadable commit record: {err}")
    if record is None:
        where = CacheLayout(root).commit_record(target.array, target.shard).relative_to(root)
        return ShardFinding(target, f"not committed (no commit record {where})")
    if (record.start, record.stop, record.file) != (target.start, target.stop, target.file):
        return ShardFinding(target, f"commit record is for rows {record.start}:{record.stop} in {record.file}, "
                                    f"the cache plans rows {target.start}:{target.stop} in {target.file}")
    path = root / target.file
    if not path.is_file():
        return ShardFinding(target, "shard file is missing")
    size = path.stat().st_size
    if size != record.nbytes:
        return ShardFinding(target, f"has {size} bytes, its commit record says {record.nbytes} "
                                    "(truncated or rewritten)")
    if target.hashed:
        _, digest = sha256_file(path)
        if digest != record.sha256:
            return ShardFinding(target, f"fails its checksum (sha256 {_short(digest)}, commit record says "
                                        f"{_short(record.sha256)})")
    if target.manifest_sha256 and target.manifest_sha256 != record.sha256:
        return ShardFinding(target, "its commit record differs from the manifest's shard table "
                                    "(the shard was rewritten after the precompute finished)")
    return ShardFinding(target, None)


def check_shards(root: Path | str, targets: Sequence[ShardTarget],
                 on_progress: Callable[[int], None] | None = None) -> list[ShardFinding]:
    """:func:`check_shard` for each target; ``on_progress(done)`` after each."""
    findings = []
    for done, target in enumerate(targets, 1):
        findings.append(check_shard(root, target))
        if on_progress is not None:
            on_progress(done)
    return findings


class _Contents:
    """Names what a shard holds: the frame keys, sample keys or table column of its rows."""

    def __init__(self, cache: OpenedCache) -> None:
        self.cache = cache

    def keys(self, array: str, rows: range) -> tuple[str, list[str]]:
        """(kind, keys) of the rows of ``array``; keys are empty for table columns or unreadable keys."""
        if array.startswith(TABLES_GROUP + "/"):
            return "table", []
        table = FRAMES_TABLE if array.startswith(FRAMES_GROUP + "/") else SAMPLES_TABLE
        keys = self.cache.readable_keys(table)
        return table, [] if keys is None else keys[rows.start:rows.stop]

    def describe(self, array: str, rows: range) -> str:
        kind, keys = self.keys(array, rows)
        if kind == "table":
            column = array.removeprefix(TABLES_GROUP + "/")
            return f"table column {column} (rows {rows.start}:{rows.stop})"
        if not keys:
            return f"{kind} rows {rows.start}:{rows.stop} (keys unreadable)"
        return f"{len(keys)} {kind} {_listed(keys)}"


def integrity_result(root: Path | str, plan: IntegrityPlan, findings: Sequence[ShardFinding],
                     seconds: float) -> CheckResult:
    """One result from the plan and the findings of every process."""
    cache = OpenedCache(root)
    contents = _Contents(cache)
    problems = list(plan.problems)
    bad = []
    for f in sorted(findings, key=lambda f: (f.target.array, f.target.shard)):
        if f.problem is None:
            continue
        rows = range(f.target.start, f.target.stop)
        kind, keys = contents.keys(f.target.array, rows)
        problems.append(f"shard {f.target.name} {f.problem}; it holds {contents.describe(f.target.array, rows)}")
        bad.append({"shard": f"{f.target.array}#{f.target.shard}", "file": f.target.file, "problem": f.problem,
                    "holds": kind, "rows": [f.target.start, f.target.stop], "keys": keys})
    n_hashed = sum(f.target.hashed for f in findings)
    detail = (f"{len(findings) - len(bad)}/{len(findings)} shards good; checksums {plan.checksums}: "
              f"{n_hashed} shards hashed, all checked for commit record, file and size")
    if plan.problems:
        detail += f"; {len(plan.problems)} array(s) missing or unreadable"
    return _result(INTEGRITY, problems, detail, seconds, checksums=plan.checksums, shards=len(findings),
                   hashed=n_hashed, bad=bad)


@_guarded(INTEGRITY)
def check_integrity(root: Path | str, checksums: str = "all", seed: int = DEFAULT_SEED,
                    on_progress: Callable[[int], None] | None = None) -> CheckResult:
    """The whole integrity check in this process."""
    with _timer() as elapsed:
        opened = _open(root, INTEGRITY)
        if isinstance(opened, CheckResult):
            return opened
        plan = plan_integrity(root, checksums, seed)
        findings = check_shards(root, plan.targets, on_progress)
        return integrity_result(root, plan, findings, elapsed())


# ----------------------------------------------------------------------------------------------
# 3. completeness


@_guarded(COMPLETENESS)
def check_completeness(root: Path | str, index: DatasetIndex | None) -> CheckResult:
    """Unique keys and valid windows; with ``index`` (built with the cache's history), the cache
    against the dataset: samples, windows and source files.

    Samples that the cache's ``report.json`` lists as failed at precompute (a window frame could
    not be decoded) are expected to be absent; they are counted in the detail, not as problems.
    """
    with _timer() as elapsed:
        cache = _open(root, COMPLETENESS)
        if isinstance(cache, CheckResult):
            return cache
        problems: list[str] = []
        # Every key is always present (stable --json layout); the dataset ones stay empty without an index.
        data: dict[str, Any] = {"dataset_compared": index is not None, "missing": [], "extra": [],
                                "failed_at_precompute": [], "changed_windows": [], "changed_sources": [],
                                "new_sources": [], "dataset_identity_matches": None}
        try:
            samples, frames = cache.table(SAMPLES_TABLE), cache.table(FRAMES_TABLE)
        except Exception as err:  # noqa: BLE001 - unreadable tables are the finding
            return _result(COMPLETENESS, [f"cannot read the tables: {type(err).__name__}: {err}"],
                           "tables unreadable", elapsed(), **data)
        sample_keys, frame_keys = list(samples[KEY_COLUMN]), list(frames[KEY_COLUMN])
        window_rows = np.asarray(samples[WINDOW_ROWS_COLUMN])
        _duplicates(sample_keys, "sample", problems, data)
        _duplicates(frame_keys, "frame", problems, data)
        _window_frames_exist(cache, sample_keys, frame_keys, window_rows, problems)
        if cache.format == "wds":
            _tar_members(cache, sample_keys, problems)
        detail = f"{len(sample_keys)} samples, {len(frame_keys)} frames"
        if index is None:
            detail += "; dataset comparison skipped (pass --data)"
        else:
            failed = cache.failed_samples()
            _against_index(cache, index, sample_keys, frame_keys, window_rows, failed, problems, data)
            detail += f" against {len(index.samples)} indexed samples of {index.source}"
            if failed:
                detail += f" ({len(failed)} failed at precompute, listed in {REPORT_NAME})"
        return _result(COMPLETENESS, problems, detail, elapsed(), **data)


def _duplicates(keys: Sequence[str], kind: str, problems: list[str], data: dict[str, Any]) -> None:
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    data[f"duplicate_{kind}s"] = repeated
    if repeated:
        problems.append(f"{len(repeated)} {kind} key(s) appear more than once: {_listed(repeated)}")


def _window_frames_exist(cache: OpenedCache, sample_keys: Sequence[str], frame_keys: Sequence[str],
                         window_rows: np.ndarray, problems: list[str]) -> None:
    if window_rows.size == 0:
        return
    outside = np.flatnonzero(((window_rows < 0) | (window_rows >= len(frame_keys))).any(axis=1))
    if outside.size:
        keys = [sample_keys[i] for i in outside]
        problems.append(f"{len(keys)} sample(s) have window rows outside the {len(frame_keys)} frames: {_listed(keys)}")
    for resolution in cache.manifest.resolutions:
        failed = read_frame_failures(cache.root, resolution)
        if not failed:
            continue
        uses_failed = np.isin(window_rows, list(failed)).any(axis=1)
        for i in np.flatnonzero(uses_failed)[:LISTED]:
            row = next(int(r) for r in window_rows[i] if int(r) in failed)
            problems.append(f"sample {sample_keys[i]} uses frame {frame_keys[row]} ({resolution}), which failed to "
                            f"decode at precompute: {failed[row]}")


def _tar_members(cache: OpenedCache, sample_keys: Sequence[str], problems: list[str]) -> None:
    """Each sample's three members in the tar shard of its row, every key once."""
    expected_members = {FRAMES_MEMBER, FEATURE_MEMBER, META_MEMBER}
    for resolution in cache.manifest.resolutions:
        try:
            layout = cache.wds_layout(resolution)
        except StoreError:
            continue  # schema reports a missing layout
        seen: Counter[str] = Counter()
        for planned in planned_tar_shards(cache.root, layout):
            if not planned.file.is_file():
                continue  # integrity reports a missing shard
            want = {sample_keys[r] for r in planned.rows if r < len(sample_keys)}
            members: dict[str, set[str]] = {}
            try:
                with tarfile.open(planned.file) as tar:
                    for name in tar.getnames():
                        base, _, ext = name.partition(".")
                        members.setdefault(decode_key(base), set()).add(ext)
            except (tarfile.TarError, OSError) as err:
                problems.append(f"tar shard {planned.file.relative_to(cache.root)} cannot be listed: {err}")
                continue
            seen.update(members.keys())
            where = planned.file.relative_to(cache.root)
            missing = sorted(want - set(members))
            extra = sorted(set(members) - want)
            partial = sorted(k for k, exts in members.items() if k in want and exts != expected_members)
            if missing:
                problems.append(f"tar shard {where} lacks samples {_listed(missing)}")
            if extra:
                problems.append(f"tar shard {where} holds samples of other rows or unknown keys: {_listed(extra)}")
            if partial:
                problems.append(f"tar shard {where} has samples without all of {sorted(expected_members)}: "
                                f"{_listed(partial)}")
        repeated = sorted(k for k, n in seen.items() if n > 1)
        if repeated:
            problems.append(f"samples in more than one tar shard: {_listed(repeated)}")


def _against_index(cache: OpenedCache, index: DatasetIndex, sample_keys: Sequence[str], frame_keys: Sequence[str],
                   window_rows: np.ndarray, failed: Mapping[str, str], problems: list[str],
                   data: dict[str, Any]) -> None:
    indexed = {s.key: s for s in index.samples}
    cached = set(sample_keys)
    missing = [s.key for s in index.samples if s.key not in cached and s.key not in failed]
    extra = [k for k in sample_keys if k not in indexed]
    data.update(missing=missing, extra=extra, failed_at_precompute=sorted(failed))
    if missing:
        problems.append(f"{len(missing)} indexed sample(s) missing from the cache: {_listed(missing)}")
    if extra:
        problems.append(f"{len(extra)} cached sample(s) not in the dataset index: {_listed(extra)}")
    both = sorted(cached & set(failed))
    if both:
        problems.append(f"{len(both)} sample(s) are cached although {REPORT_NAME} lists them as failed: "
                        f"{_listed(both)}")

    # Windows: the same frames, by frame key, in the same order.
    changed_windows = []
    for row, key in enumerate(sample_keys):
        sample = indexed.get(key)
        if sample is None or not all(0 <= int(r) < len(frame_keys) for r in window_rows[row]):
            continue  # reported above
        live = [f.key for f in index.window(sample)]
        stored = [frame_keys[int(r)] for r in window_rows[row]]
        if live != stored:
            changed_windows.append(key)
            if len(changed_windows) <= LISTED:
                problems.append(f"sample {key}: cached window {stored} differs from the dataset's {live}")
    if len(changed_windows) > LISTED:
        problems.append(f"... {len(changed_windows)} samples in all have a different window")
    data["changed_windows"] = changed_windows

    # Source files: path, size and content hash of every frame.
    frames = cache.table(FRAMES_TABLE)
    by_key = {f.key: f for f in index.frames}
    reasons = {e.file: e.reason.value + (f": {e.detail}" if e.detail else "") for e in index.report}
    root = index.source if index.source.is_dir() else index.source.parent
    changed: list[str] = []
    for row, key in enumerate(frame_keys):
        source = str(frames["source"][row])
        frame = by_key.get(key)
        if frame is None:
            why = reasons.get(str(root / source), reasons.get(source, "not in the dataset index"))
            message = f"source file {source} (frame {key}) is gone from the dataset: {why}"
        else:
            message = _source_change(
                (source, int(frames["source_width"][row]), int(frames["source_height"][row]),
                 str(frames["source_sha256"][row])),
                (frame.relpath, frame.width, frame.height, frame.sha256 or ""), key)
        if message:
            changed.append(source)
            if len(changed) <= LISTED:
                problems.append(message)
    if len(changed) > LISTED:
        problems.append(f"... {len(changed)} source files in all differ from the cache's: {_listed(changed)}")
    cached_frames = set(frame_keys)
    new = [f.relpath for f in index.frames if f.key not in cached_frames]
    if new:
        problems.append(f"{len(new)} source file(s) of the dataset are not in the cache: {_listed(new)}")
    data.update(changed_sources=changed, new_sources=new)

    identity = dataset_identity(index)
    if identity != cache.manifest.dataset:
        differences = [
            f"{name}: cache has {getattr(cache.manifest.dataset, name)!r}, dataset has {getattr(identity, name)!r}"
            for name in ("n_episodes", "n_frames", "n_samples", "digest")
            if getattr(cache.manifest.dataset, name) != getattr(identity, name)
        ]
        problems.append("dataset identity differs from the manifest's (" + "; ".join(differences) + ")")
    data["dataset_identity_matches"] = identity == cache.manifest.dataset


def _source_change(was: tuple[str, int, int, str], now: tuple[str, int, int, str], key: str) -> str:
    """How a frame's source (path, width, height, content hash) changed; empty when it did not."""
    what = []
    if was[0] != now[0]:
        what.append(f"path {was[0]} -> {now[0]}")
    if was[1:3] != now[1:3]:
        what.append(f"size {was[1]}x{was[2]} -> {now[1]}x{now[2]}")
    if was[3] != now[3]:
        what.append(f"content hash {_short(was[3])} -> {_short(now[3])}")
    return f"changed source file {was[0]} (frame {key}): {', '.join(what)}" if what else ""


# ----------------------------------------------------------------------------------------------
# 4. freshness


def as_profile(profile: Profile | str | Path) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(profile)


def profile_differences(cache: OpenedCache, profile: Profile, encoder: WindowEncoder) -> list[FieldDiff]:
    """Keyed fields in which the cache differs from what ``profile`` (with its ``encoder``) makes."""
    m = cache.manifest
    resolution = profile.cache.resolution
    differences: list[FieldDiff] = []
    wanted_resolutions: dict[str, ResolutionEntry] = {}
    if resolution.name not in m.resolutions:
        differences.append(FieldDiff("resolution", sorted(m.resolutions), resolution.name))
    else:
        height, width = _frame_shape(cache, resolution)
        wanted_resolutions[resolution.name] = ResolutionEntry(
            name=resolution.name, preprocessing=preprocessing(resolution), frame_shape=(height, width, 3),
            feature_shape=encoder.feature_shape(height, width),
        )
    wanted = replace(
        m,
        window=window_variant(profile.cache),
        encoder_fingerprint=encoder_fingerprint(encoder.model),
        feature_dtype=profile.cache.feature_dtype,
        resolutions=wanted_resolutions,
    )
    # Dataset, layout and format are the same by construction: the dataset is completeness's job,
    # and shard sizes change no stored value.
    return differences + keyed_differences(m, wanted)


def _frame_shape(cache: OpenedCache, resolution: Resolution) -> tuple[int, int]:
    if resolution.mode == "pad":
        return resolution.frame_shape()
    first = cache.group.table_row(FRAMES_TABLE, 0)  # crop: the frame height follows the sources
    return resolution.frame_shape(int(first["source_width"]), int(first["source_height"]))


@_guarded(FRESHNESS)
def check_freshness(root: Path | str, profile: Profile | str | Path,
                    encoder: WindowEncoder | None = None) -> CheckResult:
    """The cache's keyed fingerprints against ``profile``'s; builds the profile's encoder (its
    weights are what the fingerprint hashes) unless one is given."""
    with _timer() as elapsed:
        cache = _open(root, FRESHNESS)
        if isinstance(cache, CheckResult):
            return cache
        profile = as_profile(profile)
        if encoder is None:
            encoder = WindowEncoder.from_settings(profile.vggt, profile.cache, "cpu")
        differences = profile_differences(cache, profile, encoder)
        problems = [f"{d.name}: cache has {d.existing!r}, profile {profile.name} has {d.wanted!r}" for d in differences]
        current = replace(cache.manifest, versions=library_versions())
        versions = version_differences(cache.manifest, current)
        m = cache.manifest
        detail = (f"profile {profile.name}: encoder {_short(m.encoder_fingerprint)}, {', '.join(m.resolutions)}, "
                  f"{m.window.name}, {m.feature_dtype}")
        if problems:
            detail = f"{len(problems)} keyed field(s) differ from profile {profile.name}"
        if versions:
            detail += "; made with other library versions (" + ", ".join(
                f"{d.name.removeprefix('versions.')} {d.existing} -> {d.wanted}" for d in versions) + ")"
        return _result(FRESHNESS, problems, detail, elapsed(), profile=profile.name,
                       differences=[{"field": d.name, "cache": d.existing, "profile": d.wanted} for d in differences],
                       version_differences=[{"field": d.name, "cache": d.existing, "now": d.wanted} for d in versions])


def check_cache_for_training(cache: Path | str, profile: Profile | str | Path,
                             encoder: WindowEncoder | None = None) -> list[CheckResult]:
    """The start-up check of the trainer: schema, shard presence and freshness against the profile.

    Integrity runs with ``checksums="none"``: every shard must be committed, present and of its
    recorded size (cheap at any cache size); hashing every byte is left to ``janus-cache verify``.
    Returns the results when they pass; raises :class:`CacheVerificationError` (the message
    ``janus-cache verify`` prints) when one fails. Builds the profile's encoder on the CPU to
    fingerprint its weights unless ``encoder`` is given.
    """
    results = [check_schema(cache)]
    if results[0].passed:
        results += [check_integrity(cache, checksums="none"), check_freshness(cache, profile, encoder)]
    else:
        results.append(skipped(FRESHNESS, "not run: the schema check failed"))
    if any(r.failed for r in results):
        raise CacheVerificationError(cache, results)
    return results


# ----------------------------------------------------------------------------------------------
# 5. live


@dataclass(frozen=True)
class Tolerance:
    """Largest accepted difference between a live and a cached tensor of one sample.

    ``max |live - cached| <= (storage_ulp + rtol) * scale`` and ``cosine(live, cached) >=
    min_cosine``, with ``scale = max |cached|`` and ``storage_ulp`` the relative spacing of the
    stored feature dtype (bf16 2**-7, float32 2**-23): both sides are rounded to the stored dtype
    from values a compute difference ``d`` apart, so they may differ by ``d`` plus one unit in the
    last place. ``rtol`` bounds the compute difference between the precompute's batch and the
    live one (batch composition changes the kernels' summation order).
    """

    rtol: float
    min_cosine: float

    def bound(self, scale: float, feature_dtype: str) -> float:
        return (STORAGE_ULP[feature_dtype] + self.rtol) * scale


STORAGE_ULP: Mapping[str, float] = {"bfloat16": 2.0**-7, "float32": 2.0**-23}
"""Relative spacing of neighbouring values of each stored feature dtype (upper bound)."""

FEATURE_TOLERANCES: Mapping[str, Tolerance] = {
    # CPU: float32 throughout. On the tiny profile batch sizes 1, 2 and 4 and 1 or 2 threads give
    # the same float32 bits; 1e-4 leaves room for kernels that block sums differently by shape.
    "cpu": Tolerance(rtol=1e-4, min_cosine=0.9999),
    # CUDA: the encoder runs under bf16 autocast (janus_cache.vggt.CUDA_AUTOCAST_DTYPE); another
    # batch size selects other kernels, whose bf16 rounding differs by a few bf16 ulps per layer.
    "cuda": Tolerance(rtol=3e-2, min_cosine=0.999),
}
"""Live vs cached VGGT features, by the device type the encoder runs on."""

EMBEDDING_TOLERANCES: Mapping[tuple[str, str], Tolerance] = {
    ("cpu", "float32"): Tolerance(rtol=1e-4, min_cosine=0.9999),
    ("cpu", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
    ("cuda", "float32"): Tolerance(rtol=1e-3, min_cosine=0.9999),
    ("cuda", "bfloat16"): Tolerance(rtol=5e-2, min_cosine=0.999),
}
"""Live vs cached fused image embeddings, by (device type, model compute dtype). The pixel values
are identical, so the difference comes from the feature's difference through the merger."""


def feature_tolerance(device: torch.device | str) -> Tolerance:
    return FEATURE_TOLERANCES[torch.device(device).type]


def encoder_compute_dtype(device: torch.device | str) -> str:
    """The dtype the encoder computes in on ``device`` (what the tolerance depends on)."""
    return str(CUDA_AUTOCAST_DTYPE).removeprefix("torch.") if torch.device(device).type == "cuda" else "float32"


@dataclass(frozen=True)
class Comparison:
    """Differences between a live and a cached tensor of one sample."""

    max_abs: float
    sum_abs: float
    count: int
    cosine: float
    scale: float
    bound: float
    min_cosine: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.bound and self.cosine >= self.min_cosine

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / max(self.count, 1)


def compare(live: torch.Tensor, cached: torch.Tensor, tolerance: Tolerance, feature_dtype: str) -> Comparison:
    live64, cached64 = live.detach().double().cpu().reshape(-1), cached.detach().double().cpu().reshape(-1)
    diff = (live64 - cached64).abs()
    scale = float(cached64.abs().max()) if cached64.numel() else 0.0
    norms = float(live64.norm() * cached64.norm())
    cosine = float(live64 @ cached64) / norms if norms > 0 else float(torch.equal(live64, cached64))
    return Comparison(float(diff.max()) if diff.numel() else 0.0, float(diff.sum()), diff.numel(), cosine, scale,
                      tolerance.bound(scale, feature_dtype), tolerance.min_cosine)


@dataclass(frozen=True)
class LiveSample:
    """The live comparison of one sample (picklable: gathered from every process)."""

    key: str
    row: int
    problem: str | None = None
    frames_identical: bool = False
    differing_frame_bytes: int = 0
    differing_sources: tuple[str, ...] = ()
    pixel_values_identical: bool = False
    feature: Comparison | None = None
    embeddings: Comparison | None = None


def choose_live_rows(root: Path | str, n: int, seed: int = DEFAULT_SEED) -> list[int]:
    """``n`` sample rows of the cache (all when it has fewer), chosen with ``seed``, sorted."""
    total = ZarrGroup(Path(root), read_only=True).table_rows(SAMPLES_TABLE)
    return sorted(random.Random(seed).sample(range(total), min(n, total)))


def read_cached_samples(cache: OpenedCache, resolution: str, rows: Sequence[int],
                        variant: str | None = None) -> dict[int, CacheSample | str]:
    """Row -> the cache's sample dict (frames, feature, key) or the reason it cannot be read.

    zarr: through :class:`ZarrCacheReader`; webdataset: the sample's members from the tar shard
    of its row, decoded as the webdataset reader decodes them.
    """
    out: dict[int, CacheSample | str] = {}
    if cache.format == "zarr":
        reader = ZarrCacheReader(cache.root, resolution, variant or cache.variant)
        for row in rows:
            try:
                out[row] = reader.sample(row)
            except Exception as err:  # noqa: BLE001 - a corrupt shard is a finding for this sample
                out[row] = f"cannot read the cached sample: {type(err).__name__}: {err}"
        return out
    try:
        layout = cache.wds_layout(resolution, variant)
        keys = cache.keys(SAMPLES_TABLE)
    except Exception as err:  # noqa: BLE001 - a damaged layout or table is a finding for every sample
        return {row: f"cannot read the cached sample: {type(err).__name__}: {err}" for row in rows}
    per_shard: dict[int, list[int]] = {}
    for row in rows:
        per_shard.setdefault(row // layout.samples_per_shard, []).append(row)
    directory = cache.root / wds_array_path(layout.variant, resolution)
    for shard, shard_rows in per_shard.items():
        path = directory / shard_name(shard)
        try:
            with tarfile.open(path) as tar:
                for row in shard_rows:
                    base = encode_key(keys[row])
                    raw: dict[str, Any] = {"__key__": base, "__url__": str(path)}
                    for member in (FRAMES_MEMBER, FEATURE_MEMBER, META_MEMBER):
                        handle = tar.extractfile(f"{base}.{member}")
                        if handle is None:
                            raise StoreError(f"{path} member {base}.{member} is not a file")
                        raw[member] = handle.read()
                    sample = decode_sample(raw)
                    if (sample.key, sample.row) != (keys[row], row):
                        raise StoreError(f"{path}: member {base} says key {sample.key!r} row {sample.row}, "
                                         f"the samples table has {keys[row]!r} at row {row}")
                    out[row] = sample
        except Exception as err:  # noqa: BLE001 - unreadable tar content is a finding for its samples
            for row in shard_rows:
                out.setdefault(row, f"cannot read the cached sample from {path.relative_to(cache.root)}: "
                                    f"{type(err).__name__}: {err}")
    return out


def load_fusion_model(profile: Profile, device: torch.device | str) -> tuple[Any | None, str]:
    """The profile's JanusVLN model (cached-feature path), or None and why it cannot be built.

    The model lives in the ``janus_train`` package (the ``train`` extra); without it the
    embeddings part of the live check is reported as not run.
    """
    try:
        from janus_train.model import JanusVLNModel
    except ImportError as err:
        return None, f"janus_train.model is not importable ({err}); install the train extra"
    model = JanusVLNModel.from_profile(profile, live=False, device=device)
    return model.eval(), ""


class LiveChecker:
    """Recomputes cached samples with a profile's live path and compares (one process's part).

    The live path: the sample's window from the dataset ``index``, each source image decoded with
    :func:`load_frame` at the profile's resolution, ``pixel_values`` from those frames, the
    profile's encoder on them, and the fused embeddings through the profile's model.
    """

    def __init__(self, root: Path | str, profile: Profile, index: DatasetIndex, device: torch.device | str,
                 encoder: WindowEncoder | None = None, model: Any | None = None, model_note: str = "") -> None:
        self.cache = OpenedCache(root)
        self.profile = profile
        self.index = index
        self.device = torch.device(device)
        self.resolution = profile.cache.resolution
        self.variant = window_variant(profile.cache).name
        self.encoder = encoder or WindowEncoder.from_settings(profile.vggt, profile.cache, self.device)
        self.model, self.model_note = model, model_note
        self.feature_tolerance = feature_tolerance(self.device)
        self.embedding_tolerance = EMBEDDING_TOLERANCES[(self.device.type, profile.compute_dtype)]

    def unavailable(self) -> str | None:
        """Why the profile's samples cannot be read from this cache at all (None if they can)."""
        m = self.cache.manifest
        if self.resolution.name not in m.resolutions:
            return (f"the cache holds no frames at the profile's resolution {self.resolution.name} "
                    f"(it holds {', '.join(m.resolutions)})")
        if self.variant != m.window.name:
            return f"the cache holds window variant {m.window.name}, the profile's live path is {self.variant}"
        return None

    def measure(self, rows: Sequence[int], on_progress: Callable[[int], None] | None = None) -> list[LiveSample]:
        n_samples = self.cache.group.table_rows(SAMPLES_TABLE)
        outside = [r for r in rows if not 0 <= r < n_samples]
        if outside:
            raise ValueError(f"sample rows {outside} are out of range for the {n_samples} samples of {self.cache.root}")
        cached = read_cached_samples(self.cache, self.resolution.name, rows, self.variant)
        results: dict[int, LiveSample] = {}
        windows: dict[int, tuple[np.ndarray, dict[str, Any]]] = {}
        for row in rows:
            got = cached[row]
            if isinstance(got, str):
                key = self.cache.name_of(SAMPLES_TABLE, row)
                results[row] = LiveSample(key, row, problem=f"sample {key}: {got}")
            else:
                measured = self._frames(row, got)
                if isinstance(measured, LiveSample):
                    results[row] = measured
                else:
                    windows[row] = (measured, got)
        # Live features in batches of the profile's encoder batch size, like the precompute.
        batch = self.profile.cache.vggt_batch
        ready = list(windows)
        done = len(results)
        for start in range(0, len(ready), batch):
            chunk = ready[start:start + batch]
            live_frames = np.stack([windows[r][0] for r in chunk])
            features = self.encoder.encode(torch.from_numpy(live_frames))
            for row, feature in zip(chunk, features):
                results[row] = self._compare(row, windows[row][0], windows[row][1], feature)
                done += 1
                if on_progress is not None:
                    on_progress(done)
        return [results[r] for r in rows]

    def _frames(self, row: int, cached: CacheSample) -> np.ndarray | LiveSample:
        key = cached.key
        try:
            sample = self.index.sample(key)
        except KeyError:
            return LiveSample(key, row, problem=f"sample {key} is not in the dataset index of {self.index.source}")
        window = self.index.window(sample)
        try:
            live = np.stack([load_frame(f.path, self.resolution) for f in window])
        except FrameError as err:
            return LiveSample(key, row, problem=f"sample {key}: {err}")
        stored = np.asarray(cached.frames)
        if live.shape != stored.shape:
            return LiveSample(key, row, problem=f"sample {key}: live window frames are {live.shape}, "
                                                f"cached {stored.shape}")
        return live

    def _compare(self, row: int, live_frames: np.ndarray, cached: CacheSample,
                 live_feature: torch.Tensor) -> LiveSample:
        key = cached.key
        stored = np.asarray(cached.frames)
        differing = live_frames != stored
        sources = tuple(f.relpath for f, bad in zip(self.index.window(self.index.sample(key)),
                                                    differing.reshape(len(stored), -1).any(axis=1)) if bad)
        pixels_live, _ = qwen_pixel_values(live_frames)
        pixels_cached, _ = qwen_pixel_values(stored)
        pixels_identical = bool(torch.equal(pixels_live, pixels_cached))
        cached_feature = cached.feature
        if tuple(cached_feature.shape) != tuple(live_feature.shape):
            return LiveSample(key, row, problem=f"sample {key}: live feature {tuple(live_feature.shape)}, "
                                                f"cached {tuple(cached_feature.shape)}")
        feature = compare(live_feature, cached_feature, self.feature_tolerance, self.profile.cache.feature_dtype)
        embeddings = None
        if self.model is not None:
            with torch.no_grad():
                live_embeds = self.model.image_embeddings(torch.as_tensor(live_frames)[None], live_feature[None])[0]
                cached_embeds = self.model.image_embeddings(torch.as_tensor(stored)[None], cached_feature[None])[0]
            embeddings = compare(live_embeds, cached_embeds, self.embedding_tolerance, self.profile.cache.feature_dtype)
        return LiveSample(
            key, row,
            frames_identical=not differing.any(),
            differing_frame_bytes=int(differing.sum()),
            differing_sources=tuple(dict.fromkeys(sources)),
            pixel_values_identical=pixels_identical,
            feature=feature,
            embeddings=embeddings,
        )


def live_result(samples: Sequence[LiveSample], profile: Profile, device: torch.device | str, seed: int,
                seconds: float, model_note: str = "", unavailable: str | None = None) -> CheckResult:
    """One result from the live comparisons of every process."""
    device = torch.device(device)
    feature_tol = feature_tolerance(device)
    embed_tol = EMBEDDING_TOLERANCES[(device.type, profile.compute_dtype)]
    compute = f"encoder {device.type} {encoder_compute_dtype(device)}, model {device.type} {profile.compute_dtype}"
    if unavailable is not None:
        return _result(LIVE, [unavailable], "cannot compare", seconds, compute=compute, samples=[])
    problems: list[str] = []
    for s in samples:
        if s.problem is not None:
            problems.append(s.problem)
            continue
        if not s.frames_identical:
            problems.append(f"sample {s.key}: cached uint8 frames differ from the live ones in "
                            f"{s.differing_frame_bytes} bytes (source files {_listed(list(s.differing_sources))})")
        if not s.pixel_values_identical:
            problems.append(f"sample {s.key}: cached pixel_values differ from the live ones")
        for what, c in (("VGGT feature", s.feature), ("fused embeddings", s.embeddings)):
            if c is not None and not c.ok:
                problems.append(f"sample {s.key}: {what} max abs error {c.max_abs:.3g} (bound {c.bound:.3g}), "
                                f"cosine {c.cosine:.6f} (min {c.min_cosine})")
    compared = [s for s in samples if s.problem is None]
    feature = _summary([s.feature for s in compared if s.feature is not None])
    embeddings = _summary([s.embeddings for s in compared if s.embeddings is not None])
    detail = f"{len(compared)}/{len(samples)} samples (seed {seed}) compared"
    if compared:
        same = all(s.frames_identical and s.pixel_values_identical for s in compared)
        detail += "; frames and pixel_values " + ("bit-identical" if same else "DIFFER")
        if feature:
            detail += (f"; features max abs {feature['max_abs']:.3g} (bound {feature['min_bound']:.3g}), mean abs "
                       f"{feature['mean_abs']:.3g}, min cosine {feature['min_cosine']:.6f}")
        if embeddings:
            detail += f"; embeddings max abs {embeddings['max_abs']:.3g} (bound {embeddings['min_bound']:.3g})"
    if model_note:
        detail += f"; embeddings not checked: {model_note}"
    if not samples:
        detail = "no samples to compare"
    return _result(
        LIVE, problems, detail, seconds, seed=seed, compute=compute,
        tolerances={"feature": asdict(feature_tol), "embeddings": asdict(embed_tol),
                    "storage_ulp": STORAGE_ULP[profile.cache.feature_dtype]},
        frames_identical=all(s.frames_identical for s in compared) if compared else None,
        pixel_values_identical=all(s.pixel_values_identical for s in compared) if compared else None,
        feature=feature, embeddings=embeddings, embeddings_note=model_note,
        samples=[_sample_dict(s) for s in samples],
    )


def _summary(comparisons: Sequence[Comparison]) -> dict[str, float] | None:
    if not comparisons:
        return None
    return {
        "max_abs": max(c.max_abs for c in comparisons),
        "mean_abs": sum(c.sum_abs for c in comparisons) / max(sum(c.count for c in comparisons), 1),
        "min_cosine": min(c.cosine for c in comparisons),
        "max_scale": max(c.scale for c in comparisons),
        "min_bound": min(c.bound for c in comparisons),
    }


def _sample_dict(s: LiveSample) -> dict[str, Any]:
    def comparison(c: Comparison | None) -> dict[str, float] | None:
        return None if c is None else {"max_abs": c.max_abs, "mean_abs": c.mean_abs, "cosine": c.cosine,
                                       "scale": c.scale, "bound": c.bound}

    return {"key": s.key, "row": s.row, "problem": s.problem, "frames_identical": s.frames_identical,
            "pixel_values_identical": s.pixel_values_identical, "differing_sources": list(s.differing_sources),
            "feature": comparison(s.feature), "embeddings": comparison(s.embeddings)}


@_guarded(LIVE)
def check_live(root: Path | str, profile: Profile | str | Path, index: DatasetIndex | None, rows: Sequence[int],
               seed: int = DEFAULT_SEED, device: torch.device | str | None = None,
               encoder: WindowEncoder | None = None, with_model: bool = True) -> CheckResult:
    """The live check of sample ``rows`` (e.g. :func:`choose_live_rows` with ``seed``) in this
    process, against the sources of ``index`` (built with the profile's window history)."""
    if index is None:
        return skipped(LIVE, "not run: needs --data (the live path decodes the dataset's source images)")
    with _timer() as elapsed:
        profile = as_profile(profile)
        device = torch.device(device) if device is not None else profile_device(profile)
        model, note = load_fusion_model(profile, device) if with_model else (None, "not asked for")
        checker = LiveChecker(root, profile, index, device, encoder, model, note)
        unavailable = checker.unavailable()
        samples = [] if unavailable else checker.measure(rows)
        return live_result(samples, profile, device, seed, elapsed(), note, unavailable)


def profile_device(profile: Profile, local_rank: int = 0) -> torch.device:
    """Where the live path runs: the profile's device (``cuda:<local rank>`` for cuda)."""
    return torch.device(f"cuda:{local_rank}" if profile.device == "cuda" else "cpu")


def dataset_indexes(data: Path | str, cache_history: int, live_history: int) -> tuple[DatasetIndex, DatasetIndex]:
    """The index completeness compares against (the cache's window history) and the one the live
    path reads windows from (the profile's); one index when the two agree."""
    index = build_index(data, history=cache_history)
    return index, index if live_history == cache_history else build_index(data, history=live_history)


# ----------------------------------------------------------------------------------------------
# reports


def report_dict(cache: Path | str, results: Sequence[CheckResult], *, data: Path | str | None, profile: str,
                live: int, checksums: str, seed: int, world_size: int, seconds: float) -> dict[str, Any]:
    """The ``--json`` report (layout in docs/verify.md; ``schema_version`` :data:`REPORT_SCHEMA_VERSION`)."""
    schema = next((r for r in results if r.name == SCHEMA), None)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "cache": str(cache),
        "format": schema.data.get("format") if schema else None,
        "data": None if data is None else str(data),
        "profile": profile,
        "options": {"live": live, "checksums": checksums, "seed": seed},
        "world_size": world_size,
        "passed": not any(r.failed for r in results),
        "seconds": round(seconds, 4),
        "error": failure_message(cache, results) or None,
        "checks": [r.to_dict() for r in results],
    }


def format_table(results: Sequence[CheckResult], max_problems: int = 20) -> str:
    """The printed table: check, result, time, detail; then each failed check's problems."""
    width = max(len(n) for n in CHECK_NAMES)
    lines = [f"{'check':<{width}}  result  {'time':>8}  detail"]
    for r in results:
        status = r.status.upper() if r.failed else r.status  # a failure stands out
        lines.append(f"{r.name:<{width}}  {status:<6}  {r.seconds:>7.2f}s  {r.detail}")
    for r in results:
        if r.problems:
            lines.append(f"{r.name} problems:")
            lines += [f"  - {p}" for p in r.problems[:max_problems]]
            if len(r.problems) > max_problems:
                lines.append(f"  ... and {len(r.problems) - max_problems} more (see --json)")
    return "\n".join(lines)
