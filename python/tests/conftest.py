"""Fixtures for the Meltano tests: real Meltano, the real host, the ClickHouse at $CLICKHOUSE_URL.

Each test gets a schema (database) of its own, dropped afterwards, so the same tests run against
the local ClickHouse or any other one given by URL.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlencode, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_URL = "http://default:@127.0.0.1:8123"
MELTANO = Path(sys.executable).with_name("meltano")

#: Every host the tests start (by the bridge, by Meltano, by hand) inherits this variable, which
#: arms the host's tripwire in any build: it refuses to connect anywhere off this machine,
#: whatever its policy says, and appends each attempt to this file. The `tripwire` fixture fails
#: any test during which it was hit.
TRIPWIRE = Path(tempfile.gettempdir()) / f"state-backend-tripwire-{os.getpid()}"
os.environ["STATE_BACKEND_TRIPWIRE"] = str(TRIPWIRE)


@dataclass(frozen=True)
class ClickHouse:
    secure: bool
    host: str
    port: int
    user: str
    password: str

    @classmethod
    def from_env(cls) -> ClickHouse:
        parts = urlsplit(os.environ.get("CLICKHOUSE_URL", DEFAULT_URL))
        secure = parts.scheme == "https"
        return cls(
            secure=secure,
            host=parts.hostname or "127.0.0.1",
            port=parts.port or (8443 if secure else 8123),
            user=unquote(parts.username or "default"),
            password=unquote(parts.password or ""),
        )

    @property
    def loopback(self) -> bool:
        return self.host in {"127.0.0.1", "localhost", "::1"}

    def uri(self, password: str | None = None) -> str:
        password = self.password if password is None else password
        query = "?secure=true" if self.secure else ""
        return (
            f"clickhouse://{quote(self.user, safe='')}:{quote(password, safe='')}"
            f"@{self.host}:{self.port}/default{query}"
        )

    def query(self, sql: str, **params: str) -> str:
        """Runs SQL over plain HTTP, bypassing the component (to check and to clean up);
        ``params`` are bound to the query's ``{name:Type}`` parameters."""
        scheme = "https" if self.secure else "http"
        bound = urlencode({f"param_{name}": value for name, value in params.items()})
        request = urllib.request.Request(
            f"{scheme}://{self.host}:{self.port}/?{bound}", data=sql.encode()
        )
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read().decode()


@pytest.fixture(scope="session")
def clickhouse() -> ClickHouse:
    return ClickHouse.from_env()


if not ClickHouse.from_env().loopback:
    # A ClickHouse elsewhere, given by URL: the one host the tripwire lets through.
    os.environ["STATE_BACKEND_TRIPWIRE_ALLOW"] = ClickHouse.from_env().host


class Tripwire:
    """What tripped the hosts' tripwire during one test."""

    def __init__(self) -> None:
        self._start = self._size()
        self.expected = False

    @staticmethod
    def _size() -> int:
        return TRIPWIRE.stat().st_size if TRIPWIRE.exists() else 0

    def trips(self) -> str:
        if not TRIPWIRE.exists():
            return ""
        with TRIPWIRE.open("rb") as log:
            log.seek(self._start)
            return log.read().decode()


#: Trips that tests meant to make (`Tripwire.expected`); any other fails the session too.
EXPECTED_TRIPS: list[str] = []


@pytest.fixture(autouse=True)
def tripwire():
    """Fails the test if a host tried to leave this machine during it (unless the test says it
    meant to, by setting ``expected``)."""
    wire = Tripwire()
    yield wire
    trips = wire.trips()
    if wire.expected:
        EXPECTED_TRIPS.extend(trips.splitlines())
    elif trips:
        pytest.fail(f"the tripwire was hit:\n{trips}")


def pytest_sessionfinish(session, exitstatus):
    """A trip outside any test (a host still running after its test) fails the run as well."""
    recorded = TRIPWIRE.read_text().splitlines() if TRIPWIRE.exists() else []
    unexpected = list(recorded)
    for line in EXPECTED_TRIPS:
        if line in unexpected:
            unexpected.remove(line)
    if unexpected:
        print("\nthe tripwire was hit outside the tests that meant it:", *unexpected, sep="\n")
        session.exitstatus = 1
    TRIPWIRE.unlink(missing_ok=True)


