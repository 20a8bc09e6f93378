"""``aegis tokens``: the dashboard's bearer tokens for wall screens and scripts, each with a
name, a role and the factories it may see; list them; revoke one.

A token is printed once, when it is created, and never kept: the read model keeps its SHA-256
digest, its role and scope, who created it and when. The dashboard takes a new or revoked token
within ``AEGIS_DASHBOARD_TOKENS_RELOAD_S`` (a revoked token's open live streams end then).
Exit codes: 0 done, 1 refused (the name is taken, no such token), 2 bad options, 5 DynamoDB not
reachable.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the commands.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from aegis_cli import exitcodes

if TYPE_CHECKING:
    from aegis_contracts.audit import Action, AuditEvent
    from aegis_contracts.people import TokenRecord
    from aegis_storage.tokens import TokenStore

app = typer.Typer(
    help="Dashboard tokens: wall screens and scripts, by name, role and factories.",
    no_args_is_help=True,
)

T = TypeVar("T")
ActorOption = Annotated[
    str | None,
    typer.Option("--as", help="Who acts (recorded as cli:NAME). Default: your login name."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _run(
    work: Callable[[TokenStore], Awaitable[T]], audited: Callable[[T], AuditEvent] | None = None
) -> T:
    """``work`` on the kept tokens; then, with ``audited``, the audit record of what it did."""
    from aegis_dashboard_api.settings import DashboardSettings  # noqa: PLC0415
    from aegis_storage.audit import AuditLog  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage.tokens import TokenStore  # noqa: PLC0415

    settings = DashboardSettings()

    async def run() -> T:
        async with open_clients(settings.aws()) as clients:
            done = await work(TokenStore(ReadModel(clients.items, settings.table)))
            if audited is not None:
                await AuditLog(ObjectStore(clients, settings.bucket)).record(audited(done))
            return done

    # a server that did not answer, or storage that failed, is said by `aegis` (exit 5 or 1)
    return asyncio.run(run())


def _now() -> datetime:
    from aegis_contracts.times import truncate_ms, utc_now  # noqa: PLC0415

    return truncate_ms(utc_now())


def _state(token: TokenRecord, now: datetime) -> str:
    if token.revoked_at is not None:
        return "revoked"
    return "usable" if token.usable(now) else "expired"


def _line(token: TokenRecord, now: datetime) -> str:
    until = f"until {token.expires_at:%Y-%m-%d %H:%M}Z" if token.expires_at else "no expiry"
    scope = ",".join(token.scope) or "-"
    return (
        f"{token.name}  {_state(token, now):<7} {token.role.value:<9} {scope}  {until}  "
        f"by {token.created_by} {token.created_at:%Y-%m-%d %H:%M}Z"
        + (f"  revoked by {token.revoked_by}" if token.revoked_by else "")
    )


def _audited(action: Action, by: str, now: datetime, detail: str) -> Callable[[object], AuditEvent]:
    """The audit record of a token command, once it is done."""
    import socket  # noqa: PLC0415

    from aegis_contracts.audit import AuditEvent, new_event_id  # noqa: PLC0415

    def event(done: object) -> AuditEvent:
        name = getattr(done, "name", None)
        return AuditEvent(
            id=new_event_id(now),
            at=now,
            action=action,
            outcome="ok",
            actor=by,
            subject=by,
            via="cli",
            target=name if isinstance(name, str) else None,
            detail=detail,
            source=socket.gethostname()[:100],
        )

    return event


def _fail(message: str, code: int = exitcodes.FAILED) -> typer.Exit:
    typer.echo(f"tokens: {message}", err=True)
    return typer.Exit(code)


def _expiry(now: datetime, duration: str | None, until: datetime | None) -> datetime | None:
    from datetime import UTC  # noqa: PLC0415

    from aegis_contracts.times import parse_duration  # noqa: PLC0415

    if duration is not None and until is not None:
        raise ValueError("--for or --until, not both")
    expires = until.replace(tzinfo=until.tzinfo or UTC) if until else None
    if duration is not None:
        expires = now + parse_duration(duration)
    if expires is not None and expires <= now:
        raise ValueError("it would expire before it is used")
    return expires


def _new_record(
    token: str,
    *,
    name: str,
    role: str,
    factories: str | None,
    expires: datetime | None,
    by: str,
    now: datetime,
) -> TokenRecord:
    from aegis_contracts.people import Role, TokenRecord, parse_scope  # noqa: PLC0415
    from aegis_dashboard_api.access import token_digest  # noqa: PLC0415

    try:
        as_role = Role(role.lower())
    except ValueError:
        raise ValueError(f"{role!r} is not a role (viewer, responder, admin)") from None
    scope = parse_scope(factories or "")
    if as_role is not Role.ADMIN and not scope:
        raise ValueError(f"a {as_role.value} sees only --factories (say '*' for the fleet)")
    return TokenRecord(
        name=name,
        digest=token_digest(token),
        role=as_role,
        scope=scope,
        created_at=now,
        created_by=by,
        expires_at=expires,
    )


@app.command()
def create(  # noqa: PLR0917 - typer's options are keyword-passed, declared as parameters
    name: Annotated[
        str, typer.Option(help="Its name (lower case: letters, digits, . _ -), never reused.")
    ],
    role: Annotated[str, typer.Option(help="viewer, responder or admin.")] = "viewer",
    factories: Annotated[
        str | None,
        typer.Option(
            help="The factories it may see: ids or patterns, comma-separated (plant-a-*); '*' "
            "for the fleet. Required for viewer and responder; an admin sees every factory."
        ),
    ] = None,
    duration: Annotated[
        str | None, typer.Option("--for", help="Usable for this long: 8h, 7d (at most 7 days).")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="Usable until then (UTC, ISO 8601), instead of --for.")
    ] = None,
    actor: ActorOption = None,
    json_output: JsonOption = False,
) -> None:
    """Create a token and print it, once (only its digest is kept)."""
    import secrets  # noqa: PLC0415

    from aegis_storage.tokens import TokenNameTaken  # noqa: PLC0415

    now = _now()
    token = secrets.token_urlsafe(32)
    try:
        record = _new_record(
            token,
            name=name,
            role=role,
            factories=factories,
            expires=_expiry(now, duration, until),
            by=f"cli:{actor or getpass.getuser()}",
            now=now,
        )
    except ValueError as err:  # pydantic's ValidationError is one: its last line says what
        raise _fail(str(err).strip().splitlines()[-1].strip(), exitcodes.USAGE) from None

    async def work(store: TokenStore) -> TokenRecord:
        await store.add(record)
        return record

    scope = ",".join(record.scope) or "every factory"
    detail = f"{record.role.value} of {scope}" + (
        f", until {record.expires_at:%Y-%m-%dT%H:%M}Z" if record.expires_at else ""
    )
    try:
        _run(work, _audited("token.create", record.created_by, now, detail))
    except TokenNameTaken as err:
        raise _fail(str(err)) from None
    if json_output:
        typer.echo(
            json.dumps({"token": token, **record.model_dump(mode="json", exclude={"digest"})})
        )
        return
    typer.echo(token)
    typer.echo(_line(record, now), err=True)
    typer.echo("tokens: the token is shown this once; keep it in a secret store", err=True)


@app.command("list")
def list_(json_output: JsonOption = False) -> None:
    """Every token, revoked and expired ones too (never the tokens themselves)."""
    now = _now()

    async def work(store: TokenStore) -> list[TokenRecord]:
        return await store.listed(now=now)

    found = _run(work)
    if json_output:
        rows = [t.model_dump(mode="json") | {"state": _state(t, now)} for t in found]
        typer.echo(json.dumps({"tokens": rows}))
        return
    for token in found:
        typer.echo(_line(token, now))
    typer.echo(f"tokens: {len(found)}")


@app.command()
def revoke(name: str, actor: ActorOption = None, json_output: JsonOption = False) -> None:
    """Revoke a token now: the dashboard refuses it within its reload period, and ends its live
    streams. Kept, as a record; a revoked name is not used again."""
    from aegis_contracts.errors import ContractError  # noqa: PLC0415
    from aegis_storage.errors import NotFound  # noqa: PLC0415

    now = _now()
    by = f"cli:{actor or getpass.getuser()}"

    async def work(store: TokenStore) -> TokenRecord:
        return await store.revoke(name, by=by, at=now)

    try:
        revoked = _run(work, _audited("token.revoke", by, now, ""))
    except (NotFound, ContractError):
        raise _fail(f"no token {name!r}") from None
    if json_output:
        typer.echo(revoked.model_dump_json())
        return
    typer.echo(_line(revoked, now))
