"""Mutants of the lock's sending functions (those of guest/src/lock/fenced.rs that take a
session), which no native oracle runs: the guest's unit tests and the model drive the machines,
not the functions that turn their steps into statements. cargo-mutants lists the mutants (the
regex given, the justfile's `fenced_io`); each is written into the source, the component built
(its own target directory, the shipped profile), and the engine's lock tests run on it through
`STATE_BACKEND_COMPONENT` (cargo-nextest, stopping at the first failure), against the
ClickHouse at $CLICKHOUSE_URL; then the source is put back. A mutant that no test fails is
missed; the run fails if any is.

    .venv/bin/python tests/mutants/engine.py --re REGEX [--out FILE]   (`just mutants-engine`)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "guest/src/lock/fenced.rs"
TARGET = ROOT / "target/mutants-engine"
COMPONENT = TARGET / "wasm32-wasip2/release-guest/clickhouse_state.wasm"
# The engine's tests of the lock and of what it guards: the suites that take, keep, hand back,
# renew, force and read locks through the component.
SUITES = ("lock", "linger", "settle", "landing", "statements", "faults")
FILTER = " | ".join(f"test(/^{suite}::/)" for suite in SUITES)


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, **kwargs)


def listed(regex: str) -> list[dict]:
    done = run(
        ["cargo", "mutants", "--list", "--json", "-p", "clickhouse-state-guest"]
        + ["--file", SOURCE, "--re", regex]
    )
    if done.returncode != 0:
        raise SystemExit(f"cargo mutants --list failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def build() -> tuple[bool, str]:
    done = run(
        ["cargo", "build", "-q", "-p", "clickhouse-state-guest", "--target", "wasm32-wasip2"]
        + ["--profile", "release-guest", "--target-dir", str(TARGET)]
    )
    return done.returncode == 0, done.stderr


def engine_tests() -> tuple[bool, str]:
    """Whether every selected test passed, and the first failure's name."""
    env = dict(os.environ, STATE_BACKEND_COMPONENT=str(COMPONENT))
    done = run(
        ["cargo", "nextest", "run", "--max-fail", "1"]
        + ["-p", "integration-tests", "--test", "integration", "-E", FILTER],
        env=env,
    )
    out = done.stdout + done.stderr
    if done.returncode == 0:
        return True, ""
    failed = [line.split()[-1] for line in out.splitlines() if line.strip().startswith("FAIL [")]
    if not failed:
        raise SystemExit(f"the engine's tests did not build or run:\n{out[-3000:]}")
    return False, failed[0]


def apply(mutant: dict, original: str) -> str:
    """The source with the mutant's span replaced (lines and columns from 1, end exclusive)."""
    lines = original.splitlines(keepends=True)
    start, end = mutant["span"]["start"], mutant["span"]["end"]
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
    at = offset[start["line"] - 1] + start["column"] - 1
    to = offset[end["line"] - 1] + end["column"] - 1
    return original[:at] + mutant["replacement"] + original[to:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--re", required=True, help="the mutants, by cargo-mutants' --re")
    parser.add_argument(
        "--out", type=Path, help="the report (default docs/mutants/COMMIT-engine.txt)"
    )
    args = parser.parse_args()
    if run(["git", "diff", "--quiet", "HEAD", "--", "guest/src"]).returncode != 0:
        print("guest/src has uncommitted changes: the report would not be of HEAD", file=sys.stderr)
        return 1
    head = run(["git", "rev-parse", "HEAD"]).stdout.strip()
    out = args.out or ROOT / f"docs/mutants/{head[:7]}-engine.txt"
    mutants = listed(args.re)
    path = ROOT / SOURCE
    original = path.read_text()
    built, errors = build()
    if not built:
        print(f"the unmutated component does not build:\n{errors[-3000:]}", file=sys.stderr)
        return 1
    passed, failure = engine_tests()
    if not passed:
        print(f"the engine's tests fail on the unmutated code: {failure}", file=sys.stderr)
        return 1
    outcomes: dict[str, list[str]] = {"caught": [], "missed": [], "unviable": []}
    try:
        for n, mutant in enumerate(mutants, 1):
            mutated = apply(mutant, original)
            if mutated == original:
                raise SystemExit(f"{mutant['name']}: the mutant changes nothing")
            path.write_text(mutated)
            started = time.monotonic()
            built, _ = build()
            if not built:
                outcome, why = "unviable", "does not build"
            else:
                passed, failure = engine_tests()
                outcome, why = ("missed", "") if passed else ("caught", f"by {failure}")
            outcomes[outcome].append(f"{mutant['name']} ({why})" if why else mutant["name"])
            print(
                f"{n}/{len(mutants)} {outcome} {mutant['name']} {why} "
                f"({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    finally:
        path.write_text(original)
    lines = [
        f"Measured at commit `{head}`: {len(mutants)} mutants of the sending functions of "
        f"{SOURCE}, against the engine's tests ({', '.join(s + '::' for s in SUITES)}).",
        "",
    ]
    for kind, names in outcomes.items():
        lines += [f"## {kind}", *names, ""]
    out.write_text("\n".join(lines))
    counts = ", ".join(f"{len(v)} {k}" for k, v in outcomes.items())
    print(f"{counts}: {out.relative_to(ROOT)}")
    return 1 if outcomes["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())
