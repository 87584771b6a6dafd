"""`meltano state ...` commands of real Meltano, with MELTANO_STATE_BACKEND_URI=clickhouse://...

Each command is checked twice: by what Meltano prints, and by what is in ClickHouse afterwards
(read over plain HTTP, past the component), so nothing can pass by landing in Meltano's
system database instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from original_backend import OriginalStateStoreManager

WORKER = Path(__file__).with_name("lock_worker.py")


def stored(clickhouse, schema: str) -> dict[str, dict]:
    """Every state in ClickHouse, as {id: {"completed": ..., "partial": ...}}."""
    rows = clickhouse.query(
        f"SELECT state_id, partial_state, completed_state FROM {schema}.state FINAL "
        "WHERE completed_state IS NOT NULL OR partial_state IS NOT NULL "
        "ORDER BY state_id FORMAT JSONEachRow"
    )
    out = {}
    for line in rows.splitlines():
        row = json.loads(line)
        out[row["state_id"]] = {
            "completed": json.loads(row["completed_state"] or "{}"),
            "partial": json.loads(row["partial_state"] or "{}"),
        }
    return out


def last_json(output: str):
    """Meltano logs on stdout too: the JSON document is the last line."""
    return json.loads(output.strip().splitlines()[-1])


def test_state_commands_go_through_the_component(project, clickhouse, schema):
    a, b, c = "dev:tap-a-to-target-x", "dev:tap_b-to-target-x", "prod:tap-a-to-target-x"
    project.meltano("state", "set", "--force", a, '{"singer_state": {"bookmarks": {"s1": 1}}}')
    project.meltano("state", "set", "--force", b, '{"singer_state": {"bookmarks": {"s9": 9}}}')
    assert stored(clickhouse, schema)[a] == {
        "completed": {"singer_state": {"bookmarks": {"s1": 1}}},
        "partial": {},
    }
    assert last_json(project.meltano("state", "get", a).stdout) == {
        "singer_state": {"bookmarks": {"s1": 1}}
    }

    # merge: a partial state merged over the stored one
    project.meltano("state", "merge", a, '{"singer_state": {"bookmarks": {"s2": 2}}}')
    assert stored(clickhouse, schema)[a]["partial"] == {"singer_state": {"bookmarks": {"s2": 2}}}
    assert last_json(project.meltano("state", "get", a).stdout) == {
        "singer_state": {"bookmarks": {"s1": 1, "s2": 2}}
    }
    # Who wrote: each Meltano command that wrote, with no run id (they are not runs).
    writers = clickhouse.query(
        f"SELECT command, run_id FROM {schema}.state_writers FINAL FORMAT TSVRaw"
    )
    commands = {tuple(line.split("\t")) for line in writers.splitlines()}
    assert commands == {("state set", ""), ("state merge", "")}, commands

    # list, with a glob whose `_` is literal
    listed = project.meltano("state", "list", "--pattern", "dev:tap_*").stdout.split()
    assert b in listed and a not in listed
    assert {a, b} <= set(project.meltano("state", "list").stdout.split())

    # copy and move
    project.meltano("state", "copy", "--force", a, c)
    assert stored(clickhouse, schema)[c]["completed"] == {
        "singer_state": {"bookmarks": {"s1": 1, "s2": 2}}
    }
    moved = "prod:tap-moved-to-target-x"
    project.meltano("state", "move", "--force", c, moved)
    now = stored(clickhouse, schema)
    assert c not in now and moved in now

    # export, then clear everything, then import it back
    exported = last_json(project.meltano("state", "export").stdout)
    assert set(exported) == {a, b, moved}
    assert exported[a]["partial"] == {"singer_state": {"bookmarks": {"s2": 2}}}

    project.meltano("state", "clear", "--force", b)
    assert b not in stored(clickhouse, schema)
    cleared = project.meltano("state", "clear", "--force", "--all")
    assert "2 state(s) were successfully cleared" in cleared.stdout + cleared.stderr
    assert stored(clickhouse, schema) == {}

    project.meltano("state", "import", input=json.dumps(exported))
    assert stored(clickhouse, schema) == exported


def test_a_held_lock_makes_meltano_state_set_fail_clearly(
    project, manager_kwargs, clickhouse, schema
):
    sid = "dev:tap-held-to-target"
    holder = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", sid],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    holder.stdin.write(json.dumps(manager_kwargs) + "\n")
    holder.stdin.flush()
    try:
        assert any(line.strip() == "held" for line in holder.stdout)
        project.env["MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS"] = "1"
        refused = project.meltano(
            "state", "set", "--force", sid, '{"singer_state": {}}', check=False
        )
        assert refused.returncode != 0
        assert "locked" in (refused.stdout + refused.stderr).lower()
        # The holder named by its process: the worker's own pid, as its manager told its host.
        assert f"pid {holder.pid}" in refused.stdout + refused.stderr, refused.stderr
        assert sid not in stored(clickhouse, schema), "the refused set wrote"
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    project.meltano("state", "set", "--force", sid, '{"singer_state": {"after": 1}}')
    assert last_json(project.meltano("state", "get", sid).stdout) == {"singer_state": {"after": 1}}


def test_a_bad_setting_is_a_meltano_error_naming_it(project):
    for variable, says in [
        ("LOCK_MODE", "'lock_mode' must be 'fenced' or 'settle', not 'sometimes'"),
        ("PORT", "invalid port 'sometimes'"),
        ("LOCK_LEASE_SECONDS", "'lock_lease_seconds' must be a number of seconds"),
    ]:
        env = f"MELTANO_STATE_BACKEND_CLICKHOUSE_{variable}"
        refused = project.meltano("state", "list", check=False, env={env: "sometimes"})
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said
        assert says in said, said
        assert f"state_backend.clickhouse.{variable.lower()}" in said
        assert env in said
        # Meltano's own error output, not a traceback.
        assert "Traceback" not in said, said


def merge_waits_for_the_originals_lock(project, clickhouse, schema, mode: str) -> None:
    """Meltano merges a state in `mode` while the original backend holds the id's lock by its
    own protocol (a candidate in ``<table>_lock``): the merge must give up as locked, and go
    through once the original lets go."""
    sid = "dev:settle"
    project.env["MELTANO_STATE_BACKEND_CLICKHOUSE_LOCK_MODE"] = mode
    project.meltano("state", "set", "--force", sid, '{"singer_state": {"a": 1}}')
    original = OriginalStateStoreManager(clickhouse, schema)
    with original.acquire_lock(sid, retry_seconds=0.1):
        refused = project.meltano(
            "state",
            "merge",
            sid,
            '{"singer_state": {"b": 2}}',
            check=False,
            env={"MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": "2"},
        )
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, f"merged while the original held the lock:\n{said}"
        assert "locked" in said.lower(), said
        assert stored(clickhouse, schema)[sid]["partial"] == {}, "the refused merge wrote"
    project.meltano("state", "merge", sid, '{"singer_state": {"b": 2}}')
    assert stored(clickhouse, schema)[sid]["partial"] == {"singer_state": {"b": 2}}


def test_settle_mode_waits_for_a_lock_the_original_backend_holds(project, clickhouse, schema):
    merge_waits_for_the_originals_lock(project, clickhouse, schema, "settle")


def test_the_settle_check_fails_in_fenced_mode(project, clickhouse, schema):
    """Fenced mode does not see the original's lock: the check above fails, so it shows that
    settle mode was used."""
    with pytest.raises(AssertionError, match="merged while the original held the lock"):
        merge_waits_for_the_originals_lock(project, clickhouse, schema, "fenced")


def test_the_host_logs_at_meltanos_log_level(project):
    quiet = project.meltano("state", "list")
    assert "component loaded" not in quiet.stdout + quiet.stderr
    loud = project.meltano("--log-level=debug", "state", "list")
    assert "component loaded" in loud.stdout + loud.stderr


def test_a_second_package_serving_clickhouse_is_reported(project, tmp_path):
    """The original package installed next to this one: both register `clickhouse`."""
    site = tmp_path / "other-site"
    dist = site / "meltano_state_backend_clickhouse-0.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: meltano-state-backend-clickhouse\nVersion: 0.3.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[meltano.state_backends]\nclickhouse = other_clickhouse_backend:Manager\n"
    )
    (site / "other_clickhouse_backend.py").write_text(
        "raise ImportError('the other package ran, not this one')\n"
    )
    # First on the path, so Meltano picks the other package: this one's settings, which Meltano
    # loads whichever it picks, must still say so.
    project.env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(site), project.env.get("PYTHONPATH")])
    )
    refused = project.meltano("state", "list", check=False)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0, said
    assert "two packages serve Meltano's clickhouse:// state backend" in said, said
    assert "meltano-state-backend-clickhouse (other_clickhouse_backend:Manager)" in said
