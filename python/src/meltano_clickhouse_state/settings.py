"""The ``state_backend.clickhouse.*`` settings, registered with Meltano (``meltano.settings``).

Meltano hands their values to the manager as keyword arguments named after the last part. Each
overrides the same part of the URI; unset ones leave the URI alone.
"""

from __future__ import annotations

from meltano.core.setting_definition import SettingDefinition, SettingKind


def _setting(key: str, kind: SettingKind, description: str, **extra: object) -> SettingDefinition:
    return SettingDefinition(
        name=f"state_backend.clickhouse.{key}",
        label=f"ClickHouse {key.replace('_', ' ')}",
        kind=kind,
        description=description,
        env_specific=True,
        **extra,
    )


HOST = _setting("host", SettingKind.STRING, "ClickHouse host (overrides the URI's)")
PORT = _setting(
    "port",
    SettingKind.INTEGER,
    "ClickHouse HTTP(S) port (default 8123, or 8443 when secure)",
)
DATABASE = _setting("database", SettingKind.STRING, "Database of the connection (default: default)")
USER = _setting("user", SettingKind.STRING, "ClickHouse user (default: default)")
PASSWORD = _setting(
    "password",
    SettingKind.PASSWORD,
    "ClickHouse password; sent only in request headers to the configured server",
    sensitive=True,
)
SECURE = _setting(
    "secure",
    SettingKind.BOOLEAN,
    "Use HTTPS with certificate verification (ClickHouse Cloud needs it)",
)
SCHEMA = _setting("schema", SettingKind.STRING, "Database that holds the state tables (default: meltano)")
TABLE = _setting("table", SettingKind.STRING, "State table name (default: state)")
CLUSTER = _setting(
    "cluster",
    SettingKind.STRING,
    "A self-managed replicated cluster (a name in system.clusters): the tables are created ON "
    "CLUSTER with Replicated engines. Leave unset on one server and on ClickHouse Cloud",
)
CA_BUNDLE = _setting(
    "ca_bundle",
    SettingKind.STRING,
    "PEM file of CA certificates to trust besides the system's (a private CA)",
)
ALLOW_LOOPBACK = _setting(
    "allow_loopback",
    SettingKind.BOOLEAN,
    "Let the sandbox connect to loopback addresses (a ClickHouse on this machine)",
)
