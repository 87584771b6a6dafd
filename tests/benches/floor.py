"""The overhead floor: what each backend costs per Meltano call when ClickHouse answers at once.

An "instant ClickHouse" (`instant_clickhouse.py` beside this file) records the real local
ClickHouse's answers during a warm-up round, then replays them in microseconds. Through
Meltano's ``StateStoreManager`` API, in one run, it times ``set``, ``get``, ``state-ids`` and a
steady ``update`` for ours (the adapter, its host kept by the bridge) and for the original's
test copy (``python/tests/original_backend.py``), against the instant server (the floor) and
against the real local ClickHouse; then the CLI per call (process start, a whole ``get``).
Writes section 10 of ``tests/benches/results/report.md``, which says for each call whether its
floor (p50) is within GOAL times the original's in this run. With ``--fail-above X`` it exits 2
when a call's floor is more than X times the original's (`just floor-check`, in CI, holds
today's level that way); it exits 1 when the host's tripwire was hit, and 3 when the instant
server missed a request in the measured rounds (its time was then ClickHouse's).

  .venv/bin/python tests/benches/floor.py            (or `just bench-floor`)

Needs the local ClickHouse on 127.0.0.1 (`just clickhouse-start`), the .venv (Meltano, the
adapter) and a built host (target/release/state-backend). It connects to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from meltano.core.state_store import MeltanoState, StateBackend
from meltano_clickhouse_state.bridge import COMPONENT_ENV, Bridge, find_component
from meltano_clickhouse_state.embedded import LIBRARY_ENV, Embedded, find_library, library_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "tests"))

import original_backend  # noqa: E402
from conftest import TRIPWIRE, ClickHouse  # noqa: E402
from original_backend import OriginalStateStoreManager  # noqa: E402

CALLS = ("set", "get", "state-ids", "update")
# The goal: per Meltano call, ours costs at most this much of the original's floor (p50).
GOAL = 1.15
#: The exit status when a call's floor passes --fail-above (1: the tripwire, or an error).
OUT_OF_BOUNDS = 2
#: The exit status when the instant server forwarded a measured request to ClickHouse.
NOT_A_FLOOR = 3
LIBRARY_NAME = library_name()
EMBEDDED = "meltano-state-host --lib --crate-type cdylib --features embedded"
#: Ours as Meltano runs it (the host in its process), ours with the host as a child process
#: (what the embedded host saves), and the original's test copy.
BACKENDS = ("ours", "ours (child process)", "original")
OURS = BACKENDS[:2]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="The overhead floor: Meltano's state calls on ours and on the original's "
        "test copy, against an instant (record-and-replay) ClickHouse and the real local one, "
        "and the CLI per call. Writes section 10 of tests/benches/results/report.md.",
    )
    parser.add_argument(
        "--calls", type=int, default=100, help="timed calls per kind per round (default 100)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds, each on the instant server then the real one (default 3)",
    )
    parser.add_argument(
        "--cli-runs", type=int, default=30, help="runs per CLI measurement (default 30)"
    )
    parser.add_argument(
        "--clickhouse-port",
        type=int,
        default=int(os.environ.get("LOCAL_CLICKHOUSE_PORT", "8123")),
        help="the local ClickHouse on 127.0.0.1 (default $LOCAL_CLICKHOUSE_PORT or 8123)",
    )
    parser.add_argument(
        "--host-bin",
        type=Path,
        default=ROOT / "target" / "release" / "state-backend",
        help="the host executable (default target/release/state-backend)",
    )
    parser.add_argument(
        "--library",
        type=Path,
        help=f"the embedded host library (default ${LIBRARY_ENV}, else the one installed with "
        "the adapter, else target/release's)",
    )
    parser.add_argument(
        "--component",
        type=Path,
        help=f"the component (default ${COMPONENT_ENV}, else the one installed with the adapter)",
    )
    parser.add_argument(
        "--fail-above",
        type=float,
        help="exit 2 when a call's floor (p50) is more than this many times the original's",
    )
    parser.add_argument(
        "--within",
        type=Path,
        help="with --fail-above: a JSON file of the calls already within the bound in an earlier "
        "run of the same check, read and then written with this run's; a call found within it "
        "once is not out of bounds (a slow run does not undo a fast one: noise only adds time)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "tests" / "benches" / "results" / "report.md",
        help="the report whose section 10 this writes (default tests/benches/results/report.md)",
    )
    return parser.parse_args()


def ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class Instant:
    """The instant ClickHouse, a process of its own (it must not share this one's GIL)."""

    def __init__(self, upstream_port: int):
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("instant_clickhouse.py")),
                "--upstream-port",
                str(upstream_port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.process.stdout.readline())

    def control(self, action: str) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/__instant/{action}", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


