#!/usr/bin/env python3
"""A small Singer target for the pipeline tests: each stream's records as JSON lines in
`<destination>/<stream>.jsonl`. Standard library only.

Meltano calls it as `target_lines.py --config FILE` with the tap's messages on stdin. Its
config: `destination` (the directory, created if missing). As Singer targets do, it writes
the value of each STATE message on stdout once the records before it are written (flushed and
synced), so that Meltano saves only bookmarks whose records have landed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO


def log(message: str) -> None:
    print(f"target_lines: {message}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    destination = Path(config["destination"])
    destination.mkdir(parents=True, exist_ok=True)

    files: dict[str, IO[str]] = {}
    counts: dict[str, int] = {}
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            message = json.loads(line)
            kind = message.get("type")
            if kind == "SCHEMA":
                stream = message["stream"]
                if stream not in files:
                    files[stream] = (destination / f"{stream}.jsonl").open("a")
                    counts[stream] = 0
            elif kind == "RECORD":
                stream = message["stream"]
                if stream not in files:
                    raise SystemExit(f"target_lines: a RECORD of {stream} before its SCHEMA")
                files[stream].write(json.dumps(message["record"]) + "\n")
                counts[stream] += 1
            elif kind == "STATE":
                for file in files.values():
                    file.flush()
                    os.fsync(file.fileno())
                sys.stdout.write(json.dumps(message["value"]) + "\n")
                sys.stdout.flush()
            # other messages (ACTIVATE_VERSION, BATCH, ...) do not occur here
    finally:
        for file in files.values():
            file.close()
    for stream, count in counts.items():
        log(f"wrote {count} records of {stream} to {destination / f'{stream}.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
