"""The bridge to the component: the host, asked in JSON lines (the protocol of
``state-backend serve``), one host per configuration per Meltano process.

Where the wheel installed the host as a library, the host runs in Meltano's process
(:mod:`.embedded`): a call then costs no pipe round trip and no wake-up of another process.
Elsewhere, or with ``STATE_BACKEND_IN_PROCESS=0``, or where the library cannot load, it runs as
a child process, ``state-backend serve --stdio`` (:class:`Bridge`): a crash in it cannot take
Meltano down, and it gives back the locks it keeps when Meltano dies of a SIGTERM (it sees its
input end). Either way it starts once per configuration and lives until the interpreter exits.

Start-up: the host's first line says it is ready, or why it cannot start and which setting that
is about; the bridge waits for it, so a bad configuration fails where the manager is made.

Secrets: the URI and the password reach the child in its environment, never on its command
line (which any local user can read), and nothing here prints them. Other settings are
``--setting`` arguments.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import sysconfig
import threading
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

if t.TYPE_CHECKING:
    from meltano_clickhouse_state.embedded import Embedded

logger = logging.getLogger(__name__)
host_logger = logging.getLogger(f"{__name__}.host")

#: Overrides where the host executable is.
BIN_ENV = "STATE_BACKEND_BIN"


def executable_name(platform: str = sys.platform) -> str:
    """The host executable's file name on `platform` (a ``sys.platform`` value)."""
    return "state-backend.exe" if platform == "win32" else "state-backend"


EXECUTABLE = executable_name()
#: Names the component the host loads (the host's own variable).
COMPONENT_ENV = "STATE_BACKEND_COMPONENT"
#: The component, installed inside this package by the wheel.
COMPONENT_FILE = "clickhouse_state.wasm"
#: The variables the host reads settings from: set from Meltano's settings only, never inherited.
_INHERITED_NOT = frozenset(
    {
        "CLICKHOUSE_HOST",
        "CLICKHOUSE_PORT",
        "CLICKHOUSE_DATABASE",
        "CLICKHOUSE_USER",
        "CLICKHOUSE_PASSWORD",
        "CLICKHOUSE_SECURE",
        "CLICKHOUSE_SCHEMA",
        "CLICKHOUSE_TABLE",
        "CLICKHOUSE_CA_BUNDLE",
        "CLICKHOUSE_CLIENT_CERT",
        "CLICKHOUSE_CLIENT_KEY",
        "STATE_BACKEND_ALLOW_LOOPBACK",
        "STATE_BACKEND_REFUSE_PRIVATE",
        "STATE_BACKEND_IGNORE_PROXY_ENV",
    }
)
_URI_VAR = "MELTANO_STATE_BACKEND_URI"
#: Meltano's own variables for our settings, which the CLI reads when run beside Meltano: here
#: Meltano has resolved them already, and the host gets the result as flags and settings.
_MELTANO_PREFIX = "MELTANO_STATE_BACKEND_CLICKHOUSE_"
_PASSWORD_VAR = "CLICKHOUSE_PASSWORD"
#: How long the host may take to start: loading the component compiles it on first use.
_START_SECONDS = 300.0
#: A line of the host's log: time, level, the rest.
_LOG_LINE = re.compile(r"^\S+\s+(TRACE|DEBUG|INFO|WARN|ERROR)\s+(.*)$")
_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARN": logging.WARNING,
    "ERROR": logging.ERROR,
}


def host_log_level(level: int) -> str:
    """The host's ``--log`` value for a Python logging level."""
    if level <= logging.DEBUG:
        return "debug"
    if level <= logging.INFO:
        return "info"
    if level <= logging.WARNING:
        return "warn"
    return "error"


#: How long past its own per-call deadline (which it says when ready) the host may take to
#: answer before it is considered hung and stopped.
_REPLY_GRACE_SECONDS = 90.0
_EOF = object()

