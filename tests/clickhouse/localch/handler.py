"""The HTTP handler: ClickHouse's HTTP interface in front of the engine.

One thread per HTTP connection (ThreadingHTTPServer); each request borrows its own engine
connection, or its session's, for the length of its query. Nothing else is shared between
requests, so queries from different connections run in parallel.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import time
import uuid
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl, urlsplit

from . import codecs
from .engine import Connection, Engine, Result, is_set_or_use
from .errors import ClickHouseError
from .request import Query, assemble, form_fields

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
        LOG.info(
            "%s %s %s %s%s %.1fms",
            self.client_address[0],
            self.command,
            urlsplit(self.path).path,
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
        self._query_id = str(uuid.uuid4())
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
        self.send_response(status)
        for key, value in headers + extra:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:  # the client said `Connection: close` (or spoke HTTP/1.0)
            self.send_header("Connection", "close")
        else:
            self.send_header("Connection", "Keep-Alive")
            self.send_header("Keep-Alive", f"timeout={self.timeout}")
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        self._log(status, code, (time.monotonic() - started) * 1000)

    def _error_response(self, err: ClickHouseError):
        headers = [
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("X-ClickHouse-Query-Id", self._query_id),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Exception-Code", str(err.code)),
            ("X-ClickHouse-Timezone", self.engine.timezone),
        ]
        if err.name == "REQUIRED_PASSWORD":
            headers.append(("WWW-Authenticate", 'Basic realm="ClickHouse server HTTP API"'))
        return err.status, headers, err.body(self.engine.version)

    def _read_raw_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return read_chunked(self.rfile)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _header(self, name: str, default: str) -> str:
        """A header's value as UTF-8 text. Python reads header bytes as Latin-1; a server
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
        if "X-ClickHouse-User" in self.headers or "X-ClickHouse-Key" in self.headers:
            methods.append(
                (self._header("X-ClickHouse-User", "default"), self._header("X-ClickHouse-Key", ""))
            )
        auth = self.headers.get("Authorization")
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
            params.get("query_id") or self.headers.get("X-ClickHouse-Query-Id") or self._query_id
        )

        # Settings, and from them how the answer is encoded (errors included from here on).
        settings = {
            k: v for k, v in pairs if k not in RESERVED_PARAMS and not k.startswith("param_") and k
        }
        unknown = [name for name in settings if not engine.known_setting(name)]
        if unknown:
            raise codes.error("UNKNOWN_SETTING", f"Unknown setting '{unknown[0]}'")
        self._output = self._choose_output(params, settings)

        body = codecs.decode_body(self.headers.get("Content-Encoding", ""), raw_body, codes)
        if params.get("decompress") in _TRUE and body:
            verify = (
                settings.get("http_native_compression_disable_checksumming_on_decompress", "0")
                not in _TRUE
            )
            body = codecs.decompress_blocks(body, codes, verify=verify)
        if self.headers.get("Content-Type", "").startswith("multipart/form-data"):
            fields = form_fields(self.headers["Content-Type"], body, codes)
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
        database = self.headers.get("X-ClickHouse-Database") or params.get("database") or None
        fmt = (
            self.headers.get("X-ClickHouse-Format")
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
            with engine.connection() as conn:
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
        accept = self.headers.get("Accept-Encoding", "")
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
        summary = {
            "read_rows": result.read_rows,
            "read_bytes": result.read_bytes,
            "written_rows": result.written_rows,
            "written_bytes": result.written_bytes,
            "total_rows_to_read": result.read_rows,
            "result_rows": result.result_rows,
            "result_bytes": result.result_bytes,
            "elapsed_ns": result.elapsed_ns,
        }
        clause = None if query.is_insert else _FORMAT_CLAUSE.search(query.sql)
        return [
            ("Content-Type", "text/tab-separated-values; charset=UTF-8"),
            ("X-ClickHouse-Server-Display-Name", self.config.display_name),
            ("X-ClickHouse-Query-Id", self._query_id),
            ("X-ClickHouse-Format", clause.group(1) if clause else fmt),
            ("X-ClickHouse-Timezone", self.engine.timezone),
            (
                "X-ClickHouse-Summary",
                json.dumps({k: str(v) for k, v in summary.items()}, separators=(",", ":")),
            ),
        ]
