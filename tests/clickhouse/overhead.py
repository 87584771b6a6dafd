"""What the local ClickHouse's HTTP front costs per request, over chDB's own time.

Runs the same queries on chDB in this process (a chDB connection's `query`) and through the
front on 127.0.0.1 with keep-alive clients, taking turns request by request, and prints the
medians and the difference (the overhead). Two clients: `http.client` (a reused connection, as
the tests use it) and a raw socket that sends prepared bytes (the client's own cost mostly left
out). Besides SELECT 1, a one-row INSERT and a SELECT ... FINAL, two cases send URL settings as
real clients do: the guest's roles in turn, and clickhouse-connect's session and settings.

    python overhead.py                  # starts a private server (free port, temporary data)
    python overhead.py --port 18125     # a server already running on 127.0.0.1:18125
    python overhead.py --port A --port B   # two servers (say, before and after a change)
    python overhead.py --merges         # do parts get merged in the background? (see --help)

The private server is this checkout's server.py, so the numbers are for the code beside this
file. Only 127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"
DB = "overhead"
AUTH = {"X-ClickHouse-User": "default", "X-ClickHouse-Key": ""}


# -- the ways to the engine -----------------------------------------------------------------


class InProcess:
    def __init__(self, data: str):
        import chdb

        self.conn = chdb.connect(data)

    def __call__(self, sql: str, url_params: str = "") -> str:
        # URL settings have no in-process counterpart: the engine runs the bare query.
        return self.conn.query(sql, "TabSeparated").bytes().decode()


class HttpClient:
    """`http.client` on one kept-alive connection."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection(HOST, port, timeout=60)

    def __call__(self, sql: str, url_params: str = "") -> str:
        path = f"/?{url_params}" if url_params else "/"
        self.conn.request("POST", path, body=sql.encode(), headers=AUTH)
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body.decode(errors='replace')}")
        return body.decode()


class RawClient:
    """One kept-alive socket, a prepared request, and just enough parsing to read the answer."""

    def __init__(self, port: int):
        self.sock = socket.create_connection((HOST, port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = f" HTTP/1.1\r\nHost: {HOST}:{port}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in AUTH.items()
        )
        self.buf = b""

    def __call__(self, sql: str, url_params: str = "") -> str:
        body = sql.encode()
        path = f"/?{url_params}" if url_params else "/"
        request = f"POST {path}{self.head}Content-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(request.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines[1:]
            if line.lower().startswith("content-length:")
        )
        while len(self.buf) < length:
            self._recv()
        answer, self.buf = self.buf[:length], self.buf[length:]
        if lines[0].split()[1] != "200":
            raise RuntimeError(f"{lines[0]}: {answer.decode(errors='replace')}")
        return answer.decode()

    def _recv(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        self.buf += chunk


# -- a private server ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_server(data: str, log: Path) -> tuple[subprocess.Popen, list[int]]:
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "server.py"), "--port", str(port), "--data", data],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 90
    while True:
        try:
            with socket.create_connection((HOST, port), timeout=1) as sock:
                sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if sock.recv(64).startswith(b"HTTP/1.1 200"):
                    return proc, [port]
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"the server did not start:\n{log.read_text()}")
        time.sleep(0.1)  # polling for start-up, not hiding a race


# -- overhead --------------------------------------------------------------------------------


def setup(run: Callable[[str], str], tables: list[str]) -> None:
    run(f"CREATE DATABASE IF NOT EXISTS {DB}")
    # A table per way for the inserts: an insert costs more as its table's history grows
    # (parts merged, old ones waiting to be removed), so each way writes as many as the others.
    for table in tables:
        run(f"DROP TABLE IF EXISTS {DB}.{table}")
        run(f"CREATE TABLE {DB}.{table} (id UInt64, v String) ENGINE = MergeTree ORDER BY id")
    run(f"DROP TABLE IF EXISTS {DB}.r")
    run(f"CREATE TABLE {DB}.r (id UInt64, v String) ENGINE = ReplacingMergeTree ORDER BY id")
    for n in range(10):  # 10 inserts of 20 rows, each id written 5 times in all
        run(f"INSERT INTO {DB}.r SELECT number % 40, '{n}' FROM numbers(20)")
    # One part, so that a merge in one engine and not the other does not tilt the FINAL read.
    run(f"OPTIMIZE TABLE {DB}.r FINAL")


