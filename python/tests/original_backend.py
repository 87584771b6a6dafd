"""The original Python backend (``meltano-state-backend-clickhouse``), as the migration tests need it.

That package is not on the package index this project builds from, so the tests carry its
behaviour, written from its documented design: the same state table, a ``<table>_lock`` table of
candidates, and its lock: wait while a candidate is live, insert a random candidate, settle one
second, the lowest candidate wins, else withdraw and try again; give up after 30 s; release by
deleting the candidate. Its writes take ``updated_at`` from the server's clock (``now64(3)``).
It is a Meltano ``StateStoreManager``, so Meltano's own ``update`` runs on it as on the original.
"""

from __future__ import annotations

import json
import time
import typing as t
import uuid
from contextlib import contextmanager

from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager

if t.TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from conftest import ClickHouse

SETTLE_SECONDS = 1.0
STALE_SECONDS = 300


class OriginalStateStoreManager(StateStoreManager):
    def __init__(
        self, clickhouse: ClickHouse, schema: str, table: str = "state", timeout: float = 30.0
    ):
        super().__init__()
        self.ch = clickhouse
        self.state = f"{schema}.{table}"
        self.lock = f"{schema}.{table}_lock"
        self.timeout = timeout
        self.ch.query(f"CREATE DATABASE IF NOT EXISTS {schema}")
        self.ch.query(
            f"CREATE TABLE IF NOT EXISTS {self.state} (state_id String, partial_state "
            "Nullable(String), completed_state Nullable(String), updated_at DateTime64(3) "
            "DEFAULT now64(3)) ENGINE = ReplacingMergeTree(updated_at) ORDER BY state_id"
        )
        self.ch.query(
            f"CREATE TABLE IF NOT EXISTS {self.lock} (state_id String, lock_id String, "
            "locked_at DateTime DEFAULT now()) ENGINE = ReplacingMergeTree(locked_at) "
            f"ORDER BY state_id TTL locked_at + INTERVAL {STALE_SECONDS} SECOND"
        )

    @property
    def label(self) -> str:
        return "the original ClickHouse backend (test copy)"

    def set(self, state: MeltanoState) -> None:
        self.ch.query(
            f"INSERT INTO {self.state} (state_id, partial_state, completed_state) "
            "SELECT {id:String}, {partial:String}, {completed:String}",
            id=state.state_id,
            partial=json.dumps(state.partial_state),
            completed=json.dumps(state.completed_state),
        )

    def get(self, state_id: str) -> MeltanoState | None:
        row = self.ch.query(
            f"SELECT partial_state, completed_state FROM {self.state} FINAL "
            "WHERE state_id = {id:String} FORMAT JSONEachRow",
            id=state_id,
        ).strip()
        if not row:
            return None
        parts = json.loads(row)
        return MeltanoState(
            state_id,
            json.loads(parts["partial_state"] or "{}"),
            json.loads(parts["completed_state"] or "{}"),
        )

    def delete(self, state_id: str) -> None:
        self.ch.query(f"DELETE FROM {self.state} WHERE state_id = {{id:String}}", id=state_id)

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        like = (pattern or "*").replace("*", "%")
        out = self.ch.query(
            f"SELECT DISTINCT state_id FROM {self.state} FINAL "
            "WHERE state_id LIKE {like:String} FORMAT TSVRaw",
            like=like,
        )
        return out.split()

    def _live(self, state_id: str) -> list[str]:
        out = self.ch.query(
            f"SELECT lock_id FROM {self.lock} WHERE state_id = {{id:String}} ORDER BY lock_id "
            "FORMAT TSVRaw",
            id=state_id,
        )
        return out.split()

    def _withdraw(self, state_id: str, lock_id: str) -> None:
        self.ch.query(
            f"DELETE FROM {self.lock} WHERE state_id = {{id:String}} AND lock_id = {{lock:String}}",
            id=state_id,
            lock=lock_id,
        )

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        deadline = time.monotonic() + self.timeout
        while True:
            if time.monotonic() > deadline:
                raise StateIDLockedError(f"could not lock {state_id!r} in {self.timeout} s")
            self.ch.query(
                f"DELETE FROM {self.lock} WHERE state_id = {{id:String}} "
                f"AND locked_at < now() - INTERVAL {STALE_SECONDS} SECOND",
                id=state_id,
            )
            if self._live(state_id):
                time.sleep(min(retry_seconds, 0.2))
                continue
            mine = str(uuid.uuid4())
            self.ch.query(
                f"INSERT INTO {self.lock} (state_id, lock_id) SETTINGS async_insert = 0 "
                "SELECT {id:String}, {lock:String}",
                id=state_id,
                lock=mine,
            )
            time.sleep(SETTLE_SECONDS)
            live = self._live(state_id)
            if live and live[0] == mine:
                break
            self._withdraw(state_id, mine)
            time.sleep(min(retry_seconds, 0.2))
        try:
            yield
        finally:
            self._withdraw(state_id, mine)
