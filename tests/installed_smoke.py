"""Checks an installed wheel without a ClickHouse: run it with the Python of an environment
where the wheel and Meltano are installed (the release workflow does, natively on Windows,
where no ClickHouse runs).

    venv/bin/python tests/installed_smoke.py

Meltano finds the backend by its entry point; the adapter finds the host the wheel put in this
environment's scripts directory (``Scripts\\state-backend.exe`` on Windows) and the component
inside the package; the host starts, and a call to a closed port on loopback comes back as
``unreachable`` (not as the sandbox's refusal). Then the host alone, twice, with the default
compile cache: the first call compiles into the platform's per-user cache directory (or finds
an entry there), the second loads that entry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

from meltano.core.state_store import StateBackend
from meltano_clickhouse_state import bridge
from meltano_clickhouse_state.bridge import BackendError


def main() -> None:
    for name in (bridge.BIN_ENV, bridge.COMPONENT_ENV):
        os.environ.pop(name, None)
    host = bridge.find_executable()
    scripts = Path(sysconfig.get_path("scripts"))
    assert host == scripts / bridge.EXECUTABLE, f"the host is {host}, not in {scripts}"
    component = bridge.find_component()
    assert component is not None and component.is_file(), "the wheel's component is missing"
    print(f"host {host}\ncomponent {component}")
    factory = StateBackend.get_manager_factory(scheme="clickhouse")
    manager = factory(
        uri="clickhouse://smoke@127.0.0.1:1/smoke", allow_loopback=True, retry_budget_seconds=0
    )
    try:
        manager.get("smoke")
    except BackendError as e:
        print(f"{e.kind}: {e.message}")
        assert (e.kind, e.reason) == ("unreachable", None), e
    else:
        sys.exit("a closed port answered")
    finally:
        manager.close()
    check_cache(host)
    print("installed smoke: OK")


def default_cache() -> Path:
    """The platform's per-user cache directory, as the host's `dirs::cache_dir` finds it."""
    if sys.platform == "win32":
        base = Path(os.environ["LOCALAPPDATA"])
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "meltano-state-backend"


def check_cache(host: Path) -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CLICKHOUSE_", "STATE_BACKEND_"))
    }
    command = [str(host), "--log", "debug", "--allow-loopback"]
    command += ["--uri", "clickhouse://smoke@127.0.0.1:1/smoke", "get", "smoke"]
    loaded = []
    for _ in range(2):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        found = re.search(r'loaded=(Stored|Hit)\(("(?:[^"\\]|\\.)*")\)', done.stderr)
        assert found, f"no cache outcome in the host's log:\n{done.stderr}"
        loaded.append((found[1], Path(json.loads(found[2]))))
    (_, first), (outcome, second) = loaded
    assert (outcome, second) == ("Hit", first), loaded
    assert first.parent == default_cache(), f"{first} is not in {default_cache()}"
    print(f"cache: {loaded[0][0]}, then Hit, {first}")


if __name__ == "__main__":
    main()
