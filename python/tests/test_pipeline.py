"""A real pipeline: `meltano run tap-files target-lines`, incremental, with no package index.

The tap and the target ship in the repository (`plugins/`, standard library only) as Meltano
custom plugins: a namespace and an executable, no `pip_url`, so nothing is installed and
`meltano run --no-install` fails rather than install if one ever needs it. tap-files bookmarks
each CSV file by its modification time and skips the files at or before the bookmark;
target-lines writes the records as JSON lines and passes each STATE on once its records are
written. The first run reads one file; its STATE messages reach ClickHouse through the
component. The second run gets that bookmark back through the component, skips the old file
and reads only the new one.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import pytest

from conftest import MELTANO, ROOT

#: The repository's tap and target (executables; Meltano runs them directly).
PLUGINS = Path(__file__).resolve().with_name("plugins")
TAP, TARGET = PLUGINS / "tap_files.py", PLUGINS / "target_lines.py"
STATE_ID = "dev:tap-files-to-target-lines"
#: `--no-install`: a plugin that needs installing fails the run instead of reaching an index.
RUN = ("run", "--no-install", "tap-files", "target-lines")

MELTANO_YML = f"""\
default_environment: dev
project_id: meltano-clickhouse-state-tests
send_anonymous_usage_stats: false
cli:
  disable_version_check: true
environments:
- name: dev
plugins:
  extractors:
  - name: tap-files
    namespace: tap_files
    executable: {json.dumps(str(TAP))}
    capabilities: [catalog, discover, state]
    config:
      directory: $MELTANO_PROJECT_ROOT/data
      stream: events
      key_properties: [id]
  loaders:
  - name: target-lines
    namespace: target_lines
    executable: {json.dumps(str(TARGET))}
    config:
      destination: $MELTANO_PROJECT_ROOT/out
