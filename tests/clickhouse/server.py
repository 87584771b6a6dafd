"""A local ClickHouse: the real ClickHouse engine (chDB) behind ClickHouse's HTTP interface.

chDB runs the ClickHouse engine in-process but has no HTTP layer. The `localch` package beside
this file supplies one that behaves like a ClickHouse server's HTTP interface for everything
this project and the common clients rely on: endpoints, authentication, URL parameters and
settings, query parameters (also as multipart form fields), sessions, error bodies, codes and
HTTP statuses, success headers, keep-alive, compression (HTTP codings and ClickHouse's own
blocks), binary INSERT data, and the refusal of multi-statement queries.

Queries run in parallel: each request borrows a chDB connection of its own from a bounded pool
(`--max-concurrent-queries`); a named session keeps one for its life. See README.md beside this
file for what it imitates and what it does not.

Run `python server.py --help` for the options. It binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socketserver
import sys
import threading

from localch.engine import Engine, quote_identifier
from localch.handler import LOG, Config, Handler

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Server(socketserver.ThreadingTCPServer):
    """A thread per connection; the handler speaks HTTP/1.1 (localch/handler.py)."""

    allow_reuse_address = True
    daemon_threads = True
    # Many clients connect at once in the contention tests; the default backlog of 5 would
    # make the rest wait for a SYN retry (a second or more).
    request_queue_size = 1024


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
        "--init-db",
        action="append",
        default=[],
        metavar="NAME",
        help="create this database at start (repeatable), like CLICKHOUSE_DB",
    )
    parser.add_argument(
        "--max-concurrent-queries",
        type=int,
        default=100,
        metavar="N",
        help="queries that may run at once; one more fails with TOO_MANY_SIMULTANEOUS_QUERIES "
        "(default 100, as a server's max_concurrent_queries)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=100,
        metavar="N",
        help="named HTTP sessions (session_id) open at once (default 100)",
    )
    parser.add_argument(
        "--config",
        metavar="XML",
        help="a ClickHouse server configuration file for the engine, e.g. <remote_servers> and "
        "<macros> that make it look like one replica of a cluster (the deployment tests use it)",
    )
    parser.add_argument(
        "--profile-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a default for every query, as a user's settings profile gives it (a query's own "
        "settings override it); repeatable. Tests use it to show what a profile cannot change",
    )
    parser.add_argument("--quiet", action="store_true", help="log only warnings and errors")
    args = parser.parse_args(argv)
    if args.host not in ("127.0.0.1", "localhost"):
        parser.error(f"refusing to bind {args.host!r}: this server binds 127.0.0.1 only")
    if not 0 < args.port < 65536:
        parser.error(f"bad port {args.port}")
    if args.config and not os.path.isfile(args.config):
        parser.error(f"no configuration file {args.config!r}")
    if args.max_concurrent_queries < 1 or args.max_sessions < 1:
        parser.error("--max-concurrent-queries and --max-sessions must be at least 1")
    for item in args.profile_setting:
        name, sep, _ = item.partition("=")
        if not sep or not name.strip():
            parser.error(f"--profile-setting {item!r}: expected NAME=VALUE")
    for name in args.init_db:
        if not _IDENTIFIER.match(name):
            parser.error(f"bad database name {name!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # A line per request: skip what the format does not print (the logging HOWTO's
    # "Optimization"), the caller's frame above all.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    os.makedirs(args.data, exist_ok=True)
    engine = Engine(
        os.path.abspath(args.data),
        max_queries=args.max_concurrent_queries,
        max_sessions=args.max_sessions,
        config=os.path.abspath(args.config) if args.config else None,
        profile=dict(item.split("=", 1) for item in args.profile_setting),
    )
    for name in args.init_db:
        with engine.connection() as conn:
            conn.raw(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(name)}")

    Handler.engine = engine
    Handler.config = Config(args.user, args.password, "local-chdb")
    httpd = Server(("127.0.0.1", args.port), Handler)

    def stop(signum, _frame):
        LOG.info("signal %s: stopping", signum)
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    LOG.info(
        "ClickHouse %s (chDB) on http://127.0.0.1:%d, data in %s, user %r, "
        "up to %d concurrent queries",
        engine.version,
        args.port,
        args.data,
        args.user,
        args.max_concurrent_queries,
    )
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        LOG.info("stopped; at most %d queries ran at once", engine.pool.peak_busy)
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
