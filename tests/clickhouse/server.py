"""A local ClickHouse: the real ClickHouse engine (chDB) behind ClickHouse's HTTP interface.

chDB runs the ClickHouse engine in-process but has no HTTP layer. This module supplies one that
behaves like a ClickHouse server's HTTP interface for everything this project relies on:
endpoints, authentication, URL parameters and settings, query parameters, error bodies, codes
and HTTP statuses, success headers, keep-alive, and the refusal of multi-statement queries.

chDB executes one query at a time, so requests are serialised on one engine lock, and each
request's database and settings are applied before its query and undone right after it. That
keeps one client's `database` or `max_threads` from leaking into another's.

Run `python server.py --help` for the options. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

LOG = logging.getLogger("local-clickhouse")

# URL parameters that are not settings (ClickHouse's HTTPHandler reserves these).
RESERVED_PARAMS = {
    "query",
    "database",
    "default_format",
    "query_id",
    "user",
    "password",
    "quota_key",
    "stacktrace",
    "role",
    "session_id",
    "session_timeout",
    "session_check",
    "compress",
    "decompress",
    "wait_end_of_query",
    "buffer_size",
    "client_protocol_version",
    "close_session",
}

# HTTP status per error name, as in ClickHouse's src/Server/HTTP/exceptionCodeToHTTPStatus.cpp.
# Names, not numbers: the numbers come from the engine itself (errorCodeToName).
STATUS_BY_ERROR_NAME = {
    "REQUIRED_PASSWORD": 401,
    **dict.fromkeys(
        [
            "UNKNOWN_USER",
            "WRONG_PASSWORD",
            "AUTHENTICATION_FAILED",
            "SET_NON_GRANTED_ROLE",
            "ACCESS_DENIED",
        ],
        403,
    ),
    **dict.fromkeys(
        [
            "BAD_ARGUMENTS",
            "CANNOT_COMPILE_REGEXP",
            "CANNOT_PARSE_TEXT",
            "CANNOT_PARSE_ESCAPE_SEQUENCE",
            "CANNOT_PARSE_QUOTED_STRING",
            "CANNOT_PARSE_DATE",
            "CANNOT_PARSE_DATETIME",
            "CANNOT_PARSE_NUMBER",
            "CANNOT_PARSE_DOMAIN_VALUE_FROM_STRING",
            "CANNOT_PARSE_IPV4",
            "CANNOT_PARSE_IPV6",
            "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
            "CANNOT_PARSE_UUID",
            "DUPLICATE_COLUMN",
            "ILLEGAL_COLUMN",
            "UNKNOWN_ELEMENT_IN_AST",
            "UNKNOWN_TYPE_OF_AST_NODE",
            "THERE_IS_NO_COLUMN",
            "TOO_DEEP_AST",
            "TOO_BIG_AST",
            "UNEXPECTED_AST_STRUCTURE",
            "SYNTAX_ERROR",
            "INCORRECT_DATA",
            "TYPE_MISMATCH",
            "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
        ],
        400,
    ),
    **dict.fromkeys(
        [
            "UNKNOWN_TABLE",
            "UNKNOWN_FUNCTION",
            "UNKNOWN_IDENTIFIER",
            "UNKNOWN_TYPE",
            "UNKNOWN_STORAGE",
            "UNKNOWN_DATABASE",
            "UNKNOWN_SETTING",
            "UNKNOWN_DIRECTION_OF_SORTING",
            "UNKNOWN_AGGREGATE_FUNCTION",
            "UNKNOWN_FORMAT",
            "UNKNOWN_DATABASE_ENGINE",
            "UNKNOWN_TYPE_OF_QUERY",
            "UNKNOWN_ROLE",
        ],
        404,
    ),
    "QUERY_IS_TOO_LARGE": 413,
    "NOT_IMPLEMENTED": 501,
    "SOCKET_TIMEOUT": 503,
    "CANNOT_OPEN_FILE": 503,
    "HTTP_LENGTH_REQUIRED": 411,
    "TIMEOUT_EXCEEDED": 408,
    "CANNOT_SCHEDULE_TASK": 503,
    "UNSUPPORTED_MEDIA_TYPE": 415,
}

# "Code: 60. DB::Exception: <message>. (UNKNOWN_TABLE) (version 26.9.2.1)"; chDB sometimes nests
# the same prefix several times and sometimes leaves the version out.
_CODE_PREFIX = re.compile(r"^(?:Code: (\d+)\. DB::Exception: )+")
_NAME_SUFFIX = re.compile(r"(?:\s*\(([A-Z0-9_]+)\)(?: \(version [^)]*\))?\.?)+\s*$")
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
_SET_READONLY = re.compile(r"^\s*SET\b.*\breadonly\b", re.IGNORECASE | re.DOTALL)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ClickHouseError(Exception):
    """An error to answer in ClickHouse's shape: code, name, message."""

    def __init__(self, code: int, name: str, message: str):
        super().__init__(message)
        self.code = code
        self.name = name
        self.message = message


