"""An "instant ClickHouse": record-and-replay of the local ClickHouse over HTTP, for `floor.py`.

It binds 127.0.0.1 (a free port unless --port) and forwards to the real ClickHouse (127.0.0.1
only). In ``record`` mode every request goes upstream and its answer (status, the headers that
matter, body) is stored under a key: the statement with its volatile values normalised away
(see :func:`key`). In ``replay`` mode it answers from the store without touching ClickHouse; a
miss is forwarded and recorded, and counted. Answers are then real ClickHouse answers, served in
microseconds, so a client's time against it is its own overhead: the floor.

Random ids the client made up (lock candidates, owners, tokens) come back in some answers, and
the client checks them (a lock is won when the row it reads is its own). A replayed answer
carries the recording's ids, so each id seen in a request under a key is paired with the id
recorded under that key, and answers have recorded ids swapped for the live ones.

Control, on the same port: ``GET /__instant/stats``, ``POST /__instant/mode?replay`` (or
``record``), ``POST /__instant/start`` (a sequence starts: see :class:`Store`), ``POST
/__instant/reset`` (zeroes the counters). Run ``--help`` for options.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import sys
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlsplit

#: Answer headers worth replaying; the rest (Date, query ids, keep-alive) are per request.
KEPT_HEADERS = {
    "content-type",
    "content-encoding",
    "x-clickhouse-summary",
    "x-clickhouse-exception-code",
    "x-clickhouse-format",
    "x-clickhouse-timezone",
    "x-clickhouse-server-display-name",
}
#: URL parameters that differ per call by design and never change the answer's shape.
DROPPED_PARAMS = {"query_id", "insert_deduplication_token", "session_id", "session_check"}

_UUID = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# Long hex runs: tokens and hashes a client may make up.
_HEX = re.compile(rb"(?<![0-9A-Za-z_])[0-9a-f]{16,}(?![0-9A-Za-z_])")
# Numbers vary per call (state contents, clock readings, lease ends, versions, generations); a
# table or database name with digits is one identifier, so only free-standing numbers go.
_NUMBER = re.compile(rb"(?<![0-9A-Za-z_.])-?[0-9]+(?:\.[0-9]+)?(?![0-9A-Za-z_])")


def normalise(data: bytes) -> bytes:
    data = _UUID.sub(b"<uuid>", data)
    data = _HEX.sub(b"<hex>", data)
    return _NUMBER.sub(b"<n>", data)


def statement_key(method: str, path: str, body: bytes) -> bytes:
    """The statement with its volatile values normalised: method, URL path, the URL's
    parameters (``param_*`` values and the statement in ``query`` normalised, per-call ids
    dropped) and the body (normalised)."""
    parts = urlsplit(path)
    params = sorted(
        (name, normalise(value.encode()).decode(errors="replace"))
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
        if name not in DROPPED_PARAMS
    )
    return b"\n".join(
        [method.encode(), parts.path.encode(), urlencode(params).encode(), normalise(body)]
    )


class Answer:
    __slots__ = ("status", "headers", "body", "uuids")

    def __init__(self, status: int, headers: list, body: bytes, uuids: list[bytes]):
        self.status, self.headers, self.body, self.uuids = status, headers, body, uuids


class Store:
    """The recorded answers. The same statement can have different answers in one session (the
    original's read of lock candidates is empty before its insert, its own id after), so an
    answer is keyed by the statement and the one before it; replayed in the order it was
    recorded, each finds its own. Another order falls back to the statement's latest answer
    (counted as ``fallbacks``). The benchmark drives one client at a time, so "the one before"
    is server-wide."""

    def __init__(self, upstream: tuple[str, int], log_path: str | None):
        self.upstream = upstream
        self.answers: dict[tuple[bytes, bytes], Answer] = {}
        self.latest: dict[bytes, Answer] = {}
        self.previous = b""
        self.replay = False
        self.counts: Counter[str] = Counter()
        self.missed: Counter[str] = Counter()
        # recorded UUID -> live UUID, learnt from requests (see the module comment)
        self.swap: dict[bytes, bytes] = {}
        # Seconds spent answering, from a request's headers to its answer: what a call's time
        # against this server includes that is the server's, not the client's.
        self.served = 0.0
        self.lock = threading.Lock()
        self.log = open(log_path, "a") if log_path else None  # noqa: SIM115 (lives with the server)

    def lookup(self, key: bytes, uuids: list[bytes]) -> tuple[Answer | None, tuple[bytes, bytes]]:
        with self.lock:
            context = (self.previous, key)
            self.previous = key
            if not self.replay:
                self.counts["recorded"] += 1
                return None, context
            answer = self.answers.get(context)
            if answer is None:
                answer = self.latest.get(key)
                kind = "misses" if answer is None else "fallbacks"
                self.counts[kind] += 1
                self.missed[f"{kind}: {key.decode(errors='replace')[:300]}"] += 1
            else:
                self.counts["hits"] += 1
            if answer is not None:
                # pair the recording's ids with this request's, in order
                for recorded, live in zip(answer.uuids, uuids, strict=False):
                    self.swap[recorded] = live
            return answer, context

    def keep(self, context: tuple[bytes, bytes], answer: Answer) -> None:
        with self.lock:
            self.answers[context] = answer
            self.latest[context[1]] = answer

    def body(self, answer: Answer) -> bytes:
        out = answer.body
        if self.swap and b"-" in out:
            for recorded in _UUID.findall(out):
                out = out.replace(recorded, self.swap.get(recorded, recorded))
        return out


def read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(handler.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as our host uses it
    # Headers and body go out in two writes: with Nagle's algorithm the second waits for the
    # client's delayed ACK (40 ms on Linux).
    disable_nagle_algorithm = True
    store: Store

    def log_message(self, format, *args):  # noqa: A002 (the base class's signature)
        pass

    def setup(self) -> None:
        super().setup()
        self.accepted = self.server.accepted.pop(self.request, None)

    def parse_request(self) -> bool:
        # The request line is in; its headers are parsed next. Time from here is the server's,
        # and on a new connection the time since its accept too (see Server.process_request).
        self.started, self.accepted = self.accepted or time.perf_counter(), None
        return super().parse_request()

    def do_GET(self):
        self._handle()

    def do_POST(self):
        self._handle()

    def _handle(self) -> None:
        # Reading the body counts as the client's time, not the server's: our host sends its
        # body after its headers (the guest writes it once the request is under way), and a
        # wait for it is the client's. The parsing it includes is charged to both clients.
        reading = time.perf_counter()
        body = read_body(self)
        self.started += time.perf_counter() - reading
        if self.path.startswith("/__instant/"):
            return self._control()
        store = self.store
        plain = body
        coding = self.headers.get("Content-Encoding", "").lower()
        if coding in ("gzip", "deflate"):
            # Neither client compresses today; keys are made from the statement regardless.
            plain = zlib.decompress(body, 47 if coding == "gzip" else 15)
        key = statement_key(self.command, self.path, plain)
        uuids = _UUID.findall(self.path.encode()) + _UUID.findall(plain)
        answer, context = store.lookup(key, uuids)
        if answer is None:
            answer = self._forward(body, uuids)
            store.keep(context, answer)
            out = answer.body
        else:
            out = store.body(answer)
        if store.log:
            entry = {
                "replay": store.replay,
                "path": self.path,
                "headers": dict(self.headers),
                "body": plain.decode(errors="replace")[:2000],
                "status": answer.status,
                "answer_headers": dict(answer.headers),
                "answer": out.decode(errors="replace")[:2000],
            }
            store.log.write(json.dumps(entry) + "\n")
            store.log.flush()
        self.send_response(answer.status)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(out)))
        # Counted before the answer goes out, so a client that reads the count next finds it.
        with store.lock:
            store.served += time.perf_counter() - self.started
        self.end_headers()
        self.wfile.write(out)

    def _forward(self, body: bytes, uuids: list[bytes]) -> Answer:
        # One upstream connection per client connection (this thread), kept alive.
        conn = getattr(self, "_upstream", None)
        if conn is None:
            conn = self._upstream = http.client.HTTPConnection(*self.store.upstream, timeout=60)
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower()
            not in ("host", "connection", "transfer-encoding", "content-length", "accept-encoding")
        }
        # Accept-Encoding is not passed on: answers are stored and replayed plain, which HTTP
        # allows whatever a client accepts.
        headers["Content-Length"] = str(len(body))
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
        except (OSError, http.client.HTTPException):
            conn.close()  # the upstream closed a kept connection: once more on a new one
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
        data = response.read()
        kept = [(n, v) for n, v in response.getheaders() if n.lower() in KEPT_HEADERS]
        return Answer(response.status, kept, data, uuids)

    def _control(self) -> None:
        store = self.store
        parts = urlsplit(self.path)
        action = parts.path.removeprefix("/__instant/")
        with store.lock:
            if action == "mode":
                store.replay = parts.query == "replay"
            elif action == "reset":
                store.counts.clear()
                store.missed.clear()
            elif action == "start":
                store.previous = b""  # a sequence starts: key its first answer as such
            answer = {
                "mode": "replay" if store.replay else "record",
                "entries": len(store.answers),
                "served_ms": store.served * 1000,
                **store.counts,
                "missed": dict(store.missed.most_common(20)),
            }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Each new connection's accept time, until its handler takes it.
        self.accepted: dict[socket.socket, float] = {}

    def process_request(self, request, client_address) -> None:
        # A connection's first request is the server's from its accept: its thread's start and
        # the handler's set-up are this server's work, not the client's. Without this, a client
        # that opens a connection per query (the original's test copy) is charged for them and
        # a client that keeps its connection (ours) is not. Any of the client's own time between
        # its connect and its request is counted as the server's too: against the kept client.
        self.accepted[request] = time.perf_counter()
        super().process_request(request, client_address)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Record-and-replay of the local ClickHouse on 127.0.0.1 (see the module "
        "docstring); prints its port on the first line of stdout when ready."
    )
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: a free one)")
    parser.add_argument(
        "--upstream-port", type=int, default=8123, help="the real ClickHouse on 127.0.0.1"
    )
    parser.add_argument("--log", help="append every request and answer, as JSON lines, here")
    args = parser.parse_args(argv)
    Handler.store = Store(("127.0.0.1", args.upstream_port), args.log)
    server = Server(("127.0.0.1", args.port), Handler)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
