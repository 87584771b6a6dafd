"""Times `update` as Meltano makes it, for the `meltano` benchmark (tests/benches/meltano.rs).

Reads the manager's keyword arguments as one JSON line on stdin, then times N calls of each:

- ``meltano``: Meltano's ``StateStoreManager.update`` on this adapter (one bridge call);
- ``bridge``: the component's ``update`` as one bridge call (pipe + JSON + the host library).

Prints {"meltano": [ms, ...], "bridge": [ms, ...]} on the last line of stdout.
"""

from __future__ import annotations

import json
import sys
import time

from meltano.core.state_store import MeltanoState, StateBackend

WARM_UP = 10


def main() -> None:
    kwargs = json.loads(sys.stdin.readline())
    n = int(sys.argv[1])
    manager = StateBackend.get_manager_factory(scheme="clickhouse")(**kwargs)
    bridge = manager._bridge

    def meltano(i: int) -> None:
        manager.update(MeltanoState("bench:meltano", {"singer_state": {"bookmarks": {"s": i}}}, {}))

    def direct(i: int) -> None:
        partial = json.dumps({"singer_state": {"bookmarks": {"s": i}}})
        bridge.call("update", state_id="bench:bridge", partial=partial, completed="{}")

    out = {}
    for name, operation in [("meltano", meltano), ("bridge", direct)]:
        for i in range(WARM_UP):
            operation(i)
        times = []
        for i in range(n):
            started = time.perf_counter()
            operation(i)
            times.append((time.perf_counter() - started) * 1000)
        out[name] = times
    manager.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
