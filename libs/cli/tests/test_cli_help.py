"""Every ``aegis`` command and subcommand prints its help: an operator's first step with a tool.
The help answers without loading the SDKs (plugins load lazily), lists the exit codes, and
``aegis --version`` names every AEGIS package installed."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from aegis_cli import exitcodes
from aegis_cli.app import app, command_names, installed_versions


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    if hasattr(command, "list_commands"):  # a group (typer vendors its own click)
        ctx = typer.Context(command)
        for name in sorted(command.list_commands(ctx)):
            paths += _paths(command.get_command(ctx, name), (*prefix, name))
    return paths


COMMANDS = _paths(typer.main.get_command(app))
# commands whose exit codes go beyond 0 and 1: their --help says which
WITH_EXIT_CODES = [
    ("bootstrap",),
    ("status",),
    ("streams",),
    ("aggregate",),
    ("report",),
    ("replay",),
    ("migrate", "plan"),
    ("migrate", "run"),
    ("seal", "raw"),
    ("audit", "raw"),
    ("alerts", "resend"),
    ("jobs", "list"),
    ("jobs", "show"),
    ("jobs", "enable"),
    ("jobs", "validate"),
    ("simulate",),
]
# what `aegis --help` must not load: the SDKs behind the commands
HEAVY = ("aiobotocore", "botocore", "faststream", "nats", "aiohttp", "aiomqtt", "yaml")


def test_the_services_commands_are_registered() -> None:
    names = {path[0] for path in COMMANDS if path}
    assert {"bootstrap", "simulate", "migrate", "replay", "report", "jobs", "alerts"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(("aegis", *p)))
def test_help_renders(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output or repr(result.exception)
    assert "Usage" in result.output


def test_every_plugin_is_listed_by_name_without_loading_it() -> None:
    names = command_names()
    assert {"bootstrap", "status", "devices", "report", "jobs", "up"} <= set(names)
    assert len(names) == len(set(names))
    assert set(names) == {path[0] for path in COMMANDS if path}


@pytest.mark.parametrize("path", WITH_EXIT_CODES, ids=lambda p: " ".join(("aegis", *p)))
def test_help_lists_the_exit_codes(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "Exit codes" in result.output


def test_root_help_lists_every_exit_code() -> None:
    result = CliRunner().invoke(app, ["--help"], terminal_width=400)
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for code, meaning in exitcodes.MEANINGS.items():
        assert f"{code} {' '.join(meaning.split())}" in text


def _modules_after(*args: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported once ``aegis ARGS`` is done."""
    script = (
        "import sys\n"
        "from aegis_cli.app import app\n"
        "try:\n"
        f"    app({list(args)!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('MODULES', *sorted({m.split('.')[0] for m in sys.modules}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("MODULES"))
    return set(line.split()[1:])


@pytest.mark.parametrize(
    "args", [("--help",), ("report", "--help"), ("jobs", "--help"), ("audit", "raw", "--help")]
)
def test_help_loads_no_sdk(args: tuple[str, ...]) -> None:
    loaded = _modules_after(*args)
    assert "aegis_reporter" in loaded or args != ("report", "--help")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_a_subcommand_loads_its_own_plugin_only() -> None:
    loaded = _modules_after("bootstrap", "--help")
    assert not loaded & {"aegis_reporter", "aegis_orchestrator", "aegis_storage_tools"}


def test_version_names_every_aegis_package() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"aegis-cli {version('aegis-cli')}"
    shown = dict(line.split(" ", 1) for line in lines)
    assert shown == dict(installed_versions())
    # the workspace installs every member: libraries and services alike
    assert {"aegis-runtime", "aegis-storage", "aegis-reporter", "aegis-orchestrator"} <= set(shown)
    assert all(name.startswith("aegis-") for name in shown)


def test_an_unknown_command_suggests_a_plugin_command() -> None:
    result = CliRunner().invoke(app, ["reprot"])
    assert result.exit_code == exitcodes.USAGE
    assert "report" in result.output


def test_exit_codes_are_distinct_and_described() -> None:
    codes = [exitcodes.OK, exitcodes.FAILED, exitcodes.USAGE, exitcodes.FOUND]
    codes += [exitcodes.DIFFERS, exitcodes.UNAVAILABLE]
    assert codes == sorted(set(codes)) == sorted(exitcodes.MEANINGS)
    assert json.dumps(exitcodes.MEANINGS)  # plain data, for docs and scripts
