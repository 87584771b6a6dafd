"""One run of a pipeline at a time, through real `meltano run`s of two projects that share
nothing but the state backend (each has its own system database, so Meltano's own check of
running jobs cannot see the other).

- A second run is refused at once, before its tap starts, naming the first; the first ends
  with its own last bookmark.
- `--force` takes the id; the first run's later writes are refused, and the bookmark is the
  forcing run's.
- A first run killed with SIGKILL of its process group: the next run proceeds once the hold
  lapses, within the lock timeout (the host in Meltano's process), or at once (a child host,
  which sees its input end and gives the hold back).
- A run whose last block is a slow command plugin holds the id until it ends: another run,
  `meltano state set` and the CLI's `set` are refused meanwhile, and reads are not.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from test_crash import FILES, START, bookmark, lock_info, stamp, start_stream
from test_pipeline import (
    MELTANO_YML,
    PLUGINS,
    RUN,
    STATE_ID,
    run_ids,
    set_up_pipeline,
    write_events,
)

from conftest import MELTANO, Project, in_process

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and /proc")

REFUSED = "Another run of the pipeline holds its state"


@pytest.fixture
def other(tmp_path: Path, backend_env: dict[str, str]) -> Project:
    """A second Meltano project, its own system database, the same state backend."""
    base = tmp_path / "other"
    base.mkdir()
    env = {**os.environ, **backend_env}
    subprocess.run(
        [str(MELTANO), "init", "project", "--no-usage-stats"],
        cwd=base,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return Project(path=base / "project", env=env)


def later_files(project: Project, count: int, minutes: int) -> None:
    """The other project's pipeline, with `count` files stamped `minutes` after START on."""
    data, _ = set_up_pipeline(project)
    for n in range(count):
        write_events(data / f"g{n:03}.csv", [1000 + n], START + timedelta(minutes=minutes + n))


def run_of(project: Project, *extra: str) -> subprocess.CompletedProcess:
    return project.meltano(*RUN, *extra, check=False)


def output(result) -> str:
    return f"{result.stdout}\n{result.stderr}"


