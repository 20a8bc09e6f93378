"""``aegis up``: added to the ``aegis`` command by this package's ``aegis.commands`` entry point,
so only a development install (the workspace, ``make run``) has it; no image does."""

from __future__ import annotations

import asyncio

import typer


def up() -> None:
    """Run the whole platform on this machine: local servers, bootstrap, every service."""
    from aegis_devstack.stack import run_stack  # noqa: PLC0415 - the stack only when it runs
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415 - not for `aegis --help`

    raise typer.Exit(asyncio.run(run_stack(AegisSettings())))
