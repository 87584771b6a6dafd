"""The host inside Meltano's process: the host library built with its ``embedded`` feature
(``host/src/embedded/``), loaded with ctypes, speaking the protocol of ``state-backend serve``
through a function call instead of a pipe.

Why: a call through the child process pays a pipe round trip and the wake-up of another process
each way, about 0.1 ms, which was most of what a call added to ClickHouse's own time. In the
process, a call runs on the calling thread, and wakes no other. The component is as sandboxed as
in the child: the library is wasmtime and the same host.

What it gives up against the child process: a crash of the host (not of the component, whose
traps are errors) would be Meltano's; and the locks it keeps are given back when Meltano exits
cleanly (Ctrl-C included), while a SIGTERM to Meltano, like a SIGKILL, leaves them to lapse at
the end of their lease. ``STATE_BACKEND_IN_PROCESS=0`` runs the host as a child process instead.

The library's ABI is described in ``host/src/embedded/mod.rs``. ctypes releases the GIL for
each call, so other Python threads run while a call waits on ClickHouse.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import sys
import threading
import typing as t
import weakref
from pathlib import Path

from meltano_clickhouse_state.bridge import (
    _REPLY_GRACE_SECONDS,
    COMPONENT_ENV,
    BackendError,
    HostConfig,
    OutOfTurn,
    find_component,
    first_line,
    relay_log_line,
    request_line,
    result_of,
)

#: Names the embedded host library to load, instead of the one the wheel installed.
LIBRARY_ENV = "STATE_BACKEND_LIBRARY"
#: ``0`` runs the host as a child process even where the library is installed.
IN_PROCESS_ENV = "STATE_BACKEND_IN_PROCESS"

_PACKAGE_DIR = Path(__file__).resolve().parent
#: ``sb_call``'s statuses besides 0 (``host/src/embedded/mod.rs``).
_GONE, _HUNG = 1, 2


def library_name(platform: str = sys.platform) -> str:
    """The library's file name on `platform` (a ``sys.platform`` value), as cargo names it."""
    if platform == "win32":
        return "state_host.dll"
    if platform == "darwin":
        return "libstate_host.dylib"
    return "libstate_host.so"


def find_library(package_dir: Path | None = None) -> Path | None:
    """The library to run the host in this process: $STATE_BACKEND_LIBRARY, else the one the
    wheel installed in this package; ``None`` when there is none, or when
    $STATE_BACKEND_IN_PROCESS is ``0``."""
    if os.environ.get(IN_PROCESS_ENV, "").strip() == "0":
        return None
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise BackendError("host", f"{LIBRARY_ENV} names {path}, which is not a file")
        return path
    installed = (_PACKAGE_DIR if package_dir is None else package_dir) / library_name()
    return installed if installed.is_file() else None


class Unloadable(BackendError):
    """The library cannot load here (a system older than the one it was built for, say): the
    bridge runs the host as a child process instead."""

    def __init__(self, message: str):
        super().__init__("host", message)


_OUT = ctypes.POINTER(ctypes.c_ubyte)
#: What the library calls with each line of its log, on whichever thread logged it.
_SINK = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_char), ctypes.c_size_t)


#: A Ctrl-C that arrived while a log line was relayed: a call logs on the calling thread, where
#: Python runs its signal handlers, and an exception cannot cross back into the library (ctypes
#: reports it as unraisable and drops it). Raised again once the library returns.
_interrupted = threading.Event()


def _log_line(text: t.Any, size: int) -> None:
    try:
        relay_log_line(ctypes.string_at(text, size).decode(errors="replace"))
    except KeyboardInterrupt:
        _interrupted.set()
    except Exception:  # noqa: BLE001 (nothing may raise into the library's thread)
        pass


_previous_unraisable_hook = sys.unraisablehook


def _unraisable(unraisable: t.Any) -> None:
    """From Python 3.11 a signal's exception can be raised at the callback's first instruction,
    before its ``try``; ctypes then reports it here. A Ctrl-C there is kept for later."""
    from_callback = unraisable.object is _log_line or "ctypes callback" in (
        unraisable.err_msg or ""
    )
    if unraisable.exc_type is KeyboardInterrupt and from_callback:
        _interrupted.set()
        return
    _previous_unraisable_hook(unraisable)


sys.unraisablehook = _unraisable


def _reraise_interrupt() -> None:
    """Raises the Ctrl-C a log line's relay caught, on the thread Python delivers it to."""
    if _interrupted.is_set() and threading.current_thread() is threading.main_thread():
        _interrupted.clear()
        raise KeyboardInterrupt


#: Kept alive while the library may call it.
_LOG_SINK = _SINK(_log_line)
_loaded: dict[Path, ctypes.CDLL] = {}
#: The open instances, forgotten in a forked child (see :func:`_after_fork`).
_instances: weakref.WeakSet[Embedded] = weakref.WeakSet()
_loaded_lock = threading.Lock()


def _load(path: Path) -> ctypes.CDLL:
    with _loaded_lock:
        lib = _loaded.get(path)
        if lib is None:
            try:
                lib = ctypes.CDLL(str(path))
                _declare(lib)
            except (OSError, AttributeError) as e:
                # AttributeError: a library without the ABI (built without `embedded`).
                raise Unloadable(f"cannot load the host library {path}: {e}") from None
            _loaded[path] = lib
        return lib


