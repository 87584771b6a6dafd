"""Fixtures for the conformance tests of the local ClickHouse.

They talk to the server at $CLICKHOUSE_URL (default http://default:@127.0.0.1:8123), so the same
tests run against any ClickHouse. A few tests start a private server of their own (to check its
log for a password, or its limits) with the project's venv, whatever CLICKHOUSE_URL says.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlencode, urlsplit

import pytest

HERE = Path(__file__).resolve().parent
DEFAULT_URL = "http://default:@127.0.0.1:8123"


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode()

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class Server:
    """Where a ClickHouse is and how to log in."""

    scheme: str
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_url(cls, url: str) -> Server:
        parts = urlsplit(url)
        secure = parts.scheme == "https"
        return cls(
            scheme=parts.scheme,
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (8443 if secure else 8123),
            user=unquote(parts.username or "default"),
            password=unquote(parts.password or ""),
        )

    def connect(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=30)
        return http.client.HTTPConnection(self.host, self.port, timeout=30)

    def auth_headers(self) -> dict[str, str]:
        return {"X-ClickHouse-User": self.user, "X-ClickHouse-Key": self.password}

    def request(
        self,
        method: str = "POST",
        path: str = "/",
        *,
        body: str | bytes | None = None,
        params: dict[str, str] | list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
        conn: http.client.HTTPConnection | None = None,
    ) -> Response:
        own = conn is None
        conn = conn or self.connect()
        try:
            url = path + ("?" + urlencode(params) if params else "")
            all_headers = dict(self.auth_headers() if auth else {})
            all_headers.update(headers or {})
            data = body.encode() if isinstance(body, str) else body
            conn.request(method, url, body=data, headers=all_headers)
            resp = conn.getresponse()
            payload = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)
        finally:
            if own:
                conn.close()

    def query(self, sql: str, **params: str) -> Response:
        return self.request(body=sql, params=params)

    def ok(self, sql: str, **params: str) -> str:
        resp = self.query(sql, **params)
        assert resp.status == 200, resp.text
        return resp.text

    def basic(self, user: str, password: str) -> dict[str, str]:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}


@pytest.fixture(scope="session")
def server() -> Server:
    srv = Server.from_url(os.environ.get("CLICKHOUSE_URL", DEFAULT_URL))
    try:
        srv.request("GET", "/ping", auth=False)
    except OSError as exc:
        pytest.fail(
            f"no ClickHouse at {srv.scheme}://{srv.host}:{srv.port} ({exc}); run `just clickhouse-start`"
        )
    return srv


@pytest.fixture()
def database(server: Server):
    """A database of this test's own, so tests can run in parallel."""
    name = f"conf_{uuid.uuid4().hex[:12]}"
    server.ok(f"CREATE DATABASE {name}")
    yield name
    server.query(f"DROP DATABASE IF EXISTS {name}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PrivateServer:
    server: Server
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


def start_private_server(tmp_path: Path, *extra: str) -> PrivateServer:
    """The project's server on a free port, with a known password and a log the test can read.

    Fails (never skips) when it cannot start."""
    port = free_port()
    password = "s3cret-Pa55-" + uuid.uuid4().hex[:8]
    log_path = tmp_path / f"server-{port}.log"
    log = log_path.open("w")
    env = dict(os.environ, LOCAL_CLICKHOUSE_PASSWORD=password)
    process = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "server.py"),
            "--port",
            str(port),
            "--data",
            str(tmp_path / f"data-{port}"),
            "--user",
            "alice",
            "--init-db",
            "meltano",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    srv = Server("http", "127.0.0.1", port, "alice", password)
    deadline = time.monotonic() + 60
    while True:
        try:
            if srv.request("GET", "/ping", auth=False).status == 200:
                break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail("private server did not start:\n" + log_path.read_text())
        time.sleep(0.1)
    return PrivateServer(srv, process, log_path)


def stop_private_server(private: PrivateServer) -> None:
    private.process.terminate()
    private.process.wait(timeout=30)


@pytest.fixture()
def private_server(tmp_path: Path):
    """A server of the test's own (see `start_private_server`)."""
    private = start_private_server(tmp_path)
    yield private
    stop_private_server(private)
