"""The integrity check: every planned shard has a commit record matching the plan, its file
exists with the recorded size and (``checksums``) its sha256 matches; each bad shard is named with
the frame or sample keys it holds.

The shard rule itself is the store's (:func:`janus_cache.store.commit.check_record`), and so is the
rule of which shards each ``checksums`` mode hashes (:func:`janus_cache.store.commit.hashed`); this module
plans which shards to check and hash, and turns findings into one result. The work splits over
processes: :func:`plan_integrity` once, :func:`check_targets` on any share of the targets,
:func:`integrity_result` on all findings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from janus_core.plural import plural
from janus_cache.store import StoreError
from janus_cache.store.commit import CHECKSUM_MODES, SAMPLE_STRIDE, check_record, hashed, read_record
from janus_cache.store.location import cache_location, is_remote, join
from janus_cache.store.remote.errors import RemoteError
from janus_cache.store.layout import FRAMES_GROUP, FRAMES_TABLE, SAMPLES_TABLE, TABLES_GROUP, VIT_GROUP, WDS_DIR
from janus_cache.store.wds_store import planned_tar_shards
from janus_cache.store.zarr_group import PlannedShard
from janus_cache.store.open import OpenedCache
from janus_cache.verify.cache import open_checked, open_for_checks, wds_reader
from janus_cache.verify.results import DEFAULT_SEED, INTEGRITY, CheckResult, guarded, listed, result, timer

CHECKSUM_SAMPLE_FRACTION = 1 / SAMPLE_STRIDE
"""``--checksums sample`` hashes one shard in 16 (at least one) of each frame / feature / tar array,
which ones chosen by the seed (:func:`janus_cache.store.commit.hashed`); table columns are small and
always hashed. Every other shard still has its commit record, file and byte size checked."""

DEFAULT_HASH_THREADS = 4
"""Threads hashing shards in each process: reading and sha256 run without the GIL, so threads
overlap the disk's latency with hashing (one thread hashes ~0.7-1 GB/s of cached data here)."""


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
    nbytes: int = 0
    """Bytes the check reads (the shard file's size when ``hashed``, else 0): progress and cost."""

    @property
    def name(self) -> str:
        return f"{self.array}#{self.shard} ({self.file})"


@dataclass(frozen=True)
class ShardFinding:
    """What checking one :class:`ShardTarget` found: None when the shard is good. ``hash_only``:
    the damage shows only to hashing (the record, file and size are right), which a resume that
    trusts records and sizes does not see: its repair needs ``precompute --checksums all``."""

    target: ShardTarget
    problem: str | None
    hash_only: bool = False


@dataclass(frozen=True)
class IntegrityPlan:
    """The shards to check and the problems found while planning (e.g. an array that is gone)."""

    checksums: str
    targets: list[ShardTarget]
    problems: list[str]


