"""Meltano's processes export the host's traces and metrics when the standard OpenTelemetry
variables ask for them: the child process inherits them through the bridge, and the host in
Meltano's own process reads them there. A receiver on loopback, written here, gets the spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from meltano.core.state_store import MeltanoState, StateBackend
from meltano_clickhouse_state.bridge import Bridge

from conftest import in_process


class _Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.exports: list[tuple[str, dict]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def metric_names(self) -> set[str]:
        return {
            metric["name"]
            for path, body in self.exports
            if path == "/v1/metrics"
            for resource in body.get("resourceMetrics", [])
            for scope in resource.get("scopeMetrics", [])
            for metric in scope.get("metrics", [])
        }

    def span_names(self) -> set[str]:
        return {
            span["name"]
            for path, body in self.exports
            if path == "/v1/traces"
            for resource in body.get("resourceSpans", [])
            for scope in resource.get("scopeSpans", [])
            for span in scope.get("spans", [])
        }


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.exports.append((self.path, json.loads(body)))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    server = _Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _otel(monkeypatch, receiver: _Receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)


def test_the_child_process_exports_what_the_variables_ask_for(
    manager_kwargs, child_process, receiver, monkeypatch
):
    _otel(monkeypatch, receiver)
    make = StateBackend.get_manager_factory(scheme="clickhouse")
    with make(**manager_kwargs) as manager:
        manager.set(MeltanoState("dev:otel", None, {"singer_state": {"b": 1}}))
    # As Meltano's process ends: the host exits, exporting what it has left, and is waited for.
    Bridge.close_all()
    names = receiver.span_names()
    assert {"set", "clickhouse INSERT"} <= names, receiver.exports
    assert "state_backend.calls" in receiver.metric_names(), receiver.exports


@pytest.mark.skipif(not in_process(), reason="the host library is not built (`just embedded`)")
def test_the_host_in_meltanos_process_exports_what_the_variables_ask_for(
    manager_kwargs, receiver, monkeypatch
):
    # A process of its own: the host library reads the variables once per process.
    _otel(monkeypatch, receiver)
    script = (
        "import json, sys\n"
        "from meltano.core.state_store import MeltanoState, StateBackend\n"
        "make = StateBackend.get_manager_factory(scheme='clickhouse')\n"
        "with make(**json.loads(sys.argv[1])) as manager:\n"
        "    manager.set(MeltanoState('dev:otel', None, {'singer_state': {'b': 1}}))\n"
        "    print(type(manager._bridge).__name__)\n"
    )
    env = {**os.environ, "STATE_BACKEND_IN_PROCESS": "1"}
    ran = subprocess.run(
        [sys.executable, "-c", script, json.dumps(manager_kwargs)],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    assert ran.stdout.strip().splitlines()[-1] == "Embedded", ran
    names = receiver.span_names()
    assert {"set", "clickhouse INSERT"} <= names, receiver.exports
    assert "state_backend.calls" in receiver.metric_names(), receiver.exports
