"""A bucket is a first-class home for a cache, as safe as a local disk, against a real S3 server.

The server is SeaweedFS (``weed mini``, helpers.s3_server: one per test session, signed requests
only), reached through the standard AWS variables; every step goes through the public commands:
``janus-cache push`` -> ``janus-cache info`` / ``verify`` in place -> training on 2 processes from
``s3://`` (ranks started by torch's elastic agent, helpers.forked_ranks, with 2 loader workers each)
whose losses equal the local run's bit for bit -> ``janus-cache pull`` (the same bytes); a byte
flipped in a remote shard is named by verify and by the training reader; a push killed mid-way
continues without sending again what arrived; of two pushes into one prefix one is refused naming
the other. The failures of the bucket's configuration and network are tests/e2e/test_object_storage_errors.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers.damage import flip_byte
from helpers.forked_ranks import forked_launch
from helpers.profiles import REPO_ROOT, file_digests
from helpers.s3_server import (
    BUCKET,
    JANUS_CACHE,
    TIMEOUT_S,
    S3Server,
    TcpProxy,
    janus_cache,
    objects,
    one_error,
    succeeded,
)
from helpers.shared_runs import OneSampleShards, ReferenceRun, TinyTraining
from helpers.training import read_metrics
from helpers.validation import assert_metrics_equal, hand_metrics
from janus_core.profile import load_profile
from janus_train.build import prompt_builder
from janus_train.checkpoint.export import load_exported
from janus_train.config import load_train_settings
from janus_train.data.from_profile import open_training_cache
from janus_train.data.samples import CachedSamples
from janus_train.run.layout import EXPORT_DIR

def started(server: S3Server, proxy: TcpProxy, *args: str | Path, until: Callable[[], bool]) -> subprocess.Popen[str]:
    """``janus-cache ARGS`` through ``proxy``, running in the background, stalled (``proxy`` paused)
    once ``until()`` holds with nothing more arriving: what was on its way when the proxy paused is
    let land first, and while that undoes ``until()`` (a file being written finished) it runs on."""
    command = subprocess.Popen([JANUS_CACHE, *map(str, args)], cwd=REPO_ROOT, env=server.env(proxy.endpoint),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while command.poll() is None and time.monotonic() < deadline:
        if until():
            proxy.paused.set()
            settled = time.monotonic() + 0.5
            while until() and time.monotonic() < settled:
                time.sleep(0.02)
            if until():
                break
            proxy.paused.clear()
        time.sleep(0.01)
    assert command.poll() is None, f"janus-cache {args[0]} ended before the test could act on it"
    return command


def killed(command: subprocess.Popen[str]) -> None:
    """SIGKILL ``command``, stalled by :func:`started`: whatever the machine's load, it has not
    finished when it dies."""
    os.kill(command.pid, signal.SIGKILL)
    command.communicate(timeout=30)


def local_state(copy: Path) -> tuple[list[str], list[str]]:
    """The whole files of a local copy (its lock left out) and the partial ones being written."""
    files = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*") if p.is_file() and p.name != ".janus.lock")
    return [n for n in files if not n.endswith(".partial")], [n for n in files if n.endswith(".partial")]


def losses(records: list[dict]) -> list[dict]:
    """The training losses of each step's record (not its validation's)."""
    return [{k: v for k, v in r.items() if ("loss" in k and not k.startswith("val_")) or k == "step"}
            for r in records]


def test_push_verify_in_place_train_on_2_processes_and_pull_give_what_the_local_cache_gives(
        s3_server: S3Server, tiny_training: TinyTraining, reference_run: ReferenceRun, tmp_path: Path) -> None:
    cache, url = tiny_training.fp32_cache, s3_server.url("tiny")
    pushed = succeeded(janus_cache(s3_server, "push", cache, url))
    n_files = len(file_digests(cache))
    assert re.fullmatch(rf"pushed {n_files} files \([0-9.]+ [kKMG]?B\) from {cache} to {url} in [0-9.]+ s "
                        r"\([0-9.]+ [kKMG]?B/s\)\n", pushed), pushed
    assert ".janus.lock" not in objects(s3_server, url)  # released
    again = succeeded(janus_cache(s3_server, "push", cache, url))
    assert again.startswith(f"nothing to do: {url} already holds the cache {cache} ({n_files} files"), again

    info = succeeded(janus_cache(s3_server, "info", url))
    assert info.startswith(f"cache {url} (zarr, schema 3)") and "MB in the bucket" in info, info
    verified = janus_cache(s3_server, "verify", url, "--profile", tiny_training.fp32_profile, "--live", "0")
    assert "verify passed: schema, integrity, completeness, freshness" in succeeded(verified), verified.stdout

    # The reference run's settings, from the bucket, with the loader workers h800 runs with, validating
    # at the end on the cache in the bucket too (train.val_cache): its final model is the reference's,
    # whose val_* over the 8 samples of the local cache are computed here by hand.
    run = tmp_path / "run"
    trained = forked_launch("pipelines.train", "--out", run, "--cache", url, "--profile", tiny_training.fp32_profile,
                            "--set", "train.num_workers=2", "--val-cache", url, "--no-export", env=s3_server.env())
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-5000:]
    records = read_metrics(run)
    assert losses(records) == losses(reference_run.records)
    profile = load_profile(tiny_training.fp32_profile)
    dataset = CachedSamples(open_training_cache(profile, cache).reader, prompt_builder(profile))
    model = load_exported(reference_run.out / EXPORT_DIR, profile, load_train_settings(profile).model_config()).eval()
    assert records[-1]["val_samples"] == len(dataset) == 8
    assert_metrics_equal(records[-1], hand_metrics(model, dataset, tuple(range(8)), records[-1]["distill_loss_weight"]))
    recorded = json.loads((run / "run.json").read_text())["starts"][0]["caches"][0]
    assert recorded["path"] == url and recorded["manifest_sha256"] is not None

    copy = tmp_path / "copy"
    pulled = succeeded(janus_cache(s3_server, "pull", url, copy))
    assert pulled.startswith(f"pulled {n_files} files") and "verified: " in pulled, pulled
    assert file_digests(copy) == file_digests(cache)
    assert succeeded(janus_cache(s3_server, "pull", url, copy)).startswith(f"nothing to do: {copy} already holds")


def test_a_byte_flipped_in_a_remote_shard_is_named_by_verify_and_by_the_training_reader(
        s3_server: S3Server, one_sample_shards: OneSampleShards) -> None:
    import obstore

    from janus_cache.store import DamagedData
    from janus_cache.store.remote.client import bucket_store
    from janus_cache.store.remote.path import S3Path

    url = s3_server.url("damaged")
    succeeded(janus_cache(s3_server, "push", one_sample_shards.cache("a"), url))
    profile = load_profile(one_sample_shards.profile)
    with s3_server.environment():
        reader = open_training_cache(profile, S3Path.parse(url)).reader
        shard = reader.shard_file(reader.features_array, 3)  # one sample per shard: row 3's
        key = reader.sample(3).key
        data = bytearray(shard.read_bytes())
        data[20] ^= 1  # as a failing disk in the server would
        obstore.put(bucket_store(BUCKET), shard.key, bytes(data))

    checked = janus_cache(s3_server, "verify", url, "--profile", one_sample_shards.profile, "--live", "0")
    error = one_error(checked)
    name = shard.relative_to(S3Path.parse(url)).as_posix()
    assert error.startswith(f"error: cache {url} ") and f"({name}) fails its checksum" in error, error
    assert error.endswith(f"it holds 1 samples {key}"), error

    with s3_server.environment():
        fresh = open_training_cache(profile, S3Path.parse(url)).reader
        with pytest.raises(DamagedData) as damaged:
            fresh.sample(3)
    assert damaged.value.file == str(shard) and damaged.value.key == key
    assert "checksum mismatch (crc32c)" in str(damaged.value)


def test_a_push_refuses_a_cache_that_fails_its_own_checksums_or_is_unfinished_whenever_it_would_send(
        s3_server: S3Server, one_sample_shards: OneSampleShards, tmp_path: Path) -> None:
    """A re-run of a finished push says at once that there is nothing to do (the cache's own checks
    are not run: nothing is sent); as soon as anything would be sent, they are."""
    import shutil

    cache = Path(shutil.copytree(one_sample_shards.cache("a"), tmp_path / "cache"))
    shard = cache / "vggt" / next(p.name for p in (cache / "vggt").iterdir() if p.is_dir())
    file = sorted(p for p in shard.rglob("*") if p.is_file() and p.name != "zarr.json")[2]
    flip_byte(file, 20)
    url = s3_server.url("refused")
    error = one_error(janus_cache(s3_server, "push", cache, url))
    name = file.relative_to(cache).as_posix()
    assert error.startswith(f"error: refusing to push {cache}: {name} fails its checksum: sha256 "), error
    assert "manifest.json" not in objects(s3_server, url)

    # Into a prefix that holds the finished push of this cache, one that has lost a file since is
    # refused before anything is sent or removed there.
    finished = s3_server.url("finished")
    succeeded(janus_cache(s3_server, "push", one_sample_shards.cache("a"), finished))
    there = objects(s3_server, finished)
    file.unlink()
    error = one_error(janus_cache(s3_server, "push", cache, finished))
    assert error.startswith(f"error: refusing to push {cache}, it is not a finished cache: ") and name in error, error
    assert objects(s3_server, finished) == there


def test_a_push_and_a_pull_killed_mid_way_are_continued_by_the_same_command_without_moving_again_what_arrived(
        s3_server: S3Server, tiny_training: TinyTraining, tmp_path: Path) -> None:
    """What arrived intact is judged by size and sha256: a pulled file damaged since (a flipped byte,
    a truncation) is fetched again; the copy ends verified."""
    cache, url = tiny_training.bf16_cache, s3_server.url("killed")
    with TcpProxy(s3_server.endpoint.removeprefix("http://"), delay_s=0.01) as slow:
        killed(started(s3_server, slow, "push", cache, url, "--threads", 2,
                             until=lambda: len(objects(s3_server, url)) >= 12))
    arrived = objects(s3_server, url)
    assert "manifest.json" not in arrived and ".janus.lock" in arrived, sorted(arrived)
    refused = one_error(janus_cache(s3_server, "info", url))
    assert refused == (f"error: {url} is not a janus cache (no manifest.json): a push into it did not finish (the "
                       "manifest comes last); run that janus-cache push again"), refused

    result = janus_cache(s3_server, "push", cache, url)
    output = succeeded(result)
    kept = len([n for n in arrived if n != ".janus.lock"])
    assert re.search(rf"; {kept} files were already there intact$", output.strip()), output
    assert re.fullmatch(r"note: took over the lock of \S+ left by writer pid \d+ on host \S+ for janus-cache push of "
                        r".+, started \S+, which ended without releasing it\n", result.stderr.split("[push]")[0]), (
        result.stderr)
    assert sorted(objects(s3_server, url)) == sorted(file_digests(cache))

    # The pull is killed while it writes a file (every response stalled mid-way), after 12 arrived.
    copy = tmp_path / "copy"
    with TcpProxy(s3_server.endpoint.removeprefix("http://"), delay_s=0.02) as slow:
        killed(started(s3_server, slow, "pull", url, copy, "--threads", 2,
                             until=lambda: len(local_state(copy)[0]) >= 12 and bool(local_state(copy)[1])))
    whole, partial = local_state(copy)
    assert "manifest.json" not in whole and partial, (whole, partial)
    flipped, truncated = whole[0], whole[1]
    flip_byte(copy / flipped, 0)
    (copy / truncated).write_bytes((copy / truncated).read_bytes()[:-1])

    result = janus_cache(s3_server, "pull", url, copy)
    output = succeeded(result)
    assert re.search(rf"; {len(whole) - 2} files were already there intact; verified: ", output), output
    assert result.stderr.startswith(f"note: took over the lock of {copy} left by writer pid "), result.stderr
    assert file_digests(copy) == file_digests(cache) and not local_state(copy)[1]


def test_of_two_pushes_into_one_prefix_the_second_is_refused_naming_the_first(
        s3_server: S3Server, tiny_training: TinyTraining) -> None:
    cache, url = tiny_training.bf16_cache, s3_server.url("two")
    # The first push holds the lock and stalls (its network paused) while the second one runs.
    with TcpProxy(s3_server.endpoint.removeprefix("http://"), delay_s=0.01) as slow:
        first = started(s3_server, slow, "push", cache, url, "--threads", 1,
                        until=lambda: ".janus.lock" in objects(s3_server, url))
        second = janus_cache(s3_server, "push", cache, url)
        slow.delay_s = 0.0
        slow.paused.clear()
        out, err = first.communicate(timeout=TIMEOUT_S)
    assert first.returncode == 0, out + err
    error = one_error(second)
    assert re.fullmatch(rf"error: {url} is in use by writer pid {first.pid} on host \S+ for janus-cache push of "
                        rf"{cache}, started \S+ \(lock {url}/.janus.lock\); a writer must wait until it ends", error), error


def test_a_webdataset_cache_is_verified_and_streamed_in_place(s3_server: S3Server, small_shards_cache,
                                                              small_shards_profile: Path) -> None:
    import torch

    from janus_cache.store import open_cache
    from janus_cache.store.remote.path import S3Path

    cache, url = small_shards_cache("wds"), s3_server.url("wds")
    succeeded(janus_cache(s3_server, "push", cache, url))
    checked = janus_cache(s3_server, "verify", url, "--profile", small_shards_profile, "--live", "0")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    profile = load_profile(small_shards_profile)
    def stored(samples) -> list[tuple[str, bytes, bytes]]:
        return [(s.key, s.frames.tobytes(), s.feature.view(torch.int16).numpy().tobytes()) for s in samples]

    local = stored(open_training_cache(profile, cache).reader.dataset(rank=1, world=2))
    with s3_server.environment():
        remote = stored(open_training_cache(profile, S3Path.parse(url)).reader.dataset(rank=1, world=2))
        assert open_cache(S3Path.parse(url)).format == "wds"
    assert remote == local and local


def test_precompute_into_a_bucket_is_refused_in_one_line_naming_push(s3_server: S3Server, sample_dataset: Path) -> None:
    url = s3_server.url("precompute")
    result = janus_cache(s3_server, "precompute", sample_dataset, "--out", url)
    assert result.returncode == 2
    assert one_error(result) == (
        f"error: --out {url}: precompute writes a cache to a local disk (a bucket has no rename, append or lock for "
        f"its shard writers); write it to a directory, then copy it with `janus-cache push DIR {url}`, and train "
        f"from {url} in place")


def test_training_from_a_bucket_with_data_refuses_a_cache_made_stale_by_its_dataset(
        s3_server: S3Server, tiny_training: TinyTraining, tmp_path: Path) -> None:
    """The staleness check of ``make train CACHE=s3://... DATA=...`` on one rank: the dataset's index
    is kept in the user's index folder (the bucket is never written by a reader)."""
    import shutil

    cache, url = tiny_training.bf16_cache, s3_server.url("stale")
    succeeded(janus_cache(s3_server, "push", cache, url))
    data = Path(shutil.copytree(tiny_training.data, tmp_path / "data"))
    edited = min((data / "episode_0001").glob("step_0002_*.json"))
    record = json.loads(edited.read_text())
    record["landmark_description"] = "A staircase that was not there."
    edited.write_text(json.dumps(record))
    run = tmp_path / "run"
    result = forked_launch("pipelines.train", "--cache", url, "--data", data, "--profile", tiny_training.bf16_profile,
                           "--out", run, "--no-export", nproc=1, env=s3_server.env())
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"error: cache {url} ") and "changed episode episode_0001" in errors[0], errors[0]
    assert str(edited) in errors[0] and not (run / "checkpoints").exists()
