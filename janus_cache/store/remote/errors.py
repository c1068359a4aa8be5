"""A bucket's failures: the error type, and what an obstore exception's text says happened
(:func:`janus_cache.store.remote.client.remote_error` words each as one line)."""

from __future__ import annotations

import re

from janus_cache.store.errors import StoreError


class RemoteError(StoreError):
    """A bucket cannot be used as asked; the message is one line naming the place and the fix.

    Not a :class:`~janus_cache.store.damage.DamagedData`: a connection or credential failure says
    nothing about the cache's bytes, so readers pass it on instead of counting a damaged sample."""


class EndpointUnreachable(RemoteError):
    """The connection to the endpoint failed or dropped after obstore's retries (worth one more try
    of a whole file; every other RemoteError is not)."""


class ObjectMissing(RemoteError, FileNotFoundError):
    """An object that is not there (in a bucket that is: a missing bucket is a plain RemoteError)."""


_CODE = re.compile(r"<Code>([^<]+)</Code>")
CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
                    "InvalidClientTokenId", "AuthorizationHeaderMalformed")
_CONNECTION_WORDS = ("error sending request", "connection refused", "connection reset", "connection closed",
                     "broken pipe", "timed out", "dns error", "unexpected eof", "incomplete message",
                     "error decoding response body", "end of file before message length reached")


def s3_code(err: BaseException) -> str | None:
    """The S3 error code in a server's answer (``NoSuchBucket``, ``AccessDenied``...), if any."""
    found = _CODE.search(str(err))
    return found.group(1) if found else None


def is_connection_failure(err: BaseException) -> bool:
    """Whether ``err`` is a connection that could not be made or was dropped (not an answer)."""
    text = str(err).lower()
    return s3_code(err) is None and any(word in text for word in _CONNECTION_WORDS)


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    # obstore's first line holds the request and the server's whole XML answer: keep the cause.
    text = re.sub(r"<\?xml.*", "", text).strip()
    return text[:240]

