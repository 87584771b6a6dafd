"""The chDB engine, a bounded pool of its connections, and named HTTP sessions.

chDB runs the ClickHouse engine inside this process. Its connections to one data path run
queries in parallel, and each keeps its own current database and settings. A request therefore
borrows a connection of its own for its query: requests overlap as they do on a server, and no
lock is shared between them. A named session (`session_id`) owns a connection for its life, so
its `SET`s, `USE` and temporary tables stay its own.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import ClickHouseError, ErrorCodes

_SET_OR_USE = re.compile(r"^\s*(SET|USE)\b", re.IGNORECASE)
_USE = re.compile(r"^\s*USE\b", re.IGNORECASE)


def quote_string(value: str) -> str:
    """A ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_identifier(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def is_set_or_use(sql: str) -> bool:
    return _SET_OR_USE.match(sql) is not None


@dataclass
class Result:
    """What a query returned, with the counters the summary header reports."""

    payload: bytes
    elapsed_ns: int
    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    result_rows: int = 0
    result_bytes: int = 0


# Formats whose data is text, which an INSERT can carry inline after its FORMAT clause.
_TEXT_FORMATS = ("json", "tabseparated", "tsv", "csv", "values", "customseparated", "ndjson")


def _inline_text(fmt: str, data: bytes) -> str | None:
    """`data` as text when `fmt` is a text format and the bytes are UTF-8, else None."""
    if not fmt.lower().startswith(_TEXT_FORMATS):
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


class Connection:
    """One chDB connection; used by one request (or one session) at a time."""

    def __init__(self, engine: Engine, wrapper):
        self._engine = engine
        self._wrapper = wrapper  # chDB's Python connection; it owns the native one below
        self._raw = wrapper._conn
        # What the connection currently has on top of the engine's baseline (see `prepare`).
        self._database: str | None = None
        self._applied: dict[str, str] = {}
        if engine.profile:
            # The settings profile's defaults, as a server applies a user's profile at login.
            self.raw(
                "SET " + ", ".join(f"{n} = {quote_string(v)}" for n, v in engine.profile.items())
            )

    def has(self, database: str, settings: dict[str, str]) -> bool:
        """Whether `prepare(database, settings)` would have nothing to do."""
        return self._database == database and self._applied == settings

    # -- queries --
    def raw(self, sql: str, fmt: str = "TabSeparated", params: dict | None = None):
        try:
            return self._raw.query(sql, fmt, params=params or {})
        except RuntimeError as exc:  # chDB raises RuntimeError with ClickHouse's text
            raise self._engine.codes.from_text(str(exc)) from None

    def rows(self, sql: str, params: dict | None = None) -> list[tuple[str, ...]]:
        text = self.raw(sql, params=params).bytes().decode()
        return [tuple(line.split("\t")) for line in text.splitlines()]

    def scalar(self, sql: str) -> str:
        return self.raw(sql).bytes().decode().strip()

    def classify(self, sql: str) -> tuple[str, int]:
        info = self._raw.classify_query(sql)
        return info["query_class"].name, int(info["statement_count"])

    def query(self, sql: str, fmt: str, params: dict[str, str], *, is_insert: bool) -> Result:
        started = time.monotonic_ns()
        result = self.raw(sql, fmt, params)
        elapsed = time.monotonic_ns() - started
        read_rows, read_bytes = result.storage_rows_read(), result.storage_bytes_read()
        if is_insert:
            # For INSERT, chDB counts inline data as "read" too: report reads only for
            # INSERT ... SELECT, where a server also reports them.
            if re.search(r"\bFORMAT\b|\bVALUES\b", sql[:200], re.IGNORECASE):
                read_rows = read_bytes = 0
            return Result(
                result.bytes(),
                elapsed,
                read_rows,
                read_bytes,
                result.rows_written(),
                result.bytes_written(),
            )
        return Result(
            result.bytes(),
            elapsed,
            read_rows,
            read_bytes,
            0,
            0,
            result.rows_read(),
            result.bytes_read(),
        )

    def insert(self, statement: str, fmt: str, data: bytes) -> Result:
        """INSERT with its data apart from the statement: any bytes, binary formats included.

        Text data goes inline, as one query: chDB's streaming insert loses an error raised as
        the insert finishes (a CHECK constraint, a materialized view's failure), reporting the
        rows written while nothing was, and a server must not acknowledge a failed insert.
        """
        started = time.monotonic_ns()
        text = _inline_text(fmt, data)
        if text is not None:
            result = self.raw(f"{statement} FORMAT {fmt}\n{text}")
            return Result(
                b"",
                time.monotonic_ns() - started,
                written_rows=result.rows_written(),
                written_bytes=result.bytes_written(),
            )
        try:
            inserter = self._raw.send_insert(statement, fmt)
            try:
                if data:
                    self._raw.insert_append(inserter, data)
                done = self._raw.insert_done(inserter)
            except BaseException:
                try:
                    self._raw.insert_cancel(inserter)
                except RuntimeError:
                    pass  # already finished by the failure itself
                raise
        except RuntimeError as exc:
            raise self._engine.codes.from_text(str(exc)) from None
        return Result(
            b"",
            time.monotonic_ns() - started,
            written_rows=done.rows_written(),
            written_bytes=done.bytes_written(),
        )

    # -- per-request database and settings --
    def prepare(self, database: str, settings: dict[str, str]) -> None:
        """Make the connection's database `database` and its settings the baseline plus `settings`.

        The connection keeps the last request's database and settings; this changes only what
        differs (one USE and one SET at most, often none).
        """
        if self._database != database:
            self._database = None  # unknown until USE succeeds
            self.raw(f"USE {quote_identifier(database)}")
            self._database = database
        baseline = self._engine.baseline
        assignments = [
            f"{n} = {quote_string(baseline[n])}" if n in baseline else f"{n} = DEFAULT"
            for n in sorted(set(self._applied) - set(settings))
        ]
        assignments += [
            f"{n} = {quote_string(v)}" for n, v in settings.items() if self._applied.get(n) != v
        ]
        if not assignments:
            return
        self._applied = {}  # unknown until the SET succeeds
        try:
            self.raw("SET " + ", ".join(assignments))
        except ClickHouseError:
            self.reset()
            raise
        self._applied = dict(settings)

    def reset(self) -> None:
        """Back to the baseline, whatever state the connection is in (after a SET or USE query:
        a request without a session forgets them)."""
        baseline = self._engine.baseline
        changed = dict(self.rows("SELECT name, value FROM system.settings WHERE changed"))
        names = {n for n, v in changed.items() if baseline.get(n) != v} - {"database"}
        if names:
            self.raw(
                "SET "
                + ", ".join(
                    f"{n} = {quote_string(baseline[n])}" if n in baseline else f"{n} = DEFAULT"
                    for n in sorted(names)
                )
            )
        self._applied = {}
        self._database = None

    def close(self) -> None:
        try:
            self._wrapper.close()
        except RuntimeError:
            pass


class Pool:
    """At most `size` connections, each lent to one request at a time.

    A request that finds them all busy fails at once with TOO_MANY_SIMULTANEOUS_QUERIES, as a
    server at `max_concurrent_queries` does; it does not queue.
    """

    def __init__(self, engine: Engine, size: int, first: Connection):
        self._engine = engine
        self.size = size
        self._idle: list[Connection] = [first]  # the engine's first connection, already open
        self._open = 1
        self._lock = threading.Lock()
        # The most queries that ran at once (the log reports it at exit).
        self.peak_busy = 0

    # Connections are opened for new databases and settings up to this many: a client that
    # alternates between a few sets of settings (the guest's roles do) then finds a connection
    # that has its own and needs no SET (a query, about 0.3 ms); opening one costs about 2 ms,
    # once. Past it, the least recently used idle connection is changed with a SET.
    BY_STATE = 8

    def acquire(
        self, database: str | None = None, settings: dict[str, str] | None = None
    ) -> Connection:
        """An idle connection, preferably one that has `database` and `settings` already."""
        with self._lock:
            idle = self._idle  # the least recently used first
            if idle:
                pick: int | None = len(idle) - 1
                if database is not None:
                    want = settings or {}
                    fit = next(
                        (i for i in range(pick, -1, -1) if idle[i].has(database, want)), None
                    )
                    if fit is not None:
                        pick = fit
                    elif self._open < min(self.size, self.BY_STATE):
                        pick = None  # one more is opened below
                    else:
                        # Not the most recently used: its settings are the likeliest to come
                        # again, and a SET on it would make two alternating requests pay one each.
                        pick = 0
                if pick is not None:
                    conn = idle.pop(pick)
                    self._note_busy()
                    return conn
            if self._open >= self.size:
                raise self._engine.codes.error(
                    "TOO_MANY_SIMULTANEOUS_QUERIES",
                    f"Too many simultaneous queries. Maximum: {self.size}",
                )
            self._open += 1
            self._note_busy()
        try:
            return self._engine.connect()
        except BaseException:
            with self._lock:
                self._open -= 1
            raise

    def _note_busy(self) -> None:
        self.peak_busy = max(self.peak_busy, self._open - len(self._idle))

    def release(self, conn: Connection, *, healthy: bool) -> None:
        if healthy:
            with self._lock:
                self._idle.append(conn)
            return
        conn.close()
        with self._lock:
            self._open -= 1

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            conn.close()


class Session:
    """A named HTTP session: one connection, its own database and settings, and an expiry."""

    def __init__(self, session_id: str, conn: Connection, timeout_s: int):
        self.id = session_id
        self.conn = conn
        self.timeout_s = timeout_s
        self.expires_at = time.monotonic() + timeout_s
        self.database = "default"
        self.lock = threading.Lock()
        # URL settings of the last request, still on the connection: the next request changes
        # only what differs, as a pooled connection does. A client that sends the same settings
        # with every request (clickhouse-connect sends four) then costs no query for them.
        self._overrides: dict[str, str] = {}
        # The session's own value of settings that URL settings overrode: (value, changed).
        # Read from system.settings (a slow table) once, until a SET or USE query changes them.
        self._own: dict[str, tuple[str, bool]] = {}

    def run(self, database: str | None, settings: dict[str, str], sql: str, action):
        """Runs `action(conn)` with the request's database and settings on top of the session's.
        URL settings and `database` last one query; SET and USE queries last the session's life."""
        conn = self.conn
        self._override(settings)
        switched = bool(database) and database != self.database
        if switched:
            conn.raw(f"USE {quote_identifier(database)}")
        try:
            return action(conn)
        finally:
            if _USE.match(sql):
                self.database = conn.scalar("SELECT currentDatabase()")
            elif switched:
                conn.raw(f"USE {quote_identifier(self.database)}")
            if is_set_or_use(sql):
                # The session's own settings may have changed: back to them now, read afresh
                # next time.
                self._override({})
                self._own = {}

    def _override(self, settings: dict[str, str]) -> None:
        """The session's own settings, with `settings` on top."""
        conn = self.conn
        unknown = [n for n in settings if n not in self._own]
        if unknown:
            rows = conn.rows(
                "SELECT name, value, changed FROM system.settings WHERE name IN {names:Array(String)}",
                {"names": "[" + ",".join(quote_string(n) for n in unknown) + "]"},
            )
            self._own.update((n, (v, changed == "1")) for n, v, changed in rows)
        assignments = [self._restore(n) for n in self._overrides if n not in settings]
        assignments += [
            f"{n} = {quote_string(v)}" for n, v in settings.items() if self._overrides.get(n) != v
        ]
        if not assignments:
            return
        try:
            conn.raw("SET " + ", ".join(assignments))
        except ClickHouseError:
            # Part of it may have been applied: put back all of it.
            names = sorted(set(self._overrides) | set(settings))
            self._overrides = {}
            conn.raw("SET " + ", ".join(self._restore(n) for n in names))
            raise
        self._overrides = dict(settings)

    def _restore(self, name: str) -> str:
        value, changed = self._own.get(name, ("", False))
        return f"{name} = {quote_string(value)}" if changed else f"{name} = DEFAULT"


class Sessions:
    """Named sessions by id, each closed after `session_timeout` seconds without a request."""

    DEFAULT_TIMEOUT_S = 60
    MAX_TIMEOUT_S = 3600  # a server's default max_session_timeout

    def __init__(self, engine: Engine, limit: int):
        self._engine = engine
        self.limit = limit
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @contextmanager
    def use(
        self, session_id: str, timeout: str | None, check: bool, close: bool
    ) -> Iterator[Session]:
        codes = self._engine.codes
        timeout_s = self._timeout(timeout)
        self.expire()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                if check:
                    raise codes.error("SESSION_NOT_FOUND", f"Session {session_id} not found")
                if len(self._sessions) >= self.limit:
                    raise codes.error(
                        "USER_SESSION_LIMIT_EXCEEDED",
                        f"User has reached the limit of {self.limit} sessions",
                    )
                session = Session(session_id, None, timeout_s)  # type: ignore[arg-type]
                self._sessions[session_id] = session
                fresh = True
            else:
                fresh = False
            if not session.lock.acquire(blocking=False):
                raise codes.error(
                    "SESSION_IS_LOCKED", f"Session {session_id} is locked by a concurrent client"
                )
        try:
            if fresh:
                session.conn = self._engine.connect()
            session.timeout_s = timeout_s
            yield session
        except BaseException:
            if fresh and session.conn is None:
                with self._lock:
                    self._sessions.pop(session_id, None)
            raise
        finally:
            session.expires_at = time.monotonic() + session.timeout_s
            session.lock.release()
            if close:
                self._close(session_id)

    def _timeout(self, timeout: str | None) -> int:
        if timeout is None or timeout == "":
            return self.DEFAULT_TIMEOUT_S
        try:
            value = int(timeout)
        except ValueError:
            raise self._engine.codes.error(
                "CANNOT_PARSE_NUMBER", f"Cannot parse session_timeout '{timeout}'"
            ) from None
        if value > self.MAX_TIMEOUT_S:
            raise self._engine.codes.error(
                "INVALID_SESSION_TIMEOUT",
                f"Session timeout {value} is larger than max_session_timeout: {self.MAX_TIMEOUT_S}",
            )
        return max(value, 0)

    def expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            gone = [
                sid
                for sid, s in self._sessions.items()
                if s.expires_at <= now and not s.lock.locked()
            ]
            closed = [self._sessions.pop(sid) for sid in gone]
        for session in closed:
            if session.conn is not None:
                session.conn.close()

    def _close(self, session_id: str) -> None:
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is not None and session.conn is not None:
            session.conn.close()

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            if session.conn is not None:
                session.conn.close()


class Engine:
    """The chDB engine of this process, what it knows (version, error codes, settings), and
    the connections to it."""

    def __init__(
        self,
        data_dir: str,
        *,
        max_queries: int,
        max_sessions: int,
        config: str | None = None,
        profile: dict[str, str] | None = None,
    ):
        import chdb  # imported here so `--help` works without the venv

        self._chdb = chdb
        # A settings profile's defaults: every connection starts with them, and a request's own
        # settings override them (chDB reads no <profiles> from a configuration file).
        self.profile = dict(profile or {})
        # chDB passes connection-string parameters to the engine as start-up arguments.
        self._data_dir = f"{data_dir}?config-file={config}" if config else data_dir
        self.codes = ErrorCodes({})
        first = Connection(self, chdb.connect(self._data_dir))
        self.version = first.scalar("SELECT version()")
        self.timezone = first.scalar("SELECT timezone()")
        rows = first.rows("SELECT number, errorCodeToName(number) FROM numbers(2000)")
        self.codes = ErrorCodes({name: int(num) for num, name in rows if name})
        # Settings whose value chDB itself changed at start-up: restored to that value rather
        # than to the profile default.
        self.baseline = dict(first.rows("SELECT name, value FROM system.settings WHERE changed"))
        self.defaults = dict(first.rows("SELECT name, value FROM system.settings"))
        self.pool = Pool(self, max_queries, first)
        self.sessions = Sessions(self, max_sessions)

    def connect(self) -> Connection:
        return Connection(self, self._chdb.connect(self._data_dir))

    def known_setting(self, name: str) -> bool:
        return name in self.defaults

    @contextmanager
    def connection(
        self, database: str | None = None, settings: dict[str, str] | None = None
    ) -> Iterator[Connection]:
        """A pooled connection for one request, preferably one that already has its database and
        settings (see `Pool.acquire`); dropped if the request left it in doubt."""
        conn = self.pool.acquire(database, settings)
        healthy = False
        try:
            yield conn
            healthy = True
        except ClickHouseError:
            healthy = True  # the engine answered; the connection is fine
            raise
        finally:
            self.pool.release(conn, healthy=healthy)

    def close(self) -> None:
        self.sessions.close()
        self.pool.close()
