"""Meltano state backend in ClickHouse, run as a sandboxed WebAssembly component.

Meltano loads :class:`ClickHouseStateStoreManager` for ``clickhouse://`` state backend URIs. Every
operation goes to one long-lived ``state-backend serve --stdio`` process per Meltano process,
which runs the component under wasmtime (see :mod:`.bridge`).
"""

from meltano_clickhouse_state.bridge import BackendError, Bridge, HostConfig
from meltano_clickhouse_state.manager import ClickHouseStateStoreManager

__all__ = ["BackendError", "Bridge", "ClickHouseStateStoreManager", "HostConfig"]
