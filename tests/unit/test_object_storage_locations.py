"""A cache's location is parsed once at the edge into a local Path or an S3Path and passed as that
type: the command lines' values, a run's ``--cache`` sources and ``train.val_cache``; the lock
object's staleness rule; what a push or pull copies and in which order. (The server side of all
of it: tests/e2e/test_object_storage*.py.)"""

from __future__ import annotations

import json
import os
import pickle
import socket
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath

import pytest

from janus_cache.store.location import cache_location, is_remote, join, relative_name
from janus_cache.store.remote.lock import STALE_AFTER_SECONDS, stale_reason
from janus_cache.store.remote.path import S3Path
from janus_cache.transfer import CHECKSUMS, COMMITS, DATA, MANIFEST, is_content, stage_of
from janus_core.system.lock import Holder
from janus_train.data.sources import CacheSource, as_sources, parse_cache_sources


def test_an_s3_url_is_a_bucket_and_a_key_and_anything_else_a_local_path(tmp_path: Path) -> None:
    remote = cache_location("s3://caches/r2r//pad644/")
    assert remote == S3Path("caches", "r2r/pad644") and str(remote) == "s3://caches/r2r/pad644" and is_remote(remote)
    assert cache_location(tmp_path / "cache") == tmp_path / "cache" and not is_remote(cache_location("s3:/x"))
    assert cache_location(remote) is remote
    for bad in ("s3://", "s3:///key", "s3://bucket/a/../b"):
        with pytest.raises(ValueError, match="s3://"):
            cache_location(bad)


def test_an_s3_path_joins_names_and_relates_keys_like_a_posix_path() -> None:
    root = S3Path.parse("s3://caches/r2r")
    shard = root / "frames/pad644" / "c/0/0/0/0"
    assert shard.key == "r2r/frames/pad644/c/0/0/0/0" and shard.name == "0" and shard.parent.name == "0"
    assert shard.relative_to(root) == PurePosixPath("frames/pad644/c/0/0/0/0")
    assert relative_name(shard, root) == "frames/pad644/c/0/0/0/0" and join(root, "manifest.json") == root / "manifest.json"
    assert join("/data/cache", "manifest.json") == "/data/cache/manifest.json"
    assert pickle.loads(pickle.dumps(shard)) == shard and hash(shard) == hash(S3Path("caches", shard.key))
    with pytest.raises(ValueError, match="is not under"):
        S3Path.parse("s3://other/r2r/x").relative_to(root)


def test_a_runs_caches_may_be_in_buckets_also_in_a_mixture() -> None:
    one = parse_cache_sources(["s3://caches/r2r"])
    assert one == [CacheSource("r2r", S3Path("caches", "r2r"), 1.0)]
    mixed = parse_cache_sources(["r2r=s3://caches/r2r:0.7", "rxr=caches/rxr:0.3"])
    assert [(s.name, s.path, s.weight) for s in mixed] == [("r2r", S3Path("caches", "r2r"), 0.7),
                                                           ("rxr", Path("caches/rxr"), 0.3)]
    assert as_sources("s3://caches/val") == [CacheSource("val", S3Path("caches", "val"), 1.0)]


def test_a_validation_cache_setting_may_name_a_bucket_and_a_local_one_stays_relative_to_the_profile(
        tmp_path: Path) -> None:
    import yaml

    from janus_core.profile import load_profile
    from janus_train.config import load_train_settings

    from helpers.profiles import write_test_profile

    def settings_with(value: str) -> object:
        path = write_test_profile(tmp_path / f"{abs(hash(value))}.yaml")
        data = yaml.safe_load(path.read_text())
        data["train"]["val_cache"] = value
        path.write_text(yaml.safe_dump(data))
        return load_train_settings(load_profile(path)).val_cache

    assert settings_with("s3://caches/r2r-val") == "s3://caches/r2r-val"
    assert settings_with("val") == (tmp_path / "val").resolve()


def _record(holder: Holder, renewed: datetime) -> bytes:
    return json.dumps({"host": holder.host, "pid": holder.pid, "started": holder.started, "mode": holder.mode,
                       "purpose": holder.purpose, "renewed": renewed.isoformat()}).encode()


def test_a_lock_object_is_stale_when_its_process_here_is_gone_or_it_was_not_renewed() -> None:
    now = datetime.now(timezone.utc)
    alive = Holder(socket.gethostname(), os.getpid(), now.isoformat(), "writer", "janus-cache push of /c")
    assert stale_reason(_record(alive, now), now) is None
    gone = Holder(socket.gethostname(), 2 ** 22 + 12345, now.isoformat(), "writer")  # above pid_max's default
    assert stale_reason(_record(gone, now), now) == "which ended without releasing it"
    elsewhere = Holder("another-host", 1, now.isoformat(), "writer")
    assert stale_reason(_record(elsewhere, now), now) is None  # its process cannot be asked: renewals tell
    old = now - timedelta(seconds=STALE_AFTER_SECONDS + 120)
    assert stale_reason(_record(elsewhere, old), now) == "which has not renewed it for 12 minutes"
    assert stale_reason(b"not json", old) == "which has not renewed it for 12 minutes"


def test_a_copy_sends_data_then_commit_records_then_checksums_and_the_manifest_last() -> None:
    names = ["manifest.json", "checksums.json", "commits/frames/pad644/000000.json", "frames/pad644/c/0/0/0/0",
             "zarr.json", "episodes.json"]
    assert sorted(names, key=stage_of)[-3:] == ["commits/frames/pad644/000000.json", "checksums.json", "manifest.json"]
    assert [stage_of(n) for n in names] == [MANIFEST, CHECKSUMS, COMMITS, DATA, DATA, DATA]
    assert not any(is_content(n) for n in (".janus.lock", "index/abc/meta.json", "zarr.json.123.ab.partial"))
