"""``aegis up``: added to the ``aegis`` command by this package's ``aegis.commands`` entry point,
so only a development install (the workspace, ``make run``) has it; no image does.

``aegis up`` runs the stack; ``aegis up stop|start|restart SERVICE``, in the same directory,
operate one service of the running stack (:mod:`aegis_devstack.control`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from typing import Annotated

import typer

from aegis_devstack.control import Action, installed_services

app = typer.Typer(
    pretty_exceptions_enable=False,
    add_completion=False,
)

ServicesArgument = Annotated[
    list[str], typer.Argument(help="Services, as `aegis up` names them (ingest, processor, …).")
]
JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help='Print one JSON document: what was done to each service, [{"ok", "action", '
        '"service", "message", "pid", "previous_pid", "exit", "at", "ready"}].',
    ),
]
CONTROL_EXIT_CODES = (
    "Exit codes: 0 done, 1 not done (no aegis up answers in this directory, no such service, "
    "the stack is stopping; the message on stderr says why), 2 bad options."
)


@app.callback(invoke_without_command=True)
def up(
    ctx: typer.Context,
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

    A service that exits is restarted. From another terminal in the same directory, `aegis up
    stop SERVICE` keeps one down until `aegis up start SERVICE`, and `aegis up restart` replaces
    the services' processes one by one, as a rolling deploy does.
    """
    if ctx.invoked_subcommand is not None:
        if fresh or keep:
            raise typer.BadParameter("--fresh and --keep go with `aegis up` alone")
        return
    from aegis_devstack.stack import Start, run_stack  # noqa: PLC0415 - only when it runs
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415 - not for `aegis --help`

    if fresh and keep:
        raise typer.BadParameter("--fresh and --keep contradict each other")
    start: Start = "fresh" if fresh else "keep" if keep else "follow"
    raise typer.Exit(asyncio.run(run_stack(AegisSettings(), start=start)))


def _ask(action: Action, services: list[str], *, kill: bool = False, json_output: bool) -> None:
    """Ask the aegis up of this directory to do ``action`` to each service in turn (each once
    the one before is done: a restart once its new process is ready); the first that is not
    done ends the command (exit 1)."""
    from aegis_devstack.control import ControlError, Request, ask  # noqa: PLC0415

    outcomes = []
    failed = ""
    for service in services:
        try:
            outcome = asyncio.run(ask(Request(action, service, kill)))
        except (ControlError, OSError, TimeoutError) as err:
            failed = f"aegis up {action}: {err or type(err).__name__}"
            break
        outcomes.append(outcome)
        if not json_output:
            typer.echo(outcome.message, err=not outcome.ok)
        if not outcome.ok:
            failed = outcome.message
            break
        if action != "stop" and not outcome.ready:
            failed = f"aegis up {action}: {service} is not ready: stopping here"
            break
    if json_output:
        typer.echo(json.dumps([asdict(o) for o in outcomes]))
    if failed:
        if json_output or not outcomes or outcomes[-1].ok:
            typer.echo(failed, err=True)
        raise typer.Exit(1)


@app.command(epilog=CONTROL_EXIT_CODES)
def stop(
    services: ServicesArgument,
    kill: Annotated[
        bool,
        typer.Option(
            "--kill",
            help="SIGKILL instead of SIGTERM: it ends as a crash does, without its last "
            "heartbeat (no `stopping` beat for the cloud collector to wait for a replacement).",
        ),
    ] = False,
    json_output: JsonOption = False,
) -> None:
    """Stop services and keep them down.

    Stops each SERVICE of the aegis up running in this directory (SIGTERM: a clean stop, as a
    deploy's) and keeps it down, not restarted, until `aegis up start SERVICE`.
    """
    _ask("stop", services, kill=kill, json_output=json_output)


@app.command(epilog=CONTROL_EXIT_CODES)
def start(services: ServicesArgument, json_output: JsonOption = False) -> None:
    """Start services that were stopped.

    Starts each SERVICE again (stopped with `aegis up stop`, or waiting for its restart after a
    crash), the next once it is ready (/readyz; a minute at most).
    """
    _ask("start", services, json_output=json_output)


@app.command(epilog=CONTROL_EXIT_CODES)
def restart(
    services: Annotated[
        list[str] | None,
        typer.Argument(help="Services, as `aegis up` names them. None: every one of the stack."),
    ] = None,
    json_output: JsonOption = False,
) -> None:
    """Replace services' processes one by one, as a rolling deploy does.

    For each SERVICE in turn (every service of the stack when none is named, by name): SIGTERM
    to its process (a clean stop), a new process at once, with no back-off, and the next once
    the new one is ready (/readyz; a minute at most). A new process that is not ready ends the
    restart there.
    """
    _ask("restart", services or installed_services(), json_output=json_output)
