"""Another installed package that also serves Meltano's ``clickhouse://`` state backend URIs.

Meltano picks one entry point per scheme and says nothing when two packages register the same
one (for example the original ``meltano-state-backend-clickhouse`` next to this package): which
backend runs then depends on the order of the environment's paths. The two lock the same state
table in different ways, so a fleet that mixes them by accident is not safe. This module finds
that situation so that it is reported, never silently resolved.
"""

from __future__ import annotations

import logging
import sys

if sys.version_info >= (3, 12):
    from importlib.metadata import entry_points
else:  # Meltano depends on the backport there
    from importlib_metadata import entry_points

logger = logging.getLogger(__name__)

GROUP = "meltano.state_backends"
SCHEME = "clickhouse"
#: This package's distribution and the object its entry point names.
DISTRIBUTION = "meltano-state-backend-clickhouse-wasm"
OURS = "meltano_clickhouse_state.manager:ClickHouseStateStoreManager"


def other_claims() -> list[str]:
    """``"distribution (module:object)"`` for each other entry point serving ``clickhouse``."""
    found = []
    for ep in entry_points(group=GROUP, name=SCHEME):
        if ep.value == OURS:
            continue
        dist = getattr(ep, "dist", None)
        found.append(f"{dist.name if dist else 'an unknown distribution'} ({ep.value})")
    return sorted(set(found))


def message(others: list[str]) -> str:
    return (
        f"two packages serve Meltano's {SCHEME}:// state backend: {DISTRIBUTION} and "
        f"{', '.join(others)}. Meltano runs one of them depending on the order of the "
        "environment's paths, and they lock the state table in different ways. Uninstall one "
        "(to migrate from the original Python backend, install this one alone and set "
        "state_backend.clickhouse.lock_mode=settle while any other Meltano process still runs "
        "the original)"
    )


def warn_if_claimed_twice() -> None:
    others = other_claims()
    if others:
        logger.error("%s", message(others))
