"""Verify a cache: complete, intact, current, and equal to what the live path computes.

One module per check, each a plain single-process function returning a
:class:`~janus_cache.verify.results.CheckResult`:

:mod:`~janus_cache.verify.schema`
    manifest, arrays, layouts and tables present with the shapes and dtypes the manifest says.
:mod:`~janus_cache.verify.integrity`
    every planned shard committed, present, of its size and (``checksums``) its sha256.
:mod:`~janus_cache.verify.completeness`
    unique keys, valid windows, whole tar shards; with a dataset index, the cache against it.
:mod:`~janus_cache.verify.freshness`
    the keyed fingerprints equal a profile's.
:mod:`~janus_cache.verify.live`
    chosen samples recomputed from the sources (tolerances in :mod:`~janus_cache.verify.comparison`).

:mod:`~janus_cache.verify.results` holds the result type and the reports;
:mod:`~janus_cache.verify.gate` the trainer's start-up check (:func:`check_cache_for_training`).
Splitting work over processes, and building the model whose embeddings the live check compares,
is the caller's business (``pipelines/verify.py``).
"""

from janus_cache.verify.cache import open_for_checks
from janus_cache.verify.comparison import (
    EMBEDDING_TOLERANCES,
    FEATURE_TOLERANCES,
    STORAGE_ULP,
    Comparison,
    Tolerance,
    compare,
    encoder_compute_dtype,
    feature_tolerance,
)
from janus_cache.verify.completeness import check_completeness, dataset_indexes, index_store_of
from janus_cache.verify.freshness import as_profile, check_freshness, profile_differences, profile_encoder
from janus_cache.verify.gate import check_cache_for_training
from janus_cache.verify.integrity import (
    CHECKSUM_MODES,
    CHECKSUM_SAMPLE_FRACTION,
    DEFAULT_HASH_THREADS,
    IntegrityPlan,
    ShardFinding,
    ShardTarget,
    check_integrity,
    check_target,
    check_targets,
    integrity_result,
    plan_integrity,
)
from janus_cache.verify.live import (
    DEFAULT_LIVE_SAMPLES,
    ImageEmbeddings,
    LiveChecker,
    LiveSample,
    check_live,
    choose_live_rows,
    live_result,
    read_cached_samples,
)
from janus_cache.verify.results import (
    CHECK_NAMES,
    COMPLETENESS,
    DEFAULT_SEED,
    FRESHNESS,
    INTEGRITY,
    LISTED,
    LIVE,
    REPORT_SCHEMA_VERSION,
    SCHEMA,
    CacheVerificationError,
    CheckResult,
    crashed,
    failure_message,
    format_table,
    report_dict,
    skipped,
)
from janus_cache.verify.schema import check_schema

__all__ = [
    "CHECKSUM_MODES",
    "CHECKSUM_SAMPLE_FRACTION",
    "CHECK_NAMES",
    "COMPLETENESS",
    "DEFAULT_HASH_THREADS",
    "DEFAULT_LIVE_SAMPLES",
    "DEFAULT_SEED",
    "EMBEDDING_TOLERANCES",
    "FEATURE_TOLERANCES",
    "FRESHNESS",
    "INTEGRITY",
    "LISTED",
    "LIVE",
    "REPORT_SCHEMA_VERSION",
    "SCHEMA",
    "STORAGE_ULP",
    "CacheVerificationError",
    "CheckResult",
    "Comparison",
    "ImageEmbeddings",
    "IntegrityPlan",
    "LiveChecker",
    "LiveSample",
    "ShardFinding",
    "ShardTarget",
    "Tolerance",
    "as_profile",
    "check_cache_for_training",
    "check_completeness",
    "check_freshness",
    "check_integrity",
    "check_live",
    "check_schema",
    "check_target",
    "check_targets",
    "choose_live_rows",
    "compare",
    "crashed",
    "dataset_indexes",
    "index_store_of",
    "encoder_compute_dtype",
    "failure_message",
    "feature_tolerance",
    "format_table",
    "integrity_result",
    "live_result",
    "open_for_checks",
    "plan_integrity",
    "profile_differences",
    "profile_encoder",
    "read_cached_samples",
    "report_dict",
    "skipped",
]