def flat(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as one space (Meltano wraps a traceback's
    message)."""
    return " ".join(text.split())


def loaded(project: Project) -> list[str]:
    return sorted(p.name for p in (project.path / "out").iterdir())


def test_a_second_run_is_refused_at_once_naming_the_first(project, other, clickhouse, schema):
    log = project.path / "first.log"
    first = start_stream(project, clickhouse, schema, log)
    try:
        later_files(other, 3, minutes=1000)
        # A second run that waited for the first would take two minutes.
        other.env["MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS"] = "120"
        started = time.monotonic()
        second = run_of(other)
        took = time.monotonic() - started
        text = output(second)
        assert second.returncode != 0, text
        assert REFUSED in text, text
        (run_id,) = run_ids(project)
        for named in (str(run_id), f"process {first.pid}", os.uname().nodename, "lapses at"):
            assert named in text, f"{named!r} not in:\n{text}"
        # refused before its tap ran: nothing extracted, nothing loaded
        assert "tap_files:" not in text, text
        assert loaded(other) == [], text
        print(f"the second run was refused after {took:.1f} s (Meltano's start included):")
        print(text)
        assert took < 60, f"refused after {took:.1f} s: it waited"
        assert first.wait(timeout=300) == 0, log.read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert bookmark(clickhouse, schema) == stamp(FILES - 1), "the first run's last bookmark"


def test_force_takes_the_id_and_fences_the_first_run_out(project, other, clickhouse, schema):
    log = project.path / "first.log"
    first = start_stream(project, clickhouse, schema, log)
    try:
        later_files(other, 3, minutes=1000)
        forced = run_of(other, "--force")
        assert forced.returncode == 0, output(forced)
        assert first.wait(timeout=300) != 0, "the fenced run must fail, not end as if saved"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert "this run's hold" in log.read_text(), log.read_text()
    assert bookmark(clickhouse, schema) == (START + timedelta(minutes=1002)).isoformat()


def lapse_of(message: str) -> datetime:
    found = re.search(r"lapses at (\S+) if it dies", message)
    assert found, message
    return datetime.fromisoformat(found.group(1).replace("Z", "+00:00"))


@pytest.mark.parametrize("host_in", ["meltano's process", "child process"])
def test_a_killed_run_holds_the_id_no_longer_than_the_lock_timeout(
    project, other, clickhouse, schema, host_bin, host_in
):
    if host_in == "child process":
        project.env["STATE_BACKEND_IN_PROCESS"] = "0"
    elif not in_process():
        pytest.skip("no embedded host library (STATE_BACKEND_LIBRARY)")
    first = start_stream(project, clickhouse, schema, project.path / "first.log")
    (run_id,) = run_ids(project)
    os.killpg(first.pid, signal.SIGKILL)
    killed = datetime.now(timezone.utc)
    first.wait()
    held = lock_info(host_bin, project.env, schema)
    if host_in == "child process":
        # its host, in a session of its own, saw its input end and gave the hold back
        deadline = time.monotonic() + 30
        while held.get("locked"):
            assert time.monotonic() < deadline, f"the hold was not given back: {held}"
            time.sleep(0.05)
            held = lock_info(host_bin, project.env, schema)
    else:
        # the dead run still holds the id (nothing gave it back), named by its run id
        assert held.get("locked"), "no hold left: this test would show nothing"
        assert held["who"]["run_id"] == str(run_id), held
    later_files(other, 3, minutes=1000)
    refusals = 0
    while True:
        nxt = run_of(other)
        if nxt.returncode == 0:
            break
        text = output(nxt)
        assert REFUSED in text, text
        refusals += 1
        # The dead run's hold lasts an update's lease (the lock timeout, 10 s) past its last
        # renewal, which was before the kill.
        lapse = lapse_of(text)
        assert lapse <= killed + timedelta(seconds=11), f"lapses at {lapse}, killed at {killed}"
        assert datetime.now(timezone.utc) < lapse + timedelta(seconds=30), "refused after lapse"
        time.sleep(max(0.0, (lapse - datetime.now(timezone.utc)).total_seconds()) + 0.5)
    print(f"host in {host_in}: {refusals} refusals before the next run proceeded")
    if host_in == "child process":
        assert refusals == 0, "the child host gives the hold back as Meltano's input ends"
    assert bookmark(clickhouse, schema) == (START + timedelta(minutes=1002)).isoformat()


GATED_YML = (
    MELTANO_YML
    + f"""\
  utilities:
  - name: gate
    namespace: gate
    executable: {json.dumps(str(PLUGINS / "gate.py"))}
    commands:
      wait:
        args: wait
"""
)


def test_a_slow_last_block_keeps_the_id_held_from_other_runs_and_writers(
    project, other, clickhouse, schema, host_bin
):
    data, _ = set_up_pipeline(project)
    (project.path / "meltano.yml").write_text(GATED_YML)
    write_events(data / "f000.csv", [1], START)
    gate = project.path / "gate"
    env = {**project.env, "GATE_FILE": str(gate)}
    first = subprocess.Popen(
        [str(MELTANO), *RUN, "gate:wait"],
        cwd=project.path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{gate}.reached").exists():
            assert first.poll() is None, first.stdout.read()
            assert time.monotonic() < deadline, "the gate block never started"
            time.sleep(0.05)
        assert bookmark(clickhouse, schema) == stamp(0), "the first blocks saved their state"
        # More than a lease and a half (10 s) in the slow block: the hold lives on renewals.
        time.sleep(16)
        later_files(other, 3, minutes=1000)
        second = run_of(other)
        assert second.returncode != 0 and REFUSED in output(second), output(second)
        # Writes from outside the run wait the lock timeout (2 s here), then are refused.
        quick = {"MELTANO_STATE_BACKEND_LOCK_TIMEOUT_SECONDS": "2"}
        new_state = '{"singer_state": {"bookmarks": {"events": {}}}}'
        state_set = other.meltano(
            "state", "set", "--force", STATE_ID, new_state, check=False, env=quick
        )
        assert state_set.returncode != 0, output(state_set)
        assert "is held by a run of its pipeline" in flat(output(state_set)), output(state_set)
        cli = subprocess.run(
            [str(host_bin), "--uri", project.env["MELTANO_STATE_BACKEND_URI"]]
            + ["-s", f"schema={schema}", "-s", "lock_timeout_seconds=2", "--allow-loopback"]
            + ["set", STATE_ID, new_state],
            env=project.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode != 0 and "locked" in cli.stderr, cli.stderr
        (run_id,) = run_ids(project)
        assert str(run_id) in cli.stderr, cli.stderr  # the holder named
        # Reads are never held up.
        got = other.meltano("state", "get", STATE_ID)
        assert json.loads(got.stdout)["singer_state"]["bookmarks"]["events"], got.stdout
        assert STATE_ID in other.meltano("state", "list").stdout
        gate.touch()
        assert first.wait(timeout=300) == 0, first.stdout.read()
    finally:
        gate.touch()
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert bookmark(clickhouse, schema) == stamp(0), "nothing from outside was written"
    after = run_of(other)
    assert after.returncode == 0, output(after)
