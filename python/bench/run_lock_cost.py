"""What a run's hold costs per STATE message: `just bench-run-lock`.

Two streams of Meltano's `update` through this adapter, on one host, taking turns message by
message, so that drift on a shared machine hits both alike:

- ``held``: a `meltano run` (click's context `run`, a run id bound in structlog's, as Meltano
  sets them): its first read takes the run's hold, and its updates write under it;
- ``kept``: a library caller (no run): its updates keep the id's grant for the linger (5 s
  when served), as every update did before the hold.

Each stream has its own state id, read once first (Meltano's read at a run's start). Prints the
median of each and their ratio, measured in this one run. Arguments: [MESSAGES] (default 500).
The local ClickHouse unless ``CLICKHOUSE_URL`` names another; a schema of its own, dropped after.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from pathlib import Path

import click
import structlog
from meltano.core.state_store import MeltanoState, StateBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import ClickHouse  # noqa: E402

WARM_UP = 20


def message(state_id: str, i: int) -> MeltanoState:
    return MeltanoState(state_id, {"singer_state": {"bookmarks": {"s": {"n": i}}}}, {})


def main() -> None:
    messages = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    clickhouse = ClickHouse.from_env()
    schema = f"bench_run_lock_{uuid.uuid4().hex[:8]}"
    kwargs = {
        "uri": clickhouse.uri(),
        "schema": schema,
        "allow_loopback": clickhouse.loopback,
        "lock_timeout_seconds": 10,
        "lock_retry_seconds": 1,
    }
    factory = StateBackend.get_manager_factory(scheme="clickhouse")
    try:
        kept = factory(**kwargs)
        kept.get("bench:kept")
        meltano = click.Context(click.Command("meltano"), info_name="meltano")
        with click.Context(click.Command("run"), info_name="run", parent=meltano):
            structlog.contextvars.bind_contextvars(run_id=str(uuid.uuid4()))
            held = factory(**kwargs)
            held.get("bench:held")  # the run's first read: takes the hold
            assert held._bridge.run_holds == {"bench:held"}, "the run took no hold"
            times: dict[str, list[float]] = {"held": [], "kept": []}
            for i in range(WARM_UP + messages):
                for name, manager in (("held", held), ("kept", kept)):
                    state = message(f"bench:{name}", i)
                    started = time.perf_counter()
                    manager.update(state)
                    if i >= WARM_UP:
                        times[name].append((time.perf_counter() - started) * 1000)
    finally:
        clickhouse.query(f"DROP DATABASE IF EXISTS {schema}")
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    for name, median in medians.items():
        print(f"{name}: median {median:.2f} ms per update over {messages}")
    print(f"held / kept: {medians['held'] / medians['kept']:.2f}x (measured in this one run)")


if __name__ == "__main__":
    main()
