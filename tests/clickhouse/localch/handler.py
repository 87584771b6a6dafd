"""The HTTP handler: ClickHouse's HTTP interface in front of the engine.

One thread per HTTP connection (the server is a ThreadingTCPServer); each request borrows its
own engine connection, or its session's, for the length of its query. Nothing else is shared
between requests, so queries from different connections run in parallel.

HTTP/1.1 is read and written here rather than by `http.server`, whose handler parses headers
with the `email` package and writes the headers and the body apart: that was most of the
front's own time per request (`overhead.py`, docs/local-clickhouse.md).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import socketserver
import time
import uuid
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qsl, urlsplit

from . import codecs
from .engine import Connection, Engine, Result, is_set_or_use
from .errors import ClickHouseError
from .request import Query, assemble, form_fields

LOG = logging.getLogger("local-clickhouse")

# URL parameters that are not settings (ClickHouse's HTTPHandler reserves these).
# Settings a server takes per query only (SET refuses them).
PER_QUERY_ONLY = ("run_query_in_background",)
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
_FORMAT_CLAUSE = re.compile(r"\bFORMAT\s+([A-Za-z0-9_]+)\s*;?\s*$", re.IGNORECASE)
_SET_READONLY = re.compile(r"^\s*SET\b.*\breadonly\b", re.IGNORECASE | re.DOTALL)
_TRUE = {"1", "true", "True"}


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


class Output:
    """How this request's answer is encoded: ClickHouse blocks (`compress=1`), then an HTTP
    content coding. Decided once the request is authenticated; errors after that are encoded
    too, as a server does."""

    def __init__(self, native: bool = False, http: str | None = None, level: int = 3):
        self.native = native
        self.http = http
        self.level = level

    def encode(self, body: bytes) -> tuple[bytes, list[tuple[str, str]]]:
        if self.native:
            body = codecs.compress_blocks(body)
        if self.http:
            return codecs.encode_body(self.http, body, self.level), [
                ("Content-Encoding", self.http)
            ]
        return body, []


# Limits as http.server's: a request line or header line of at most 64 KiB, 100 headers.
_MAX_LINE = 65536
_MAX_HEADERS = 100
_END_OF_HEADERS = (b"\r\n", b"\n", b"")
_REASONS = {s.value: s.phrase for s in HTTPStatus}
_METHODS = {"GET": (True, True), "HEAD": (True, False), "POST": (False, True)}  # read-only, body


class _Date:
    """The Date header, formatted once a second rather than on every answer."""

    second = -1
    line = ""

    @classmethod
    def now(cls) -> str:
        now = int(time.time())
        if now != cls.second:
            cls.line = f"Date: {formatdate(now, usegmt=True)}\r\n"
            cls.second = now
        return cls.line


class Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive, as much of it as ClickHouse's clients use."""

    # An answer goes out in one write; with Nagle's algorithm on, a kept-alive connection
    # could still hold a short answer until the client's delayed ACK (about 40 ms).
    disable_nagle_algorithm = True
    # Idle keep-alive connections are closed after this many seconds, as a server does
    # (StreamRequestHandler makes it the socket's timeout).
    timeout = 30

    engine: Engine
    config: Config

    # -- HTTP/1.1 --
    def handle(self) -> None:
        self.close_connection = False
        try:
            while not self.close_connection:
                self._handle_one()
        except (TimeoutError, ConnectionError):
            pass  # idle past the timeout, or the client went away: drop the connection

    def _handle_one(self) -> None:
        self.close_connection = True  # until the request says otherwise
        line = self.rfile.readline(_MAX_LINE + 1)
        if not line:
            return
        if len(line) > _MAX_LINE:
            return self._refuse(414, "Request-URI Too Long")
        words = line.decode("iso-8859-1").split()
        if not words:
            return
        if len(words) != 3:
            return self._refuse(400, "Bad request syntax")
        command, path, version = words
        major, _, minor = version[5:].partition(".")
        if not (version.startswith("HTTP/") and major.isdigit() and minor.isdigit()):
            return self._refuse(400, "Bad request version")
        if int(major) >= 2:
            return self._refuse(505, "Invalid HTTP version")
        headers = self._read_headers()
        if headers is None:
            return
        self.command, self.headers = command, headers
        # http.server's rule: `//x` is `/x` (a client would read `//x` as a host).
        self.path = "/" + path.lstrip("/") if path.startswith("//") else path
        modern = (int(major), int(minor)) >= (1, 1)
        connection = headers.get("connection", "").lower()
        self.close_connection = connection == "close" or (not modern and connection != "keep-alive")
        if modern and headers.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        method = _METHODS.get(command)
        if method is None:
            return self._refuse(501, f"Unsupported method ({command!r})")
        self._handle(read_only=method[0], send_body=method[1])

    def _read_headers(self) -> dict[str, str] | None:
        """The headers by lower-case name (the first of repeated ones, as http.server kept),
        values read as Latin-1; None after refusing a request whose headers are too large."""
        headers: dict[str, str] = {}
        readline = self.rfile.readline
        for _ in range(_MAX_HEADERS + 1):
            raw = readline(_MAX_LINE + 1)
            if raw in _END_OF_HEADERS:
                return headers
            if len(raw) > _MAX_LINE:
                self._refuse(431, "Line too long")
                return None
            name, _, value = raw.decode("iso-8859-1").partition(":")
            headers.setdefault(name.lower(), value.lstrip(" \t").rstrip("\r\n"))
        self._refuse(431, "Too many headers")
        return None

    def _refuse(self, status: int, message: str) -> None:
        """An answer to a request that is not HTTP we read; the connection is closed after it."""
        self.close_connection = True
        body = f"{status} {message}\n".encode()
        self._send(status, [("Content-Type", "text/plain; charset=UTF-8")], body, True)

    def _send(self, status: int, headers, body: bytes, send_body: bool) -> None:
        """Status line, headers and body in one write."""
        head = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nServer: ClickHouse\r\n"]
        head.append(_Date.now())
        head += [f"{key}: {value}\r\n" for key, value in headers]
        head.append(f"Content-Length: {len(body)}\r\n")
        if self.close_connection:  # the client said `Connection: close` (or spoke HTTP/1.0)
            head.append("Connection: close\r\n\r\n")
        else:
            head.append(f"Connection: Keep-Alive\r\nKeep-Alive: timeout={self.timeout}\r\n\r\n")
        data = "".join(head).encode("latin-1")
        self.wfile.write(data + body if send_body and body else data)

    # -- logging: the request line can carry `password=`, so it is never logged as is --
    def _log(self, status: int, code: int | None, elapsed_ms: float) -> None:
        if LOG.isEnabledFor(logging.INFO):
            LOG.info(
                "%s %s %s %s%s %.1fms",
                self.client_address[0],
                self.command,
                urlsplit(self.path).path,
                status,
                f" code={code}" if code is not None else "",
                elapsed_ms,
            )

    # -- a request --
    def _handle(self, *, read_only: bool, send_body: bool) -> None:
        started = time.monotonic()
        self._query_id = ""  # a fresh one is made when an answer needs it
        self._output = Output()
        code = None
        try:
            status, headers, body = self._answer(read_only)
        except ClickHouseError as err:
            status, headers, body = self._error_response(err)
            code = err.code
        except Exception:  # a bug here must not kill the connection thread silently
            LOG.exception("internal error")
            err = ClickHouseError(1001, "STD_EXCEPTION", "Internal error of the local server.")
            status, headers, body = self._error_response(err)
            code = err.code
        body, extra = self._output.encode(body)
        self._send(status, headers + extra, body, send_body)
        self._log(status, code, (time.monotonic() - started) * 1000)

    def _query_id_or_new(self) -> str:
        if not self._query_id:
            self._query_id = str(uuid.uuid4())
        return self._query_id

    def _error_response(self, err: ClickHouseError):
        headers = [
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Query-Id", self._query_id_or_new()),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Exception-Code", str(err.code)),
            ("X-ClickHouse-Timezone", self.engine.timezone),
        ]
        if err.name == "REQUIRED_PASSWORD":
            headers.append(("WWW-Authenticate", 'Basic realm="ClickHouse server HTTP API"'))
        return err.status, headers, err.body(self.engine.version)

    def _read_raw_body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return read_chunked(self.rfile)
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _header(self, name: str, default: str) -> str:
        """A header's value as UTF-8 text. Header bytes are read as Latin-1; a server
        compares the bytes, so a password with non-ASCII characters must come back whole."""
        value = self.headers.get(name)
        if value is None:
            return default
        try:
            return value.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            return value

    def _authenticate(self, params: dict[str, str]) -> str:
        codes = self.engine.codes
        methods = []
        if "x-clickhouse-user" in self.headers or "x-clickhouse-key" in self.headers:
            methods.append(
                (self._header("x-clickhouse-user", "default"), self._header("x-clickhouse-key", ""))
            )
        auth = self.headers.get("authorization")
        if auth:
            scheme, _, value = auth.partition(" ")
            if scheme.lower() != "basic":
                raise codes.error(
                    "AUTHENTICATION_FAILED", "Invalid authentication: only Basic is supported"
                )
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise codes.error(
                    "AUTHENTICATION_FAILED", "Invalid authentication: malformed Basic credentials"
                ) from None
            methods.append((user, password))
        if "user" in params or "password" in params:
            methods.append((params.get("user", "default"), params.get("password", "")))
        if len(methods) > 1:
            raise codes.error(
                "AUTHENTICATION_FAILED",
                "Invalid authentication: it is not allowed to use several authentication "
                "methods (headers, Basic auth, URL parameters) simultaneously",
            )
        user, password = methods[0] if methods else ("default", "")
        if user != self.config.user or password != self.config.password:
            raise codes.error(
                "AUTHENTICATION_FAILED",
                f"{user}: Authentication failed: password is incorrect, or there is no user with such name",
            )
        return user

    def _answer(self, read_only: bool):
        engine = self.engine
        codes = engine.codes
        url = urlsplit(self.path)
        raw_body = b"" if read_only else self._read_raw_body()
        if url.path not in ("/", "/ping", "/query"):
            raise codes.error("BAD_ARGUMENTS", f"There is no handle {url.path}. Use / or /ping")
        pairs = parse_qsl(url.query, keep_blank_values=True)
        params = dict(pairs)
        if url.path == "/ping" or (read_only and "query" not in params and not raw_body):
            return 200, [("Content-Type", "text/html; charset=UTF-8")], b"Ok.\n"

        self._authenticate(params)
        self._query_id = (
            params.get("query_id") or self.headers.get("x-clickhouse-query-id") or self._query_id
        )

        # Settings, and from them how the answer is encoded (errors included from here on).
        settings = {
            k: v for k, v in pairs if k not in RESERVED_PARAMS and not k.startswith("param_") and k
        }
        unknown = [name for name in settings if not engine.known_setting(name)]
        if unknown:
            raise codes.error("UNKNOWN_SETTING", f"Unknown setting '{unknown[0]}'")
        # chDB takes a request's settings by SET, which refuses the per-query-only ones; a
        # server takes them with the query. Their default asks for nothing, so it is dropped.
        for name in PER_QUERY_ONLY:
            if name in settings and settings[name] == engine.defaults.get(name):
                del settings[name]
        self._output = self._choose_output(params, settings)

        body = codecs.decode_body(self.headers.get("content-encoding", ""), raw_body, codes)
        if params.get("decompress") in _TRUE and body:
            verify = (
                settings.get("http_native_compression_disable_checksumming_on_decompress", "0")
                not in _TRUE
            )
            body = codecs.decompress_blocks(body, codes, verify=verify)
        if self.headers.get("content-type", "").startswith("multipart/form-data"):
            fields = form_fields(self.headers["content-type"], body, codes)
            pairs += fields
            params.update(fields)
            body = b""
        query = assemble(params.get("query"), body, codes)
        if not query.sql.strip():
            raise codes.error("SYNTAX_ERROR", "Empty query")
        query_params = {k[len("param_") :]: v for k, v in pairs if k.startswith("param_")}

        readonly = settings.pop("readonly", None)
        if readonly is not None and readonly not in ("0", "1", "2"):
            raise codes.error("CANNOT_PARSE_NUMBER", f"Cannot parse readonly = '{readonly}'")
        database = self.headers.get("x-clickhouse-database") or params.get("database") or None
        fmt = (
            self.headers.get("x-clickhouse-format")
            or params.get("default_format")
            or "TabSeparated"
        )

        def run(conn: Connection) -> Result:
            self._check(
                conn, query, read_only=read_only or readonly in ("1", "2"), via_get=read_only
            )
            if query.insert_statement is not None:
                return conn.insert(query.insert_statement, query.insert_format, query.data)
            return conn.query(query.sql, fmt, query_params, is_insert=query.is_insert)

        session_id = params.get("session_id")
        if session_id:
            with engine.sessions.use(
                session_id,
                params.get("session_timeout"),
                params.get("session_check") in _TRUE,
                params.get("close_session") in _TRUE,
            ) as session:
                result = session.run(database, settings, query.sql, run)
        else:
            with engine.connection(database or "default", settings) as conn:
                conn.prepare(database or "default", settings)
                try:
                    result = run(conn)
                finally:
                    if is_set_or_use(query.sql):
                        conn.reset()  # without a session, a SET or USE lasts one query
        return 200, self._success_headers(query, fmt, result), result.payload

    def _choose_output(self, params: dict[str, str], settings: dict[str, str]) -> Output:
        defaults = self.engine.defaults
        native = params.get("compress") in _TRUE
        accept = self.headers.get("accept-encoding", "")
        enabled = (
            settings.get("enable_http_compression", defaults.get("enable_http_compression", "0"))
            in _TRUE
        )
        http = codecs.choose_response_encoding(accept) if accept and enabled else None
        try:
            level = int(
                settings.get(
                    "http_zlib_compression_level", defaults.get("http_zlib_compression_level", "3")
                )
            )
        except ValueError:
            raise self.engine.codes.error(
                "CANNOT_PARSE_NUMBER", "Cannot parse http_zlib_compression_level"
            ) from None
        return Output(native, http, level)

    def _check(self, conn: Connection, query: Query, *, read_only: bool, via_get: bool) -> None:
        """The refusals a server makes before running a query."""
        codes = self.engine.codes
        if not read_only and ";" not in query.sql:
            # One statement (a second needs a `;`) and writes are allowed: nothing for the
            # engine's classifier to tell, and it costs tens of microseconds.
            kind, statements = "", 1
        else:
            kind, statements = conn.classify(query.sql)
        if statements > 1:
            raise codes.error(
                "SYNTAX_ERROR",
                "Syntax error (Multi-statements are not allowed): failed at position "
                f"{query.sql.find(';') + 1} (end of query)",
            )
        writes = (
            query.insert_statement is not None
            or kind in ("MUTATING", "MUTATING_GLOBAL")
            or (kind == "CONTROL" and not is_set_or_use(query.sql))
        )
        if writes and read_only:
            hint = (
                " For queries over HTTP, method GET implies readonly. You should use method POST"
                " for modifying queries"
                if via_get
                else ""
            )
            raise codes.error(
                "READONLY", f"{self.config.user}: Cannot execute query in readonly mode.{hint}"
            )
        if _SET_READONLY.match(query.sql):
            raise codes.error(
                "READONLY", "The local server does not let a query change the readonly setting"
            )

    def _success_headers(self, query: Query, fmt: str, result: Result) -> list[tuple[str, str]]:
        # Every value is an integer, so the JSON is written directly (as a server writes it).
        summary = (
            f'{{"read_rows":"{result.read_rows}","read_bytes":"{result.read_bytes}",'
            f'"written_rows":"{result.written_rows}","written_bytes":"{result.written_bytes}",'
            f'"total_rows_to_read":"{result.read_rows}","result_rows":"{result.result_rows}",'
            f'"result_bytes":"{result.result_bytes}","elapsed_ns":"{result.elapsed_ns}"}}'
        )
        clause = None if query.is_insert else _FORMAT_CLAUSE.search(query.sql)
        return [
            ("Content-Type", "text/tab-separated-values; charset=UTF-8"),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Query-Id", self._query_id_or_new()),
            ("X-ClickHouse-Format", clause.group(1) if clause else fmt),
            ("X-ClickHouse-Timezone", self.engine.timezone),
            ("X-ClickHouse-Summary", summary),
        ]
