"""Meltano's ``StateStoreManager`` for ``clickhouse://`` URIs, delegating to the component.

``update`` (one per STATE message) is the component's own ``update``, one call that takes the
lock, reads, merges as Meltano does, writes under the lock's token and releases (see
:meth:`ClickHouseStateStoreManager.update` for the two cases that keep Meltano's way). Meltano's
``clear`` runs unchanged: it takes :meth:`acquire_lock` and calls
:meth:`delete` inside it. While this manager holds the lock of an id, ``set`` and ``delete`` of
that id go to the component as fenced writes under the lock's token, so a holder that lost its
lock cannot overwrite newer state.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import typing as t
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from meltano.core.error import MeltanoConfigurationError
from meltano.core.state_store.base import MeltanoState, StateIDLockedError, StateStoreManager

from meltano_clickhouse_state import conflict, run_context, settings
from meltano_clickhouse_state.bridge import BackendError, Bridge, HostConfig, host_log_level
from meltano_clickhouse_state.errors_table import ERRORS
from meltano_clickhouse_state.settings import env_var, meltano_name

if t.TYPE_CHECKING:
    from meltano_clickhouse_state.embedded import Embedded

logger = logging.getLogger(__name__)


_Host = t.TypeVar("_Host", bound="Bridge | Embedded")


_identifying = threading.Lock()


def _identified(bridge: _Host) -> _Host:
    """``bridge``, its host told who this process is (once per host: Meltano's command, its run
    id, this machine and process), so that the history and the lock's holder name them. Who
    wrote never fails Meltano's call: a host that cannot be told (an older executable) is
    logged and used as it is."""
    with _identifying:
        if bridge.identified:
            return bridge
        bridge.identified = True
        try:
            caller = run_context.current()
            bridge.call(
                "identify",
                run_id=caller.run_id or "",
                command=caller.command,
                host=caller.host,
                pid=caller.pid,
                meltano_version=caller.meltano_version or "",
            )
        except Exception as e:  # noqa: BLE001 - who wrote is best effort, never the call's fate
            logger.debug("the state-backend host was not told who this process is: %s", e)
    return bridge


class StateLockedError(StateIDLockedError, BackendError):
    """The lock of a state id stayed held by another process past the lock timeout, or another
    run of the pipeline holds it (a run is refused at once)."""


#: The state ids a run in this process holds (across hosts: a host that died held them).
_RUN_HELD: set[str] = set()


def _when(ms: t.Any) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(int(ms) / 1000, tz=datetime.timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _holder_is_run(lock: dict[str, t.Any] | None) -> bool:
    who = (lock or {}).get("who") or {}
    return who.get("command") in run_context.RUN_COMMANDS and bool(who.get("run_id"))


def run_lock_message(state_id: str, lock: dict[str, t.Any] | None, caller_is_run: bool) -> str:
    """Why a run, or a write from outside it, is refused while a run holds ``state_id``: who
    holds it (command, run id, host, process), since when, and until when if it died."""
    lock = lock or {}
    who = lock.get("who") or {}
    if who:
        holder = (
            f"`meltano {who.get('command') or '?'}` (run id {who.get('run_id') or 'none'}) on "
            f"host {who.get('host') or '?'}, process {who.get('pid') or '?'}"
        )
    else:
        holder = f"{lock.get('owner') or 'another process'} (which did not say who it is)"
    since, until = _when(lock.get("acquired_at_ms")), _when(lock.get("expires_at_ms"))
    if caller_is_run:
        head = f"Another run of the pipeline holds its state {state_id!r}"
        remedy = (
            "This run did not start. Run it again once that run has ended, or with --force to "
            "take the state anyway (that run's later writes are then refused)."
        )
    else:
        head = f"The state {state_id!r} is held by a run of its pipeline"
        remedy = (
            "Nothing was written. Write it once that run has ended, or break the hold with "
            f"`state-backend unlock {state_id}` (that run's later writes are then refused)."
        )
    return (
        f"{head}: {holder}, since {since}. The hold is given back when that run ends, and "
        f"lapses at {until} if it dies (it is renewed while the run lives). {remedy}"
    )


class StateBackendConfigurationError(MeltanoConfigurationError):
    """The ClickHouse state backend's settings are wrong; ``setting`` is Meltano's name of the
    one at fault, where known."""

    def __init__(self, reason: str, setting: str | None = None):
        self.setting = setting
        if setting is None:
            instruction = "Check the state_backend.clickhouse.* settings and state_backend.uri"
        elif setting == "state_backend.uri":
            instruction = (
                "Check state_backend.uri (MELTANO_STATE_BACKEND_URI), "
                "e.g. clickhouse://user:password@host:8123/default"
            )
        else:
            instruction = f"Check the setting {setting} ({env_var(setting.rsplit('.', 1)[-1])})"
            if setting.endswith((".user", ".database", ".host", ".port", ".password")):
                instruction += " or state_backend.uri"
        super().__init__(reason, instruction)


#: The exception each kind of error raises, by (kind, reason), from the host's table.
_EXCEPTIONS = {(kind, reason): raises for kind, reason, _, raises in ERRORS}


def _is_mine(lock: dict[str, t.Any] | None, caller: run_context.Caller) -> bool:
    """Whether the holder named by ``lock`` is this very run (a host of it that died): its run
    id, host and process."""
    who = (lock or {}).get("who") or {}
    return (
        bool(caller.run_id)
        and who.get("run_id") == caller.run_id
        and who.get("pid") == caller.pid
        and who.get("host") == caller.host
    )


def _error(error: BackendError) -> Exception:
    raises = _EXCEPTIONS.get((error.kind, error.reason), "backend")
    if raises == "configuration":
        setting = meltano_name(error.setting) if error.setting else None
        return StateBackendConfigurationError(f"ClickHouse state backend: {error.message}", setting)
    if raises == "locked":
        message = error.message
        if _holder_is_run(error.lock):
            state_id = (error.lock or {}).get("state_id", "")
            message = run_lock_message(state_id, error.lock, caller_is_run=False)
        return StateLockedError(error.kind, message, error.lock)
    if error.reason == "address-refused":
        # The sandbox refused a special address; a ClickHouse on this machine is loopback.
        return BackendError(
            error.kind,
            f"{error.message} (to reach a ClickHouse on this machine, set "
            "state_backend.clickhouse.allow_loopback to true, or "
            "MELTANO_STATE_BACKEND_CLICKHOUSE_ALLOW_LOOPBACK=true; private networks are "
            "refused while state_backend.clickhouse.refuse_private is true)",
            reason=error.reason,
        )
    return error


def _to_setting(value: t.Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _json_part(value: str | None, state_id: str) -> dict[str, t.Any]:
    if not value:
        return {}
    try:
        return json.loads(value)
    except ValueError:
        raise BackendError("host", f"the stored state of {state_id!r} is not JSON") from None


class ClickHouseStateStoreManager(StateStoreManager):
    """State in ClickHouse, through the sandboxed WebAssembly component."""

    def __init__(
        self,
        uri: str,
        *,
        lock_timeout_seconds: float | None = None,
        lock_retry_seconds: float | None = None,
        **kwargs: t.Any,
    ) -> None:
        # Meltano passes every state_backend.* setting: ours by the host's names.
        ours = {name: kwargs.pop(name) for name in list(kwargs) if name in settings.MELTANO_NAMES}
        super().__init__(**kwargs)
        others = conflict.other_claims()
        if others:
            raise StateBackendConfigurationError(conflict.message(others))
        client_cert, client_key = ours.get("client_cert"), ours.get("client_key")
        if bool(client_cert) != bool(client_key):
            missing = "client_key" if client_cert else "client_cert"
            raise StateBackendConfigurationError(
                "ClickHouse state backend: mutual TLS needs both a client certificate and its key",
                meltano_name(missing),
            )
        overrides = {
            name: value
            for name, value in ours.items()
            if name in settings.COMPONENT and value is not None
        }
        self.config = HostConfig(
            uri=uri,
            settings=tuple((name, _to_setting(value)) for name, value in overrides.items()),
            lock_timeout_seconds=float(
                10 if lock_timeout_seconds is None else lock_timeout_seconds
            ),
            lock_retry_seconds=float(1 if lock_retry_seconds is None else lock_retry_seconds),
            allow_loopback=bool(ours.get("allow_loopback")),
            refuse_private=bool(ours.get("refuse_private")),
            ignore_proxy_env=bool(ours.get("ignore_proxy_env")),
            ca_bundle=ours.get("ca_bundle") or None,
            client_cert=client_cert or None,
            client_key=client_key or None,
            # Meltano's --log-level sets the root logger's; the host logs at the same level.
            log_level=host_log_level(logger.getEffectiveLevel()),
        )
        parts = urlsplit(uri)
        host, port = overrides.get("host"), overrides.get("port")
        where = f"{host or parts.hostname}:{port or parts.port or ''}".rstrip(":")
        self._label = f"ClickHouse state backend (WebAssembly component) at {where}"
        # Starts the host now: a configuration error is Meltano's, raised where Meltano made
        # this manager, naming the setting.
        try:
            self._bridge = _identified(Bridge.shared(self.config))
        except BackendError as e:
            raise _error(e) from None
        # Lock numbers in the host, by state id, for the locks this manager holds.
        self._held: dict[str, int] = {}
        # Who calls (Meltano's command, run id, --force), read once, at the first read or write.
        self._caller: run_context.Caller | None = None

    @property
    def label(self) -> str:
        """Where the state lives, without credentials."""
        return self._label

    def _call(self, method: str, **params: t.Any) -> t.Any:
        # A host that died fails the call in flight; the next one starts a new host, unless
        # this manager holds locks, whose numbers only the dead host knew.
        try:
            if not self._bridge.alive and not self._held:
                self._bridge = _identified(Bridge.shared(self.config))
            return self._bridge.call(method, **params)
        except BackendError as e:
            raise _error(e) from None

    def _hold_for_run(self, state_id: str) -> None:
        """A run (``meltano run``, ``el``, ``elt``) holds ``state_id`` from its first read or
        write until its process ends: the host takes the hold once, and refuses at once while
        another run holds it. The host renews it and gives it back at the end; nothing here
        runs between calls."""
        caller = self._caller or run_context.current()
        if not caller.is_run:
            return  # asked again at the next call: a run binds its run id first thing
        self._caller = caller
        if not self._bridge.alive and not self._held:
            self._bridge = _identified(Bridge.shared(self.config))
        bridge = self._bridge
        if state_id in bridge.run_holds:
            return
        try:
            if state_id in _RUN_HELD:
                # This run held it through a host that died: taken back from that host only.
                # A hold that lapsed or was forced meanwhile may have let another run in.
                holder = bridge.call("lock_info", state_id=state_id)
                if not _is_mine(holder, caller):
                    raise BackendError(
                        "lock-lost",
                        f"this run's hold on {state_id!r} was lost when its state-backend host "
                        "died: another run may have written the state since",
                    )
                logger.warning(
                    "taking back the hold of %r from this run's host that died", state_id
                )
                bridge.call("hold_run", state_id=state_id, force=True)
            else:
                bridge.call("hold_run", state_id=state_id, force=caller.force)
        except BackendError as e:
            if e.kind == "locked":
                message = run_lock_message(state_id, e.lock, caller_is_run=True)
                raise StateLockedError(e.kind, message, e.lock) from None
            raise _error(e) from None
        bridge.run_holds.add(state_id)
        _RUN_HELD.add(state_id)

    @staticmethod
    def _state_params(state: MeltanoState) -> dict[str, str]:
        return {
            "state_id": state.state_id,
            "partial": json.dumps(state.partial_state or {}),
            "completed": json.dumps(state.completed_state or {}),
        }

    @staticmethod
    def _state(value: dict[str, t.Any]) -> MeltanoState:
        state_id = value["state_id"]
        return MeltanoState(
            state_id=state_id,
            partial_state=_json_part(value.get("partial"), state_id),
            completed_state=_json_part(value.get("completed"), state_id),
        )

    def update(self, state: MeltanoState) -> None:  # type: ignore[misc]
        """Meltano's ``update`` (final in the base class, by type hint only) as one call.

        The component does what Meltano's does: under the lock, a partial state is merged into
        the stored one and a complete state replaces both. One bridge call and one query fewer
        than Meltano's four calls. While this manager holds the lock of the id itself, Meltano's
        merge runs under that lock (the component's update would wait for it, Meltano's own would
        try to take it again); a complete state that also carries a partial one takes Meltano's
        path.
        """
        self._hold_for_run(state.state_id)
        if state.state_id in self._held:
            # Under this manager's own lock: Meltano's merge, written under that lock.
            to_write = state
            if not state.is_complete() and (current := self.get(state.state_id)):
                current.merge_partial(state)
                to_write = current
            self.set(to_write)
        elif state.is_complete() and state.partial_state:
            # Meltano writes a complete state's partial part as given, where the component
            # resets it: that rare shape takes Meltano's path.
            super().update(state)
        else:
            self._call("update", **self._state_params(state))

    def set(self, state: MeltanoState) -> None:
        """Overwrites both parts; fenced by the lock's token when this manager holds it."""
        lock = self._held.get(state.state_id)
        if lock is None:
            self._call("set", **self._state_params(state))
        else:
            self._call("set_locked", lock=lock, **self._state_params(state))

    def get(self, state_id: str) -> MeltanoState | None:
        self._hold_for_run(state_id)
        value = self._call("get", state_id=state_id)
        return None if value is None else self._state(value)

    def delete(self, state_id: str) -> None:
        lock = self._held.get(state_id)
        if lock is None:
            self._call("delete", state_id=state_id)
        else:
            self._call("delete_locked", lock=lock)

    def get_state_ids(self, pattern: str | None = None) -> Iterable[str]:
        return self._call("state_ids", pattern=pattern)

    def get_all(self, pattern: str | None = None) -> Iterable[MeltanoState]:
        """All states in one query, not one per id."""
        return [self._state(value) for value in self._call("get_all", pattern=pattern)]

    def set_all(self, states: Iterable[MeltanoState]) -> int:
        """All states in one insert."""
        return int(self._call("set_all", states=[self._state_params(s) for s in states]))

    def clear_all(self) -> int:
        return int(self._call("clear_all"))

    def migrate(self) -> None:
        self._call("migrate")

    @contextmanager
    def acquire_lock(self, state_id: str, *, retry_seconds: float) -> Iterator[None]:
        """The component's lock on ``state_id``.

        The component waits up to ``lock_timeout_seconds``, retrying every
        ``lock_retry_seconds`` (both Meltano settings); ``retry_seconds`` (always 1 in
        Meltano's own calls) is superseded by that setting. Raises ``StateIDLockedError`` naming
        the holder when the timeout passes.
        """
        del retry_seconds
        if state_id in self._held:
            raise BackendError(
                "invalid-input", f"this manager already holds the lock on {state_id!r}"
            )
        lock = self._call("acquire_lock", state_id=state_id)["lock"]
        self._held[state_id] = lock
        try:
            yield
        except BaseException:
            del self._held[state_id]
            try:
                self._bridge.call("release", lock=lock)
            except BackendError:
                pass  # the first error is the one to report; the lock expires with its lease
            raise
        del self._held[state_id]
        self._call("release", lock=lock)

    def close(self) -> None:
        """Releases what this manager still holds; the shared host keeps running."""
        for state_id, lock in list(self._held.items()):
            del self._held[state_id]
            try:
                self._bridge.call("release", lock=lock)
            except BackendError:
                pass  # the lock expires with its lease
