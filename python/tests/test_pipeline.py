"""A real pipeline: `meltano run tap-spreadsheets target-jsonl` (both from PyPI), incremental.

tap-spreadsheets (a Singer SDK tap) bookmarks each file by its modification time and skips files
it has seen. The first
run reads one file; its STATE messages reach ClickHouse through the component. The second run
gets that bookmark back through the component, skips the old file and reads only the new one.
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone

STATE_ID = "dev:tap-spreadsheets-to-target-jsonl"

MELTANO_YML = """\
default_environment: dev
project_id: meltano-clickhouse-state-tests
environments:
- name: dev
plugins:
  extractors:
  - name: tap-spreadsheets
    namespace: tap_spreadsheets
    pip_url: tap-spreadsheets==1.1.2
    executable: tap-spreadsheets
    capabilities: [catalog, discover, state, about]
    config:
      files:
      - path: data/*.csv
        format: csv
        table_name: events
        primary_keys: [id]
  loaders:
  - name: target-jsonl
    namespace: target_jsonl
    pip_url: target-jsonl==0.1.4
    executable: target-jsonl
    config:
      destination_path: out
      do_timestamp_file: false
"""


def write_events(path, ids, modified: datetime) -> None:
    path.write_text("id,name\n" + "".join(f"{i},event {i}\n" for i in ids))
    stamp = modified.timestamp()
    os.utime(path, (stamp, stamp))


def take_loaded_ids(out_dir) -> list[int]:
    """Ids of the records that target-jsonl wrote; removes its files for the next run."""
    ids = []
    for path in out_dir.glob("*.jsonl"):
        ids += [int(json.loads(line)["id"]) for line in path.read_text().splitlines()]
        path.unlink()
    return sorted(ids)


def stored_bookmarks(clickhouse, schema) -> dict:
    raw = clickhouse.query(
        f"SELECT completed_state FROM {schema}.state FINAL "
        f"WHERE state_id = '{STATE_ID}' FORMAT TSVRaw"
    )
    return json.loads(raw)["singer_state"]["bookmarks"]["events"]


def test_meltano_run_resumes_from_the_bookmark_stored_through_the_component(
    project, clickhouse, schema
):
    (project.path / "meltano.yml").write_text(MELTANO_YML)
    data, out = project.path / "data", project.path / "out"
    data.mkdir()
    out.mkdir()
    project.meltano("install")

    write_events(data / "a.csv", [1, 2, 3], datetime(2026, 11, 1, 10, tzinfo=timezone.utc))
    first = project.meltano("run", "tap-spreadsheets", "target-jsonl")
    assert "ClickHouseStateStoreManager" in first.stdout + first.stderr
    assert take_loaded_ids(out) == [1, 2, 3]
    bookmark = stored_bookmarks(clickhouse, schema)
    assert bookmark["replication_key_value"] == "2026-11-01T10:00:00+00:00"

    # A new file arrives; the old one is unchanged.
    write_events(data / "b.csv", [4, 5], datetime(2026, 11, 2, 10, tzinfo=timezone.utc))
    second = project.meltano("run", "tap-spreadsheets", "target-jsonl")
    log = second.stdout + second.stderr
    assert re.search(r"Skipping \S*a\.csv", log), "the tap skipped the bookmarked file"
    assert take_loaded_ids(out) == [4, 5], "the second run resumed from the bookmark"
    # The bookmark moved on to the new file, in ClickHouse...
    bookmark = stored_bookmarks(clickhouse, schema)
    assert bookmark["replication_key_value"] == "2026-11-02T10:00:00+00:00"
    # ...and Meltano reads it back through the component.
    got = json.loads(project.meltano("state", "get", STATE_ID).stdout.strip().splitlines()[-1])
    assert got["singer_state"]["bookmarks"]["events"] == bookmark
