"""``aegis``: the one operator command. Subcommands for what operators do by hand.

Services add their subcommands (``simulate``, ``report``, ``jobs``, …) through the entry-point group
``aegis.commands`` (name -> a ``typer.Typer`` or a command function), so this library never imports
a service and an image with one service installed shows that service's commands.
"""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer

from aegis_cli.devices_cli import app as devices_app
from aegis_runtime.settings import AegisSettings
from aegis_storage.bootstrap import (
    bootstrap as run_bootstrap,
)
from aegis_storage.bootstrap import (
    describe_foundation,
    drift,
    expected_foundation,
)
from aegis_storage.clients import open_clients
from aegis_storage.errors import StorageError

app = typer.Typer(
    name="aegis",
    help="AEGIS factory-safety telemetry platform: operator commands.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """AEGIS factory-safety telemetry platform: operator commands."""


EXIT_FAILED = 1
EXIT_DRIFT = 3


@app.command()
def bootstrap(
    check: Annotated[
        bool, typer.Option("--check", help="Only compare with the contract; change nothing.")
    ] = False,
    reindex: Annotated[
        bool,
        typer.Option(
            "--reindex",
            help="Backfill the fleet index again (after a rollout during which writers of the "
            "previous version kept writing); a full scan of the table.",
        ),
    ] = False,
) -> None:
    """Create the bucket and table of the storage contract, idempotently.

    A second run changes nothing and says so. With --check, report drift and exit 3 if any.
    """
    settings = AegisSettings()
    try:
        code = asyncio.run(_bootstrap(settings, check=check, reindex=reindex))
    except StorageError as err:
        typer.echo(f"bootstrap failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    raise typer.Exit(code)


async def _bootstrap(settings: AegisSettings, *, check: bool, reindex: bool = False) -> int:
    target = settings.aws_endpoint_url or f"AWS {settings.region}"
    async with open_clients(settings.aws()) as clients:
        if not check:
            report = await run_bootstrap(
                clients, bucket=settings.bucket, table=settings.table, reindex=reindex
            )
            for step in report.steps:
                typer.echo(
                    f"  {step.action:<9} {step.resource:<40} {step.setting:<20} {step.detail}"
                )
            typer.echo(
                f"bootstrap: {'changes applied' if report.changed else 'nothing to change'} "
                f"({target})"
            )
        actual = await describe_foundation(clients, bucket=settings.bucket, table=settings.table)
    found = drift(
        actual,
        expected_foundation(bucket=settings.bucket, table=settings.table, region=settings.region),
    )
    for line in found:
        typer.echo(f"  drift     {line}", err=True)
    if check:
        typer.echo("bootstrap --check: " + ("drift found" if found else "matches the contract"))
    return EXIT_DRIFT if found else 0


@app.command()
def status(
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the rows as JSON (for scripts).")
    ] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh until Ctrl-C.")] = False,
    interval: Annotated[
        float, typer.Option(min=0.2, help="Seconds between refreshes with --watch.")
    ] = 2.0,
) -> None:
    """The fleet from the read model: level, score, reasons, freshness, pipeline per factory."""
    from aegis_cli.status import run_status  # noqa: PLC0415 - only this command needs it

    raise typer.Exit(
        run_status(AegisSettings(), json_output=json_output, watch=watch, interval=interval)
    )


@app.command()
def streams() -> None:
    """Create or update the NATS JetStream streams to the contract, once per deployment.

    Run it as the admin identity (AEGIS_NATS_USER=admin): services with identities run with
    AEGIS_NATS_MANAGE_STREAMS=false and only check that the streams exist.
    """
    from aegis_runtime.broker import (  # noqa: PLC0415 - only this command needs a broker
        BrokerError,
        StreamLimits,
        create_broker,
        ensure_streams,
    )

    settings = AegisSettings()

    async def run() -> dict[str, str]:
        broker = create_broker(settings, name="streams")
        try:
            return dict(await ensure_streams(broker, limits=StreamLimits.of(settings)))
        finally:
            await broker.stop()

    try:
        outcome = asyncio.run(run())
    except BrokerError as err:
        typer.echo(f"streams failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    for name, what in outcome.items():
        typer.echo(f"  {what:<9} {name}")


@app.command(name="nats-auth")
def nats_auth(
    passwords: Annotated[
        Path,
        typer.Argument(
            dir_okay=False,
            help="name=password lines, one per NATS identity; created, and completed, as needed.",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the block here instead of stdout.")
    ] = None,
) -> None:
    """Write nats-server's authorization block: every NATS identity with its permissions
    (aegis_cli.natsauth) and bcrypt hashes of the passwords file's passwords.

    Identities missing from the passwords file get a new random password there first (mode
    0600). Mount the file as the services' secret and the block as the server's.
    """
    from aegis_cli.natsauth import (  # noqa: PLC0415 - only this command needs bcrypt
        ensure_passwords,
        server_authorization,
    )

    try:
        block = server_authorization(ensure_passwords(passwords))
    except ValueError as err:
        typer.echo(f"nats-auth: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    if out is None:
        typer.echo(block, nl=False)
    else:
        out.write_text(block)
        typer.echo(f"nats-auth: wrote {out}", err=True)


app.add_typer(devices_app, name="devices")


def _load_plugins() -> None:
    for ep in entry_points(group="aegis.commands"):
        try:
            target = ep.load()
        except Exception as err:
            print(f"aegis: cannot load command {ep.name!r}: {err}", file=sys.stderr)
            continue
        if isinstance(target, typer.Typer):
            app.add_typer(target, name=ep.name)
        else:
            app.command(name=ep.name)(target)


_load_plugins()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
