#!/usr/bin/env python3
"""A slow command plugin for the run-lock tests: `gate.py wait` marks that it started
(`$GATE_FILE.reached`), then waits until `$GATE_FILE` exists (at most 300 s), as a dbt step
that takes its time would keep the last block of a `meltano run` busy. Standard library only."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    if sys.argv[1:] != ["wait"]:
        print("usage: gate.py wait", file=sys.stderr)
        return 2
    gate = Path(os.environ["GATE_FILE"])
    Path(f"{gate}.reached").touch()
    deadline = time.monotonic() + 300
    while not gate.exists():
        if time.monotonic() > deadline:
            print("gate: never opened", file=sys.stderr)
            return 1
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
