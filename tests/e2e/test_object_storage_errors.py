"""What goes wrong with a bucket is one line, and nothing is left written half.

Against the real S3 server of helpers.s3_server, through ``janus-cache info / push / pull``, with
the configuration a user has: the standard AWS variables, or ``AWS_PROFILE`` with its config and
credential files (``AWS_CONFIG_FILE`` / ``AWS_SHARED_CREDENTIALS_FILE`` stand for ``~/.aws/``), and
the allow-http switch for the server's ``http://`` endpoint. A dropped connection goes through a
TCP proxy that cuts the transfer (helpers.s3_server.TcpProxy): retried with backoff first, one line
when it keeps failing. A full local disk during a pull is a size-limited tmpfs in a user+mount
namespace of the test's own.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.profiles import file_digests
from benchmarks.seaweedfs import ACCESS_KEY, BUCKET, SECRET_KEY, free_port
from helpers.s3_server import JANUS_CACHE, S3Server, TcpProxy, janus_cache, objects, one_error, succeeded
from helpers.shared_runs import TinyTraining


def test_no_credentials(s3_server: S3Server) -> None:
    url = s3_server.url()
    error = one_error(janus_cache(s3_server, "info", url, AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None))
    assert error == (f"error: no AWS credentials found for {s3_server.endpoint}: set AWS_ACCESS_KEY_ID and "
                     "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE naming a profile of ~/.aws/credentials or ~/.aws/config")


def test_wrong_credentials(s3_server: S3Server, tiny_training: TinyTraining) -> None:
    url = s3_server.url()
    error = one_error(janus_cache(s3_server, "push", tiny_training.bf16_cache, url, AWS_SECRET_ACCESS_KEY="wrong"))
    assert error.startswith(f"error: {s3_server.endpoint} refused the credentials from the environment "
                            f"(AWS_ACCESS_KEY_ID) (SignatureDoesNotMatch) for {url}/.janus.lock: check "), error
    assert objects(s3_server, url) == {}


def test_a_missing_bucket(s3_server: S3Server) -> None:
    error = one_error(janus_cache(s3_server, "info", "s3://no-such-bucket/caches/r2r"))
    assert error == (f"error: the bucket 'no-such-bucket' does not exist at {s3_server.endpoint}: create it "
                     "(aws s3 mb s3://no-such-bucket) or fix the URL s3://no-such-bucket/caches/r2r/manifest.json")


def test_an_endpoint_that_is_down(s3_server: S3Server) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    error = one_error(janus_cache(s3_server, "info", s3_server.url(), endpoint=down))
    assert error.startswith(f"error: cannot reach the S3 endpoint {down} for s3://{BUCKET}/"), error
    assert "retried 4 times with backoff" in error and error.endswith("then run the same command again"), error


def test_a_prefix_that_holds_no_janus_cache(s3_server: S3Server, tmp_path: Path, tiny_training: TinyTraining) -> None:
    import obstore

    from janus_cache.store.remote.client import bucket_store

    url = s3_server.url("empty")
    expected = (f"error: {url} is not a janus cache (no manifest.json): nothing janus wrote is there; push a cache "
                f"with janus-cache push CACHE {url}")
    assert one_error(janus_cache(s3_server, "info", url)) == expected
    assert one_error(janus_cache(s3_server, "pull", url, tmp_path / "copy")) == expected
    assert not (tmp_path / "copy").exists()
    with s3_server.environment():
        obstore.put(bucket_store(BUCKET), url.removeprefix(f"s3://{BUCKET}/") + "/notes.txt", b"not a cache")
    assert one_error(janus_cache(s3_server, "push", tiny_training.bf16_cache, url)) == (
        f"error: {url} holds 1 object(s) but no janus cache (no zarr.json): push into an empty prefix, or one that "
        "holds a janus cache")
    assert sorted(objects(s3_server, url)) == ["notes.txt"]


def test_a_plain_http_endpoint_needs_the_allow_http_switch(s3_server: S3Server) -> None:
    error = one_error(janus_cache(s3_server, "info", s3_server.url(), AWS_ALLOW_HTTP=None))
    assert error == (f"error: the S3 endpoint {s3_server.endpoint} is plain http: set AWS_ALLOW_HTTP=true to allow it "
                     "(a server on this machine or a trusted network), or use an https:// endpoint")


def test_a_profile_of_the_aws_config_files_is_used_and_a_missing_one_is_named(
        s3_server: S3Server, tiny_training: TinyTraining, tmp_path: Path) -> None:
    config, credentials = tmp_path / "config", tmp_path / "credentials"
    config.write_text(f"[profile janus-test]\nregion = us-east-1\nendpoint_url = {s3_server.endpoint}\n")
    credentials.write_text(f"[janus-test]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    files = {"AWS_CONFIG_FILE": str(config), "AWS_SHARED_CREDENTIALS_FILE": str(credentials),
             "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_ENDPOINT_URL": None}
    url = s3_server.url("profile")
    succeeded(janus_cache(s3_server, "push", tiny_training.bf16_cache, url, AWS_PROFILE="janus-test", **files))
    assert succeeded(janus_cache(s3_server, "info", url, AWS_PROFILE="janus-test", **files)).startswith(f"cache {url}")
    assert one_error(janus_cache(s3_server, "info", url, AWS_PROFILE="nobody", **files)) == (
        "error: AWS_PROFILE names the profile 'nobody', which ~/.aws/config and ~/.aws/credentials do not hold: name "
        "one of their profiles, or unset AWS_PROFILE")


def test_a_dropped_connection_is_retried_and_one_that_keeps_dropping_is_one_line(
        s3_server: S3Server, tiny_training: TinyTraining, tmp_path: Path) -> None:
    cache, target = tiny_training.bf16_cache, s3_server.endpoint.removeprefix("http://")
    url = s3_server.url("dropped")
    with TcpProxy(target, drop=3, drop_after=4096) as flaky:
        succeeded(janus_cache(s3_server, "push", cache, url, endpoint=flaky.endpoint))
        assert flaky.dropped == 3
    copy = tmp_path / "copy"
    with TcpProxy(target, drop=3, drop_after=4096) as flaky:
        succeeded(janus_cache(s3_server, "pull", url, copy, endpoint=flaky.endpoint))
    assert file_digests(copy) == file_digests(cache)

    broken_url = s3_server.url("broken")
    with TcpProxy(target, drop=10_000, drop_after=0) as broken:
        error = one_error(janus_cache(s3_server, "push", cache, broken_url, endpoint=broken.endpoint))
    assert error.startswith(f"error: cannot reach the S3 endpoint {broken.endpoint} for {broken_url}"), error
    assert objects(s3_server, broken_url) == {}


def _namespaces_work() -> bool:
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt && test -d /mnt"],
                           capture_output=True, check=False) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs unprivileged user+mount namespaces (unshare -rm)")
def test_a_full_local_disk_during_a_pull_is_one_line_and_leaves_no_half_written_cache(
        s3_server: S3Server, tiny_training: TinyTraining, tmp_path: Path) -> None:
    cache, url = tiny_training.bf16_cache, s3_server.url("full")
    succeeded(janus_cache(s3_server, "push", cache, url))
    mount, kept = tmp_path / "small-disk", tmp_path / "kept"
    mount.mkdir()
    size = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file()) // 2 // 4096 * 4096  # half of it
    script = (f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(mount))} && "
              f"{shlex.quote(JANUS_CACHE)} pull {url} {shlex.quote(str(mount / 'copy'))}; code=$?; "
              f"cp -a {shlex.quote(str(mount))} {shlex.quote(str(kept))}; exit $code")
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script],
                            env=s3_server.env(), capture_output=True, text=True, timeout=300, check=False)
    error = one_error(result)
    assert re.fullmatch(rf"error: {re.escape(str(mount / 'copy'))}: not enough room to pull {url}: [0-9.]+ [kKM]?B "
                        r"to write, [0-9.]+ [kKM]?B free; free space or pull elsewhere", error), error
    left = [p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()]
    assert "copy/manifest.json" not in left and not any(name.endswith(".partial") for name in left), left
