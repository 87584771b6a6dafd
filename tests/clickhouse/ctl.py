"""Start, stop and check the local ClickHouse in the background (used by the justfile and CI).

python ctl.py start [server options...]   start unless /ping already answers; wait for it
python ctl.py stop                        stop the server this script started (by its pid)
python ctl.py status                      exit 0 when /ping answers
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
STATE = Path(os.environ.get("LOCAL_CLICKHOUSE_STATE", HERE.parent.parent / ".local"))
PID_FILE = STATE / "clickhouse.pid"
LOG_FILE = STATE / "clickhouse.log"
START_TIMEOUT_S = 90


def port_of(args: list[str]) -> int:
    if "--port" in args:
        return int(args[args.index("--port") + 1])
    return int(os.environ.get("LOCAL_CLICKHOUSE_PORT", "8123"))


def pings(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as resp:
            return resp.status == 200 and resp.read() == b"Ok.\n"
    except (urllib.error.URLError, OSError):
        return False


def running_pid() -> int | None:
    try:
        pid = int(PID_FILE.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def start(args: list[str]) -> int:
    port = port_of(args)
    if pings(port):
        print(f"local ClickHouse already answers on 127.0.0.1:{port}")
        return 0
    STATE.mkdir(parents=True, exist_ok=True)
    if "--port" not in args:
        args = ["--port", str(port), *args]
    if "--data" not in args:
        args = ["--data", str(STATE / "clickhouse"), *args]
    with LOG_FILE.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE / "server.py"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the recipe that started it
        )
    PID_FILE.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while not pings(port):
        if proc.poll() is not None:
            print(
                f"local ClickHouse exited with {proc.returncode}; log: {LOG_FILE}", file=sys.stderr
            )
            print(LOG_FILE.read_text()[-4000:], file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            proc.terminate()
            print(
                f"local ClickHouse did not answer /ping in {START_TIMEOUT_S}s; log: {LOG_FILE}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)
    print(f"local ClickHouse up on 127.0.0.1:{port} (pid {proc.pid}, log {LOG_FILE})")
    return 0


def stop() -> int:
    pid = running_pid()
    if pid is None:
        print("local ClickHouse: no server started by `start` is running")
        PID_FILE.unlink(missing_ok=True)
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while running_pid() is not None:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.1)
    PID_FILE.unlink(missing_ok=True)
    print(f"local ClickHouse stopped (pid {pid})")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "start":
        return start(rest)
    if command == "stop":
        return stop()
    if command == "status":
        up = pings(port_of(rest))
        print("up" if up else "down")
        return 0 if up else 1
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
