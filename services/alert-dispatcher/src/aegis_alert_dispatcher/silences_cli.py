"""``aegis silences``: hold back the notifications of matching incidents for a while
(maintenance), list them, end one early.

A silence is checked by the guard before it is written (docs/alerting.md): one that could hide a
CRITICAL incident needs ``--reason``, lasts at most 8 hours and names a factory or a reason.
Exit codes: 0 done, 1 refused (every problem on stderr) or no such silence, 2 bad options,
5 DynamoDB not reachable.

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
    from aegis_contracts.silences import Silence
    from aegis_storage.silences import SilenceStore

app = typer.Typer(
    help="Silences: hold back notifications during maintenance.", no_args_is_help=True
)

T = TypeVar("T")
ActorOption = Annotated[
    str | None,
    typer.Option("--as", help="Who acts (recorded as cli:NAME). Default: your login name."),
]


def _run(work: Callable[[SilenceStore], Awaitable[T]]) -> T:
    from aegis_alert_dispatcher.settings import DispatcherSettings  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415
    from aegis_storage.silences import SilenceStore  # noqa: PLC0415

    settings = DispatcherSettings()

    async def run() -> T:
        async with open_clients(settings.aws()) as clients:
            return await work(SilenceStore(ReadModel(clients.items, settings.table)))

    # a server that did not answer, or storage that failed, is said by `aegis` (exit 5 or 1)
    return asyncio.run(run())


def _now() -> datetime:
    from aegis_contracts.times import utc_now  # noqa: PLC0415

    return utc_now()


def _line(s: Silence, now: datetime) -> str:
    when = "active" if s.active(now) else ("ended" if s.ends <= now else "pending")
    matchers = ", ".join(str(m) for m in s.matchers)
    return (
        f"{s.id}  {when:<7} {s.starts_at:%Y-%m-%d %H:%M}Z -> {s.ends:%Y-%m-%d %H:%M}Z  "
        f"{matchers}  by {s.created_by}" + (f"  ({s.reason})" if s.reason else "")
    )


@app.command()
def add(  # noqa: PLR0917 - typer's options are keyword-passed, declared as parameters
    match: Annotated[
        list[str],
        typer.Option(
            "--match", "-m", help="A matcher: factory=plant-a-1, reason=~CO_.*, severity!=CRITICAL"
        ),
    ],
    duration: Annotated[
        str | None, typer.Option("--for", help="How long: 30m, 2h, 1d (or --until).")
    ] = None,
    until: Annotated[
        datetime | None, typer.Option(help="When it ends (UTC, ISO 8601), instead of --for.")
    ] = None,
    reason: Annotated[str, typer.Option(help="Why (required when it could hide a CRITICAL).")] = "",
    actor: ActorOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the silence as JSON.")] = False,
) -> None:
    """Create a silence, starting now."""
    from datetime import UTC  # noqa: PLC0415

    from aegis_contracts.silences import SilenceRefused, new_silence  # noqa: PLC0415
    from aegis_contracts.times import parse_duration  # noqa: PLC0415

    now = _now()
    try:
        silence = new_silence(
            matchers=match,
            by=f"cli:{actor or getpass.getuser()}",
            now=now,
            reason=reason,
            ends_at=until.replace(tzinfo=until.tzinfo or UTC) if until else None,
            duration=parse_duration(duration) if duration is not None else None,
        )
    except SilenceRefused as err:
        for problem in err.problems:
            typer.echo(f"silences: refused: {problem}", err=True)
        raise typer.Exit(exitcodes.FAILED) from None
    except ValueError as err:
        typer.echo(f"silences: {err}", err=True)
        raise typer.Exit(exitcodes.USAGE) from None

    async def work(store: SilenceStore) -> None:
        await store.add(silence)

    _run(work)
    if json_output:
        typer.echo(silence.model_dump_json())
        return
    typer.echo(_line(silence, now))


@app.command("list")
def list_(
    ended: Annotated[bool, typer.Option(help="Also those ended in the last 30 days.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """The silences in force or to come."""
    now = _now()

    async def work(store: SilenceStore) -> list[Silence]:
        return await store.listed(now=now)

    found = [s for s in _run(work) if ended or s.ends > now]
    if json_output:
        typer.echo(json.dumps({"silences": [s.model_dump(mode="json") for s in found]}))
        return
    for silence in found:
        typer.echo(_line(silence, now))
    typer.echo(f"silences: {len(found)}")


@app.command()
def expire(silence_id: str, actor: ActorOption = None) -> None:
    """End a silence now; the incidents it held back are notified if still firing."""
    from aegis_contracts.errors import ContractError  # noqa: PLC0415
    from aegis_storage.errors import NotFound  # noqa: PLC0415

    now = _now()

    async def work(store: SilenceStore) -> Silence:
        return await store.end(silence_id, by=f"cli:{actor or getpass.getuser()}", at=now)

    try:
        ended = _run(work)
    except (NotFound, ContractError):
        typer.echo(f"silences: no silence {silence_id}", err=True)
        raise typer.Exit(exitcodes.FAILED) from None
    typer.echo(_line(ended, now))
