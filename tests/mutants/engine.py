"""Mutants of the lock's sending functions (those of guest/src/lock/fenced.rs that take a
session), which no native oracle runs: the guest's unit tests and the model drive the machines,
not the functions that turn their steps into statements. cargo-mutants lists the mutants (the
regex given, the justfile's `fenced_io`). The run works in a private worktree of HEAD
(target/mutants-engine/tree), so the checkout it was started from is never written to and may
change while it runs. The engine's tests are built once into a nextest archive; each mutant is
written into the worktree's source, the component built (its own target directory, the shipped
profile's code without LTO, incrementally), and the archived tests run on it through `STATE_BACKEND_COMPONENT` (stopping at the
first failure), against the ClickHouse at $CLICKHOUSE_URL. A mutant counts as caught only when
the test that failed passes again on the unmutated component; one that no test fails is missed,
and the run fails if any is.

    .venv/bin/python tests/mutants/engine.py --re REGEX [--out FILE]   (`just mutants-engine`)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "guest/src/lock/fenced.rs"
TARGET = ROOT / "target/mutants-engine"
TREE = TARGET / "tree"
ARCHIVE = TARGET / "engine-tests.tar.zst"
COMPONENT = TARGET / "wasm32-wasip2/release-guest/clickhouse_state.wasm"
UNMUTATED = TARGET / "unmutated.wasm"
# The engine's tests of the lock and of what it guards: the suites that take, keep, hand back,
# renew, force and read locks through the component, and the lock log's migration (deployment).
SUITES = ("lock", "linger", "settle", "landing", "statements", "faults", "deployment")
FILTER = " | ".join(f"test(/^{suite}::/)" for suite in SUITES)


def run(args: list[str], cwd: Path = TREE, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, **kwargs)


def checked(args: list[str], what: str, cwd: Path = TREE) -> str:
    done = run(args, cwd=cwd)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def worktree() -> str:
    """A fresh worktree of HEAD at TREE, sharing the checkout's venv; HEAD's full hash."""
    head = checked(["git", "rev-parse", "HEAD"], "git rev-parse", cwd=ROOT).strip()
    if TREE.exists():
        checked(["git", "worktree", "remove", "--force", str(TREE)], "git worktree remove", ROOT)
    checked(["git", "worktree", "prune"], "git worktree prune", cwd=ROOT)
    checked(["git", "worktree", "add", "--detach", str(TREE), head], "git worktree add", ROOT)
    # The tests find the local ClickHouse's Python through their own manifest's directory.
    (TREE / ".venv").symlink_to(ROOT / ".venv")
    return head


def archive() -> None:
    """The engine's tests of HEAD, built once (the checkout's target directory, so its built
    dependencies are reused) and frozen: the checkout's edits cannot reach a mutant's run."""
    checked(
        ["cargo", "nextest", "archive", "-p", "integration-tests", "--test", "integration"]
        + ["--target-dir", str(ROOT / "target"), "--archive-file", str(ARCHIVE)],
        "building the engine's tests",
    )


def listed(regex: str) -> list[dict]:
    done = run(
        ["cargo", "mutants", "--list", "--json", "-p", "clickhouse-state-guest"]
        + ["--file", SOURCE, "--re", regex]
    )
    if done.returncode != 0:
        raise SystemExit(f"cargo mutants --list failed:\n{done.stderr[-3000:]}")
    # cargo-mutants lists a struct field's deletion whatever --re says (cargo-mutants#632): a
    # pure function's would be judged here by tests that never run it.
    return [m for m in json.loads(done.stdout) if re.search(regex, m["name"])]


# The shipped profile's code (release-guest: panic=abort, no overflow checks), compiled the way a
# rebuild is quick: without whole-program LTO into one unit, and incrementally. What the code
# does is the same; only how hard the optimiser works on it differs.
QUICK_PROFILE = {
    "CARGO_PROFILE_RELEASE_GUEST_LTO": "false",
    "CARGO_PROFILE_RELEASE_GUEST_CODEGEN_UNITS": "16",
    "CARGO_PROFILE_RELEASE_GUEST_INCREMENTAL": "true",
}


def build() -> tuple[bool, str]:
    done = run(
        ["cargo", "build", "-q", "-p", "clickhouse-state-guest", "--target", "wasm32-wasip2"]
        + ["--profile", "release-guest", "--target-dir", str(TARGET)],
        env=dict(os.environ, **QUICK_PROFILE),
    )
    return done.returncode == 0, done.stderr


# cargo-nextest's exit codes: 0 every test passed, 100 a test failed (any status: FAIL, SIGABRT
# from the tripwire's check, TIMEOUT...); anything else did not run the tests.
NEXTEST_TEST_FAILED = 100
# A mutant that hangs a test is a timeout, not a stalled run (the unmutated suites take ~4 min).
TIMEOUT_S = 900
STATUS = re.compile(r"^\s*(FAIL|SIG\w+|ABORT|TIMEOUT|LEAK-FAIL)\s+\[[^\]]*\]\s+(.*)$")


def engine_tests(component: Path = COMPONENT, tests: str = FILTER) -> tuple[str, str]:
    """ "passed", "failed" (with the first failure's status and test) or "timeout"."""
    env = dict(os.environ, STATE_BACKEND_COMPONENT=str(component))
    try:
        done = run(
            ["cargo", "nextest", "run", "--archive-file", str(ARCHIVE)]
            + ["--workspace-remap", str(TREE), "--color", "never", "--max-fail", "1"]
            + ["-E", tests],
            env=env,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return "timeout", f"over {TIMEOUT_S} s"
    out = done.stdout + done.stderr
    if done.returncode == 0:
        return "passed", ""
    if done.returncode != NEXTEST_TEST_FAILED:
        raise SystemExit(f"the engine's tests did not run (exit {done.returncode}):\n{out[-3000:]}")
    failed = [" ".join(m.groups()) for m in map(STATUS.match, out.splitlines()) if m]
    return "failed", failed[0] if failed else "a test failed"


def failed_test(failure: str) -> str | None:
    """The test's name in a failure's line ("FAIL (3/54) integration-tests::integration lock::x")."""
    name = failure.split()[-1] if failure.split() else ""
    return name if "::" in name and any(name.startswith(s + "::") for s in SUITES) else None


def fails_unmutated(failure: str) -> str | None:
    """Why a failure is not the mutant's: the test failed again on the unmutated component (a
    flaky test or a sick server), or its name could not be read to try it. None if it passes."""
    test = failed_test(failure)
    if test is None:
        return f"the failing test's name is not in {failure!r}"
    verdict, again = engine_tests(UNMUTATED, f"test(={test})")
    return None if verdict == "passed" else f"{test} fails on the unmutated component too: {again}"


def apply(mutant: dict, original: str) -> str:
    """The source with the mutant's span replaced (lines and columns from 1, end exclusive)."""
    lines = original.splitlines(keepends=True)
    start, end = mutant["span"]["start"], mutant["span"]["end"]
    offset = [0]
    for line in lines:
        offset.append(offset[-1] + len(line))
    at = offset[start["line"] - 1] + start["column"] - 1
    to = offset[end["line"] - 1] + end["column"] - 1
    mutated = original[:at] + mutant["replacement"] + original[to:]
    removed = {line[1:] for line in mutant["diff"].splitlines()[2:] if line.startswith("-")}
    gone = set(original.splitlines()) - set(mutated.splitlines())
    if not gone <= {line.rstrip("\n") for line in removed}:
        raise SystemExit(f"{mutant['name']}: the change written is not cargo-mutants' diff")
    return mutated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--re", required=True, help="the mutants, by cargo-mutants' --re")
    parser.add_argument(
        "--out", type=Path, help="the report (default docs/mutants/COMMIT-engine.txt)"
    )
    args = parser.parse_args()
    head = worktree()
    out = (args.out or ROOT / f"docs/mutants/{head[:7]}-engine.txt").resolve()
    mutants = listed(args.re)
    print(f"{len(mutants)} mutants of {SOURCE} at {head[:7]}", flush=True)
    path = TREE / SOURCE
    original = path.read_text()
    archive()
    built, errors = build()
    if not built:
        print(f"the unmutated component does not build:\n{errors[-3000:]}", file=sys.stderr)
        return 1
    UNMUTATED.write_bytes(COMPONENT.read_bytes())
    verdict, failure = engine_tests(UNMUTATED)
    if verdict != "passed":
        print(f"the engine's tests fail on the unmutated code: {failure}", file=sys.stderr)
        return 1
    outcomes: dict[str, list[str]] = {"caught": [], "missed": [], "timeout": [], "unviable": []}
    # A stop by SIGTERM or SIGHUP (a job killed) puts the source back too, as Ctrl-C does.
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, lambda signum, _: sys.exit(128 + signum))
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
                verdict, failure = engine_tests()
                outcome, why = {
                    "passed": ("missed", ""),
                    "failed": ("caught", f"by {failure}"),
                    "timeout": ("timeout", failure),
                }[verdict]
                if outcome == "caught" and (not_the_mutant := fails_unmutated(failure)):
                    raise SystemExit(f"{mutant['name']}: {not_the_mutant}")
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
        f"The mutants: cargo mutants --file {SOURCE} --re '{args.re}'",
        "",
    ]
    for kind, names in outcomes.items():
        lines += [f"## {kind}", *names, ""]
    out.write_text("\n".join(lines))
    counts = ", ".join(f"{len(v)} {k}" for k, v in outcomes.items())
    print(f"{counts}: {out}")
    return 1 if outcomes["missed"] or outcomes["timeout"] else 0


if __name__ == "__main__":
    sys.exit(main())
