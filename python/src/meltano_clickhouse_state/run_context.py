"""Who is calling: the Meltano run this process is, read from what Meltano already keeps.

Meltano hands a state backend its settings and nothing of the run (meltano#9947). Two places
hold the rest while a `meltano run`, `el` or `elt` is under way, both in this process:
- click's context stack (thread-local; the command runs its asyncio loop in the same thread):
  the command's name and its `--force` (`MELTANO_RUN_FORCE` included, as click read it);
- structlog's context variables, where the command binds its run id (`Job.run_id`) first
  thing (meltano/cli/run.py, meltano/cli/elt.py).
Anything else (`meltano state ...`, a library caller, `el --dump`) is not a run: it holds
nothing. A `meltano state` command's `--force` means "do not prompt", not "take the id".
"""

from __future__ import annotations

import functools
import os
import socket
import typing as t
from dataclasses import dataclass
from importlib import metadata

#: The commands whose process is one run of a pipeline.
RUN_COMMANDS = ("run", "el", "elt")


@dataclass(frozen=True)
class Caller:
    """Who writes: Meltano's command, its run id where it has one, and this process."""

    command: str
    run_id: str | None
    force: bool
    host: str
    pid: int
    meltano_version: str | None

    @property
    def is_run(self) -> bool:
        """A run of a pipeline: it holds its state id until its process ends."""
        return self.command in RUN_COMMANDS and self.run_id is not None


@functools.cache
def _meltano_version() -> str | None:
    try:
        return metadata.version("meltano")
    except metadata.PackageNotFoundError:
        return None


def _command_path(context: t.Any) -> list[str]:
    names = []
    while context is not None:
        if context.info_name:
            names.append(str(context.info_name))
        context = context.parent
    return names[::-1]


def current() -> Caller:
    """The caller as this process's click context and structlog's context say it is."""
    command, force = "library", False
    try:
        import click

        context = click.get_current_context(silent=True)
    except ImportError:
        context = None
    if context is not None:
        path = _command_path(context)
        # `meltano state set` is "state set"; the root (`meltano`) is left out.
        command = " ".join(path[1:]) or path[0]
        params = context.params or {}
        if command in ("el", "elt") and params.get("dump"):
            command += " --dump"  # prints the state and exits: a read, not a run
        force = command in RUN_COMMANDS and bool(params.get("force"))
    run_id = None
    try:
        import structlog

        value = structlog.contextvars.get_contextvars().get("run_id")
        run_id = str(value) if value else None
    except ImportError:
        pass
    return Caller(
        command=command,
        run_id=run_id,
        force=force,
        host=socket.gethostname(),
        pid=os.getpid(),
        meltano_version=_meltano_version(),
    )
