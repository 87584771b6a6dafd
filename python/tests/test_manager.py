"""The adapter as Meltano sees it: a StateStoreManager loaded through Meltano's entry point.

Meltano's own final `update` and `clear` are what run here; only get/set/delete/lock are ours.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from meltano.core.error import MeltanoConfigurationError
from meltano.core.state_store import MeltanoState, StateBackend
from meltano.core.state_store.base import StateIDLockedError
from meltano_clickhouse_state import BackendError, ClickHouseStateStoreManager, settings
from meltano_clickhouse_state.bridge import Bridge

from conftest import INSTALLED, ROOT, in_process

WORKER = Path(__file__).with_name("lock_worker.py")


def make(**kwargs):
    return StateBackend.get_manager_factory(scheme="clickhouse")(**kwargs)


@pytest.fixture
def manager(manager_kwargs):
    with make(**manager_kwargs) as manager:
        yield manager


def test_meltano_finds_the_backend_and_its_settings():
    assert StateBackend.get_manager_factory(scheme="clickhouse") is ClickHouseStateStoreManager
    from meltano.core.config_service import ConfigService

    names = {s.name: s for s in ConfigService.addon.get_all()}
    for key in ["host", "port", "database", "user", "password", "secure", "schema", "table"]:
        assert f"state_backend.clickhouse.{key}" in names
    assert names["state_backend.clickhouse.password"].is_redacted


def test_set_get_delete_round_trip(manager, clickhouse, schema):
    state = MeltanoState("dev:tap-a-to-b", {"p": 1}, {"singer_state": {"bookmarks": {"s": 1}}})
    manager.set(state)
    assert manager.get("dev:tap-a-to-b") == state
    # It is really in ClickHouse, in the configured schema.
    stored = clickhouse.query(f"SELECT completed_state FROM {schema}.state FINAL FORMAT TSVRaw")
    assert json.loads(stored) == state.completed_state
    manager.delete("dev:tap-a-to-b")
    assert manager.get("dev:tap-a-to-b") is None
    assert manager.get("never-set") is None


def test_partial_states_merge_into_the_stored_partial(manager):
    sid = "dev:tap-merge-to-target"
    manager.update(MeltanoState(sid, {}, {"singer_state": {"bookmarks": {"a": {"ts": 1}}}}))
    manager.update(MeltanoState(sid, {"singer_state": {"bookmarks": {"b": {"ts": 2}}}}, {}))
    manager.update(
        MeltanoState(sid, {"singer_state": {"bookmarks": {"b": {"ts": 3}, "c": {"ts": 4}}}}, {})
    )
    state = manager.get(sid)
    assert state.completed_state == {"singer_state": {"bookmarks": {"a": {"ts": 1}}}}
    assert state.partial_state == {"singer_state": {"bookmarks": {"b": {"ts": 3}, "c": {"ts": 4}}}}
    # What a tap gets: the partial overlaid on the completed.
    assert json.loads(state.json_merged()) == {
        "singer_state": {"bookmarks": {"a": {"ts": 1}, "b": {"ts": 3}, "c": {"ts": 4}}}
    }


def test_a_complete_state_resets_the_partial(manager):
    sid = "dev:tap-reset-to-target"
    manager.update(MeltanoState(sid, {"singer_state": {"bookmarks": {"b": 2}}}, {}))
    manager.update(MeltanoState(sid, {}, {"singer_state": {"bookmarks": {"a": 9}}}))
    state = manager.get(sid)
    assert state.partial_state == {}
    assert state.completed_state == {"singer_state": {"bookmarks": {"a": 9}}}


def test_update_is_one_call_to_the_component(manager, monkeypatch):
    calls: list[str] = []
    send = manager._bridge.call

    def counted(method, **params):
        calls.append(method)
        return send(method, **params)

    monkeypatch.setattr(manager._bridge, "call", counted)
    sid = "dev:one-call"
    manager.update(MeltanoState(sid, {"singer_state": {"bookmarks": {"a": 1}}}, {}))
    manager.update(MeltanoState(sid, {"singer_state": {"bookmarks": {"b": 2}}}, {}))
    assert calls == ["update", "update"]
    assert manager.get(sid).partial_state == {"singer_state": {"bookmarks": {"a": 1, "b": 2}}}
    # While this manager holds the lock itself, Meltano's own update runs under it (the
    # component's would wait for that lock), its write fenced by the lock's token.
    calls.clear()
    with manager.acquire_lock(sid, retry_seconds=1):
        manager.update(MeltanoState(sid, {"singer_state": {"bookmarks": {"c": 3}}}, {}))
    assert "update" not in calls and "set_locked" in calls
    assert manager.get(sid).partial_state["singer_state"]["bookmarks"] == {"a": 1, "b": 2, "c": 3}
    # A complete state carrying a partial one keeps Meltano's meaning: both parts as given.
    manager.update(MeltanoState(sid, {"p": 1}, {"singer_state": {"done": True}}))
    assert manager.get(sid) == MeltanoState(sid, {"p": 1}, {"singer_state": {"done": True}})


def test_clear_bulk_and_patterns(manager):
    ids = ["dev:tap_a-to-x", "dev:tapXa-to-x", "dev:tap%b-to-x", "prod:tap-a-to-x", "dev:ünï'\"\\"]
    written = manager.set_all(MeltanoState(i, {}, {"singer_state": {"id": i}}) for i in ids)
    assert written == len(ids)
    assert sorted(manager.get_state_ids()) == sorted(ids)
    # `_` and `%` are literal in a glob; `?` is one character.
    assert list(manager.get_state_ids("dev:tap_a-*")) == ["dev:tap_a-to-x"]
    assert sorted(manager.get_state_ids("dev:tap?a-*")) == ["dev:tapXa-to-x", "dev:tap_a-to-x"]
    assert sorted(s.state_id for s in manager.get_all("prod:*")) == ["prod:tap-a-to-x"]
    assert manager.get("dev:ünï'\"\\").completed_state == {"singer_state": {"id": "dev:ünï'\"\\"}}
    manager.clear("dev:tap%b-to-x")
    assert "dev:tap%b-to-x" not in manager.get_state_ids()
    assert manager.clear_all() == len(ids) - 1
    assert list(manager.get_state_ids()) == []


def test_bad_input_is_refused_and_writes_nothing(manager):
    with pytest.raises(BackendError) as refused:
        manager.set(MeltanoState("", {}, {"singer_state": {}}))
    assert refused.value.kind == "invalid-input"
    assert list(manager.get_state_ids()) == []


def _worker(manager_kwargs, *args: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    process.stdin.write(json.dumps(manager_kwargs) + "\n")
    process.stdin.flush()
    return process


def test_locks_exclude_each_other_across_two_meltano_processes(manager_kwargs, manager):
    sid = "dev:contended"
    rounds = 12
    kwargs = {**manager_kwargs, "lock_timeout_seconds": 60, "lock_retry_seconds": 0.05}
    workers = [_worker(kwargs, "increment", sid, str(rounds)) for _ in range(2)]
    # Both loaded before either starts: they contend, rather than run one after the other.
    for worker in workers:
        assert any(line.strip() == "ready" for line in worker.stdout), "a worker did not start"
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    began, sections = [], []
    for worker in workers:
        out, _ = worker.communicate(timeout=300)
        assert worker.returncode == 0
        run = json.loads(out.strip().splitlines()[-1])
        began.append(run["began"])
        sections.append(run["sections"])
    # Lost increments: every read-modify-write happened under the lock, so none is lost.
    final = manager.get(sid).completed_state["count"]
    lost = 2 * rounds - final
    # Overlapping critical sections across the two processes.
    overlaps = sum(1 for a0, a1 in sections[0] for b0, b1 in sections[1] if a0 < b1 and b0 < a1)
    # They did contend: each was asking for the lock before the other's last section ended.
    # (Who gets it when is not fair: the holder often takes it again at once; see the count.)
    order = sorted((start, who) for who, spans in enumerate(sections) for start, _ in spans)
    handoffs = sum(1 for (_, a), (_, b) in itertools.pairwise(order) if a != b)
    print(
        f"lock across processes: {2 * rounds} sections, {lost} lost, {overlaps} overlapping, "
        f"{handoffs} hand-offs between the processes"
    )
    assert (lost, overlaps) == (0, 0)
    for me, other in [(0, 1), (1, 0)]:
        last_end = max(end for _, end in sections[other])
        assert began[me] < last_end, f"worker {me} began after worker {other} was done"


def test_the_lock_timeout_gives_meltano_a_locked_error_naming_the_holder(manager_kwargs):
    sid = "dev:held-elsewhere"
    holder = _worker(manager_kwargs, "hold", sid)
    try:
        # Meltano logs on stdout too; wait for the worker's own line.
        for line in holder.stdout:
            if line.strip() == "held":
                break
        else:
            pytest.fail("the holder exited without taking the lock")
        with make(**{**manager_kwargs, "lock_timeout_seconds": 1}) as waiter:
            started = time.monotonic()
            with pytest.raises(StateIDLockedError) as locked:
                waiter.update(MeltanoState(sid, {}, {"singer_state": {"late": True}}))
            waited = time.monotonic() - started
            assert 1.0 <= waited < 10, waited
            assert "locked by" in str(locked.value)
            assert locked.value.lock["owner"] in str(locked.value)
            assert waiter.get(sid) is None, "nothing was written"
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    # Released: the same update goes through.
    with make(**manager_kwargs) as after:
        after.update(MeltanoState(sid, {}, {"singer_state": {"late": True}}))
        assert after.get(sid).completed_state == {"singer_state": {"late": True}}


def test_a_writer_whose_lock_was_broken_cannot_overwrite(manager, manager_kwargs):
    sid = "dev:broken-lock"
    with manager.acquire_lock(sid, retry_seconds=1):
        manager.set(MeltanoState(sid, {}, {"singer_state": {"v": 1}}))
        with make(**manager_kwargs) as operator:
            assert operator._call("force_unlock", state_id=sid) is True
            operator.update(MeltanoState(sid, {}, {"singer_state": {"v": 2}}))
        with pytest.raises(BackendError) as lost:
            manager.set(MeltanoState(sid, {}, {"singer_state": {"v": "stale"}}))
        assert lost.value.kind == "lock-lost"
    assert manager.get(sid).completed_state == {"singer_state": {"v": 2}}


def test_a_crashed_host_gives_a_clear_error_and_the_next_call_recovers(child_process, manager):
    manager.set(MeltanoState("dev:crash", {}, {"singer_state": {"v": 1}}))
    # Killed while this manager holds a lock, whose number only that host knew: an error.
    assert manager._bridge.pid != os.getpid(), "the host is not a child process"
    with pytest.raises(BackendError) as crashed:
        with manager.acquire_lock("dev:crash", retry_seconds=1):
            os.kill(manager._bridge.pid, signal.SIGKILL)
            manager._bridge._process.wait(timeout=10)
            started = time.monotonic()
            manager.get("dev:crash")
    assert time.monotonic() - started < 10
    assert crashed.value.kind == "host"
    assert "killed by signal 9" in str(crashed.value)
    # The next operation starts a new host.
    assert manager.get("dev:crash").completed_state == {"singer_state": {"v": 1}}
    # Killed while idle: the next operation starts a new host at once.
    os.kill(manager._bridge.pid, signal.SIGKILL)
    manager._bridge._process.wait(timeout=10)
    assert manager.get("dev:crash").completed_state == {"singer_state": {"v": 1}}


def test_a_missing_host_gives_a_clear_error(child_process, manager_kwargs, monkeypatch):
    monkeypatch.setenv("STATE_BACKEND_BIN", "/nonexistent/state-backend")
    with pytest.raises(BackendError, match="STATE_BACKEND_BIN names /nonexistent/state-backend"):
        make(**{**manager_kwargs, "table": "other"})


def test_a_bad_uri_is_meltanos_configuration_error_where_the_manager_is_made(manager_kwargs):
    uri = "clickhouse://default:s3cret@127.0.0.1:8123/db?secure=maybe"
    with pytest.raises(MeltanoConfigurationError) as failed:
        make(**{**manager_kwargs, "uri": uri})
    assert failed.value.setting == "state_backend.uri"
    assert "'secure' must be true or false" in str(failed.value)
    assert "MELTANO_STATE_BACKEND_URI" in str(failed.value)
    assert "s3cret" not in str(failed.value)


# A value the host refuses for each setting, given as Meltano gives it.
BAD_VALUES = {
    "host": "",
    "port": 70000,
    "database": "",
    "user": "",
    "secure": "maybe",
    "schema": "not-a-name",
    "table": "x;y",
    "cluster": "two words",
    "lock_mode": "sometimes",
    "lock_lease_seconds": 0,
    "lock_settle_seconds": -1,
    "lock_linger_seconds": "soon",
    "retry_budget_seconds": "soon",
    "retries": 1001,
    "retry_backoff_seconds": "soon",
    "ca_bundle": "/nonexistent/ca.pem",
    "lock_timeout_seconds": -5,
    "lock_retry_seconds": 0,
    "history_days": 3651,
    "history_versions": -1,
}


@pytest.mark.parametrize("setting", sorted(BAD_VALUES))
def test_every_setting_reaches_the_host_and_a_bad_value_names_it(manager_kwargs, setting):
    with pytest.raises(MeltanoConfigurationError) as failed:
        make(**{**manager_kwargs, setting: BAD_VALUES[setting]})
    expected = (
        f"state_backend.{setting}"
        if setting.startswith("lock_") and setting.endswith(("timeout_seconds", "retry_seconds"))
        else f"state_backend.clickhouse.{setting}"
    )
    assert failed.value.setting == expected, str(failed.value)
    assert expected in str(failed.value)
    assert "MELTANO_" + expected.upper().replace(".", "_") in str(failed.value)


def test_every_meltano_setting_of_ours_is_tested_or_cannot_be_wrong():
    from meltano.core.config_service import ConfigService

    ours = {
        s.name.removeprefix("state_backend.clickhouse.")
        for s in ConfigService.addon.get_all()
        if s.name.startswith("state_backend.clickhouse.")
    }
    # password: any text is a password; allow_loopback, refuse_private, ignore_proxy_env:
    # booleans Meltano casts (each has a test of its own), and history and run_lock, booleans
    # too; the client pair: the next test.
    assert ours - set(BAD_VALUES) == {
        "password",
        "history",
        "run_lock",
        "allow_loopback",
        "refuse_private",
        "ignore_proxy_env",
        "client_cert",
        "client_key",
    }


def test_mutual_tls_names_the_missing_or_unreadable_half(manager_kwargs, tmp_path):
    with pytest.raises(MeltanoConfigurationError) as half:
        make(**{**manager_kwargs, "client_cert": str(tmp_path / "cert.pem")})
    assert half.value.setting == "state_backend.clickhouse.client_key"
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(MeltanoConfigurationError) as unreadable:
        make(
            **manager_kwargs,
            client_cert=str(tmp_path / "cert.pem"),
            client_key=str(tmp_path / "key.pem"),
        )
    assert unreadable.value.setting == "state_backend.clickhouse.client_cert"


def test_lock_settings_reach_the_lock(manager_kwargs, clickhouse, schema):
    sid = "dev:settings"
    with make(**{**manager_kwargs, "lock_lease_seconds": 42}) as fenced:
        with fenced.acquire_lock(sid, retry_seconds=1):
            info = fenced._call("lock_info", state_id=sid)
            assert info["expires_at_ms"] - info["acquired_at_ms"] == 42_000
    with make(**{**manager_kwargs, "lock_mode": "settle", "lock_settle_seconds": 0.1}) as settle:
        started = time.monotonic()
        with settle.acquire_lock(sid, retry_seconds=1):
            # The original protocol's candidate row, in the original's lock table.
            rows = clickhouse.query(
                f"SELECT count() FROM {schema}.state_lock WHERE state_id = {{id:String}}", id=sid
            )
            assert rows.strip() == "1"
        assert time.monotonic() - started < 5


def test_the_host_logs_at_meltanos_level(manager_kwargs, caplog):
    from meltano_clickhouse_state.bridge import host_log_level

    assert [host_log_level(level) for level in (5, 10, 20, 30, 40, 50)] == [
        "debug",
        "debug",
        "info",
        "warn",
        "error",
        "error",
    ]
    caplog.set_level(logging.WARNING)
    assert make(**manager_kwargs).config.log_level == "warn"
    caplog.set_level(logging.DEBUG)
    manager = make(**{**manager_kwargs, "table": "debug_level"})
    assert manager.config.log_level == "debug"
    manager.get("x")
    # The host's own debug line, forwarded at debug level under the bridge's logger.
    loaded = [
        r
        for r in caplog.records
        if r.name == "meltano_clickhouse_state.bridge.host" and "component loaded" in r.getMessage()
    ]
    assert loaded and all(r.levelno == logging.DEBUG for r in loaded), caplog.text


def test_a_wrong_password_is_unauthorized_and_never_shown(manager_kwargs, caplog):
    secret = "Wr0ng-pässword-7c1e"
    caplog.set_level(logging.DEBUG)
    manager = make(**{**manager_kwargs, "password": secret})
    with pytest.raises(BackendError) as refused:
        manager.get("x")
    assert refused.value.kind == "unauthorized"
    assert secret not in str(refused.value)
    assert secret not in repr(manager.config)
    assert secret not in caplog.text
    assert secret not in manager.label


def test_a_refused_loopback_address_names_the_setting_that_allows_it(clickhouse, manager_kwargs):
    if not clickhouse.loopback:
        pytest.skip("the ClickHouse under test is not on this machine")
    manager = make(**{**manager_kwargs, "allow_loopback": False})
    with pytest.raises(BackendError) as refused:
        manager.get("x")
    assert (refused.value.kind, refused.value.reason) == ("unreachable", "address-refused")
    assert "its address is refused" in str(refused.value)
    assert "state_backend.clickhouse.allow_loopback" in str(refused.value)


def test_refuse_private_refuses_a_private_clickhouse_before_connecting(manager_kwargs, tripwire):
    """The address is a literal in 10/8: the host refuses it before any packet leaves (the
    tripwire under the policy, which would stop a connection, was not reached)."""
    uri = "clickhouse://default:throwaway-pw-0000@10.255.255.1:8123/default"
    manager = make(**{**manager_kwargs, "uri": uri, "refuse_private": True})
    with pytest.raises(BackendError) as refused:
        manager.get("x")
    assert (refused.value.kind, refused.value.reason) == ("unreachable", "address-refused")
    assert "its address is refused" in str(refused.value)
    assert "refuse_private" in str(refused.value)
    assert tripwire.trips() == ""


def test_proxies_in_the_environment_are_honoured_unless_ignored(manager_kwargs, monkeypatch):
    """The host inherits Meltano's environment and goes through the proxy it names: here one
    nobody listens at (port 1 of this machine), so a call fails; ``ignore_proxy_env`` connects
    directly."""
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy", "https_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:1")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
    kwargs = {**manager_kwargs, "retries": 0}
    with make(**{**kwargs, "ignore_proxy_env": True}) as direct:
        assert direct.get("dev:proxied") is None
    with make(**kwargs) as proxied:
        with pytest.raises(BackendError) as failed:
            proxied.get("dev:proxied")
    # The ClickHouse answered the direct call just before: the refusal is the proxy's.
    assert failed.value.kind == "unreachable", str(failed.value)
    assert "connection refused" in str(failed.value), str(failed.value)


def test_with_refuse_private_off_a_private_clickhouse_trips_the_wire(manager_kwargs, tripwire):
    """Meltano reaches private networks by default: the same literal then gets past the policy,
    and the tripwire stops it before a connection (the refusal test above relies on it)."""
    uri = "clickhouse://default:throwaway-pw-0000@10.255.255.1:8123/default"
    manager = make(**{**manager_kwargs, "uri": uri, "retry_budget_seconds": 0})
    tripwire.expected = True
    with pytest.raises(BackendError) as tripped:
        manager.get("x")
    assert "tripwire: refused to leave this machine" in str(tripped.value)
    assert "10.255.255.1" in tripwire.trips()


def test_equal_configurations_share_one_host(manager_kwargs):
    first = make(**manager_kwargs)
    second = make(**manager_kwargs)
    assert first._bridge is second._bridge
    assert Bridge.shared(first.config).pid == first._bridge.pid


def test_the_host_is_found_in_order(tmp_path, monkeypatch, host_bin):
    from meltano_clickhouse_state.bridge import EXECUTABLE, find_executable

    scripts = tmp_path / "scripts"
    scripts.mkdir()
    installed = scripts / EXECUTABLE
    installed.write_bytes(b"")
    bundled = tmp_path / "bin" / EXECUTABLE
    bundled.parent.mkdir()
    bundled.write_bytes(b"")
    on_path = tmp_path / "path"
    on_path.mkdir()
    (on_path / EXECUTABLE).symlink_to(host_bin)
    monkeypatch.setenv("PATH", str(on_path))
    nowhere = tmp_path / "elsewhere"
    # The variable wins, then the wheel's script, then a bundled copy, then PATH.
    monkeypatch.setenv("STATE_BACKEND_BIN", str(host_bin))
    assert find_executable(tmp_path, scripts) == host_bin
    monkeypatch.delenv("STATE_BACKEND_BIN")
    assert find_executable(tmp_path, scripts) == installed
    assert find_executable(tmp_path, nowhere) == bundled
    assert find_executable(nowhere, nowhere) == on_path / EXECUTABLE
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BackendError, match="not in this Python's scripts directory .* nor on PATH"):
        find_executable(nowhere, nowhere)


def test_a_windows_install_is_found_and_runs(
    child_process, tmp_path, monkeypatch, host_bin, manager_kwargs
):
    """The wheel on Windows: pip puts the host in the environment's ``Scripts\\`` as
    ``state-backend.exe`` and the component in ``Lib\\site-packages``. Laid out by the nt
    install scheme (with this platform's host under the name the adapter uses on Windows), and
    with the adapter's directories those of that layout (as sysconfig gives them on Windows),
    Meltano's calls find both there, start that host with that component, and work; nothing
    else is on PATH or named by the environment. (The Windows host itself runs under Wine in
    `just wheel-smoke`, and the wheel installed on Windows in the release workflow.)"""
    import shutil
    import sysconfig

    import psutil
    from meltano_clickhouse_state import bridge

    prefix = tmp_path / "venv"
    where = {"base": str(prefix), "platbase": str(prefix), "installed_base": str(prefix)}
    scripts = Path(sysconfig.get_path("scripts", "nt", vars=where))
    package = Path(sysconfig.get_path("purelib", "nt", vars=where)) / "meltano_clickhouse_state"
    assert scripts == prefix / "Scripts"
    assert package == prefix / "Lib" / "site-packages" / "meltano_clickhouse_state"
    scripts.mkdir(parents=True)
    package.mkdir(parents=True)
    shutil.copy2(host_bin, scripts / "state-backend.exe")
    component = os.environ.get("STATE_BACKEND_COMPONENT") or bridge.find_component()
    assert component, "no component to lay out"
    shutil.copy2(component, package / "clickhouse_state.wasm")
    assert bridge.executable_name("win32") == "state-backend.exe"
    monkeypatch.setattr(bridge, "EXECUTABLE", bridge.executable_name("win32"))
    monkeypatch.setattr(bridge, "_SCRIPTS_DIR", scripts)
    monkeypatch.setattr(bridge, "_PACKAGE_DIR", package)
    monkeypatch.delenv("STATE_BACKEND_BIN", raising=False)
    monkeypatch.delenv("STATE_BACKEND_COMPONENT", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))

    with make(**manager_kwargs) as manager:
        manager.set(MeltanoState("windows:layout", {}, {"singer_state": {"at": 1}}))
        assert manager.get("windows:layout").completed_state == {"singer_state": {"at": 1}}
        host = psutil.Process(manager._bridge.pid)
        assert Path(host.exe()) == scripts / "state-backend.exe"
        assert host.environ()["STATE_BACKEND_COMPONENT"] == str(package / "clickhouse_state.wasm")


@pytest.mark.skipif(
    not INSTALLED, reason="checks the installed wheel (STATE_BACKEND_TEST_INSTALLED=1)"
)
def test_the_installed_wheel_brings_its_host_and_component(host_bin):
    import sysconfig

    from meltano_clickhouse_state import bridge

    assert "STATE_BACKEND_BIN" not in os.environ and "STATE_BACKEND_COMPONENT" not in os.environ
    # the host the wheel installed as a script of this environment, not a workspace build
    assert host_bin.parent == Path(sysconfig.get_path("scripts"))
    assert Path(sys.prefix).resolve() in host_bin.resolve().parents
    # the component inside the installed package, passed to the host
    component = bridge.find_component()
    assert component is not None and component.is_file()
    assert component.parent == Path(bridge.__file__).resolve().parent
    assert Path(sys.prefix).resolve() in component.resolve().parents
    assert ROOT / "python" not in component.resolve().parents
    config = bridge.HostConfig(uri="clickhouse://u:p@h/db")
    assert config.environment()[bridge.COMPONENT_ENV] == str(component)
    # the host as a library for this process, inside the installed package: the default host
    from meltano_clickhouse_state import embedded

    library = embedded.find_library()
    assert library is not None and library.parent == component.parent


def test_a_second_package_serving_clickhouse_refuses_this_one(
    manager_kwargs, tmp_path, monkeypatch
):
    dist = tmp_path / "meltano_state_backend_clickhouse-0.3.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: meltano-state-backend-clickhouse\nVersion: 0.3.0\n"
    )
    (dist / "entry_points.txt").write_text(
        "[meltano.state_backends]\nclickhouse = other_backend:Manager\n"
    )
    # Last on the path: Meltano would pick this package, which refuses to run beside the other.
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    with pytest.raises(MeltanoConfigurationError) as refused:
        ClickHouseStateStoreManager(**manager_kwargs)
    said = str(refused.value)
    assert "meltano-state-backend-clickhouse-wasm and meltano-state-backend-clickhouse" in said
    assert "lock_mode=settle" in said


def test_the_exceptions_come_from_the_hosts_table_of_errors(host_bin):
    """`state-backend errors` against the installed package's table, and each row's exception."""
    from meltano_clickhouse_state import manager
    from meltano_clickhouse_state.errors_table import ERRORS

    listed = json.loads(
        subprocess.run([str(host_bin), "errors"], capture_output=True, check=True).stdout
    )
    assert [(e["kind"], e["reason"], e["exit_code"], e["meltano"]) for e in listed] == list(ERRORS)
    expected = {
        "configuration": MeltanoConfigurationError,
        "locked": manager.StateLockedError,
        "backend": BackendError,
    }
    for kind, reason, _, raises in ERRORS:
        raised = manager._error(BackendError(kind, "m", lock={}, reason=reason))
        assert isinstance(raised, expected[raises]), (kind, reason, raised)
        if raises == "backend":
            assert not isinstance(raised, manager.StateLockedError), kind


def test_the_meltano_settings_are_the_hosts(host_bin):
    """`state-backend settings` (the host's table) against the settings Meltano sees."""
    import inspect

    from meltano.core.config_service import ConfigService

    listed = json.loads(
        subprocess.run([str(host_bin), "settings"], capture_output=True, check=True).stdout
    )
    meltanos_own = {"lock_timeout_seconds", "lock_retry_seconds"}
    hosts = {s["name"]: s for s in listed}
    ours = {
        s.name.removeprefix("state_backend.clickhouse."): s
        for s in ConfigService.addon.get_all()
        if s.name.startswith("state_backend.clickhouse.")
    }
    assert set(ours) == set(hosts) - meltanos_own
    # The manager takes each as Meltano passes it, a keyword named after it: Meltano's own as
    # parameters, ours from the generated table, which is the host's.
    parameters = inspect.signature(ClickHouseStateStoreManager.__init__).parameters
    assert meltanos_own <= set(parameters)
    assert set(hosts) == set(settings.MELTANO_NAMES)
    # Descriptions say the host's default, or that the setting is required.
    for name, definition in ours.items():
        default = hosts[name]["default"]
        if default == "from the URI (required)":
            assert "Required" in definition.description, name
        elif default and default not in {"none", "from the URI", "from the URI, else empty"}:
            assert default.strip("`") in definition.description, (name, default)


@pytest.mark.skipif(not in_process(), reason="no embedded host library (STATE_BACKEND_LIBRARY)")
def test_where_the_library_is_installed_the_host_runs_in_this_process(manager_kwargs, clickhouse):
    """The default where the wheel installed the library: the host in Meltano's process, no
    child. It answers as the child does, gives back a kept lock when closed (at Meltano's exit),
    and a configuration error is Meltano's, naming the setting."""
    import psutil
    from meltano_clickhouse_state.embedded import Embedded

    children = {p.pid for p in psutil.Process().children(recursive=True)}
    manager = make(**{**manager_kwargs, "table": "in_process"})
    assert isinstance(manager._bridge, Embedded) and manager._bridge.pid == os.getpid()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    sid = "dev:in-process"
    manager.update(MeltanoState(sid, {"singer_state": {"i": 1}}, {}))
    assert manager.get(sid).partial_state == {"singer_state": {"i": 1}}
    # The update's lock is kept for the next one; closing the host gives it back.
    assert manager._call("lock_info", state_id=sid) is not None
    Bridge.close_all()
    assert not manager._bridge.alive
    with make(**{**manager_kwargs, "table": "in_process"}) as after:
        assert after._call("lock_info", state_id=sid) is None
    with pytest.raises(MeltanoConfigurationError) as refused:
        make(**{**manager_kwargs, "table": "x", "lock_mode": "sometimes"})
    assert refused.value.setting == "state_backend.clickhouse.lock_mode"


def test_a_library_that_cannot_load_falls_back_to_a_child_process(
    manager_kwargs, tmp_path, monkeypatch, caplog
):
    """A library built for a newer system than this one fails to load: the bridge runs the host
    as a child process instead, and says so at info level."""
    not_a_library = tmp_path / "libstate_host.so"
    not_a_library.write_bytes(b"not a shared library")
    monkeypatch.setenv("STATE_BACKEND_LIBRARY", str(not_a_library))
    caplog.set_level(logging.INFO)
    with make(**{**manager_kwargs, "table": "fallback"}) as manager:
        assert isinstance(manager._bridge, Bridge) and manager._bridge.pid != os.getpid()
        manager.set(MeltanoState("dev:fallback", {}, {"singer_state": {"v": 1}}))
        assert manager.get("dev:fallback").completed_state == {"singer_state": {"v": 1}}
    assert "running the host as a child process" in caplog.text


def test_a_ctrl_c_during_a_relayed_log_line_is_raised_once_the_library_returns(monkeypatch):
    """A call relays its log on the calling thread, where Python runs its signal handlers; ctypes
    drops an exception raised in its callback, so the Ctrl-C is kept and raised afterwards."""
    import ctypes
    import types

    from meltano_clickhouse_state import embedded

    def interrupted(_line: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "relay_log_line", interrupted)
    line = ctypes.create_string_buffer(b"a log line")
    embedded._LOG_SINK(ctypes.cast(line, ctypes.POINTER(ctypes.c_char)), 10)
    with pytest.raises(KeyboardInterrupt):
        embedded._reraise_interrupt()
    embedded._reraise_interrupt()  # once only

    # Raised before the callback's `try` (Python 3.11+), ctypes reports it as unraisable to the
    # hook the module installs (pytest puts its own in place during a test).
    embedded._unraisable(
        types.SimpleNamespace(
            exc_type=KeyboardInterrupt,
            exc_value=KeyboardInterrupt(),
            exc_traceback=None,
            err_msg="Exception ignored on calling ctypes callback function",
            object=embedded._log_line,
        )
    )
    with pytest.raises(KeyboardInterrupt):
        embedded._reraise_interrupt()