def plan_integrity(root: Path | str, checksums: str = "all", seed: int = DEFAULT_SEED) -> IntegrityPlan:
    """Which shards to check and which to hash (see :data:`CHECKSUM_SAMPLE_FRACTION`)."""
    if checksums not in CHECKSUM_MODES:
        raise ValueError(f"checksums must be one of {CHECKSUM_MODES}, got {checksums!r}")
    cache = open_for_checks(root)
    problems: list[str] = []
    planned = _planned(cache, problems)
    manifest_sha = {(a, e.shard): e.sha256 for a, entries in cache.manifest.shards.items() for e in entries
                    if e.committed}
    n_shards = Counter(p.array for p in planned)
    targets = []
    for p in planned:
        hash_it = hashed(checksums, p.array, p.shard, n_shards[p.array], seed)
        targets.append(ShardTarget(p.array, p.shard, p.rows.start, p.rows.stop,
                                   p.file.relative_to(cache.root).as_posix(), hash_it,
                                   manifest_sha.get((p.array, p.shard), ""), _size(p.file) if hash_it else 0))
    return IntegrityPlan(checksums, targets, problems)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _planned(cache: OpenedCache, problems: list[str]) -> list[PlannedShard]:
    """Every shard the cache should hold, committed or not: the arrays of the manifest's shard
    table (of the arrays on disk when the precompute did not finish) and the tar layouts' shards.
    An array that is gone or cannot be opened is a problem naming what it held."""
    contents = Contents(cache)
    listed_arrays = {a: e for a, e in cache.manifest.shards.items() if not a.startswith(WDS_DIR + "/")}
    try:
        paths = list(listed_arrays) if cache.manifest.shards else cache.group.array_paths()
    except (OSError, ValueError) as err:
        problems.append(f"cannot list the arrays of {cache.root}: {err}")
        paths = []
    planned: list[PlannedShard] = []
    for path in paths:
        entries = listed_arrays.get(path, ())

        def held(path: str = path, entries: Sequence = entries) -> str:
            # Only for a problem's message: naming the keys reads the key column.
            return contents.describe(path, range(entries[0].start, entries[-1].stop)) if entries else "unknown rows"

        if not cache.group.has_array(path):
            problems.append(f"array {path} ({len(entries)} shards in the manifest) is missing from the cache; "
                            f"it held {held()}")
            continue
        try:
            plan = cache.group.array_shard_plan(path)
            planned += [PlannedShard(path, i, rows, cache.group.shard_file(path, i)) for i, rows in enumerate(plan)]
        except Exception as err:  # noqa: BLE001 - any failure to open the array is a finding
            problems.append(f"array {path} cannot be opened ({type(err).__name__}: {err}); it holds {held()}")
            continue
        if entries and len(plan) != len(entries):
            problems.append(f"array {path} has {len(plan)} shards, the manifest's shard table lists {len(entries)}")
    if cache.format == "wds":
        for name in cache.manifest.resolutions:
            try:
                planned += planned_tar_shards(cache.root, wds_reader(cache, name).layout)
            except StoreError as err:
                problems.append(str(err))
    return planned


def check_target(root: Path | str, target: ShardTarget) -> ShardFinding:
    """The store's shard check (record matching the plan, file present with the recorded size and,
    when ``target.hashed``, sha256), plus the record agreeing with the manifest's shard table."""
    root = cache_location(root)
    try:
        record = read_record(root, target.array, target.shard)
    except RemoteError:  # the bucket's failure, not the shard's
        raise
    except StoreError as err:
        return ShardFinding(target, str(err))
    rows, file = range(target.start, target.stop), join(root, target.file)
    check = check_record(root, record, target.array, target.shard, rows, file, verify=True, checksum=target.hashed)
    if not check.ok:
        hash_only = target.hashed and check_record(root, record, target.array, target.shard, rows, file,
                                                   verify=True, checksum=False).ok
        return ShardFinding(target, check.problem, hash_only)
    if target.manifest_sha256 and record is not None and record.sha256 != target.manifest_sha256:
        return ShardFinding(target, "its commit record differs from the manifest's shard table "
                                    "(the shard was rewritten after the precompute finished)", hash_only=True)
    return ShardFinding(target, None)


def check_targets(root: Path | str, targets: Sequence[ShardTarget],
                 on_progress: Callable[[ShardFinding], None] | None = None,
                 threads: int = DEFAULT_HASH_THREADS) -> list[ShardFinding]:
    """:func:`check_target` for each target, on ``threads`` threads when any target is hashed (record
    and size checks alone are Python-bound on a disk, where threads only add GIL contention; a
    bucket's are request-bound, so they take the threads too); ``on_progress(finding)`` after each, in
    this thread. Findings come back in the order of ``targets``."""
    waits = any(t.hashed for t in targets) or is_remote(cache_location(root))
    if threads <= 1 or len(targets) <= 1 or not waits:
        findings = []
        for target in targets:
            findings.append(check_target(root, target))
            if on_progress is not None:
                on_progress(findings[-1])
        return findings
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="janus-hash") as pool:
        findings = []
        # map() submits every target up front and yields in order, so progress follows the slowest
        # shard in flight by at most ``threads`` shards.
        for finding in pool.map(lambda target: check_target(root, target), targets):
            findings.append(finding)
            if on_progress is not None:
                on_progress(finding)
        return findings


