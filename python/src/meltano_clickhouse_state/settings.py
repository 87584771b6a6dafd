"""The ``state_backend.clickhouse.*`` settings, registered with Meltano (``meltano.settings``).

They come from the host's table (``state-backend settings``) through ``settings_table.py``,
which ``just python-tables`` writes and ``just lint`` checks.

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
from meltano_clickhouse_state.settings_table import SETTINGS

PREFIX = "state_backend.clickhouse."


#: Each setting's Meltano name by the host's name (``uri`` is Meltano's own).
MELTANO_NAMES: dict[str, str] = {name: meltano for name, _, meltano, _, _ in SETTINGS}
#: The settings of the component (the host's options are the rest).
COMPONENT: frozenset[str] = frozenset(
    name for name, scope, _, _, _ in SETTINGS if scope == "component"
)
_KINDS = {
    "text": SettingKind.STRING,
    "boolean": SettingKind.BOOLEAN,
    "secret": SettingKind.PASSWORD,
}


def meltano_name(setting: str) -> str:
    """Meltano's name for one of the host's settings (``uri`` is Meltano's own)."""
    return MELTANO_NAMES.get(setting, f"state_backend.{setting}")


def env_var(setting: str) -> str:
    """The environment variable Meltano reads for that setting."""
    return "MELTANO_" + meltano_name(setting).upper().replace(".", "_")


def _definition(key: str, kind: str, description: str) -> SettingDefinition:
    extra = {"sensitive": True} if kind == "secret" else {}
    return SettingDefinition(
        name=PREFIX + key,
        label=f"ClickHouse {key.replace('_', ' ')}",
        kind=_KINDS[kind],
        description=description,
        env_specific=True,
        **extra,
    )


#: The definitions, by the host's name; each is also this module's attribute in capitals
#: (``HOST``), which the ``meltano.settings`` entry points name.
DEFINITIONS: dict[str, SettingDefinition] = {
    name: _definition(name, kind, description)
    for name, _, meltano, kind, description in SETTINGS
    if meltano.startswith(PREFIX)
}
globals().update({name.upper(): definition for name, definition in DEFINITIONS.items()})

# Meltano imports this module whenever it reads its settings, whichever package it then picks
# for clickhouse:// URIs: the one place that can warn when another package claims the scheme.
conflict.warn_if_claimed_twice()