#: The host runs in a session (on Windows, a process group) of its own. A Ctrl-C in the
#: terminal, or a signal to Meltano's process group, then reaches Meltano alone, whose clean-up
#: can still release its locks through the host; when Meltano exits, or is killed with its
#: whole group, the host sees its input end, gives back the locks it keeps and exits. Sent to the
#: host itself, SIGINT and SIGTERM do the same.
_OWN_SESSION: dict[str, t.Any] = (
    {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    if os.name == "nt"
    else {"start_new_session": True}
)


class BackendError(Exception):
    """An operation failed; ``kind`` is the contract's error case (``locked``, ``unreachable``,
    ``unauthorized``, ``invalid-input``, ...) or ``host`` when the host process itself failed."""

    def __init__(
        self,
        kind: str,
        message: str,
        lock: dict[str, t.Any] | None = None,
        setting: str | None = None,
        reason: str | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.lock = lock
        #: The host's name of the setting a configuration error is about (``uri`` for the URI).
        self.setting = setting
        #: Why, where the host knows more than the kind: ``address-refused`` when its egress
        #: policy refused the address.
        self.reason = reason


class OutOfTurn(Exception):
    """An answer to another request than the one in hand."""


class NotAFirstLine(BackendError):
    """A host's first line that neither says it is ready nor why it is not."""

    def __init__(self, message: str):
        super().__init__("host", message)


def request_line(request_id: int, method: str, params: dict[str, t.Any]) -> str:
    """One request of the host's protocol (``state-backend serve``), without its newline."""
    return json.dumps({"id": request_id, "method": method, "params": params})


def result_of(method: str, request_id: int, answer: str | bytes) -> t.Any:
    """The result in the host's answer to request ``request_id``; raises :class:`BackendError`
    for an error it answered, :class:`OutOfTurn` for an answer to another request."""
    try:
        reply = json.loads(answer)
    except ValueError:
        raise BackendError("host", f"the host answered {method} with non-JSON") from None
    if reply.get("id") != request_id:
        raise OutOfTurn
    if "error" in reply:
        error = reply["error"] or {}
        raise BackendError(
            error.get("kind", "unknown"),
            error.get("message", "unknown error"),
            error.get("lock"),
            reason=error.get("reason"),
        )
    return reply.get("result")


def first_line(line: str | bytes) -> float:
    """The call deadline (seconds) a host's first line says it is ready with; raises
    :class:`BackendError` when the line says why it could not start, or is not a ready line."""
    try:
        parsed = json.loads(line)
    except ValueError:
        raise NotAFirstLine("the host started with a line that is not JSON") from None
    if "ready" in parsed:
        try:
            return float(parsed["ready"]["call_deadline_ms"]) / 1000
        except (KeyError, TypeError, ValueError):
            raise NotAFirstLine("the host did not say its call deadline when ready") from None
    error = parsed.get("error") or {}
    raise BackendError(
        error.get("kind", "host"),
        error.get("message", "the host could not start"),
        setting=error.get("setting"),
    )


def relay_log_line(line: str) -> None:
    """One line of the host's log, through this package's logger at its own level."""
    # The host logs at the level it was started with, which follows this logger's.
    parsed = _LOG_LINE.match(line)
    if parsed:
        host_logger.log(_LEVELS[parsed.group(1)], "%s", parsed.group(2))
    else:
        host_logger.warning("%s", line)


#: This package's directory and this environment's scripts directory (where pip installs the
#: wheel's executable).
_PACKAGE_DIR = Path(__file__).resolve().parent
_SCRIPTS_DIR = Path(sysconfig.get_path("scripts"))


def find_executable(package_dir: Path | None = None, scripts_dir: Path | None = None) -> Path:
    """The host executable: $STATE_BACKEND_BIN, the one the wheel installed into this Python's
    scripts directory (``bin/`` in a POSIX venv, ``Scripts\\`` on Windows), a copy bundled in
    this package, or PATH."""
    package_dir = _PACKAGE_DIR if package_dir is None else package_dir
    scripts_dir = _SCRIPTS_DIR if scripts_dir is None else scripts_dir
    explicit = os.environ.get(BIN_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise BackendError("host", f"{BIN_ENV} names {path}, which is not a file")
        return path
    candidates = [scripts_dir / EXECUTABLE, package_dir / "bin" / EXECUTABLE]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    found = shutil.which(EXECUTABLE)
    if found:
        return Path(found)
    raise BackendError(
        "host",
        f"the {EXECUTABLE} host executable was not found: it is not in this Python's scripts "
        f"directory ({candidates[0].parent}) nor on PATH. Install the platform wheel "
        f"(`pip install meltano-state-backend-clickhouse-wasm`), or set {BIN_ENV}",
    )


def find_component(package_dir: Path | None = None) -> Path | None:
    """The component the wheel installed inside this package, if any (else the host finds its
    own: $STATE_BACKEND_COMPONENT, or beside its executable)."""
    if os.environ.get(COMPONENT_ENV):
        return None
    installed = (_PACKAGE_DIR if package_dir is None else package_dir) / COMPONENT_FILE
    return installed if installed.is_file() else None


@dataclass(frozen=True)
class HostConfig:
    """How to start a host: what it connects to and with which settings.

    Equal configurations share one process. ``repr`` never shows the URI or the password.
    """

    uri: str = field(repr=False)
    #: The host's settings (``-s name=value``); a ``password`` among them goes in the
    #: environment instead.
    settings: tuple[tuple[str, str], ...] = field(repr=False, default=())
    lock_timeout_seconds: float = 10.0
    lock_retry_seconds: float = 1.0
    allow_loopback: bool = False
    refuse_private: bool = False
    #: Connect directly, whatever HTTPS_PROXY and the like say (the host honours them).
    ignore_proxy_env: bool = False
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    #: The host's ``--log`` level (see :func:`host_log_level`).
    log_level: str = "warn"
    executable: Path | None = None

    def command(self, executable: Path) -> list[str]:
        command = [str(executable), "--log", self.log_level]
        if self.allow_loopback:
            command.append("--allow-loopback")
        if self.refuse_private:
            command.append("--refuse-private")
        if self.ignore_proxy_env:
            command.append("--ignore-proxy-env")
        for flag, path in [
            ("--ca-bundle", self.ca_bundle),
            ("--client-cert", self.client_cert),
            ("--client-key", self.client_key),
        ]:
            if path:
                command += [flag, path]
        for name, value in self.settings:
            if name != "password":
                command += ["-s", f"{name}={value}"]
        command += [
            "-s",
            f"lock_timeout_seconds={self.lock_timeout_seconds:g}",
            "-s",
            f"lock_retry_seconds={self.lock_retry_seconds:g}",
            "serve",
            "--stdio",
        ]
        return command

    def environment(self) -> dict[str, str]:
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in _INHERITED_NOT
            and name != _URI_VAR
            and not name.startswith(_MELTANO_PREFIX)
        }
        env[_URI_VAR] = self.uri
        for name, value in self.settings:
            if name == "password":
                env[_PASSWORD_VAR] = value
        component = find_component()
        if component is not None:
            env[COMPONENT_ENV] = str(component)
        return env


class Bridge:
    """One host process; calls are serialised (one request, one answer)."""

    _shared: t.ClassVar[dict[HostConfig, Bridge | Embedded]] = {}
    _shared_lock: t.ClassVar = threading.Lock()

    def __init__(self, config: HostConfig):
        self.config = config
        self.identified = False  # told who this process is (manager._identified)
        self.run_holds: set[str] = set()  # the ids a run holds through it (manager)
        self._ids = itertools.count(1)
        self._mutex = threading.Lock()
        self._lines: queue.Queue[t.Any] = queue.Queue()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._stderr_done = threading.Event()
        self._call_deadline = 0.0  # said by the host when ready
        executable = config.executable or find_executable()
        try:
            self._process = subprocess.Popen(
                config.command(executable),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=config.environment(),
                **_OWN_SESSION,
            )
        except OSError as e:
            raise BackendError("host", f"cannot start {executable}: {e.strerror or e}") from None
        threading.Thread(target=self._read_answers, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._wait_until_ready()
        logger.debug("started the state-backend host (pid %d)", self._process.pid)

    def _wait_until_ready(self) -> None:
        """Reads the host's first line: ready, or why it cannot start (then it has exited)."""
        try:
            first = self._lines.get(timeout=_START_SECONDS)
        except queue.Empty:
            self._process.kill()
            raise BackendError(
                "host", f"the state-backend host did not start within {_START_SECONDS:g} s"
            ) from None
        if first is _EOF:
            raise self._exited("it was ready")
        try:
            self._call_deadline = first_line(first)
        except NotAFirstLine:
            self._process.kill()
            raise
        except BackendError:
            try:
                self._process.wait(timeout=10)  # it exits after saying why
            except subprocess.TimeoutExpired:
                self._process.kill()
            raise

    @classmethod
    def shared(cls, config: HostConfig) -> Bridge | Embedded:
        """The running host for ``config``, started on first use or after it died: in this
        process where the embedded host library is installed (:mod:`.embedded`), else a
        child process."""
        from meltano_clickhouse_state.embedded import Embedded, Unloadable, find_library

        with cls._shared_lock:
            bridge = cls._shared.get(config)
            if bridge is None or not bridge.alive:
                if bridge is not None:
                    logger.warning("the state-backend host had exited; starting a new one")
                bridge = None
                library = None if config.executable else find_library()
                if library is not None:
                    try:
                        bridge = Embedded(config, library)
                    except Unloadable as e:
                        logger.info("%s; running the host as a child process", e)
                bridge = bridge or cls(config)
                cls._shared[config] = bridge
            return bridge

    @classmethod
    def close_all(cls) -> None:
        with cls._shared_lock:
            bridges = list(cls._shared.values())
            cls._shared.clear()
        try:
            for bridge in bridges:
                bridge.close()
        finally:
            if "meltano_clickhouse_state.embedded" in sys.modules:
                sys.modules["meltano_clickhouse_state.embedded"].stop_logging()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    @property
    def pid(self) -> int:
        return self._process.pid

    def call(self, method: str, **params: t.Any) -> t.Any:
        """Sends one request and waits for its answer; raises :class:`BackendError`."""
        with self._mutex:
            if not self.alive:
                raise self._exited(f"answering {method}")
            request_id = next(self._ids)
            line = request_line(request_id, method, params) + "\n"
            try:
                assert self._process.stdin is not None
                self._process.stdin.write(line.encode())
                self._process.stdin.flush()
            except (BrokenPipeError, ValueError):
                raise self._exited(f"answering {method}") from None
            timeout = self._call_deadline + _REPLY_GRACE_SECONDS
            try:
                answer = self._lines.get(timeout=timeout)
            except queue.Empty:
                self._process.kill()
                raise BackendError(
                    "host",
                    f"the state-backend host did not answer {method} within {timeout:g} s "
                    f"and was stopped",
                ) from None
            if answer is _EOF:
                raise self._exited(f"answering {method}")
            try:
                return result_of(method, request_id, answer)
            except OutOfTurn:
                self._process.kill()
                raise BackendError(
                    "host", f"the host answered out of turn to {method}; stopped it"
                ) from None

    def close(self, timeout: float = 10.0) -> None:
        """Ends the process: closing its input makes it release held locks and exit."""
        if self._process.stdin and not self._process.stdin.closed:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _exited(self, before: str) -> BackendError:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._stderr_done.wait(timeout=2)
        said = " | ".join(self._stderr_tail) or "nothing on stderr"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return BackendError("host", f"the state-backend host {how} before {before}: {said}")

    def _read_answers(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(_EOF)

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            line = raw.decode(errors="replace").rstrip()
            if line:
                self._stderr_tail.append(line)
                relay_log_line(line)
        self._stderr_done.set()


atexit.register(Bridge.close_all)
