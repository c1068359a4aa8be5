"""The trainer's start-up check: a cache may be trained on with a profile.

Cheap at any cache size and never builds the VGGT encoder: schema, shard presence (commit record,
file and size; hashing every byte is left to ``janus-cache verify``) and freshness, whose encoder
fingerprint is computed from the profile's checkpoint file.
"""

from __future__ import annotations

from pathlib import Path

from janus_cache.verify.freshness import check_freshness
from janus_cache.verify.integrity import check_integrity
from janus_cache.verify.results import FRESHNESS, CacheVerificationError, CheckResult, skipped
from janus_cache.verify.schema import check_schema
from janus_core.profile import Profile
from janus_core.vggt.encoder import EncoderIdentity


def check_cache_for_training(cache: Path | str, profile: Profile | str | Path,
                             encoder: EncoderIdentity | None = None) -> list[CheckResult]:
    """Schema, shard presence and freshness of ``cache`` against ``profile``.

    Returns the results when they pass; raises :class:`CacheVerificationError` (its message is
    the line ``janus-cache verify`` prints) when one fails. ``encoder`` (the profile's encoder
    identity) is computed from the profile unless given.
    """
    results = [check_schema(cache)]
    if results[0].passed:
        results += [check_integrity(cache, checksums="none"), check_freshness(cache, profile, encoder)]
    else:
        results.append(skipped(FRESHNESS, "not run: the schema check failed"))
    if any(r.failed for r in results):
        raise CacheVerificationError(cache, results)
    return results
