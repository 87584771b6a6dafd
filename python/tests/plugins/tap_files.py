#!/usr/bin/env python3
"""A small incremental Singer tap for the pipeline tests: the CSV files of a directory, one
stream, each file bookmarked by its modification time. Standard library only.

Meltano calls it as it calls any extractor with the capabilities `catalog`, `discover` and
`state`: `tap_files.py --config FILE --discover` (the catalog on stdout), then
`tap_files.py --config FILE [--catalog FILE] [--state FILE]` (`--properties` is taken as
`--catalog`). Its config:

    directory: the directory of the CSV files (header line, then rows)
    stream:    the stream's name (default "events")
    key_properties: the stream's primary key (default ["id"])

`TAP_FILES_PAUSE_SECONDS` in the environment makes it pause that long before each file (a
stream that takes its time, for the crash tests).

It reads the files modified after the bookmark, oldest first, and skips (logging
`Skipping <path>`) those at or before it. Each record is a row, its values as strings, plus
`_modified` (the file's modification time, the replication key). After each file it emits a
STATE message whose bookmark is that file's modification time:

    {"bookmarks": {"events": {"replication_key": "_modified",
                              "replication_key_value": "2026-11-01T10:00:00+00:00"}}}
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPLICATION_KEY = "_modified"


def log(message: str) -> None:
    print(f"tap_files: {message}", file=sys.stderr, flush=True)


def emit(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def modified(path: Path) -> datetime:
    return datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)


def csv_files(directory: Path) -> list[Path]:
    """The directory's CSV files, oldest first."""
    return sorted(directory.glob("*.csv"), key=lambda path: (path.stat().st_mtime, path.name))


def discover(config: dict) -> dict:
    """One stream: the columns of the files there now (all strings) and the replication key."""
    directory = Path(config["directory"])
    columns: dict[str, dict] = {}
    for path in csv_files(directory) if directory.is_dir() else []:
        with path.open(newline="") as file:
            for name in next(csv.reader(file), []):
                columns.setdefault(name, {"type": ["string", "null"]})
    stream = config.get("stream", "events")
    key_properties = config.get("key_properties", ["id"])
    schema = {
        "type": "object",
        "properties": {
            **columns,
            REPLICATION_KEY: {"type": ["string"], "format": "date-time"},
        },
    }
    return {
        "streams": [
            {
                "tap_stream_id": stream,
                "stream": stream,
                "schema": schema,
                "key_properties": key_properties,
                "replication_key": REPLICATION_KEY,
                "replication_method": "INCREMENTAL",
                "metadata": [
                    {
                        "breadcrumb": [],
                        "metadata": {
                            "inclusion": "available",
                            "selected-by-default": True,
                            "table-key-properties": key_properties,
                            "valid-replication-keys": [REPLICATION_KEY],
                            "forced-replication-method": "INCREMENTAL",
                        },
                    }
                ],
            }
        ]
    }


def selected(stream: dict) -> bool:
    for entry in stream.get("metadata", []):
        if entry.get("breadcrumb") == []:
            metadata = entry.get("metadata", {})
            return metadata.get("selected", metadata.get("selected-by-default", False))
    return False


def sync(config: dict, catalog: dict, state: dict) -> None:
    directory = Path(config["directory"])
    bookmarks = dict(state.get("bookmarks", {}))
    for stream in catalog["streams"]:
        name = stream["tap_stream_id"]
        if not selected(stream):
            log(f"stream {name} is not selected")
            continue
        emit(
            {
                "type": "SCHEMA",
                "stream": name,
                "schema": stream["schema"],
                "key_properties": stream.get("key_properties", []),
                "bookmark_properties": [REPLICATION_KEY],
            }
        )
        bookmark = bookmarks.get(name, {}).get("replication_key_value")
        after = datetime.fromisoformat(bookmark) if bookmark else None
        log(f"stream {name}: bookmark {bookmark}")
        pause = float(os.environ.get("TAP_FILES_PAUSE_SECONDS", "0"))
        for path in csv_files(directory):
            stamp = modified(path)
            if after is not None and stamp <= after:
                log(f"Skipping {path}: modified {stamp.isoformat()}, not after the bookmark")
                continue
            time.sleep(pause)
            log(f"Reading {path}: modified {stamp.isoformat()}")
            with path.open(newline="") as file:
                for row in csv.DictReader(file):
                    record = {**row, REPLICATION_KEY: stamp.isoformat()}
                    emit({"type": "RECORD", "stream": name, "record": record})
            bookmarks[name] = {
                "replication_key": REPLICATION_KEY,
                "replication_key_value": stamp.isoformat(),
            }
            emit({"type": "STATE", "value": {**state, "bookmarks": dict(bookmarks)}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--catalog", "--properties", dest="catalog", type=Path)
    parser.add_argument("--state", type=Path)
    parser.add_argument("--about", action="store_true")
    args = parser.parse_args()
    if args.about:
        emit({"name": "tap-files", "capabilities": ["catalog", "discover", "state"]})
        return 0
    config = json.loads(args.config.read_text())
    if args.discover:
        emit(discover(config))
        return 0
    catalog = json.loads(args.catalog.read_text()) if args.catalog else discover(config)
    state = json.loads(args.state.read_text()) if args.state else {}
    sync(config, catalog, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