"""


def write_events(path, ids, modified: datetime) -> None:
    path.write_text("id,name\n" + "".join(f"{i},event {i}\n" for i in ids))
    stamp = modified.timestamp()
    os.utime(path, (stamp, stamp))


def take_loaded_ids(out_dir) -> list[int]:
    """Ids of the records that target-lines wrote; removes its files for the next run."""
    ids = []
    for path in out_dir.glob("*.jsonl"):
        ids += [int(json.loads(line)["id"]) for line in path.read_text().splitlines()]
        path.unlink()
    return sorted(ids)


def set_up_pipeline(project) -> tuple[Path, Path]:
    """Writes the project's meltano.yml (the repository's tap and target, nothing to install)
    and returns the tap's input directory and the target's output directory."""
    for plugin in (TAP, TARGET):
        assert os.access(plugin, os.X_OK), f"{plugin} is not executable (chmod +x, in git too)"
    (project.path / "meltano.yml").write_text(MELTANO_YML)
    data, out = project.path / "data", project.path / "out"
    data.mkdir()
    out.mkdir()
    return data, out


def run_ids(project) -> list[uuid.UUID]:
    """The run ids of the project's runs, oldest first, from Meltano's system database."""
    with sqlite3.connect(project.path / ".meltano" / "meltano.db") as db:
        rows = db.execute("SELECT run_id FROM runs ORDER BY started_at").fetchall()
    return [uuid.UUID(str(run_id)) for (run_id,) in rows]


def stored_bookmarks(clickhouse, schema) -> dict:
    raw = clickhouse.query(
        f"SELECT completed_state FROM {schema}.state FINAL "
        f"WHERE state_id = '{STATE_ID}' FORMAT TSVRaw"
    )
    return json.loads(raw)["singer_state"]["bookmarks"]["events"]


def test_meltano_run_resumes_from_the_bookmark_stored_through_the_component(
    project, clickhouse, schema
):
    data, out = set_up_pipeline(project)
    write_events(data / "a.csv", [1, 2, 3], datetime(2026, 11, 1, 10, tzinfo=timezone.utc))
    first = project.meltano(*RUN)
    log = first.stdout + first.stderr
    assert "ClickHouseStateStoreManager" in log
    assert "Skipping" not in log, "no bookmark yet: the tap read every file"
    assert take_loaded_ids(out) == [1, 2, 3]
    bookmark = stored_bookmarks(clickhouse, schema)
    assert bookmark == {
        "replication_key": "_modified",
        "replication_key_value": "2026-11-01T10:00:00+00:00",
    }

    # A new file arrives; the old one is unchanged.
    write_events(data / "b.csv", [4, 5], datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
    second = project.meltano(*RUN)
    log = second.stdout + second.stderr
    assert re.search(r"Skipping \S*a\.csv", log), "the tap skipped the bookmarked file"
    assert take_loaded_ids(out) == [4, 5], "the second run resumed from the bookmark"
    # The bookmark moved on to the new file, in ClickHouse...
    bookmark = stored_bookmarks(clickhouse, schema)
    assert bookmark["replication_key_value"] == "2026-11-02T10:00:00+00:00"
    # ...and Meltano reads it back through the component.
    got = json.loads(project.meltano("state", "get", STATE_ID).stdout.strip().splitlines()[-1])
    assert got["singer_state"]["bookmarks"]["events"] == bookmark


def state_backend(host_bin, project, *args: str):
    """The CLI beside Meltano, with the project's environment (Meltano's variables): JSON out."""
    result = subprocess.run(
        [str(host_bin), "--allow-loopback", *args],
        cwd=project.path,
        env=project.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"state-backend {' '.join(args)}: {result.stderr}"
    return json.loads(result.stdout)


def test_a_restore_after_a_bad_run_makes_the_next_run_load_what_it_skipped(
    project, clickhouse, schema, host_bin
):
    data, out = set_up_pipeline(project)
    write_events(data / "a.csv", [1, 2, 3], datetime(2026, 11, 1, 10, tzinfo=timezone.utc))
    project.meltano(*RUN)
    assert take_loaded_ids(out) == [1, 2, 3]
    # A bad run: a file stamped years ahead moves the bookmark past every real file.
    bad = data / "bad.csv"
    write_events(bad, [666], datetime(2030, 1, 1, tzinfo=timezone.utc))
    project.meltano(*RUN)
    assert take_loaded_ids(out) == [666]
    bad.unlink()
    write_events(data / "b.csv", [4, 5], datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
    project.meltano(*RUN)
    assert take_loaded_ids(out) == [], "the bad bookmark skips the new file"

    history = state_backend(host_bin, project, "history", STATE_ID)

    def bookmark_of(entry) -> str:
        return entry["state"]["singer_state"]["bookmarks"]["events"]["replication_key_value"]

    # Newest first: the bad run's bookmark, then the first run's.
    assert bookmark_of(history[0]) == "2030-01-01T00:00:00+00:00"
    assert all(entry["op"] == "update" for entry in history), history
    first_good = next(e for e in history if bookmark_of(e) == "2026-11-01T10:00:00+00:00")
    # Each version names the run that wrote it: Meltano's run id (its system database's), the
    # command, the process, this machine, Meltano's version.
    runs = run_ids(project)
    assert len(runs) == 3, runs
    assert uuid.UUID(first_good["who"]["run_id"]) == runs[0], first_good
    assert uuid.UUID(history[0]["who"]["run_id"]) in runs[1:], history[0]
    for entry in history:
        who = entry["who"]
        assert who["command"] == "run", entry
        assert who["host"] == socket.gethostname(), entry
        assert who["meltano_version"] == metadata.version("meltano"), entry
        assert who["pid"] not in (0, os.getpid()), entry
    # Each run its own process, named by its own pid (not the host's, not this one's).
    pids = {uuid.UUID(e["who"]["run_id"]): e["who"]["pid"] for e in history}
    assert len(set(pids.values())) == len(pids), pids
    diff = state_backend(
        host_bin, project, "diff", STATE_ID, str(first_good["version"]), str(history[0]["version"])
    )
    assert (
        diff["bookmarks"]["events"]["from"]["replication_key_value"] == "2026-11-01T10:00:00+00:00"
    )
    assert diff["bookmarks"]["events"]["to"]["replication_key_value"] == "2030-01-01T00:00:00+00:00"

    restored = state_backend(
        host_bin, project, "restore", STATE_ID, "--to", str(first_good["version"])
    )
    replaced = restored["replaced"]["singer_state"]["bookmarks"]["events"]
    assert replaced["replication_key_value"] == "2030-01-01T00:00:00+00:00"
    assert restored["restored"]["op"] == "restore"

    # The next run resumes from the restored bookmark: it loads the file the bad one hid.
    project.meltano(*RUN)
    assert take_loaded_ids(out) == [4, 5]
    history = state_backend(host_bin, project, "history", STATE_ID)
    ops = [e["op"] for e in history]
    assert "restore" in ops, ops
    restore = next(e for e in history if e["op"] == "restore")
    assert (restore["who"]["command"], restore["who"]["run_id"]) == ("cli restore", ""), restore


class OwnClickHouse:
    """The local ClickHouse of this test's own (the project's server on a free port), which it
    kills and starts again on the same data. It fails the test when it cannot start."""

    SERVER = ROOT / "tests" / "clickhouse" / "server.py"
    #: The workspace's venv has the engine (chdb); the wheel's test venv does not need it.
    PYTHON = ROOT / ".venv" / "bin" / "python"

    def __init__(self, directory: Path):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        directory.mkdir(parents=True, exist_ok=True)
        self.data = directory / "data"
        self.log = directory / "server.log"
        self.process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"clickhouse://default:@127.0.0.1:{self.port}/default"

    def start(self) -> None:
        if not self.PYTHON.exists():
            pytest.fail(f"no Python with the engine at {self.PYTHON}: run tests/bootstrap.sh")
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [str(self.PYTHON), str(self.SERVER), "--port", str(self.port)]
                + ["--data", str(self.data)],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the local server exited: {self.log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ping", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        pytest.fail(f"the local server did not start: {self.log.read_text()}")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def queries_seen(self) -> int:
        """Queries the server has logged so far (each is a POST)."""
        return self.log.read_text().count(" POST /")

    def query(self, sql: str) -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/", data=sql.encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()


def test_meltano_run_rides_through_a_clickhouse_restart(project, schema, tmp_path):
    """The server is killed (SIGKILL) at the run's first query to it and started again only
    once the backend has logged a retry, plus 8 s: the run completes, and the bookmark it stored
    is right and read back by the next run."""
    server = OwnClickHouse(tmp_path / "clickhouse")
    server.start()
    env = {
        "MELTANO_STATE_BACKEND_URI": server.uri,
        "MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK": "true",
    }
    try:
        data, out = set_up_pipeline(project)
        write_events(data / "a.csv", [1, 2, 3], datetime(2026, 11, 1, 10, tzinfo=timezone.utc))

        run = subprocess.Popen(
            [str(MELTANO), *RUN],
            cwd=project.path,
            env={**project.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        lines: list[str] = []
        retried = threading.Event()

        def read() -> None:
            assert run.stdout is not None
            for line in run.stdout:
                lines.append(line)
                if "retry" in line and "unreachable" in line:
                    retried.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 300
        while server.queries_seen() == 0:
            assert run.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "the run sent no query"
            time.sleep(0.02)
        server.kill()
        killed = time.monotonic()
        assert retried.wait(timeout=120), "the run met no outage:\n" + "".join(lines)
        time.sleep(8)
        server.start()
        outage = time.monotonic() - killed
        assert run.wait(timeout=600) == 0, "".join(lines)
        reader.join(timeout=10)
        log = "".join(lines)
        assert "ClickHouseStateStoreManager" in log
        assert take_loaded_ids(out) == [1, 2, 3]
        stored = server.query(
            f"SELECT completed_state FROM {schema}.state FINAL "
            f"WHERE state_id = '{STATE_ID}' FORMAT TSVRaw"
        )
        bookmark = json.loads(stored)["singer_state"]["bookmarks"]["events"]
        assert bookmark["replication_key_value"] == "2026-11-01T10:00:00+00:00"
        print(f"outage of {outage:.1f} s ridden through")

        # The next run reads that bookmark back and goes on from it.
        write_events(data / "b.csv", [4, 5], datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
        second = project.meltano(*RUN, env=env)
        assert re.search(r"Skipping \S*a\.csv", second.stdout + second.stderr)
        assert take_loaded_ids(out) == [4, 5]
    finally:
        server.kill()
