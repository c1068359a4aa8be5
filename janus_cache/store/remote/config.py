"""Where a bucket is and who reads it: the AWS ecosystem's configuration, not janus's.

botocore (the library under boto3 and the AWS CLI) resolves it exactly as those tools do:

* credentials: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (/ ``AWS_SESSION_TOKEN``), else the
  profile named by ``AWS_PROFILE`` (or ``default``) in ``~/.aws/credentials`` and ``~/.aws/config``
  (static keys, SSO, ``credential_process``, an assumed role), else a container's or instance's role;
* region: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region`` (``us-east-1`` when none);
* endpoint: ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``endpoint_url`` (or its
  ``services`` section), else AWS's own;
* ``AWS_ALLOW_HTTP=true``: an ``http://`` endpoint is allowed (a test server on localhost), obstore's
  own switch; without it such an endpoint is refused in one line.

The result is handed to obstore explicitly (:func:`store_options`), credentials through obstore's
boto3 provider (refreshed when they expire).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any

from janus_cache.store.remote.errors import RemoteError

DEFAULT_REGION = "us-east-1"
"""The region requests are signed for when none is configured (what S3-compatible servers accept)."""

ALLOW_HTTP_VARIABLE = "AWS_ALLOW_HTTP"
TRUE_WORDS = ("1", "true", "yes", "on")

RETRIES = 4
"""Tries after the first of one request that failed on a dropped connection, a timeout or a 5xx
answer (obstore's retry, with exponential backoff and jitter)."""
RETRY_BACKOFF = (timedelta(milliseconds=200), timedelta(seconds=4))
"""First and longest wait between two tries of a request."""
RETRY_TIMEOUT = timedelta(seconds=30)
"""How long a request is retried at most: an endpoint that is down is one line after about this long."""
CONNECT_TIMEOUT = "10s"
REQUEST_TIMEOUT = "300s"
"""A whole request (a shard of hundreds of MB on a slow link included)."""


@dataclass(frozen=True)
class S3Settings:
    """The resolved configuration (for messages and the store); credentials stay in botocore."""

    endpoint: str | None
    """None: AWS's own endpoint for the region."""
    region: str
    allow_http: bool
    credentials_from: str
    """Where the credentials came from, for messages: ``environment``, ``profile 'p' (...)``..."""

    @property
    def where(self) -> str:
        """The endpoint as messages name it."""
        return self.endpoint or f"AWS S3 ({self.region})"


def _session() -> Any:
    import botocore.session
    from botocore.exceptions import ProfileNotFound

    session = botocore.session.Session()
    try:
        session.get_scoped_config()
    except ProfileNotFound as err:
        raise RemoteError(f"AWS_PROFILE names the profile {err.kwargs.get('profile')!r}, which ~/.aws/config and "
                          "~/.aws/credentials do not hold: name one of their profiles, or unset AWS_PROFILE") from None
    return session


def _endpoint(session: Any) -> str | None:
    from botocore.configprovider import ConfiguredEndpointProvider

    provider = ConfiguredEndpointProvider(full_config=session.full_config, scoped_config=session.get_scoped_config(),
                                          client_name="s3")
    endpoint = provider.provide()
    return str(endpoint).rstrip("/") if endpoint else None


def _region(session: Any) -> str:
    return os.environ.get("AWS_REGION") or session.get_config_variable("region") or DEFAULT_REGION


def _credential_source(credentials: Any) -> str:
    method = getattr(credentials, "method", "") or "unknown"
    profile = os.environ.get("AWS_PROFILE")
    if method == "env":
        return "the environment (AWS_ACCESS_KEY_ID)"
    return f"{method}" + (f" of profile {profile!r} (AWS_PROFILE)" if profile else "")


@cache
def _resolved(pid: int) -> tuple[S3Settings, Any]:
    """The settings and the botocore session of this process (``pid``: resolved again after a fork,
    as obstore's clients are)."""
    session = _session()
    endpoint = _endpoint(session)
    allow_http = os.environ.get(ALLOW_HTTP_VARIABLE, "").strip().lower() in TRUE_WORDS
    credentials = session.get_credentials()
    region = _region(session)
    if credentials is None:
        raise RemoteError(
            f"no AWS credentials found for {endpoint or 'AWS S3'}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE naming a profile of ~/.aws/credentials or ~/.aws/config")
    settings = S3Settings(endpoint, region, allow_http, _credential_source(credentials))
    if endpoint and endpoint.startswith("http://") and not allow_http:
        raise RemoteError(f"the S3 endpoint {endpoint} is plain http: set {ALLOW_HTTP_VARIABLE}=true to allow it "
                          "(a server on this machine or a trusted network), or use an https:// endpoint")
    return settings, session


def s3_settings() -> S3Settings:
    """This process's S3 configuration (:class:`RemoteError` when there are no credentials)."""
    return _resolved(os.getpid())[0]


def store_options() -> dict[str, Any]:
    """Keyword arguments of obstore's ``S3Store`` for this configuration."""
    import boto3
    from obstore.auth.boto3 import Boto3CredentialProvider

    settings, session = _resolved(os.getpid())
    # The session that resolved the settings: its credentials (and their refresh) are the provider's.
    provider = Boto3CredentialProvider(boto3.Session(botocore_session=session))
    options: dict[str, Any] = {
        "region": settings.region,
        "credential_provider": provider,
        # Every PUT carries the sha256 of its body and the server checks it (where it supports it).
        "checksum_algorithm": "sha256",
        "client_options": {"allow_http": settings.allow_http, "connect_timeout": CONNECT_TIMEOUT,
                           "timeout": REQUEST_TIMEOUT},
        "retry_config": {"max_retries": RETRIES, "retry_timeout": RETRY_TIMEOUT,
                         "backoff": {"init_backoff": RETRY_BACKOFF[0], "max_backoff": RETRY_BACKOFF[1], "base": 2}},
    }
    if settings.endpoint:
        options["endpoint"] = settings.endpoint
    return options
