"""``aegis devices add|revoke|list|sync``: factory and service credentials of the production broker.

The new password goes to stdout alone, once (``PW=$(aegis devices add factory-a)``); everything
else goes to stderr. Nothing here logs a password. See :mod:`aegis_cli.devices`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from aegis_cli.devices import DeviceError, DeviceRegistry, Role

app = typer.Typer(
    name="devices",
    help="MQTT credentials of factories and services (the broker's password file and ACL).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

EXIT_REFUSED = 1
RELOAD_HINT = (
    "reload the broker so it reads the files again: kill -HUP <mosquitto pid> "
    "(compose: docker compose kill -s HUP mosquitto)"
)

PasswordFile = Annotated[
    Path,
    typer.Option(
        "--password-file",
        envvar="AEGIS_BROKER_PASSWORD_FILE",
        help="The devices' password_file; services go to the same path + '-services'.",
    ),
]
AclFile = Annotated[
    Path,
    typer.Option("--acl-file", envvar="AEGIS_BROKER_ACL_FILE", help="The broker's acl_file."),
]
DEFAULT_PASSWORD_FILE = Path("deploy/mosquitto/passwd")
DEFAULT_ACL_FILE = Path("deploy/mosquitto/acl")


@app.command()
def add(
    name: Annotated[
        str, typer.Argument(help="Factory id, or a service account name (aegis-ingest, ...).")
    ],
    role: Annotated[
        Role,
        typer.Option(
            help="factory: publish under aegis/NAME/, read its upload answers; ingest; "
            "monitor ($SYS)."
        ),
    ] = Role.FACTORY,
    password_file: PasswordFile = DEFAULT_PASSWORD_FILE,
    acl_file: AclFile = DEFAULT_ACL_FILE,
) -> None:
    """Register a device and print its new password (shown this once, never stored in clear)."""
    registry = DeviceRegistry(password_file, acl_file)
    try:
        password = registry.add(name, role)
    except DeviceError as err:
        typer.echo(f"devices add: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    typer.echo(password)
    allowed = {
        Role.FACTORY: f"publish to aegis/{name}/+ and read aegis/{name}/upload_url/+",
        Role.INGEST: "subscribe to aegis/+/+ and publish to aegis/+/upload_url/+",
        Role.MONITOR: "subscribe to $SYS/#",
    }[role]
    typer.echo(
        f"added {name} ({role.value}): may {allowed}. The password above is not shown again.\n"
        + RELOAD_HINT,
        err=True,
    )


@app.command()
def revoke(
    name: Annotated[str, typer.Argument(help="The device to remove.")],
    password_file: PasswordFile = DEFAULT_PASSWORD_FILE,
    acl_file: AclFile = DEFAULT_ACL_FILE,
) -> None:
    """Remove a device: after the broker reloads, it can no longer connect."""
    try:
        gone = DeviceRegistry(password_file, acl_file).revoke(name)
    except DeviceError as err:
        typer.echo(f"devices revoke: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    typer.echo(f"revoked {gone.name} ({gone.role.value}); {RELOAD_HINT}", err=True)


@app.command()
def sync(
    password_file: PasswordFile = DEFAULT_PASSWORD_FILE,
    acl_file: AclFile = DEFAULT_ACL_FILE,
) -> None:
    """Rewrite the ACL from each client's role, as this version grants it (after an upgrade);
    passwords are kept."""
    try:
        devices = DeviceRegistry(password_file, acl_file).sync()
    except DeviceError as err:
        typer.echo(f"devices sync: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    typer.echo(f"rewrote the ACL of {len(devices)} clients; {RELOAD_HINT}", err=True)


@app.command(name="list")
def list_devices(
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")] = False,
    password_file: PasswordFile = DEFAULT_PASSWORD_FILE,
    acl_file: AclFile = DEFAULT_ACL_FILE,
) -> None:
    """The registered devices and their roles (never their passwords)."""
    try:
        devices = DeviceRegistry(password_file, acl_file).devices()
    except DeviceError as err:
        typer.echo(f"devices list: {err}", err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    if json_output:
        typer.echo(json.dumps([{"name": d.name, "role": d.role.value} for d in devices]))
        return
    for d in devices:
        typer.echo(f"{d.name:<40} {d.role.value}")
    typer.echo(f"{len(devices)} devices", err=True)