def quote_string(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


class Engine:
    """The chDB engine, one query at a time, with per-request database and settings."""

    def __init__(self, data_dir: str):
        import chdb  # imported here so `--help` works without the venv

        self._chdb = chdb
        self._conn = chdb.connect(data_dir)
        self._lock = threading.Lock()
        self.version = self._scalar("SELECT version()")
        self.timezone = self._scalar("SELECT timezone()")
        rows = self._rows("SELECT number, errorCodeToName(number) FROM numbers(2000)")
        self._code_by_name = {name: int(num) for num, name in rows if name}
        self._name_by_code = {code: name for name, code in self._code_by_name.items()}
        # Settings whose value chDB itself changed at start-up: restored to that value rather
        # than to the profile default.
        self._baseline = dict(self._rows("SELECT name, value FROM system.settings WHERE changed"))
        self._known_settings = {
            name for (name,) in self._rows("SELECT name FROM system.settings")
        }
        # What the connection currently has on top of the baseline (see `execute`).
        self._database: str | None = None
        self._applied: dict[str, str] = {}

    # -- raw access (lock held by the caller, or during start-up) --
    def _raw(self, sql: str, fmt: str = "TabSeparated", params: dict | None = None):
        try:
            return self._conn._conn.query(sql, fmt, params=params or {})
        except RuntimeError as exc:  # chDB raises RuntimeError with ClickHouse's text
            raise self.error_from_text(str(exc)) from None

    def _rows(self, sql: str) -> list[tuple[str, ...]]:
        text = self._raw(sql).bytes().decode()
        return [tuple(line.split("\t")) for line in text.splitlines()]

    def _scalar(self, sql: str) -> str:
        return self._raw(sql).bytes().decode().strip()

    def code(self, name: str) -> int:
        return self._code_by_name[name]

    def error(self, name: str, message: str) -> ClickHouseError:
        return ClickHouseError(self.code(name), name, message)

    def error_from_text(self, text: str) -> ClickHouseError:
        text = text.strip()
        prefix = _CODE_PREFIX.match(text)
        code = int(prefix.group(1)) if prefix else 1001
        body = text[prefix.end():] if prefix else text
        # chDB nests "Code: N. DB::Exception:" inside messages; keep the innermost text once.
        body = _CODE_PREFIX.sub("", body)
        while True:
            inner = re.search(r"Code: \d+\. DB::Exception: ", body)
            if not inner:
                break
            body = body[inner.end():]
        suffix = _NAME_SUFFIX.search(body)
        if suffix:
            body = body[: suffix.start()]
        body = body.rstrip()
        if not body.endswith("."):
            body += "."
        name = self._name_by_code.get(code, "STD_EXCEPTION")
        return ClickHouseError(code, name, body)

    def classify(self, sql: str) -> tuple[str, int]:
        info = self._conn._conn.classify_query(sql)
        return info["query_class"].name, int(info["statement_count"])

    def execute(
        self,
        sql: str,
        *,
        database: str,
        fmt: str,
        settings: dict[str, str],
        params: dict[str, str],
    ):
        """Run one query with exactly its own database and settings.

        The connection keeps the last request's database and settings; the next request changes
        only what differs (one USE and one SET at most, often none). Every request thus runs
        with its settings and none of another's, without undoing and redoing them each time.
        """
        unknown = [name for name in settings if name not in self._known_settings]
        if unknown:
            raise self.error("UNKNOWN_SETTING", f"Unknown setting '{unknown[0]}'")
        with self._lock:
            if self._database != database:
                self._database = None  # unknown until USE succeeds
                self._raw(f"USE {quote_identifier(database)}")
                self._database = database
            self._apply(settings)
            started = time.monotonic_ns()
            try:
                result = self._raw(sql, fmt, params)
            finally:
                if re.match(r"^\s*(SET|USE)\b", sql, re.IGNORECASE):
                    self._forget_session_changes()
            return result, time.monotonic_ns() - started

    def _apply(self, wanted: dict[str, str]) -> None:
        """Make the connection's settings the baseline plus `wanted`."""
        assignments = [
            f"{n} = {quote_string(self._baseline[n])}" if n in self._baseline else f"{n} = DEFAULT"
            for n in sorted(set(self._applied) - set(wanted))
        ]
        assignments += [
            f"{n} = {quote_string(v)}" for n, v in wanted.items() if self._applied.get(n) != v
        ]
        if not assignments:
            return
        self._applied = {}  # unknown until the SET succeeds; the next request resets all
        try:
            self._raw("SET " + ", ".join(assignments))
        except ClickHouseError:
            self._reset_all()
            raise
        self._applied = dict(wanted)

    def _reset_all(self) -> None:
        """Back to the baseline, whatever state the connection is in."""
        changed = dict(self._rows("SELECT name, value FROM system.settings WHERE changed"))
        names = {n for n, v in changed.items() if self._baseline.get(n) != v} - {"database"}
        if names:
            self._raw(
                "SET "
                + ", ".join(
                    f"{n} = {quote_string(self._baseline[n])}" if n in self._baseline else f"{n} = DEFAULT"
                    for n in sorted(names)
                )
            )
        self._applied = {}

    def _forget_session_changes(self) -> None:
        # A SET or USE query changes the connection; a server without a session forgets it.
        self._reset_all()
        self._database = None

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class Config:
    def __init__(self, user: str, password: str, display_name: str):
        self.user = user
        self.password = password
        self.display_name = display_name

    def __repr__(self) -> str:  # never print the password
        return f"Config(user={self.user!r}, password=<redacted>)"


def read_chunked(rfile) -> bytes:
    chunks = []
    while True:
        line = rfile.readline(65537)
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            # trailers, up to the empty line
            while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        chunks.append(rfile.read(size))
        rfile.readline(3)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ClickHouse"
    # Headers and body go out in separate writes; with Nagle's algorithm on, a kept-alive
    # connection would hold the body until the client's delayed ACK (about 40 ms).
    disable_nagle_algorithm = True
    # Idle keep-alive connections are closed after this many seconds, as a server does.
    timeout = 30

    engine: Engine
    config: Config

    # -- logging: the request line can carry `password=`, so it is never logged as is --
    def version_string(self) -> str:
        return self.server_version

    def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's signature)
        pass

    def log_request(self, code="-", size="-"):
        pass

    def _log(self, status: int, code: int | None, elapsed_ms: float) -> None:
        path = urlsplit(self.path).path
        LOG.info(
            "%s %s %s %s%s %.1fms",
            self.client_address[0],
            self.command,
            path,
            status,
            f" code={code}" if code is not None else "",
            elapsed_ms,
        )

    # -- HTTP methods --
    def do_GET(self):
        self._handle(read_only=True, send_body=True)

    def do_HEAD(self):
        self._handle(read_only=True, send_body=False)

    def do_POST(self):
        self._handle(read_only=False, send_body=True)

    def _handle(self, *, read_only: bool, send_body: bool) -> None:
        started = time.monotonic()
        query_id = str(uuid.uuid4())
        try:
            status, headers, body, code = self._answer(read_only, query_id)
        except ClickHouseError as err:
            status, headers, body, code = self._error_response(err, query_id)
        except Exception:  # a bug here must not kill the connection thread silently
            LOG.exception("internal error")
            err = ClickHouseError(1001, "STD_EXCEPTION", "Internal error of the local server.")
            status, headers, body, code = self._error_response(err, query_id)
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "Keep-Alive")
        self.send_header("Keep-Alive", f"timeout={self.timeout}")
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        self._log(status, code, (time.monotonic() - started) * 1000)

    def _error_response(self, err: ClickHouseError, query_id: str):
        message = err.message if err.message.endswith(".") else err.message + "."
        body = (
            f"Code: {err.code}. DB::Exception: {message} ({err.name}) "
            f"(version {self.engine.version})\n"
        ).encode()
        headers = [
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Query-Id", query_id),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Exception-Code", str(err.code)),
            ("X-ClickHouse-Timezone", self.engine.timezone),
        ]
        status = STATUS_BY_ERROR_NAME.get(err.name, 500)
        if err.name == "REQUIRED_PASSWORD":
            headers.append(("WWW-Authenticate", 'Basic realm="ClickHouse server HTTP API"'))
        return status, headers, body, err.code

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = read_chunked(self.rfile)
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
        encoding = (self.headers.get("Content-Encoding") or "").lower().strip()
        if encoding in ("", "identity"):
            return body
        if encoding in ("gzip", "deflate"):
            wbits = 31 if encoding == "gzip" else 15
            try:
                return zlib.decompress(body, wbits)
            except zlib.error as exc:
                raise self.engine.error("CANNOT_DECOMPRESS", f"Cannot decompress body: {exc}")
        raise self.engine.error(
            "UNKNOWN_COMPRESSION_METHOD", f"Unknown Content-Encoding '{encoding}'"
        )

    def _authenticate(self, params: dict[str, str]) -> str:
        methods = []
        if "X-ClickHouse-User" in self.headers or "X-ClickHouse-Key" in self.headers:
            methods.append(
                (self.headers.get("X-ClickHouse-User", "default"), self.headers.get("X-ClickHouse-Key", ""))
            )
        auth = self.headers.get("Authorization")
        if auth:
            scheme, _, value = auth.partition(" ")
            if scheme.lower() != "basic":
                raise self.engine.error(
                    "AUTHENTICATION_FAILED", "Invalid authentication: only Basic is supported"
                )
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise self.engine.error(
                    "AUTHENTICATION_FAILED", "Invalid authentication: malformed Basic credentials"
                ) from None
            methods.append((user, password))
        if "user" in params or "password" in params:
            methods.append((params.get("user", "default"), params.get("password", "")))
        if len(methods) > 1:
            raise self.engine.error(
                "AUTHENTICATION_FAILED",
                "Invalid authentication: it is not allowed to use several authentication "
                "methods (headers, Basic auth, URL parameters) simultaneously",
            )
        user, password = methods[0] if methods else ("default", "")
        if user != self.config.user or password != self.config.password:
            raise self.engine.error(
                "AUTHENTICATION_FAILED",
                f"{user}: Authentication failed: password is incorrect, or there is no user "
                "with such name",
            )
        return user

    def _answer(self, read_only: bool, query_id: str):
        url = urlsplit(self.path)
        if url.path not in ("/", "/ping", "/query"):
            self._drain()
            raise ClickHouseError(
                self.engine.code("BAD_ARGUMENTS"),
                "BAD_ARGUMENTS",
                f"There is no handle {url.path}. Use / or /ping",
            )
        pairs = parse_qsl(url.query, keep_blank_values=True)
        params = dict(pairs)
        body = b"" if read_only else self._read_body()
        if url.path == "/ping" or (
            read_only and "query" not in params and not body
        ):
            return 200, [("Content-Type", "text/html; charset=UTF-8")], b"Ok.\n", None

        self._authenticate(params)
        query_id = params.get("query_id") or query_id
        sql_parts = []
        if "query" in params:
            sql_parts.append(params["query"])
        if body:
            try:
                sql_parts.append(body.decode("utf-8"))
            except UnicodeDecodeError:
                # ClickHouse takes bytes; Python's chDB binding takes text. Binary INSERT data
                # (RowBinary, Native) is therefore not supported by this local server.
                raise self.engine.error(
                    "NOT_IMPLEMENTED", "The local server accepts only UTF-8 request bodies"
                ) from None
        sql = "\n".join(sql_parts)
        if not sql.strip():
            raise self.engine.error("SYNTAX_ERROR", "Empty query")

        settings = {}
        query_params = {}
        for key, value in pairs:
            if key.startswith("param_"):
                query_params[key[len("param_"):]] = value
            elif key not in RESERVED_PARAMS:
                settings[key] = value
        # Compression is not implemented, so never compress (the header is ignored).
        settings.pop("enable_http_compression", None)
        readonly = settings.pop("readonly", None)
        if readonly is not None and readonly not in ("0", "1", "2"):
            raise self.engine.error("CANNOT_PARSE_NUMBER", f"Cannot parse readonly = '{readonly}'")

        kind, statements = self.engine.classify(sql)
        if statements > 1:
            raise self.engine.error(
                "SYNTAX_ERROR",
                "Syntax error (Multi-statements are not allowed): failed at position "
                f"{sql.find(';') + 1} (end of query)",
            )
        writes = kind in ("MUTATING", "MUTATING_GLOBAL") or (
            kind == "CONTROL" and not re.match(r"^\s*(SET|USE)\b", sql, re.IGNORECASE)
        )
        if writes and (read_only or readonly in ("1", "2")):
            hint = (
                " For queries over HTTP, method GET implies readonly. You should use method POST"
                " for modifying queries" if read_only else ""
            )
            raise self.engine.error(
                "READONLY", f"{self.config.user}: Cannot execute query in readonly mode.{hint}"
            )
        if _SET_READONLY.match(sql):
            raise self.engine.error(
                "READONLY", "The local server does not let a query change the readonly setting"
            )

        database = params.get("database") or "default"
        fmt = params.get("default_format") or "TabSeparated"
        result, elapsed_ns = self.engine.execute(
            sql, database=database, fmt=fmt, settings=settings, params=query_params
        )
        payload = result.bytes()
        # chDB classifies `INSERT ... SETTINGS ...` as CONTROL, so look at the statement itself.
        is_insert = re.match(r"^\s*INSERT\b", sql, re.IGNORECASE) is not None
        read_rows, read_bytes = result.storage_rows_read(), result.storage_bytes_read()
        if is_insert:
            # For INSERT, chDB counts inline data as "read" too: report reads only for
            # INSERT ... SELECT, where the server also reports them.
            written_rows, written_bytes = result.rows_written(), result.bytes_written()
            if re.search(r"\bFORMAT\b|\bVALUES\b", sql[:200], re.IGNORECASE):
                read_rows = read_bytes = 0
            result_rows = result_bytes = 0
        else:
            written_rows = written_bytes = 0
            result_rows, result_bytes = result.rows_read(), result.bytes_read()
        summary = {
            "read_rows": read_rows,
            "read_bytes": read_bytes,
            "written_rows": written_rows,
            "written_bytes": written_bytes,
            "total_rows_to_read": read_rows,
            "result_rows": result_rows,
            "result_bytes": result_bytes,
            "elapsed_ns": elapsed_ns,
        }
        clause = _FORMAT_CLAUSE.search(sql) if not is_insert else None
        headers = [
            ("Content-Type", "text/tab-separated-values; charset=UTF-8"),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Query-Id", query_id),
            ("X-ClickHouse-Format", clause.group(1) if clause else fmt),
            ("X-ClickHouse-Timezone", self.engine.timezone),
            ("X-ClickHouse-Summary", json.dumps({k: str(v) for k, v in summary.items()}, separators=(",", ":"))),
        ]
        return 200, headers, payload, None

    def _drain(self) -> None:
        if self.command == "POST":
            self._read_body()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="local-clickhouse",
        description=(
            "Serve the real ClickHouse engine (chDB) behind ClickHouse's HTTP interface, on "
            "127.0.0.1 only. For development, tests, the demo and CI."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; only 127.0.0.1")
    parser.add_argument("--port", type=int, default=8123, help="TCP port (default 8123)")
    parser.add_argument(
        "--data", default=".local/clickhouse", help="data directory (default .local/clickhouse)"
    )
    parser.add_argument("--user", default="default", help="the one user (default 'default')")
    parser.add_argument(
        "--password",
        default=os.environ.get("LOCAL_CLICKHOUSE_PASSWORD", ""),
        help="its password (default: $LOCAL_CLICKHOUSE_PASSWORD, else empty)",
    )
    parser.add_argument(
        "--init-db", action="append", default=[], metavar="NAME",
        help="create this database at start (repeatable), like CLICKHOUSE_DB",
    )
    parser.add_argument("--quiet", action="store_true", help="log only warnings and errors")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost"):
        parser.error(f"refusing to bind {args.host!r}: this server binds 127.0.0.1 only")
    if not 0 < args.port < 65536:
        parser.error(f"bad port {args.port}")
    for name in args.init_db:
        if not _IDENTIFIER.match(name):
            parser.error(f"bad database name {name!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    os.makedirs(args.data, exist_ok=True)
    engine = Engine(os.path.abspath(args.data))
    for name in args.init_db:
        with engine._lock:
            engine._raw(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(name)}")

    Handler.engine = engine
    Handler.config = Config(args.user, args.password, "local-chdb")
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    httpd.daemon_threads = True

    def stop(signum, _frame):
        LOG.info("signal %s: stopping", signum)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info(
        "ClickHouse %s (chDB) on http://127.0.0.1:%d, data in %s, user %r",
        engine.version, args.port, args.data, args.user,
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        engine.close()
        LOG.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
