"""Mutants of the SQL guard (guest/src/sql/guard.rs), which cargo-mutants cannot make: each
clause of the condition dropped, each comparison flipped, each event list cut short. Each mutant
is written into the source, the guard's test against the engine runs
(`deployment::the_guard_in_sql_decides_as_the_guard_in_rust`: the guard's SQL on the ClickHouse
at $CLICKHOUSE_URL, against the same rule in Rust and the expected verdict of every case), and
the source is put back. A mutant the test does not fail is missed; the run fails if any is.

    .venv/bin/python tests/mutants/sql_guard.py [--out FILE]   (`just mutants-sql`)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUARD = ROOT / "guest/src/sql/guard.rs"
TEST = "deployment::the_guard_in_sql_decides_as_the_guard_in_rust"

# (name, text in guard.rs, its replacement): each replaces exactly one place.
MUTANTS: list[tuple[str, str, str]] = [
    (
        "the stored version's clause dropped",
        """"(SELECT toUnixTimestamp64Milli(max(updated_at)) FROM {state} \\
         WHERE state_id = {{id:String}}) = {{expected:UInt64}} \\
         AND max(l.generation)""",
        # Still reads the state table, so the statement's other argument stays in use.
        """"(SELECT count() FROM {state} WHERE 0) = 0 \\
         AND max(l.generation)""",
    ),
    ("the stored version: = flipped to >=", ") = {{expected:UInt64}}", ") >= {{expected:UInt64}}"),
    ("the stored version: = flipped to <=", ") = {{expected:UInt64}}", ") <= {{expected:UInt64}}"),
    (
        "the newest generation's clause dropped",
        "AND max(l.generation) = {{generation:UInt64}} \\\n",
        "\\\n",
    ),
    (
        "the newest generation: = flipped to >=",
        "max(l.generation) = {{generation:UInt64}}",
        "max(l.generation) >= {{generation:UInt64}}",
    ),
    (
        "the released-or-forced clause dropped",
        "AND countIf(l.generation = {{generation:UInt64}} AND l.event IN ('release', 'force')) = 0 \\\n",
        "\\\n",
    ),
    (
        "a force no longer counts",
        "l.event IN ('release', 'force')) = 0",
        "l.event IN ('release')) = 0",
    ),
    (
        "a release no longer counts",
        "l.event IN ('release', 'force')) = 0",
        "l.event IN ('force')) = 0",
    ),
    (
        "the released-or-forced count: = 0 flipped to > 0",
        "l.event IN ('release', 'force')) = 0",
        "l.event IN ('release', 'force')) > 0",
    ),
    (
        "the claim's clause dropped",
        "AND ({{confirmed:UInt8}} = 1 OR",
        "AND (1 = 1 OR",
    ),
    ("confirmed no longer exempts", "({{confirmed:UInt8}} = 1 OR", "(0 = 1 OR"),
    ("confirmed: = 1 flipped to = 0", "({{confirmed:UInt8}} = 1 OR", "({{confirmed:UInt8}} = 0 OR"),
    (
        "the owner's own claim: > 0 flipped to >= 0",
        "AND l.owner = {{owner:String}}) > 0",
        "AND l.owner = {{owner:String}}) >= 0",
    ),
    (
        "a rival claim: != flipped to =",
        "AND l.owner != {{owner:String}}) = 0",
        "AND l.owner = {{owner:String}}) = 0",
    ),
    (
        "a rival claim: = 0 flipped to >= 0",
        "AND l.owner != {{owner:String}}) = 0",
        "AND l.owner != {{owner:String}}) >= 0",
    ),
    (
        "the previous grant's renewal clause dropped",
        "AND maxIf(l.until_ms, l.generation = {{previous:UInt64}} AND l.event IN ('acquire', 'renew')) \\\n         <= {{previous_until:UInt64}}",
        "",
    ),
    (
        "the previous grant's renewal: <= flipped to >=",
        "<= {{previous_until:UInt64}}",
        ">= {{previous_until:UInt64}}",
    ),
    (
        "a renewal of the previous grant no longer counts",
        "l.generation = {{previous:UInt64}} AND l.event IN ('acquire', 'renew')",
        "l.generation = {{previous:UInt64}} AND l.event IN ('acquire')",
    ),
    (
        "the previous grant: generation flipped to this one",
        "l.generation = {{previous:UInt64}} AND",
        "l.generation = {{generation:UInt64}} AND",
    ),
]


def run_test() -> tuple[bool, str]:
    # --workspace, as `just test` builds: `-p integration-tests` alone resolves the dependencies'
    # features differently, and its first build took two minutes in CI.
    done = subprocess.run(
        ["cargo", "test", "-q", "--workspace", "--test", "integration", "--", TEST],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    out = done.stdout + done.stderr
    if done.returncode != 0 and "panicked" not in out:
        raise SystemExit(f"the test did not build or run:\n{out[-3000:]}")
    # Caught only by one of the test's verdicts (SQL against Rust, the expected verdict, what
    # the insert wrote), not by any panic: a mutant that breaks the SQL's syntax proves nothing.
    verdicts = ("SQL and Rust disagree", "assertion `left == right` failed")
    caught = done.returncode != 0 and any(v in out for v in verdicts)
    if done.returncode != 0 and not caught:
        raise SystemExit(f"the test failed other than by a verdict:\n{out[-3000:]}")
    return caught, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    original = GUARD.read_text()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    failed, _ = run_test()
    if failed:
        print("the guard's test fails on the unmutated code", file=sys.stderr)
        return 1
    lines = [f"SQL guard mutants at {head.stdout.strip()}, against `{TEST}`:", ""]
    missed = 0
    try:
        for name, text, replacement in MUTANTS:
            if original.count(text) != 1:
                raise SystemExit(f"{name}: the text is in guard.rs {original.count(text)} times")
            GUARD.write_text(original.replace(text, replacement))
            started = time.monotonic()
            caught, reason = run_test()
            missed += not caught
            verdict = "caught" if caught else "MISSED"
            line = f"{verdict}  {name} ({time.monotonic() - started:.0f} s)"
            print(line, flush=True)
            lines.append(line)
    finally:
        GUARD.write_text(original)
    lines += ["", f"{len(MUTANTS) - missed} of {len(MUTANTS)} caught"]
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
