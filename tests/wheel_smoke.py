"""Smoke-tests a built wheel's host against a ClickHouse: the one test every platform's wheel
gets, here (`just wheel-smoke`) and in the release workflow.

    python tests/wheel_smoke.py WHEEL...

The wheel is unpacked, not installed, and its own executable runs with its own component:
`--version` (which must be the wheel's version), then `set`, `merge` (under the lock) and `get`
of one state in `$CLICKHOUSE_URL` (a test schema, `smoke_<platform>`). The first call compiles
the component into a fresh cache directory and the second must load it from there, so the
compile cache is exercised with the platform's own paths.

A wheel for another machine runs through an emulator, chosen from its tag:
- `manylinux*_aarch64` on x86_64: qemu-user (Debian: qemu-user, libc6-arm64-cross);
- `win_amd64` off Windows: Wine (Debian: wine64). Every path the host sees is a Windows path
  (`Z:\\...`). Wine 8.0 lacks bcryptprimitives.dll, which Rust's standard library imports and
  real Windows has: a stand-in (tests/windows/bcryptprimitives.c, built with zig) goes next to
  the unpacked executable, never into a wheel.
macOS wheels run on macOS only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Debian's 64-bit loader (its `wine` wrapper looks for a 32-bit prefix), else what PATH has.
WINE = "/usr/lib/wine/wine64" if Path("/usr/lib/wine/wine64").is_file() else shutil.which("wine64")
#: The host's settings come from here, never from the caller's environment (its tripwire may).
NOT_INHERITED = re.compile(
    r"^(CLICKHOUSE_|MELTANO_|STATE_BACKEND_(?!TRIPWIRE))|_PROXY$|^NO_PROXY$", re.IGNORECASE
)
QEMU_AARCH64 = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]
STAND_IN = ROOT / "tests" / "windows" / "bcryptprimitives.c"


def fail(message: str) -> None:
    print(f"wheel smoke: {message}", file=sys.stderr)
    sys.exit(1)


class Platform:
    """How to run the wheel's executable on this machine, and how it names paths."""

    def __init__(self, wheel: Path, work: Path):
        name = wheel.name
        self.windows = name.endswith("-win_amd64.whl")
        self.launcher: list[str] = []
        here = platform.machine().lower()
        if self.windows and os.name != "nt":
            if WINE is None:
                fail(f"{name} runs here under Wine: apt-get install wine64")
            self.launcher = [WINE]
            os.environ["WINEPREFIX"] = str(work / "wine-prefix")
            os.environ["WINEDEBUG"] = "-all"
            # A new prefix would offer to install Mono and Gecko; the host needs neither.
            os.environ["WINEDLLOVERRIDES"] = "mscoree=;mshtml="
        elif re.search(r"_aarch64\.whl$", name) and here not in ("aarch64", "arm64"):
            self.launcher = QEMU_AARCH64
        elif "-macosx_" in name and sys.platform != "darwin":
            fail(f"{name} is a macOS wheel: it runs on macOS only")
        self.tag = "windows" if self.windows else re.sub(r"\W", "_", name.rsplit("-", 1)[1][:-4])

    def path(self, path: Path) -> str:
        """`path` as the executable sees it."""
        if self.windows and os.name != "nt":
            return "Z:" + str(path).replace("/", "\\")
        return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheels", type=Path, nargs="+", metavar="WHEEL")
    args = parser.parse_args()
    url = os.environ.get("CLICKHOUSE_URL")
    if not url:
        fail("CLICKHOUSE_URL is not set (e.g. http://default:@127.0.0.1:8123)")
    for wheel in args.wheels:
        smoke(wheel, url)


def smoke(wheel_path: Path, url: str) -> None:
    version = wheel_path.name.split("-")[1]
    with tempfile.TemporaryDirectory(prefix="wheel-smoke-") as tmp:
        work = Path(tmp)
        with zipfile.ZipFile(wheel_path) as wheel:
            wheel.extractall(work / "wheel")
        on = Platform(wheel_path, work)
        exe = "state-backend.exe" if on.windows else "state-backend"
        found = sorted((work / "wheel").glob(f"*.data/scripts/{exe}"))
        if not found:
            fail(f"{wheel_path.name} has no {exe} among its scripts")
        host = found[0]
        host.chmod(0o755)
        component = work / "wheel" / "meltano_clickhouse_state" / "clickhouse_state.wasm"
        if not component.is_file():
            fail(f"{wheel_path.name} has no component")
        if on.windows and on.launcher:
            subprocess.run(
                [sys.executable, "-m", "ziglang", "cc", "-target", "x86_64-windows-gnu"]
                + ["-shared", "-O2", "-o", str(host.parent / "bcryptprimitives.dll")]
                + [str(STAND_IN), "-ladvapi32"],
                check=True,
            )
        cache = work / "cache"
        env = {
            **{k: v for k, v in os.environ.items() if not NOT_INHERITED.search(k)},
            "STATE_BACKEND_CACHE_DIR": on.path(cache),
            "STATE_BACKEND_COMPONENT": on.path(component),
            "MELTANO_STATE_BACKEND_URI": url.rstrip("/") + "/default",
        }

        def run(*argv: str) -> subprocess.CompletedProcess[str]:
            command = [*on.launcher, str(host), "--allow-loopback"]
            command += ["-s", f"schema=smoke_{on.tag}", *argv]
            started = time.monotonic()
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
            took = time.monotonic() - started
            print(f"$ state-backend {' '.join(argv)}  ({took:.1f} s)", file=sys.stderr)
            if done.returncode != 0:
                fail(f"exit {done.returncode}\n{done.stdout}{done.stderr}")
            return done

        said = run("--version").stdout.strip()
        print(f"  {said}", file=sys.stderr)
        if version not in said.split():
            fail(f"--version says {said!r}, the wheel is {version}")
        state_id = f"smoke:{time.time_ns()}"
        first = run("--log", "debug", "set", state_id, '{"singer_state": {"a": 1}}')
        second = run("--log", "debug", "merge", state_id, '{"singer_state": {"b": 2}}')
        got = json.loads(run("get", state_id).stdout)
        print(f"  {got}", file=sys.stderr)
        if got != {"singer_state": {"a": 1, "b": 2}}:
            fail(f"get read {got}, not the merge of both")
        # The first call compiled into the cache, the second loaded that entry: both name it
        # by the path the executable was given (a Windows path under Wine).
        entries = sorted(cache.glob("*.cwasm"))
        if len(entries) != 1:
            fail(f"the cache holds {[e.name for e in entries]}, not one entry")
        entry = json.dumps(on.path(entries[0]))
        for call, outcome in ((first, "Stored"), (second, "Hit")):
            if f"loaded={outcome}({entry})" not in call.stderr:
                fail(f"expected loaded={outcome}({entry}) in the host's log:\n{call.stderr}")
        print(f"  cache: stored, then loaded {entry}", file=sys.stderr)
        print(f"wheel smoke: {wheel_path.name}: OK")


if __name__ == "__main__":
    main()