class Contents:
    """Names what a shard holds: the frame keys, sample keys or table column of its rows."""

    def __init__(self, cache: OpenedCache) -> None:
        self.cache = cache

    def keys(self, array: str, rows: range) -> tuple[str, list[str]]:
        """(kind, keys) of the rows of ``array``; keys are empty for table columns or unreadable keys.
        The key column is read once (by the cache) and only when a shard needs naming."""
        if array.startswith(TABLES_GROUP + "/"):
            return "table", []
        # ViT features are one row per frame too (cache.vit_features).
        table = FRAMES_TABLE if array.startswith((FRAMES_GROUP + "/", VIT_GROUP + "/")) else SAMPLES_TABLE
        keys = self.cache.readable_keys(table)
        return table, [] if keys is None else keys[rows.start:rows.stop]

    def describe(self, array: str, rows: range) -> str:
        kind, keys = self.keys(array, rows)
        if kind == "table":
            column = array.removeprefix(TABLES_GROUP + "/")
            return f"table column {column} (rows {rows.start}:{rows.stop})"
        if not keys:
            return f"{kind} rows {rows.start}:{rows.stop} (keys unreadable)"
        return f"{len(keys)} {kind} {listed(keys)}"


def _named(target: ShardTarget, problem: str) -> str:
    """The problem as one line that names the shard once, with its file."""
    prefix = f"shard {target.array}#{target.shard} "
    if problem.startswith(prefix + "("):
        return problem
    if problem.startswith(prefix):
        return f"shard {target.name} {problem.removeprefix(prefix)}"
    return f"shard {target.name}: {problem}"


def integrity_result(root: Path | str, plan: IntegrityPlan, findings: Sequence[ShardFinding],
                     seconds: float) -> CheckResult:
    """One result from the plan and the findings of every process."""
    contents = Contents(open_for_checks(root))
    problems = list(plan.problems)
    bad = []
    for f in sorted(findings, key=lambda f: (f.target.array, f.target.shard)):
        if f.problem is None:
            continue
        rows = range(f.target.start, f.target.stop)
        kind, keys = contents.keys(f.target.array, rows)
        problems.append(f"{_named(f.target, f.problem)}; it holds {contents.describe(f.target.array, rows)}")
        bad.append({"shard": f"{f.target.array}#{f.target.shard}", "file": f.target.file, "problem": f.problem,
                    "hash_only": f.hash_only, "holds": kind, "rows": [f.target.start, f.target.stop], "keys": keys})
    n_hashed = sum(f.target.hashed for f in findings)
    detail = (f"{len(findings) - len(bad)}/{plural(len(findings), 'shard')} good; checksums {plan.checksums}: "
              f"{plural(n_hashed, 'shard')} hashed, all checked for commit record, file and size")
    if plan.problems:
        detail += f"; {plural(len(plan.problems), 'array')} missing or unreadable"
    return result(INTEGRITY, problems, detail, seconds, checksums=plan.checksums, shards=len(findings),
                  hashed=n_hashed, bad=bad)


@guarded(INTEGRITY)
def check_integrity(root: Path | str, checksums: str = "all", seed: int = DEFAULT_SEED,
                    on_progress: Callable[[ShardFinding], None] | None = None,
                    threads: int = DEFAULT_HASH_THREADS) -> CheckResult:
    """The whole integrity check in this process."""
    with timer() as elapsed:
        opened = open_checked(root, INTEGRITY)
        if isinstance(opened, CheckResult):
            return opened
        plan = plan_integrity(root, checksums, seed)
        findings = check_targets(root, plan.targets, on_progress, threads)
        return integrity_result(root, plan, findings, elapsed())