def _declare(lib: ctypes.CDLL) -> None:
    """The ABI's signatures (``host/src/embedded/mod.rs``)."""
    size = ctypes.c_size_t
    lib.sb_open.argtypes = [
        ctypes.c_char_p,
        size,
        ctypes.POINTER(_OUT),
        ctypes.POINTER(size),
    ]
    lib.sb_open.restype = ctypes.c_void_p
    lib.sb_call.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        size,
        ctypes.c_uint64,
        ctypes.POINTER(_OUT),
        ctypes.POINTER(size),
    ]
    lib.sb_call.restype = ctypes.c_int
    lib.sb_set_log_sink.argtypes = [_SINK]
    lib.sb_set_log_sink.restype = None
    lib.sb_free.argtypes = [_OUT, size]
    lib.sb_free.restype = None
    lib.sb_close.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
    lib.sb_close.restype = None


def open_config(config: HostConfig) -> bytes:
    """What ``sb_open`` takes for `config`: the settings ``state-backend serve`` gets as flags
    and variables. It holds the URI and the password: it is never logged."""
    settings = [[name, value] for name, value in config.settings]
    settings += [
        ["lock_timeout_seconds", f"{config.lock_timeout_seconds:g}"],
        ["lock_retry_seconds", f"{config.lock_retry_seconds:g}"],
    ]
    component = find_component() or os.environ.get(COMPONENT_ENV) or None
    return json.dumps(
        {
            "uri": config.uri,
            "settings": settings,
            "allow_loopback": config.allow_loopback,
            "refuse_private": config.refuse_private,
            "ignore_proxy_env": config.ignore_proxy_env,
            "ca_bundle": config.ca_bundle,
            "client_cert": config.client_cert,
            "client_key": config.client_key,
            "log": config.log_level,
            "component": str(component) if component else None,
        }
    ).encode()


class Embedded:
    """One host instance in this process; calls are serialised (one request, one answer). The
    same interface as :class:`~meltano_clickhouse_state.bridge.Bridge`."""

    def __init__(self, config: HostConfig, library: Path):
        self.config = config
        self.identified = False  # told who this process is (manager._identified)
        self.run_holds: set[str] = set()  # the ids a run holds through it (manager)
        self._lib = _load(library)
        self._ids = itertools.count(1)
        self._mutex = threading.Lock()
        # The host's log, line by line as it comes, through this package's logger.
        self._lib.sb_set_log_sink(_LOG_SINK)
        out, size = _OUT(), ctypes.c_size_t()
        request = open_config(config)
        handle = self._lib.sb_open(request, len(request), ctypes.byref(out), ctypes.byref(size))
        first = self._take(out, size)
        if not handle:
            first_line(first)  # raises why it did not start
            raise BackendError("host", "the host library did not start and did not say why")
        self._handle: int | None = handle
        self._call_deadline = first_line(first)
        _instances.add(self)
        _reraise_interrupt()  # after the instance is kept, so that it is closed at exit

    @property
    def alive(self) -> bool:
        return self._handle is not None

    @property
    def pid(self) -> int:
        """The process the host runs in: this one."""
        return os.getpid()

    def call(self, method: str, **params: t.Any) -> t.Any:
        """Sends one request and waits for its answer; raises :class:`BackendError`."""
        try:
            return self._call(method, **params)
        finally:
            _reraise_interrupt()

    def _call(self, method: str, **params: t.Any) -> t.Any:
        with self._mutex:
            if self._handle is None:
                raise BackendError("host", f"the state-backend host has ended; not sent: {method}")
            request_id = next(self._ids)
            line = request_line(request_id, method, params).encode()
            timeout_ms = int((self._call_deadline + _REPLY_GRACE_SECONDS) * 1000)
            out, size = _OUT(), ctypes.c_size_t()
            status = self._lib.sb_call(
                self._handle, line, len(line), timeout_ms, ctypes.byref(out), ctypes.byref(size)
            )
            answer = self._take(out, size)
            if status != 0:
                # Freed at once: the host's idle thread is not waited for.
                handle, self._handle = self._handle, None
                self._lib.sb_close(handle, 0)
                what = "did not answer" if status == _HUNG else "ended before it answered"
                raise BackendError("host", f"the state-backend host {what} {method}: {answer}")
            try:
                return result_of(method, request_id, answer)
            except OutOfTurn:
                handle, self._handle = self._handle, None
                self._lib.sb_close(handle, 0)
                raise BackendError(
                    "host", f"the host answered out of turn to {method}; stopped using it"
                ) from None

    def close(self, timeout: float = 10.0) -> None:
        """Ends the instance: it gives back the locks it holds, then closes, within `timeout`
        seconds (a host that takes longer is left to finish, as a child would be killed)."""
        with self._mutex:
            handle, self._handle = self._handle, None
            if handle is not None:
                try:
                    self._lib.sb_close(handle, int(timeout * 1000))
                finally:
                    _reraise_interrupt()

    def _forget(self) -> None:
        """In a forked child: the handle is the parent's, whose thread the child does not have."""
        self._handle = None

    def _take(self, out: t.Any, size: ctypes.c_size_t) -> str:
        if not out:
            return ""
        try:
            return ctypes.string_at(out, size.value).decode(errors="replace")
        finally:
            self._lib.sb_free(out, size)


def stop_logging() -> None:
    """The library's log goes to stderr from now on: at the interpreter's exit, after the
    hosts have closed, nothing may call into Python any more."""
    with _loaded_lock:
        for lib in _loaded.values():
            lib.sb_set_log_sink(_SINK())


def _after_fork() -> None:
    """A forked child has none of the hosts' threads: its handles are dropped, not closed (a
    close would wait for a thread that is not there), and its next call starts a host of its
    own."""
    _interrupted.clear()
    for instance in list(_instances):
        instance._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
