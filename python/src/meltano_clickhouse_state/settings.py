"""The ``state_backend.clickhouse.*`` settings, registered with Meltano (``meltano.settings``).

Meltano hands their values to the manager as keyword arguments named after the last part, which
is also the host's name for the setting. Unset ones leave the URI and the defaults alone.
Meltano's own ``state_backend.lock_timeout_seconds`` and ``state_backend.lock_retry_seconds``
apply too.

Numbers and choices are strings to Meltano: Meltano's own casts fail with a traceback that does
not name the setting ("invalid literal for int()"), while the host's checks name it, and the
manager raises them as Meltano's configuration error. Booleans keep Meltano's kind.
"""

from __future__ import annotations

from meltano.core.setting_definition import SettingDefinition, SettingKind

from meltano_clickhouse_state import conflict

PREFIX = "state_backend.clickhouse."


def _setting(key: str, kind: SettingKind, description: str, **extra: object) -> SettingDefinition:
    return SettingDefinition(
        name=PREFIX + key,
        label=f"ClickHouse {key.replace('_', ' ')}",
        kind=kind,
        description=description,
        env_specific=True,
        **extra,
    )


def meltano_name(setting: str) -> str:
    """Meltano's name for one of the host's settings (``uri`` is Meltano's own)."""
    if setting in {"uri", "lock_timeout_seconds", "lock_retry_seconds"}:
        return f"state_backend.{setting}"
    return PREFIX + setting


def env_var(setting: str) -> str:
    """The environment variable Meltano reads for that setting."""
    return "MELTANO_" + meltano_name(setting).upper().replace(".", "_")


HOST = _setting("host", SettingKind.STRING, "ClickHouse host; overrides the URI's")
PORT = _setting(
    "port",
    SettingKind.STRING,
    "ClickHouse HTTP(S) port; overrides the URI's (default 8123, or 8443 when secure)",
)
DATABASE = _setting(
    "database",
    SettingKind.STRING,
    "Database the connection logs in to; overrides the URI's path. Required here or in the URI",
)
USER = _setting(
    "user",
    SettingKind.STRING,
    "ClickHouse user; overrides the URI's. Required here or in the URI",
)
PASSWORD = _setting(
    "password",
    SettingKind.PASSWORD,
    "ClickHouse password; overrides the URI's. Sent only in request headers to the configured "
    "server",
    sensitive=True,
)
SECURE = _setting(
    "secure",
    SettingKind.BOOLEAN,
    "Use HTTPS with certificate verification (ClickHouse Cloud needs it); default false",
)
SCHEMA = _setting(
    "schema", SettingKind.STRING, "Database that holds the state tables (default meltano)"
)
TABLE = _setting(
    "table",
    SettingKind.STRING,
    "State table name (default state); the lock tables are <table>_lock_log and <table>_lock",
)
CLUSTER = _setting(
    "cluster",
    SettingKind.STRING,
    "A self-managed replicated cluster (a name in system.clusters): the tables are created ON "
    "CLUSTER with Replicated engines. Leave unset on one server and on ClickHouse Cloud",
)
LOCK_MODE = _setting(
    "lock_mode",
    SettingKind.STRING,
    "fenced (default): leases and fencing tokens in <table>_lock_log. settle: the original "
    "Python backend's protocol on <table>_lock, while any process still runs that backend",
)
LOCK_LEASE_SECONDS = _setting(
    "lock_lease_seconds",
    SettingKind.STRING,
    "Fenced mode: an explicit lock (Meltano's acquire_lock) is lost this long after its holder "
    "stops renewing it (default 300). An update's lock lasts state_backend.lock_timeout_seconds "
    "(at least 10 s, at most this), so a killed run keeps an id that long at most",
)
LOCK_LINGER_SECONDS = _setting(
    "lock_linger_seconds",
    SettingKind.STRING,
    "Fenced mode: an update keeps the lock of its state id for the next update (which then "
    "costs one round trip) and gives it back once idle this long, or as soon as another "
    "process waits for it; not for a lease after it met another writer of the id (default 0 "
    "(5 when served, as for Meltano))",
)
LOCK_SETTLE_SECONDS = _setting(
    "lock_settle_seconds",
    SettingKind.STRING,
    "Settle mode: how long a candidate waits before deciding (default 1, as the original)",
)
RETRY_BUDGET_SECONDS = _setting(
    "retry_budget_seconds",
    SettingKind.STRING,
    "How long a call keeps trying again after transient failures (refused connections, resets, "
    "502/503/504, ClickHouse's transient errors), never past a held lock's lease (default 60): "
    "a ClickHouse restart or failover within it does not fail the run",
)
RETRIES = _setting(
    "retries",
    SettingKind.STRING,
    "At most this many retries of a request, 0 to 1000, within the budget (default: no limit)",
)
RETRY_BACKOFF_SECONDS = _setting(
    "retry_backoff_seconds",
    SettingKind.STRING,
    "First pause before a retry, doubled each try up to 2 s, with jitter (default 0.2)",
)
CA_BUNDLE = _setting(
    "ca_bundle",
    SettingKind.STRING,
    "PEM file of CA certificates to trust besides the system's (a private CA)",
)
CLIENT_CERT = _setting(
    "client_cert",
    SettingKind.STRING,
    "PEM file of a client certificate (chain) for mutual TLS; needs client_key",
)
CLIENT_KEY = _setting(
    "client_key",
    SettingKind.STRING,
    "PEM file of the client certificate's private key for mutual TLS; needs client_cert",
)
ALLOW_LOOPBACK = _setting(
    "allow_loopback",
    SettingKind.BOOLEAN,
    "Let the sandbox connect to loopback addresses (a ClickHouse on this machine); default false",
)
REFUSE_PRIVATE = _setting(
    "refuse_private",
    SettingKind.BOOLEAN,
    "Refuse private networks (10/8, 172.16/12, 192.168/16, fc00::/7, ...) as a multi-tenant "
    "runner does; default false (reachable)",
)

# Meltano imports this module whenever it reads its settings, whichever package it then picks
# for clickhouse:// URIs: the one place that can warn when another package claims the scheme.
conflict.warn_if_claimed_twice()
