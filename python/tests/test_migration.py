"""Moving a fleet from the original Python backend to this one, step by step as the README says:

1. the same URI and table: this backend reads and merges what the original wrote;
2. ``lock_mode=settle`` while any process still runs the original: the two exclude each other;
3. the default mode once none does: the state carries on.

The original is the test copy in ``original_backend.py``; ours is loaded through Meltano's entry
point with the settings a user would give.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from meltano.core.state_store import MeltanoState, StateBackend
from meltano.core.state_store.base import StateIDLockedError

from original_backend import OriginalStateStoreManager


def ours(manager_kwargs, **settings):
    return StateBackend.get_manager_factory(scheme="clickhouse")(**{**manager_kwargs, **settings})


@pytest.fixture
def original(clickhouse, schema):
    return OriginalStateStoreManager(clickhouse, schema)


def bookmark(n: int) -> dict:
    return {"singer_state": {"bookmarks": {"orders": {"id": n}}}}


def test_step_1_the_same_table_is_read_and_merged(original, manager_kwargs, schema, clickhouse):
    original.update(MeltanoState("dev:tap-a-to-b", {}, bookmark(1)))
    original.update(MeltanoState("dev:tap-c-to-d", bookmark(7), {}))
    with ours(manager_kwargs, lock_mode="settle") as manager:
        assert sorted(manager.get_state_ids()) == ["dev:tap-a-to-b", "dev:tap-c-to-d"]
        assert manager.get("dev:tap-a-to-b").completed_state == bookmark(1)
        manager.update(MeltanoState("dev:tap-a-to-b", bookmark(2), {}))
        merged = manager.get("dev:tap-a-to-b")
        assert merged.completed_state == bookmark(1)
        assert merged.partial_state == bookmark(2)
    # ...and the original reads what ours wrote (the same rows, the same columns).
    assert original.get("dev:tap-a-to-b").partial_state == bookmark(2)
    tables = clickhouse.query(
        "SELECT name FROM system.tables WHERE database = {db:String} ORDER BY name FORMAT TSVRaw",
        db=schema,
    ).split()
    # No table of its own for the state; the fenced lock log appears when first needed, and
    # the history (ours alone) with its view into the state table, and who wrote, when the
    # first write creates what is missing.
    assert set(tables) - {"state_lock_log"} == {
        "state",
        "state_lock",
        "state_history",
        "state_history_to_state",
        "state_writers",
    }


def test_the_history_holds_our_writes_and_not_the_originals(
    original, manager_kwargs, clickhouse, schema
):
    original.update(MeltanoState("dev:tap-a-to-b", {}, bookmark(1)))
    with ours(manager_kwargs, lock_mode="settle") as manager:
        manager.update(MeltanoState("dev:tap-a-to-b", bookmark(2), {}))
    original.update(MeltanoState("dev:tap-a-to-b", {}, bookmark(3)))
    with ours(manager_kwargs, lock_mode="settle") as manager:
        # The original's write is the state now...
        assert manager.get("dev:tap-a-to-b") == MeltanoState("dev:tap-a-to-b", {}, bookmark(3))
    # ...but only ours is in the history.
    history = clickhouse.query(
        "SELECT op, partial_state FROM {db:Identifier}.state_history "
        "WHERE state_id = 'dev:tap-a-to-b' ORDER BY updated_at FORMAT TSVRaw",
        db=schema,
    )
    assert [line.split("\t", 1) for line in history.splitlines()] == [
        ["update", json.dumps(bookmark(2), separators=(",", ":"))]
    ]


def test_step_2_settle_mode_and_the_original_exclude_each_other(original, manager_kwargs):
    """Both sides run Meltano's own ``update`` (lock, read, merge, write, release) on one id,
    each adding its own increments to one counter: a lost increment is two holders at once."""
    sid = "dev:shared"
    original.set(MeltanoState(sid, {}, {"singer_state": {"count": 0}}))
    rounds = 4
    errors: list[BaseException] = []

    def add_one(manager) -> None:
        # Meltano's update merges a partial state; the read-modify-write is ours, inside the
        # lock, so it is exactly what two holders would break.
        with manager.acquire_lock(sid, retry_seconds=0.2):
            current = manager.get(sid)
            count = current.completed_state["singer_state"]["count"]
            # A holder that works a while, as a tap's run does: two holders would overlap here.
            time.sleep(0.3)
            manager.set(MeltanoState(sid, {}, {"singer_state": {"count": count + 1}}))

    def run(make) -> None:
        try:
            manager = make()
            for _ in range(rounds):
                add_one(manager)
        except BaseException as e:  # reported below
            errors.append(e)

    # Two of ours, each with a host of its own as two Meltano processes would have (equal
    # settings would share one host, whose calls take turns).
    settle = {"lock_mode": "settle", "lock_timeout_seconds": 60}
    workers = [
        threading.Thread(target=run, args=(lambda: original,)),
        threading.Thread(
            target=run, args=(lambda: ours(manager_kwargs, **settle, lock_retry_seconds=0.2),)
        ),
        threading.Thread(
            target=run, args=(lambda: ours(manager_kwargs, **settle, lock_retry_seconds=0.3),)
        ),
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not errors, errors
    final = original.get(sid).completed_state["singer_state"]["count"]
    assert final == rounds * len(workers), f"{rounds * len(workers) - final} increments lost"


def test_step_2_a_lock_held_by_the_original_keeps_settle_mode_out(original, manager_kwargs):
    sid = "dev:held-by-original"
    quick = {"lock_timeout_seconds": 2, "lock_retry_seconds": 0.2}
    with original.acquire_lock(sid, retry_seconds=0.2):
        with ours(manager_kwargs, lock_mode="settle", **quick) as manager:
            with pytest.raises(StateIDLockedError):
                manager.update(MeltanoState(sid, bookmark(1), {}))
        # Why step 2 exists: the default mode does not look at the original's lock table.
        with ours(manager_kwargs, **quick) as manager:
            manager.update(MeltanoState(sid, bookmark(1), {}))


def test_step_3_the_default_mode_carries_on(original, manager_kwargs):
    original.update(MeltanoState("dev:tap-a-to-b", {}, bookmark(1)))
    with ours(manager_kwargs, lock_mode="settle") as manager:
        manager.update(MeltanoState("dev:tap-a-to-b", bookmark(2), {}))
    with ours(manager_kwargs) as manager:
        manager.update(MeltanoState("dev:tap-a-to-b", bookmark(3), {}))
        state = manager.get("dev:tap-a-to-b")
        assert state.completed_state == bookmark(1)
        assert state.partial_state == bookmark(3)
        manager.update(MeltanoState("dev:tap-a-to-b", {}, bookmark(4)))
        assert manager.get("dev:tap-a-to-b") == MeltanoState("dev:tap-a-to-b", {}, bookmark(4))
