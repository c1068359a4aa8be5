"""One writer per prefix of a bucket: a lock object made with a conditional create.

S3 has no ``flock``: the writer (``janus-cache push``) creates ``PREFIX/.janus.lock`` with
``If-None-Match: *`` (obstore's ``mode="create"``), which the server refuses when the object
exists, so of two pushes into one prefix exactly one gets it; the other is refused in one line
naming the holder (host, pid, start), as :class:`janus_core.system.lock.DirectoryLock` names a local
one. The object holds :class:`janus_core.system.lock.Holder`'s record plus the time it was last renewed.

No kernel drops the lock of a push that was killed, so a lock is *stale* (and taken over, with a
``note:`` as a local one is) when its holder is a process of this host that no longer exists, or
when it was not renewed for :data:`STALE_AFTER_SECONDS` (a holder renews it every
:data:`RENEW_SECONDS` while it runs). A takeover is a conditional overwrite (``If-Match`` on the
stale object's ETag), so of two processes taking over one stale lock only one succeeds. A holder
whose renewal finds the object changed has lost its lock and must stop before it writes what makes
the cache complete (:meth:`PrefixLock.check`). Releasing deletes the object.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from janus_cache.store.remote.client import bucket_store, remote_error
from janus_cache.store.remote.path import S3Path
from janus_core.system.lock import LOCK_NAME, DirectoryBusy, Holder, LockError

RENEW_SECONDS = 60.0
STALE_AFTER_SECONDS = 600.0
"""A lock not renewed for this long belongs to a holder that is gone (10 missed renewals)."""


def lock_object(root: S3Path) -> S3Path:
    """The lock object of the prefix ``root``."""
    return root / LOCK_NAME


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _record(holder: Holder) -> bytes:
    return json.dumps({**asdict(holder), "renewed": _now().isoformat()}).encode() + b"\n"


def _alive_here(holder: Holder) -> bool | None:
    """Whether the holder's process is alive (None: it runs on another host, which cannot be asked)."""
    if holder.host != socket.gethostname():
        return None
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def stale_reason(data: bytes, modified: datetime) -> str | None:
    """Why the lock object holding ``data`` (last written at ``modified``) is stale, or None."""
    holder = Holder.parse(data)
    try:
        renewed = datetime.fromisoformat(json.loads(data.decode())["renewed"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        renewed = modified
    if holder is not None and _alive_here(holder) is False:
        return "which ended without releasing it"
    age = (_now() - renewed).total_seconds()
    if age > STALE_AFTER_SECONDS:
        return f"which has not renewed it for {age / 60:.0f} minutes"
    return None


class PrefixLock:
    """A held lock object; :meth:`release` (or leaving the ``with`` block) gives it up."""

    def __init__(self, root: S3Path, holder: Holder, e_tag: str, previous: str | None) -> None:
        self.root, self.holder, self._e_tag = root, holder, e_tag
        self.previous = previous
        """For a takeover: the stale holder and why it was stale."""
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew_until_released, name="janus-lock-renew", daemon=True)
        self._renewer.start()

    @classmethod
    def acquire(cls, root: S3Path, purpose: str = "") -> PrefixLock:
        """Take the prefix's lock now, or raise :class:`~janus_core.system.lock.DirectoryBusy` naming its holder."""
        import obstore

        path = lock_object(root)
        store = bucket_store(root.bucket)
        holder = Holder.me(True, purpose)
        try:
            result = obstore.put(store, path.key, _record(holder), mode="create")
            return cls(root, holder, str(result["e_tag"]), None)
        except obstore.exceptions.AlreadyExistsError:
            pass
        except Exception as err:  # noqa: BLE001
            raise remote_error(err, str(path)) from None
        try:
            found = obstore.get(store, path.key)
            data, meta = bytes(found.bytes()), found.meta
        except FileNotFoundError:  # released meanwhile: try once more
            return cls._create_or_refuse(root, holder, path)
        except Exception as err:  # noqa: BLE001
            raise remote_error(err, str(path)) from None
        old = Holder.parse(data)
        reason = stale_reason(data, meta["last_modified"])
        named = old.describe() if old is not None else "a holder whose record cannot be read"
        if reason is None:
            raise DirectoryBusy(f"{root} is in use by {named} (lock {path}); a writer must wait until it ends")
        try:
            result = obstore.put(store, path.key, _record(holder), mode={"e_tag": str(meta["e_tag"])})
        except (obstore.exceptions.PreconditionError, obstore.exceptions.AlreadyExistsError,
                FileNotFoundError):
            return cls._create_or_refuse(root, holder, path)  # another process took it over first
        except Exception as err:  # noqa: BLE001
            raise remote_error(err, str(path)) from None
        return cls(root, holder, str(result["e_tag"]), f"{named}, {reason}")

    @classmethod
    def _create_or_refuse(cls, root: S3Path, holder: Holder, path: S3Path) -> PrefixLock:
        import obstore

        try:
            result = obstore.put(bucket_store(root.bucket), path.key, _record(holder), mode="create")
        except obstore.exceptions.AlreadyExistsError:
            current = Holder.parse(path.read_bytes())
            named = current.describe() if current is not None else "another writer"
            raise DirectoryBusy(f"{root} is in use by {named} (lock {path}); a writer must wait until it "
                                "ends") from None
        except Exception as err:  # noqa: BLE001
            raise remote_error(err, str(path)) from None
        return cls(root, holder, str(result["e_tag"]), None)

    def takeover_note(self) -> str | None:
        if self.previous is None:
            return None
        return f"took over the lock of {self.root} left by {self.previous}"

    def _renew_until_released(self) -> None:
        import obstore

        path = lock_object(self.root)
        while not self._stop.wait(RENEW_SECONDS):
            try:
                result = obstore.put(bucket_store(self.root.bucket), path.key, _record(self.holder),
                                     mode={"e_tag": self._e_tag})
                self._e_tag = str(result["e_tag"])
            except (obstore.exceptions.PreconditionError, FileNotFoundError):
                self._lost = f"the lock {path} was taken over by another writer while this one ran"
                return
            except Exception:  # noqa: BLE001 - a renewal that failed on the network is tried again
                continue

    def check(self) -> None:
        """Raise :class:`~janus_core.system.lock.LockError` when the lock was lost (taken over)."""
        if self._lost is not None:
            raise LockError(f"{self._lost}; nothing more was written: run the command again when it has ended")

    def release(self) -> None:
        """Stop renewing and delete the lock object, if it is still this holder's."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._renewer.join()
        if self._lost is not None:
            return
        import obstore

        path = lock_object(self.root)
        try:
            found = path.head()
            if found is not None and found["e_tag"] == self._e_tag:
                obstore.delete(bucket_store(self.root.bucket), path.key)
        except Exception:  # noqa: BLE001 - a lock that cannot be deleted now is left to go stale
            pass

    def __enter__(self) -> PrefixLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def holder_of(root: S3Path) -> str | None:
    """Who holds the prefix's lock, for a reader that must not read a cache being written (None:
    no lock, or a stale one)."""
    path = lock_object(root)
    import obstore

    try:
        found = obstore.get(bucket_store(root.bucket), path.key)
        data, meta = bytes(found.bytes()), found.meta
    except FileNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001
        raise remote_error(err, str(path)) from None
    if stale_reason(data, meta["last_modified"]) is not None:
        return None
    holder = Holder.parse(data)
    return holder.describe() if holder is not None else "a writer whose record cannot be read"
