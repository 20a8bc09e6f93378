"""Every ``aegis`` command and subcommand prints its help: an operator's first step with a tool."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aegis_cli.app import app


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    subcommands = getattr(command, "commands", {})  # a group (typer vendors its own click)
    for name, sub in sorted(subcommands.items()):
        paths += _paths(sub, (*prefix, name))
    return paths


COMMANDS = _paths(typer.main.get_command(app))


def test_the_services_commands_are_registered() -> None:
    names = {path[0] for path in COMMANDS if path}
    assert {"bootstrap", "simulate", "migrate", "replay", "report", "jobs", "alerts"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(("aegis", *p)))
def test_help_renders(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output or repr(result.exception)
    assert "Usage" in result.output