class Target:
    """One ClickHouse to run against, with tables of its own for each backend."""

    def __init__(self, name: str, port: int, schema: str):
        self.name, self.port, self.schema = name, port, schema
        self.clickhouse = ClickHouse(False, "127.0.0.1", port, "default", "")
        self.uri = f"clickhouse://default:@127.0.0.1:{port}/default"

    def managers(self, host_bin: Path):
        """Each backend's manager, by label: ours as Meltano makes it (its factory, its keyword
        arguments), the original as its tests do."""

        def ours(table: str):
            return StateBackend.get_manager_factory(scheme="clickhouse")(
                uri=self.uri,
                schema=self.schema,
                table=table,
                allow_loopback=True,
                lock_timeout_seconds=10,
                lock_retry_seconds=1,
            )

        in_process, child = ours(f"ours_{self.name}"), ours(f"ours_child_{self.name}")
        # A configuration naming the executable runs its host as a child process (and, being a
        # configuration of its own, a host of its own).
        child.config = dataclasses.replace(child.config, executable=host_bin)
        child._bridge = Bridge.shared(child.config)
        # Each backend as it is named, or the comparison is of nothing.
        assert isinstance(in_process._bridge, Embedded), "ours does not run in this process"
        assert child._bridge.pid != os.getpid(), "ours (child process) is not a child"
        original = OriginalStateStoreManager(self.clickhouse, self.schema, f"orig_{self.name}")
        return dict(zip(BACKENDS, (in_process, child, original), strict=True))


def run_round(target: Target, host_bin: Path, n: int, times: dict, served=None) -> None:
    """One round on one target: set/get/state-ids alternating ours and the original call by
    call, then a stream of updates on each. With ``served`` (the instant server's count of its
    own milliseconds), each call's time is the client's alone: the server's share of it is
    taken out, and kept in ``times["server"]``."""
    pairs = tuple(target.managers(host_bin).items())

    def timed(label: str, call: str, run) -> None:
        before = served() if served else 0.0
        cpu_started = time.process_time()
        started = time.perf_counter()
        run()
        elapsed = ms(started)
        cpu = (time.process_time() - cpu_started) * 1000
        server = served() - before if served else 0.0
        times[target.name][label][call].append(elapsed - server)
        if served:
            times["server"][label][call].append(server)
            times["cpu"][label][call].append(cpu)

    for label, manager in pairs:
        manager.get(f"{label}:ops")  # untimed: ours checks its schema on the first call
    for i in range(n):
        for label, manager in pairs:
            state = MeltanoState(f"{label}:ops", {}, {"singer_state": {"n": i}})
            timed(label, "set", lambda m=manager, s=state: m.set(s))
            timed(label, "get", lambda m=manager, s=state: m.get(s.state_id))
            timed(label, "state-ids", lambda m=manager, x=label: list(m.get_state_ids(f"{x}:*")))
    for label, manager in pairs:
        state_id = f"{label}:stream"
        if label in OURS:
            # The first update takes the lock; the host keeps it for the next (steady state).
            manager.update(MeltanoState(state_id, {"singer_state": {"s": -1}}, {}))
        for i in range(n):
            state = MeltanoState(state_id, {"singer_state": {"bookmarks": {"s": i}}}, {})
            timed(label, "update", lambda m=manager, s=state: m.update(s))
        if label in OURS:
            # Ends the host, which gives the kept lock back now rather than in the background
            # (its idle checks) while the next backend runs.
            manager.close()
            Bridge.close_all()


def cli_times(command: list[str], runs: int, env: dict) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        out.append(ms(started))
    return out


def cli_parts(command: list[str], runs: int, env: dict) -> dict[str, list[float]]:
    """The parts of a CLI call, from the host's own `--timings` (load, open, call, close); the
    rest of the wall time is the process: its start, argument parsing and exit."""
    out: dict[str, list[float]] = {}
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        wall = ms(started)
        line = next(x for x in done.stderr.splitlines() if "timings_ms" in x)
        parts = json.loads(line)["timings_ms"]
        parts["the rest (process start, output, exit)"] = wall - sum(parts.values())
        parts["whole call"] = wall
        for name, value in parts.items():
            out.setdefault(name, []).append(value)
    return out


