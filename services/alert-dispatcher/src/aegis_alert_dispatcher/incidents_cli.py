"""``aegis incidents``: the open incidents, one incident's timeline, acknowledge and resolve.

Reads and changes the incident items of the read model (``INCIDENT#{id}``) as the dashboard and
the Slack button do: every change is written only on the version read, so it never overwrites
what someone else did meanwhile, and announced on ``aegis.changes.incident`` (open dashboards
show it at once; without NATS it is written all the same). Who acts is ``cli:{--as}`` (default:
the login name).
Exit codes: 0 done, 1 no such incident or the change is refused (resolved already, no note),
2 bad options, 5 S3/DynamoDB not reachable.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the commands.
"""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from aegis_cli import exitcodes

if TYPE_CHECKING:
    from aegis_contracts.items import Incident
    from aegis_storage.incidents import IncidentStore

app = typer.Typer(
    help="Incidents: list the open ones, show one, acknowledge, resolve.", no_args_is_help=True
)

T = TypeVar("T")
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON, not a table.")]
ActorOption = Annotated[
    str | None,
    typer.Option("--as", help="Who acts (recorded as cli:NAME). Default: your login name."),
]


def _run(work: Callable[[IncidentStore], Awaitable[T]], *, announce: bool = False) -> T:
    """``announce``: the change is announced on ``aegis.changes.incident`` as the dispatcher's
    and the dashboard's are (open dashboards show it at once); without NATS it is written all
    the same, and screens show it at their next read."""
    from aegis_alert_dispatcher.settings import DispatcherSettings  # noqa: PLC0415
    from aegis_runtime.bus import BrokerUnavailable, connect_broker, create_broker  # noqa: PLC0415
    from aegis_runtime.service import change_sink  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.incidents import IncidentStore  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415

    settings = DispatcherSettings()

    async def run() -> T:
        broker = create_broker(settings, name="incidents-cli") if announce else None
        try:
            if broker is not None:
                try:
                    await connect_broker(broker, settings)
                except BrokerUnavailable as err:
                    typer.echo(f"incidents: not announced ({err})", err=True)
                    broker = None
            changes = None if broker is None else change_sink(broker, settings)
            async with open_clients(settings.aws()) as clients:
                store = IncidentStore(
                    ReadModel(clients.items, settings.table, changes=changes),
                    ObjectStore(clients, settings.bucket),
                )
                return await work(store)
        finally:
            if broker is not None:
                await broker.stop()

    # a server that did not answer, or storage that failed, is said by `aegis` (exit 5 or 1)
    return asyncio.run(run())


def _line(i: Incident) -> str:
    who = f" by {i.acknowledged_by}" if i.acknowledged_by else ""
    return (
        f"{i.incident_id}  {i.severity:<8} {i.state:<12} {i.scope:<20} {i.reason:<24} "
        f"triggered {i.triggered_at:%Y-%m-%d %H:%M:%S}Z level {i.level}{who}"
    )


def _now() -> Any:
    from aegis_contracts.times import utc_now  # noqa: PLC0415

    return utc_now()


@app.command("list")
def list_(
    factory: Annotated[str | None, typer.Option(help="Only this factory (or cloud-infra).")] = None,
    json_output: JsonOption = False,
) -> None:
    """The open incidents (triggered or acknowledged), oldest first."""

    async def work(store: IncidentStore) -> list[Incident]:
        return await store.open(now=_now())

    found = [i for i in _run(work) if factory is None or i.scope == factory]
    if json_output:
        typer.echo(json.dumps({"incidents": [i.model_dump(mode="json") for i in found]}))
        return
    for incident in found:
        typer.echo(_line(incident))
    typer.echo(f"incidents: {len(found)} open")


@app.command()
def show(incident_id: str, json_output: JsonOption = False) -> None:
    """One incident and its timeline (open, or closed within the read model's keeping)."""
    incident = _run(lambda store: _get(store, incident_id))
    if json_output:
        typer.echo(incident.model_dump_json())
        return
    typer.echo(_line(incident))
    for event in incident.timeline:
        extra = " ".join(
            f"{k}={v}"
            for k, v in (("receiver", event.receiver), ("outcome", event.outcome))
            if v is not None
        )
        typer.echo(
            f"  {event.at:%Y-%m-%d %H:%M:%S}Z  {event.kind:<16} {event.by} via {event.via}"
            f"  {extra}  {event.detail}".rstrip()
        )
    if incident.archived_key:
        typer.echo(f"  record: {incident.archived_key}")


async def _get(store: IncidentStore, incident_id: str) -> Incident:
    from aegis_contracts import keys  # noqa: PLC0415
    from aegis_contracts.errors import ContractError  # noqa: PLC0415

    try:
        keys.incident_id(incident_id)
    except ContractError as err:
        typer.echo(f"incidents: {err}", err=True)
        raise typer.Exit(exitcodes.USAGE) from None
    found = await store.get(incident_id)
    if found is None:
        typer.echo(f"incidents: no incident {incident_id}", err=True)
        raise typer.Exit(exitcodes.FAILED)
    return found


def _change(incident_id: str, what: str, transition: Callable[[Incident], Any]) -> None:
    from aegis_contracts.errors import ContractError  # noqa: PLC0415

    async def work(store: IncidentStore) -> tuple[Incident, bool]:
        await _get(store, incident_id)
        return await store.change(incident_id, transition)

    try:
        incident, changed = _run(work, announce=True)
    except ContractError as err:
        typer.echo(f"incidents: {err}", err=True)
        raise typer.Exit(exitcodes.FAILED) from None
    typer.echo(_line(incident))
    typer.echo(f"incidents: {what}" if changed else f"incidents: was {incident.state} already")


def _actor(name: str | None) -> str:
    return f"cli:{name or getpass.getuser()}"


@app.command()
def ack(
    incident_id: str,
    note: Annotated[str | None, typer.Option(help="What you are doing about it.")] = None,
    actor: ActorOption = None,
) -> None:
    """Acknowledge: someone is on it; escalation stops and reminders end."""
    from aegis_contracts import incidents  # noqa: PLC0415

    def transition(current: Incident) -> Incident | None:
        return incidents.acknowledge(current, by=_actor(actor), via="cli", at=_now(), note=note)

    _change(incident_id, "acknowledged", transition)


@app.command()
def resolve(
    incident_id: str,
    note: Annotated[str, typer.Option(help="Why it is closed (required).")],
    actor: ActorOption = None,
) -> None:
    """Resolve by hand, with a note (a false alarm, handled on site)."""
    from aegis_contracts import incidents  # noqa: PLC0415

    def transition(current: Incident) -> Incident | None:
        return incidents.resolve(current, by=_actor(actor), via="cli", at=_now(), note=note)

    _change(incident_id, "resolved", transition)
