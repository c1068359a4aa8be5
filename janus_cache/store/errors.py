"""The store's error: a cache's stored data is missing, inconsistent or cannot be read or written
as asked. Every reader's and writer's failure a user can act on is one (one line); it lives apart
from the modules that raise it, so that the local and the remote readers can share it."""

from __future__ import annotations


class StoreError(RuntimeError):
    """A cache's stored data is missing, inconsistent or cannot be written as asked."""
