"""A stream of STATE messages through Meltano's API, for the `meltano` benchmark.

Reads one JSON line on stdin: the manager's keyword arguments (``uri``, ``schema``, ``table``,
``allow_loopback``), ``clickhouse`` (host, port, user, password, secure) for the original
backend's test copy, and ``tables``: the names of the other tables to use (``original``,
``ops``, ``original_ops``). Arguments: MESSAGES SLOW_MESSAGES STREAMS OPS.

Each stream is one Meltano run on one state id: a fresh manager, Meltano's read of the state at
the start, then one ``update`` per STATE message (Meltano's own ``StateStoreManager.update``
call). Streams of the three backends alternate, so that drift on a shared machine hits them alike:

- ``ours``: this adapter, default settings (fenced lock, kept for 5 s by ``serve``), MESSAGES
  messages;
- ``settle``: this adapter with ``lock_mode=settle`` (the original's protocol), SLOW_MESSAGES;
- ``original``: the original backend's test copy (``python/tests/original_backend.py``),
  SLOW_MESSAGES (each waits out its one-second settle).

Then ``set``, ``get`` and ``get_state_ids``, OPS each, alternating ours and the original's, each
on a fresh table.
Prints one JSON object of millisecond samples on the last line of stdout.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

from meltano.core.state_store import MeltanoState, StateBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import ClickHouse  # noqa: E402
from original_backend import OriginalStateStoreManager  # noqa: E402


def message(i: int) -> MeltanoState:
    return MeltanoState("placeholder", {"singer_state": {"bookmarks": {"s": {"n": i}}}}, {})


def timed(operation) -> float:
    started = time.perf_counter()
    operation()
    return (time.perf_counter() - started) * 1000


def stream(manager, state_id: str, messages: int) -> list[float]:
    """One run: Meltano reads the state, then updates it once per STATE message."""
    manager.get(state_id)
    times = []
    for i in range(messages):
        state = message(i)
        state.state_id = state_id
        times.append(timed(lambda state=state: manager.update(state)))
    return times


def main() -> None:
    settings = json.loads(sys.stdin.readline())
    messages, slow, streams, ops = (int(a) for a in sys.argv[1:5])
    clickhouse = ClickHouse(**settings.pop("clickhouse"))
    tables = settings.pop("tables")
    factory = StateBackend.get_manager_factory(scheme="clickhouse")
    out: dict[str, list[float]] = {
        f"{name}_{part}": []
        for name in ("ours", "settle", "original")
        for part in ("first", "steady")
    }

    def record(name: str, times: list[float]) -> None:
        out[f"{name}_first"].append(times[0])
        out[f"{name}_steady"].extend(times[1:])

    for _ in range(streams):
        run = uuid.uuid4().hex[:8]
        ours = factory(**settings)
        record("ours", stream(ours, f"ours:{run}", messages))
        ours.close()
        settle = factory(**settings, lock_mode="settle")
        record("settle", stream(settle, f"settle:{run}", slow))
        settle.close()
        original = OriginalStateStoreManager(clickhouse, settings["schema"], tables["original"])
        record("original", stream(original, f"original:{run}", slow))

    # Fresh tables for both: the streams above left thousands of parts in ours (one per
    # insert) and a few dozen in the original's, and a read with FINAL pays for each part.
    ours = factory(**{**settings, "table": tables["ops"]})
    original = OriginalStateStoreManager(clickhouse, settings["schema"], tables["original_ops"])
    for name in ("set", "get", "state_ids"):
        out[f"ours_{name}"], out[f"original_{name}"] = [], []
    for i in range(ops):
        for label, manager in (("ours", ours), ("original", original)):
            state = MeltanoState(f"{label}:ops", {}, {"singer_state": {"n": i}})
            out[f"{label}_set"].append(timed(lambda m=manager, s=state: m.set(s)))
            out[f"{label}_get"].append(timed(lambda m=manager, s=state: m.get(s.state_id)))
            out[f"{label}_state_ids"].append(
                timed(lambda m=manager, p=f"{label}:*": list(m.get_state_ids(p)))
            )
    ours.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
