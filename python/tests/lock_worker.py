"""A second (and third) Meltano process for the lock tests.

Reads the manager's keyword arguments as one JSON line on stdin (so no password is on a
command line), loads the manager through Meltano's entry point, then:

- ``increment ID N``: prints ``ready`` once its host answers and waits for a ``go`` line (so that
  several workers start together), then N times, under the lock of ID, reads a counter, adds
  one and writes it back; prints when it began and each critical section's (start, end) times
  as JSON at the end.
- ``hold ID``: takes the lock of ID, prints ``held``, and keeps it until stdin closes.
"""

from __future__ import annotations

import json
import sys
import time

from meltano.core.state_store import MeltanoState, StateBackend


def main() -> None:
    kwargs = json.loads(sys.stdin.readline())
    manager = StateBackend.get_manager_factory(scheme="clickhouse")(**kwargs)
    mode, state_id = sys.argv[1], sys.argv[2]
    if mode == "increment":
        manager.get(state_id)  # the host is up before the start
        print("ready", flush=True)
        sys.stdin.readline()
        began = time.time()
        sections = []
        for _ in range(int(sys.argv[3])):
            with manager.acquire_lock(state_id, retry_seconds=1):
                start = time.time()
                stored = manager.get(state_id)
                count = stored.completed_state.get("count", 0) if stored else 0
                manager.set(MeltanoState(state_id, {}, {"count": count + 1}))
                sections.append((start, time.time()))
        print(json.dumps({"began": began, "sections": sections}), flush=True)
    elif mode == "hold":
        with manager.acquire_lock(state_id, retry_seconds=1):
            print("held", flush=True)
            sys.stdin.read()
    manager.close()


if __name__ == "__main__":
    main()