def main() -> int:
    args = parse_args()
    if not args.host_bin.is_file():
        sys.exit(
            f"no host at {args.host_bin}: build it (cargo build --release -p meltano-state-host)"
        )
    component = args.component or os.environ.get(COMPONENT_ENV) or find_component()
    if component is None:
        sys.exit(f"no component: give --component or set {COMPONENT_ENV}")
    library = args.library or find_library() or ROOT / "target" / "release" / LIBRARY_NAME
    if not library.is_file():
        sys.exit(f"no embedded host at {library}: build it (cargo rustc --release -p {EMBEDDED})")
    # The bridge, the child process and the CLI run the same host and component.
    os.environ[LIBRARY_ENV] = str(library)
    os.environ["STATE_BACKEND_BIN"] = str(args.host_bin)
    os.environ[COMPONENT_ENV] = str(component)
    # The original's settle (one second per update, by design) is a module constant in its test
    # copy, not a parameter: set to 0, its update shows the floor of its queries alone.
    original_backend.SETTLE_SECONDS = 0
    run_started = time.perf_counter()
    load_before = os.getloadavg()

    instant = Instant(args.clickhouse_port)
    schema = f"floor_{uuid.uuid4().hex[:8]}"
    targets = [
        Target("instant", instant.port, schema),
        Target("real", args.clickhouse_port, schema),
    ]
    times = {
        name: {b: {c: [] for c in CALLS} for b in BACKENDS}
        for name in [t.name for t in targets] + ["server", "cpu"]
    }
    cli_env = {**os.environ, "STATE_BACKEND_ALLOW_LOOPBACK": "true"}
    cli_env.pop("MELTANO_STATE_BACKEND_URI", None)

    def cli_get(target: Target, *log: str) -> list[str]:
        return [
            str(args.host_bin),
            *log,
            "--component",
            str(component),
            "--uri",
            target.uri,
            "-s",
            f"schema={schema}",
            "-s",
            f"table=ours_{target.name}",
            "get",
            "ours:ops",
        ]

    try:
        # Recording warm-up: the same sequences as measured below, answered by ClickHouse.
        warm: dict = {
            name: {b: {c: [] for c in CALLS} for b in BACKENDS}
            for name in ("instant", "server", "cpu")
        }
        instant.control("start")
        run_round(targets[0], args.host_bin, args.calls, warm)
        instant.control("start")
        for _ in range(3):
            subprocess.run(cli_get(targets[0]), env=cli_env, check=True, capture_output=True)
        instant.control("start")
        raw_requests(instant.port, args.calls, record=True)
        recorded = instant.control("mode?replay")
        instant.control("reset")
        instant.control("start")
        raw = raw_requests(instant.port, args.calls, record=False)

        for _ in range(args.rounds):
            for target in targets:
                served = None
                if target.name == "instant":
                    instant.control("start")
                    served = lambda: instant.control("stats")["served_ms"]  # noqa: E731
                run_round(target, args.host_bin, args.calls, times, served)

        version = cli_times([str(args.host_bin), "--version"], args.cli_runs, cli_env)
        instant.control("start")
        cli = {t.name: cli_times(cli_get(t), args.cli_runs, cli_env) for t in targets}
        parts = cli_parts(cli_get(targets[0], "--timings"), args.cli_runs, cli_env)
        replay = instant.control("stats")
    finally:
        Bridge.close_all()
        instant.stop()
        targets[1].clickhouse.query(f"DROP DATABASE IF EXISTS {schema}")
    seconds = time.perf_counter() - run_started
    tripped = TRIPWIRE.read_text() if TRIPWIRE.exists() else ""
    TRIPWIRE.unlink(missing_ok=True)

    report = render(
        args,
        component,
        times,
        version,
        cli,
        parts,
        raw,
        recorded,
        replay,
        seconds,
        load_before,
        tripped,
    )
    print(report)
    write_section(args.out, "floor", report)
    for measure in MEASURES:
        for line in out_of_bounds(times, GOAL, measure):
            print(f"goal not met: {line}", file=sys.stderr)
    over = (
        out_of_bounds(times, args.fail_above, skip=within_before(args)) if args.fail_above else []
    )
    if args.fail_above and args.within:
        within = within_before(args) | (set(CALLS) - set(calls_above(times, args.fail_above)))
        args.within.write_text(json.dumps(sorted(within)))
    for line in over:
        print(f"out of bounds: {line}", file=sys.stderr)
    if tripped:
        return 1
    misses = replay.get("misses", 0)
    if misses:
        # A request the instant server forwarded: some call's time holds ClickHouse's own, and
        # its ratio is not the floor's. Not a slowdown: a run of its own would not mend it.
        print(f"the instant server missed {misses} requests: not a floor", file=sys.stderr)
        return NOT_A_FLOOR
    return OUT_OF_BOUNDS if over else 0