#: Set (to 1) to test the package as installed from its wheel: its own host executable and
#: component, found as a user's would be, instead of the workspace's debug build.
INSTALLED = os.environ.get("STATE_BACKEND_TEST_INSTALLED") == "1"


@pytest.fixture(scope="session")
def host_bin() -> Path:
    """The host executable the tests drive: the installed one (see INSTALLED), else
    $STATE_BACKEND_BIN or the debug build."""
    if INSTALLED:
        from meltano_clickhouse_state.bridge import find_executable

        return find_executable()
    path = Path(os.environ.get("STATE_BACKEND_BIN", ROOT / "target" / "debug" / "state-backend"))
    if not path.is_file():
        pytest.fail(f"no host executable at {path}: run `cargo build -p meltano-state-host`")
    return path


def in_process() -> bool:
    """Whether Meltano's processes run the host themselves (the embedded host library, which
    the wheel installs) rather than as a child process: the default wherever it is installed.
    Against the installed wheel (CI) it must be: a test that needs the library fails there
    instead of skipping."""
    from meltano_clickhouse_state.embedded import find_library

    return INSTALLED or find_library() is not None


@pytest.fixture
def child_process(monkeypatch) -> None:
    """The host as a child process (`state-backend serve`) for this test and the Meltano
    processes it starts, where the default is the host in the process: for what only a child
    process has (a process of its own to kill, an executable to find)."""
    monkeypatch.setenv("STATE_BACKEND_IN_PROCESS", "0")


@pytest.fixture
def schema(clickhouse: ClickHouse):
    """A database of this test's own, dropped afterwards."""
    name = f"meltano_py_{uuid.uuid4().hex[:10]}"
    yield name
    clickhouse.query(f"DROP DATABASE IF EXISTS {name}")


@pytest.fixture
def backend_env(clickhouse: ClickHouse, host_bin: Path, schema: str, monkeypatch) -> dict[str, str]:
    """The environment a Meltano process needs to keep its state in `schema`."""
    env = {
        "MELTANO_STATE_BACKEND_URI": clickhouse.uri(),
        "MELTANO_STATE_BACKEND_CLICKHOUSE_SCHEMA": schema,
        "MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK": "true"
        if clickhouse.loopback
        else "false",
        "MELTANO_SEND_ANONYMOUS_USAGE_STATS": "false",
        "MELTANO_DISABLE_TRACKING": "true",
        # Meltano asks PyPI for its newest version otherwise.
        "MELTANO_CLI_DISABLE_VERSION_CHECK": "true",
    }
    if not INSTALLED:
        # the workspace's builds, never a copy left in the source tree by `just wheel`
        env["STATE_BACKEND_BIN"] = str(host_bin)
        env["STATE_BACKEND_COMPONENT"] = str(
            ROOT / "target" / "wasm32-wasip2" / "release-guest" / "clickhouse_state.wasm"
        )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def manager_kwargs(clickhouse: ClickHouse, schema: str, backend_env) -> dict:
    """Keyword arguments as Meltano passes them to the manager."""
    return {
        "uri": clickhouse.uri(),
        "schema": schema,
        "allow_loopback": clickhouse.loopback,
        "lock_timeout_seconds": 10,
        "lock_retry_seconds": 1,
    }


@dataclass
class Project:
    """A Meltano project in a temporary directory, its state in this test's schema."""

    path: Path
    env: dict[str, str]

    def meltano(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
    ):
        result = subprocess.run(
            [str(MELTANO), *args],
            cwd=self.path,
            env={**self.env, **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"meltano {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
            )
        return result


@pytest.fixture
def project(tmp_path: Path, backend_env: dict[str, str]) -> Project:
    env = {**os.environ, **backend_env}
    subprocess.run(
        [str(MELTANO), "init", "project", "--no-usage-stats"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return Project(path=tmp_path / "project", env=env)
