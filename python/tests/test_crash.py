"""A killed `meltano run` does not lock out the next one, and a Ctrl-C leaves no lock behind.

The run streams a STATE message every 0.2 s, so the backend keeps the id's lock between them.
Once a few bookmarks are stored, it is killed with SIGKILL:

- `group`: Meltano's whole process group (a cancelled CI job, a shell's kill). The host runs in
  a session of its own, so it outlives Meltano, sees its input end and gives the lock back.
- `host`: the host process alone: its kept grant stays in the lock log until its lease ends
  (an update's lease is the lock timeout, 10 s under Meltano).
- `all`: both, as a container's kill does.

With the host in Meltano's process (the default where the wheel installed its library), there
is one process to kill:

- `in-process`: Meltano's process group; the kept grant stays in the lock log until its lease
  ends, as with `all`.

Then `meltano run --force` runs at once. Its first state write must succeed within 15 s of the
kill and the run must save its bookmark; the time is printed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from test_pipeline import RUN, STATE_ID, set_up_pipeline, write_events

from conftest import MELTANO, in_process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and /proc")

#: The files the tap reads, one STATE after each.
FILES = 80
START = datetime(2026, 11, 1, 10, tzinfo=timezone.utc)


def stamp(n: int) -> str:
    """The bookmark of file `n` (0-based)."""
    return (START + timedelta(minutes=n)).isoformat()


def bookmark(clickhouse, schema) -> str | None:
    """The stored bookmark as Meltano reads it: a run's partial state over the completed one
    (None before the run has made the table)."""
    try:
        rows = clickhouse.query(
            f"SELECT partial_state, completed_state FROM {schema}.state FINAL "
            f"WHERE state_id = '{STATE_ID}' FORMAT JSONEachRow"
        ).strip()
    except urllib.error.HTTPError as e:
        if e.code == 404:  # UNKNOWN_DATABASE or UNKNOWN_TABLE: not made yet
            return None
        raise
    if not rows:
        return None
    row = json.loads(rows)
    for part in (row["partial_state"], row["completed_state"]):
        events = json.loads(part or "{}").get("singer_state", {}).get("bookmarks", {})
        if "events" in events:
            return events["events"]["replication_key_value"]
    return None


def host_of(pid: int) -> int:
    """The pid of the state-backend host that process `pid` started."""
    hosts = hosts_of(pid)
    if not hosts:
        raise AssertionError(f"no state-backend host among the children of {pid}")
    return hosts[0]


def hosts_of(pid: int) -> list[int]:
    """The pids of the state-backend hosts (`serve`) that process `pid` started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid and b"serve" in cmdline:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def lock_info(host_bin: Path, env: dict[str, str], schema: str) -> dict:
    result = subprocess.run(
        [str(host_bin), "--uri", env["MELTANO_STATE_BACKEND_URI"], "-s", f"schema={schema}"]
        + ["--allow-loopback", "lock-info", STATE_ID],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)


def index(value: str | None) -> int:
    """Which file a bookmark is of (-1: none)."""
    if value is None:
        return -1
    return int((datetime.fromisoformat(value) - START) / timedelta(minutes=1))


def progress_after(clickhouse, schema, beyond: int, killed: float, process) -> float | None:
    """Seconds from `killed` until a bookmark of file `beyond` or later is stored, or None if
    `process` ends first. The killed host may still have had one write on its way, so
    `beyond` is two files past the bookmark read at the kill: only the next run writes it."""
    while process.poll() is None:
        if index(bookmark(clickhouse, schema)) >= beyond:
            return time.monotonic() - killed
        time.sleep(0.05)
    if index(bookmark(clickhouse, schema)) >= beyond:
        return time.monotonic() - killed
    return None