# What the guest sends around its queries: the database, and settings by role (a deciding
# read, an insert); a connection that had the other role's settings needs a SET first.
_ROLES = [
    "database=default&wait_end_of_query=1&select_sequential_consistency=1",
    "database=default&wait_end_of_query=1&async_insert=0&insert_deduplicate=1",
]


# What clickhouse-connect 1.12 sends with every request: its session and four settings.
_CLICKHOUSE_CONNECT = (
    "cancel_http_readonly_queries_on_client_close=1&enable_http_compression=1"
    "&send_progress_in_http_headers=1&http_headers_progress_interval_ms=120000"
)


def cases(table: str, role: list[int]) -> dict[str, Callable[[], tuple[str, str]]]:
    """Each case gives the next query and its URL parameters. `role` counts the role requests
    to one server, whichever way they come, so that they alternate at the server."""
    inserted = [0]

    def insert() -> tuple[str, str]:
        inserted[0] += 1
        return f"INSERT INTO {DB}.{table} VALUES ({inserted[0]}, 'x')", ""

    def roles() -> tuple[str, str]:
        role[0] += 1
        return "SELECT 1", _ROLES[role[0] % 2]

    return {
        "SELECT 1": lambda: ("SELECT 1", ""),
        "INSERT 1 row": insert,
        "SELECT FINAL": lambda: (f"SELECT v FROM {DB}.r FINAL WHERE id = 7", ""),
        "SELECT 1 roles": roles,
        "SELECT 1 session": lambda: (
            "SELECT 1",
            f"session_id=overhead-{table}&{_CLICKHOUSE_CONNECT}",
        ),
    }


def measure(
    ways: dict[str, Callable[..., str]],
    server_of: dict[str, str],
    table_of: dict[str, str],
    rounds: int,
    warmup: int,
):
    """Medians in microseconds, by case and way. One case after the other (so that a case's
    URL settings do not fall on the next case's requests), and within a case every way in each
    round, in an order that rotates each round, so drift on a busy machine falls on all alike."""
    role = {server: [0] for server in set(server_of.values())}
    sql_of = {way: cases(table_of[way], role[server_of[way]]) for way in ways}
    names = list(sql_of[next(iter(ways))])
    times: dict[tuple[str, str], list[int]] = {(c, w): [] for c in names for w in ways}
    order = list(ways)
    for case in names:
        for r in range(warmup + rounds):
            rot = r % len(order)
            for way in order[rot:] + order[:rot]:
                sql, url_params = sql_of[way][case]()
                started = time.perf_counter_ns()
                ways[way](sql, url_params)
                elapsed = time.perf_counter_ns() - started
                if r >= warmup:
                    times[case, way].append(elapsed)
    return names, {k: statistics.median(v) / 1000 for k, v in times.items()}


def overhead(args: argparse.Namespace, tmp: str) -> None:
    inproc = InProcess(os.path.join(tmp, "in-process"))
    proc, ports = (None, args.port) if args.port else start_server(*private(tmp))
    try:
        ways: dict[str, Callable[..., str]] = {"in-process": inproc}
        server_of = {"in-process": "in-process"}
        for port in ports:
            ways[f"http.client {port}"] = HttpClient(port)
            ways[f"raw {port}"] = RawClient(port)
            server_of[f"http.client {port}"] = server_of[f"raw {port}"] = str(port)
        table_of = {way: f"t{i}" for i, way in enumerate(ways)}
        for server in dict.fromkeys(server_of.values()):
            mine = [way for way in ways if server_of[way] == server]
            setup(ways[mine[0]], [table_of[way] for way in mine])
        names, med = measure(ways, server_of, table_of, args.rounds, args.warmup)
    finally:
        stop(proc)
        inproc.conn.close()
    print(f"medians of {args.rounds} rounds, in microseconds; overhead = HTTP - in-process")
    for port in ports:
        print(f"\nserver on {HOST}:{port}")
        print(
            f"{'query':<16}{'in-process':>11}{'http.client':>13}{'overhead':>10}"
            f"{'raw socket':>12}{'overhead':>10}"
        )
        for case in names:
            base = med[case, "in-process"]
            client, raw = med[case, f"http.client {port}"], med[case, f"raw {port}"]
            print(
                f"{case:<16}{base:>11.0f}{client:>13.0f}{client - base:>10.0f}"
                f"{raw:>12.0f}{raw - base:>10.0f}"
            )
    print(
        "\nSELECT 1 roles: two sets of URL settings in turn, as the guest's roles send them."
        "\nSELECT 1 session: a session and the four settings clickhouse-connect sends."
        "\nIn-process runs the bare SELECT 1 for both."
    )


