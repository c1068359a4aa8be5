"""One obstore ``S3Store`` per bucket (and key prefix) and process, and its failures as one line.

obstore's clients hold connections and a runtime (tokio's) that a forked process cannot use: a
child forked after its parent made a request hangs in its first one. So the stores are kept per
process id, made on first use from this process's configuration
(:mod:`janus_cache.store.remote.config`), and :func:`forks_can_read_buckets` tells whoever forks
workers that read a bucket (a DataLoader) to start them from a fresh interpreter instead.

obstore raises one exception type per kind of failure with the server's answer (its S3 error
``<Code>``) and a debug dump inside; :func:`remote_error` turns any of them into the one line a user
reads. A dropped connection or a 5xx answer has been retried by then
(:data:`~janus_cache.store.remote.config.RETRIES` tries with backoff).
"""

from __future__ import annotations

import os
from typing import Any

from janus_cache.store.remote.config import RETRIES, s3_settings, store_options
from janus_cache.store.remote.errors import (
    CREDENTIAL_CODES,
    EndpointUnreachable,
    ObjectMissing,
    RemoteError,
    first_line,
    is_connection_failure,
    s3_code,
)

_STORES: dict[tuple[int, str, str], Any] = {}


def forks_can_read_buckets() -> bool:
    """Whether a process forked from this one now can use obstore (it cannot once this process has
    made a store: its runtime does not survive a fork)."""
    pid = os.getpid()
    return not any(key[0] == pid for key in _STORES)


def bucket_store(bucket: str, prefix: str = "") -> Any:
    """obstore's ``S3Store`` of ``bucket``, its keys relative to ``prefix`` (no leading or trailing ``/``)."""
    key = (os.getpid(), bucket, prefix)
    store = _STORES.get(key)
    if store is None:
        from obstore.store import S3Store

        store = S3Store(bucket, prefix=prefix or None, **store_options())
        _STORES[key] = store
    return store


def remote_error(err: BaseException, where: str) -> RemoteError:
    """``err``, raised by obstore while using ``where`` (an ``s3://`` URL), as one line."""
    if isinstance(err, RemoteError):
        return err
    settings = s3_settings()
    code = s3_code(err)
    bucket = where.removeprefix("s3://").split("/", 1)[0]
    if code in CREDENTIAL_CODES:
        return RemoteError(f"{settings.where} refused the credentials from {settings.credentials_from} ({code}) "
                           f"for {where}: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile's keys")
    if code in ("AccessDenied", "AllAccessDisabled"):
        return RemoteError(f"{settings.where} denies access to {where} ({code}) with the credentials from "
                           f"{settings.credentials_from}: grant them s3:GetObject, s3:PutObject, s3:DeleteObject and "
                           "s3:ListBucket on it, or use other credentials")
    if code == "NoSuchBucket":
        return RemoteError(f"the bucket {bucket!r} does not exist at {settings.where}: create it "
                           f"(aws s3 mb s3://{bucket}) or fix the URL {where}")
    if isinstance(err, FileNotFoundError):
        return ObjectMissing(f"{where} does not exist")
    if code is None and " 403 " in first_line(err):  # a HEAD's refusal has no body to say why
        return RemoteError(f"{settings.where} refused access to {where} (403 Forbidden) with the credentials from "
                           f"{settings.credentials_from}: check the keys, and that they may read and write it")
    if is_connection_failure(err):
        return EndpointUnreachable(f"cannot reach the S3 endpoint {settings.where} for {where} (the connection failed or "
                           f"dropped, retried {RETRIES} times with backoff): {first_line(err)}; check that it is up "
                           "and that AWS_ENDPOINT_URL names it, then run the same command again")
    return RemoteError(f"{settings.where} failed on {where}: {code + ': ' if code else ''}{first_line(err)}")
