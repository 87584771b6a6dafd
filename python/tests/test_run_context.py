"""The caller as Meltano's own process state says it is (no ClickHouse, no host): click's
context for the command and its --force, structlog's context for the run id."""

from __future__ import annotations

import os
import uuid

import click
import pytest
import structlog
from meltano_clickhouse_state.run_context import current


@pytest.fixture(autouse=True)
def no_run_id():
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()


def in_command(*path: str, **params):
    """The innermost of nested click contexts named by ``path``, as Meltano's CLI pushes them."""
    parent = None
    for name in path:
        parent = click.Context(click.Command(name), info_name=name, parent=parent)
    assert parent is not None
    parent.params.update(params)
    return parent


def test_a_run_names_its_command_run_id_and_force():
    run_id = str(uuid.uuid4())
    structlog.contextvars.bind_contextvars(run_id=run_id)
    with in_command("meltano", "run", force=True):
        caller = current()
    assert (caller.command, caller.run_id, caller.force) == ("run", run_id, True)
    assert caller.is_run
    assert caller.pid == os.getpid() and caller.host


@pytest.mark.parametrize("command", ["el", "elt"])
def test_el_and_elt_are_runs_too(command):
    structlog.contextvars.bind_contextvars(run_id="r-1")
    with in_command("meltano", command, force=False):
        caller = current()
    assert caller.command == command and caller.is_run and not caller.force


def test_el_dump_reads_and_is_not_a_run():
    structlog.contextvars.bind_contextvars(run_id="r-1")
    with in_command("meltano", "el", dump="state", force=True):
        caller = current()
    assert caller.command == "el --dump" and not caller.is_run and not caller.force


def test_a_state_commands_force_does_not_take_the_id():
    # `meltano state set --force` means "do not prompt"; it binds no run id either.
    with in_command("meltano", "state", "set", force=True):
        caller = current()
    assert caller.command == "state set" and not caller.force and not caller.is_run


def test_a_run_without_a_run_id_is_not_held():
    with in_command("meltano", "run"):
        caller = current()
    assert caller.command == "run" and caller.run_id is None and not caller.is_run


def test_outside_any_command_it_is_a_library_call():
    caller = current()
    assert caller.command == "library" and not caller.is_run and not caller.force


def test_meltanos_version_is_the_installed_one():
    from importlib import metadata

    assert current().meltano_version == metadata.version("meltano")