@pytest.mark.parametrize("kill", ["group", "host", "all", "in-process"])
def test_a_killed_run_does_not_lock_out_the_next(project, clickhouse, schema, host_bin, kill):
    """With the host as a child process: `group`: Meltano's process group; its host, in a
    session of its own, sees its input end and gives the lock back. `host`: the host alone;
    Meltano's run goes on, its adapter starts a new host, and that one must get the lock the
    dead one kept. `all`: both, as a container's kill does. `in-process`: Meltano's group, the
    host in Meltano's process. Then (but for `host`) `meltano run --force` at once."""
    if kill == "in-process":
        if not in_process():
            pytest.skip("no embedded host library (STATE_BACKEND_LIBRARY)")
    else:
        project.env["STATE_BACKEND_IN_PROCESS"] = "0"
    log = project.path / "killed.log"
    run = start_stream(project, clickhouse, schema, log)
    if kill == "in-process":
        assert hosts_of(run.pid) == [], "the host runs as a child process, not in Meltano's"
        host = None
    else:
        host = host_of(run.pid)
    if kill in ("host", "all"):
        os.kill(host, signal.SIGKILL)
    if kill in ("group", "all", "in-process"):
        os.killpg(run.pid, signal.SIGKILL)
    killed = time.monotonic()
    beyond = index(bookmark(clickhouse, schema)) + 2
    if kill == "host":
        nxt = run
    else:
        run.wait()
        if kill in ("all", "in-process"):
            # The kill left a live grant behind: otherwise this test would show nothing.
            assert lock_info(host_bin, project.env, schema)["locked"], "no lock left"
        else:
            # The host outlived Meltano's group, and gave the lock back as its input ended.
            deadline = time.monotonic() + 30
            while alive(host):
                assert time.monotonic() < deadline, "the host did not exit after Meltano"
                time.sleep(0.05)
            assert not lock_info(host_bin, project.env, schema)["locked"], "a lock was left"
        nxt = subprocess.Popen(
            [str(MELTANO), *RUN, "--force"],
            cwd=project.path,
            env=project.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        saved = progress_after(clickhouse, schema, beyond, killed, nxt)
        nxt.wait(timeout=600)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        if nxt.poll() is None:
            nxt.kill()
            nxt.wait()
    output = log.read_text() if nxt is run else nxt.stdout.read()
    print(f"kill={kill}: the next bookmark was stored {saved} s after the kill")
    assert nxt.returncode == 0, output
    assert "is locked by" not in output, output
    assert bookmark(clickhouse, schema) == stamp(FILES - 1), "the run saved its last bookmark"
    assert saved is not None and saved <= 15, f"{saved} s after the kill:\n{output}"


def start_stream(project, clickhouse, schema, log: Path) -> subprocess.Popen:
    """`meltano run` in a session of its own (as a terminal's foreground job), once it has
    stored a few bookmarks and keeps the id's lock between STATE messages."""
    data, _ = set_up_pipeline(project)
    for n in range(FILES):
        write_events(data / f"f{n:03}.csv", [n], START + timedelta(minutes=n))
    with log.open("w") as out:
        run = subprocess.Popen(
            [str(MELTANO), *RUN],
            cwd=project.path,
            env={**project.env, "TAP_FILES_PAUSE_SECONDS": "0.2"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while bookmark(clickhouse, schema) not in {stamp(n) for n in range(10, FILES)}:
        assert run.poll() is None, f"the run ended early:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no bookmarks stored:\n{log.read_text()}"
        time.sleep(0.05)
    return run


@pytest.mark.parametrize("host_in", ["child process", "meltano's process"])
def test_a_ctrl_c_of_meltano_run_leaves_no_lock_behind(
    project, clickhouse, schema, host_bin, host_in
):
    """SIGINT to the run's process group, as a terminal's Ctrl-C sends it: Meltano stops, and
    its host gives back the lock it kept before it exits (not when the lease ends)."""
    if host_in == "child process":
        project.env["STATE_BACKEND_IN_PROCESS"] = "0"
    elif not in_process():
        pytest.skip("no embedded host library (STATE_BACKEND_LIBRARY)")
    log = project.path / "interrupted.log"
    run = start_stream(project, clickhouse, schema, log)
    if host_in == "child process":
        host = host_of(run.pid)
    else:
        assert hosts_of(run.pid) == [], "the host runs as a child process, not in Meltano's"
        host = run.pid
    assert lock_info(host_bin, project.env, schema)["locked"], "the stream keeps the lock"
    os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
    deadline = time.monotonic() + 30
    while alive(host):
        assert time.monotonic() < deadline, "the host did not exit after Meltano"
        time.sleep(0.05)
    info = lock_info(host_bin, project.env, schema)
    assert not info["locked"], f"a lock was left behind: {info}\n{log.read_text()}"