#: What a ratio is of: the wall time less the instant server's share ("instant"), or this
#: process's CPU time ("cpu"), which waits and a busy machine's scheduling leave out.
MEASURES = {"instant": "floor", "cpu": "CPU time"}


def floor_ratio(times: dict, call: str, ours: str = "ours", measure: str = "instant") -> float:
    """Ours (as Meltano runs it, unless ``ours`` names the child process) / the original's
    floor (p50) for one call, in this run; of this process's CPU time with ``measure="cpu"``."""
    return p50(times[measure][ours][call]) / p50(times[measure]["original"][call])


def calls_above(times: dict, bound: float, measure: str = "instant") -> list[str]:
    """The calls whose floor (p50) is more than ``bound`` times the original's, in this run."""
    return [call for call in CALLS if floor_ratio(times, call, measure=measure) > bound]


def out_of_bounds(
    times: dict, bound: float, measure: str = "instant", skip: frozenset = frozenset()
) -> list[str]:
    """A line for each of ``calls_above(times, bound, measure)`` but those in ``skip``."""
    return [
        f"{call}: the {MEASURES[measure]} is "
        f"{floor_ratio(times, call, measure=measure):.2f}x the original's (at most {bound}x)"
        for call in calls_above(times, bound, measure)
        if call not in skip
    ]


def within_before(args: argparse.Namespace) -> frozenset:
    """The calls that earlier runs of this check found within its bound (``--within``)."""
    if args.within is None or not args.within.exists():
        return frozenset()
    return frozenset(json.loads(args.within.read_text()))


def write_section(path: Path, name: str, body: str) -> None:
    """Replaces section ``name`` of the report (between its markers, which
    ``tests/src/report.rs`` writes), keeping the rest of the file."""
    text = path.read_text()
    start_mark, end_mark = f"<!-- section {name} -->\n", f"\n<!-- /section {name} -->"
    start = text.find(start_mark)
    end = text.find(end_mark, start)
    if start < 0 or end < 0:
        sys.exit(f"{path} has no section {name}: run `just bench-report` first")
    path.write_text(text[: start + len(start_mark)] + stamp() + "\n" + body.strip() + text[end:])