# -- background merges -----------------------------------------------------------------------


def merges(args: argparse.Namespace, tmp: str) -> None:
    """Single-row inserts into a ReplacingMergeTree, through the front and in-process, taking
    turns; active parts counted every 200 inserts, then every 5 s for --watch seconds."""
    inproc = InProcess(os.path.join(tmp, "in-process"))
    proc, ports = (None, args.port) if args.port else start_server(*private(tmp))
    try:
        front = HttpClient(ports[0])
        ways = {"front": front, "in-process": inproc}
        for run in ways.values():
            run(f"CREATE DATABASE IF NOT EXISTS {DB}")
            run(f"DROP TABLE IF EXISTS {DB}.m")
            run(
                f"CREATE TABLE {DB}.m (id UInt64, v String) ENGINE = ReplacingMergeTree ORDER BY id"
            )
        parts = (
            f"SELECT count(), max(level) FROM system.parts "
            f"WHERE active AND database = '{DB}' AND table = 'm'"
        )

        def sample(label: str) -> None:
            cells = []
            for name, run in ways.items():
                count, level = run(parts).split()
                cells.append(f"{name} {count:>3} parts (max level {level:>3})")
            print(f"{label:<22}" + "   ".join(cells), flush=True)

        started = time.monotonic()
        for i in range(1, args.inserts + 1):
            for run in ways.values():
                run(f"INSERT INTO {DB}.m VALUES ({i % 100}, '{i}')")
            if i % 200 == 0:
                sample(f"{i} inserts, {time.monotonic() - started:4.1f}s")
        after = time.monotonic()
        for s in range(0, args.watch + 1, 5):
            time.sleep(max(0.0, after + s - time.monotonic()))  # the sampling clock
            sample(f"+{s}s after the last")
    finally:
        stop(proc)
        inproc.conn.close()


# -- command ---------------------------------------------------------------------------------


def private(tmp: str) -> tuple[str, Path]:
    return os.path.join(tmp, "server"), Path(tmp) / "server.log"


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        proc.terminate()
        proc.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="overhead.py",
        description="Per-request overhead of the local ClickHouse's HTTP front over in-process "
        "chDB: SELECT 1, a one-row INSERT into a MergeTree, a SELECT ... FINAL on a small "
        "ReplacingMergeTree, and SELECT 1 with the URL settings the guest and clickhouse-connect "
        "send, taking turns in one run; prints the medians. Connects to 127.0.0.1 only.",
    )
    parser.add_argument(
        "--port",
        type=int,
        action="append",
        help="use the server already running on 127.0.0.1:PORT; repeat it to measure several "
        "in the same run (default: start a private one from this checkout on a free port, with "
        "temporary data)",
    )
    parser.add_argument("--rounds", type=int, default=1000, help="measured rounds (default 1000)")
    parser.add_argument("--warmup", type=int, default=100, help="rounds not counted (default 100)")
    parser.add_argument(
        "--merges",
        action="store_true",
        help="instead: insert --inserts single rows into a ReplacingMergeTree through the front "
        "and in-process, and print the active parts every 200 inserts and for --watch seconds",
    )
    parser.add_argument("--inserts", type=int, default=2000, help="for --merges (default 2000)")
    parser.add_argument("--watch", type=int, default=30, help="for --merges, seconds (default 30)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="local-clickhouse-overhead-") as tmp:
        (merges if args.merges else overhead)(args, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
