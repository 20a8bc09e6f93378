"""``aegis up``: added to the ``aegis`` command by this package's ``aegis.commands`` entry point,
so only a development install (the workspace, ``make run``) has it; no image does."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer


def up(
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start from nothing: empty the emulator (moto_server) and the AEGIS streams.",
        ),
    ] = False,
    keep: Annotated[
        bool,
        typer.Option(
            "--keep",
            help="Keep the streams' messages even when the store starts empty (they replay "
            "against it).",
        ),
    ] = False,
) -> None:
    """Run the whole platform on this machine: local servers, bootstrap, every service.

    The queue follows the store: when the S3/DynamoDB emulator starts empty (a new moto_server
    keeps nothing across runs), the AEGIS streams are purged with it, so a run never replays
    the last run's backlog against objects that no longer exist. An emulator that kept its data
    keeps the queue too.
    """
    from aegis_devstack.stack import Start, run_stack  # noqa: PLC0415 - only when it runs
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415 - not for `aegis --help`

    if fresh and keep:
        raise typer.BadParameter("--fresh and --keep contradict each other")
    start: Start = "fresh" if fresh else "keep" if keep else "follow"
    raise typer.Exit(asyncio.run(run_stack(AegisSettings(), start=start)))