def stamp() -> str:
    """The section's first line, as ``tests/src/report.rs``'s ``stamp`` writes it: the commit
    whose code it measured, and whether that code had uncommitted changes."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    head = git("rev-parse", "HEAD") or "unknown"
    measured = ["guest", "host", "contract", "python", "hosts", "wit", "Cargo.toml", "Cargo.lock"]
    changes = git("status", "--porcelain", "--", *measured, ":(exclude,glob)**/tests/**")
    dirty = changes is None or changes != ""
    tail = ", with uncommitted changes to the measured code" if dirty else ""
    return f"Measured at commit `{head}`{tail}."


def raw_requests(port: int, n: int, *, record: bool) -> dict[str, list[float]]:
    """The instant server alone: one small statement over a kept connection (as our host
    sends them) and over a new connection each time (as the original's test copy does)."""
    sql = b"SELECT 1 FORMAT TSV"
    out: dict[str, list[float]] = {"kept connection": [], "new connection each": []}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for _ in range(2 if record else n):
        started = time.perf_counter()
        conn.request("POST", "/", body=sql)
        conn.getresponse().read()
        out["kept connection"].append(ms(started))
    conn.close()
    for _ in range(2 if record else n):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", data=sql, timeout=10) as r:
            r.read()
        out["new connection each"].append(ms(started))
    return out


def render(
    args, component, times, version, cli, parts, raw, recorded, replay, seconds, load, tripped
) -> str:
    def rel(path) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)

    lines = [
        "## 10. The overhead floor: Meltano's state calls against an instant ClickHouse",
        "",
        f"`.venv/bin/python tests/benches/floor.py --calls {args.calls} --rounds {args.rounds} "
        f"--cli-runs {args.cli_runs}` (`just bench-floor`) on {platform.machine()}, "
        f"{os.cpu_count()} cores, load average {load[0]:.2f} at the start; host "
        f"`{rel(args.host_bin)}`, component `{rel(component)}`; {seconds:.0f} s.",
        "",
        "The *instant ClickHouse* (`tests/benches/instant_clickhouse.py`, 127.0.0.1) recorded the "
        "local ClickHouse's answers during one warm-up round of the same sequence, then "
        "replayed them without touching ClickHouse. It counts its own time on each request, from "
        "its request line to its answer, and that share is taken out of each call's time: what "
        "is left is the backend's own overhead, the floor. *Real* is the local ClickHouse (chDB "
        "behind its HTTP front), whole calls. The server's time on a connection's first request "
        "starts at the connection's accept (the thread it starts and its set-up are its own "
        "work, paid once per query by a client that connects per query), and leaves out reading "
        "the request's body (ours sends its body after its headers: a wait for it is the "
        "client's). Finding the answer costs it more for a longer URL: ours carries its "
        "settings there. "
        f"Each round runs {args.calls} timed calls of each kind per backend against the "
        f"instant server, then the same against the real one; {args.rounds} rounds. `set`, "
        "`get` and `state-ids` take turns between the backends call by call; `update` is a "
        "stream per backend. Every call goes through Meltano's `StateStoreManager` API.",
        "",
        "- **ours**: the adapter as Meltano makes it (`StateBackend.get_manager_factory`), one "
        "call per Meltano call to the host in Meltano's process (the embedded host library, "
        f"`{rel(os.environ[LIBRARY_ENV])}`). Its `update` is the "
        "steady state of a stream: the host keeps the lock between updates (one fenced insert "
        "per update); the first update of each stream, which takes the lock, is not timed.",
        "- **ours (child process)**: the same, with the host as a child process "
        "(`state-backend serve --stdio` over a pipe, as `STATE_BACKEND_IN_PROCESS=0` runs it): "
        "what the embedded host saves.",
        "- **original**: its test copy (`python/tests/original_backend.py`); `update` is "
        "Meltano's own (take the lock, `get`, `set`, release). Its lock waits out a 1 s settle "
        "per update by design; here that settle is set to 0 (`SETTLE_SECONDS`, a module "
        "constant, not a parameter), so its row is the floor of its seven queries alone. In "
        "real use each of its updates costs at least 1 s more.",
        "",
        "| call | backend | floor p50 ms | floor p99 ms | instant server's share p50 ms | "
        "real p50 ms | real p99 ms | floor / real (p50) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for call in CALLS:
        for backend in BACKENDS:
            f, r = times["instant"][backend][call], times["real"][backend][call]
            server = times["server"][backend][call]
            name = f"{call} (settle 0)" if call == "update" and backend == "original" else call
            lines.append(
                f"| {name} | {backend} | {p50(f):.2f} | {p99(f):.2f} | {p50(server):.2f} | "
                f"{p50(r):.2f} | {p99(r):.2f} | {p50(f) / p50(r):.0%} |"
            )
    lines += [
        "",
        "Ratios measured in this run, ours / original (below 1: ours is faster), and the "
        "floor with the host as a child process:",
        "",
        "| call | floor p50 | floor p99 | real p50 | real p99 | child process: floor p50 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for call in CALLS:
        o, g = times["instant"]["ours"][call], times["instant"]["original"][call]
        ro, rg = times["real"]["ours"][call], times["real"]["original"][call]
        name = f"{call} (original's settle 0)" if call == "update" else call
        lines.append(
            f"| {name} | {p50(o) / p50(g):.2f}x | {p99(o) / p99(g):.2f}x | "
            f"{p50(ro) / p50(rg):.2f}x | {p99(ro) / p99(rg):.2f}x | "
            f"{floor_ratio(times, call, OURS[1]):.2f}x |"
        )
    missed = calls_above(times, GOAL)
    lines += [
        "",
        f"The goal, each call's floor p50 at most {GOAL}x the original's: "
        + (f"**not met** for {', '.join(missed)}." if missed else "**met** for every call."),
        "",
        "### CPU time per call",
        "",
        "This process's CPU time (`time.process_time`: every thread, so ours's host thread "
        "too) over each call against the instant server, p50 ms. The instant server is a "
        "process of its own, so none of its work is counted; nor are the waits, which a busy "
        "machine's scheduling lengthens. Ours as a child process is left out: its host's CPU "
        "is the child's.",
        "",
        "| call | ours | original | ours / original |",
        "|---|---:|---:|---:|",
    ]
    for call in CALLS:
        o, g = times["cpu"]["ours"][call], times["cpu"]["original"][call]
        name = f"{call} (original's settle 0)" if call == "update" else call
        lines.append(
            f"| {name} | {p50(o):.3f} | {p50(g):.3f} | "
            f"{floor_ratio(times, call, measure='cpu'):.2f}x |"
        )
    missed = calls_above(times, GOAL, "cpu")
    lines += [
        "",
        f"The goal in CPU time, each call's p50 at most {GOAL}x the original's: "
        + (f"**not met** for {', '.join(missed)}." if missed else "**met** for every call."),
        "",
        "### The instant server alone",
        "",
        "`SELECT 1` from Python's `http.client` (kept connection: our host keeps its "
        "connections) and `urllib` (a new connection each time, `Connection: close`: what the "
        "original's test copy does for every query).",
        "",
        "| request | p50 ms | p99 ms |",
        "|---|---:|---:|",
    ]
    for name, xs in raw.items():
        lines.append(f"| {name} | {p50(xs):.3f} | {p99(xs):.3f} |")
    lines += [
        "",
        "### The CLI, per call",
        "",
        f"Wall times from `time.perf_counter` around `subprocess.run` (fork and exec included), "
        f"medians of {args.cli_runs} runs. `get` is `state-backend --component ... --uri "
        "clickhouse://default:@127.0.0.1:PORT/default -s schema=... -s table=... get ID` with "
        "`STATE_BACKEND_ALLOW_LOOPBACK=true`.",
        "",
        "| part | median ms | min ms |",
        "|---|---:|---:|",
        f"| process start (`state-backend --version`) | {p50(version):.1f} | {min(version):.1f} |",
        f"| `get`, whole call, instant ClickHouse | {p50(cli['instant']):.1f} | "
        f"{min(cli['instant']):.1f} |",
        f"| `get`, whole call, real ClickHouse | {p50(cli['real']):.1f} | {min(cli['real']):.1f} |",
        "",
        "The parts of a `get` against the instant server, from the host's own `--timings` "
        "(`load`: the component from the compile cache; `open`: instantiate and open; `call`: "
        "the one request; `close`); *the rest* is the wall time less those: the process's start, "
        "its output and its exit.",
        "",
        "| part | median ms |",
        "|---|---:|",
    ]
    for name, xs in parts.items():
        lines.append(f"| {name} | {p50(xs):.2f} |")
    missed = replay.get("missed") or {}
    lines += [
        "",
        "### Replay",
        "",
        f"Recorded {recorded.get('recorded', 0)} requests into {recorded.get('entries', 0)} "
        f"answers. Replay: {replay.get('hits', 0)} exact hits, {replay.get('fallbacks', 0)} "
        f"fallbacks (the statement recorded, but after another one), **{replay.get('misses', 0)} "
        "misses** (forwarded to ClickHouse and recorded).",
        "",
        "Keys: the method, the URL path and its parameters and the body, with volatile values "
        "normalised: UUIDs (lock candidates, owners, dedup tokens), hex runs of 16+ and "
        "free-standing numbers (state contents, clock readings, lease ends, versions, "
        "generations) in the `param_*` values, in the statement (URL `query=` or body) and in "
        "insert data; `query_id`, `insert_deduplication_token` and `session_*` dropped. An answer "
        "is keyed by its statement and the one before it, as one statement can answer "
        "differently in one sequence (the original's read of lock candidates: empty, then its "
        "own). UUIDs a client sent come back in some answers (a lock's holder), so replayed "
        "answers carry the live ones in place of the recorded ones.",
    ]
    if missed:
        lines += ["", "Not replayed exactly (count, kind, key):", ""]
        lines += [f"- {count} x `{key[:200]!r}`" for key, count in missed.items()]
    lines += [
        "",
        "Traffic as seen: our host sends chunked request bodies over kept-alive HTTP/1.1 "
        "connections, no `Accept-Encoding`, no compression; the original's test copy sends "
        "each query with `urllib` on a new connection (`Connection: close`, `Accept-Encoding: "
        "identity`). The instant server forwards without `Accept-Encoding` and answers plain.",
    ]
    if tripped:
        lines += [
            "",
            f"**The host's tripwire was hit** (a connection off this machine):\n{tripped}",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
