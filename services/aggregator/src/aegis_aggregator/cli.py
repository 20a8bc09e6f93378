"""``aegis aggregate``: re-aggregate 5-minute windows by hand (after a replay or a backfill).

Runs the same code as the service, for every window in ``[--from, --to)`` (aligned to 5 minutes),
without claims: an operator's re-run rewrites the same keys. Windows older than HISTORY#STATE
holds are read from the state_snapshot objects, so any range can be rewritten. ObjectCreated
events are published when NATS is reachable (``--no-events`` to skip). Exit codes: 0 done, 1 a
window failed, 2 bad options.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Annotated

import typer

from aegis_aggregator.aggregate import WINDOW, Aggregator
from aegis_aggregator.settings import AggregatorSettings
from aegis_contracts.errors import ContractError
from aegis_contracts.events import ObjectCreated
from aegis_contracts.ids import validate_factory_id
from aegis_contracts.times import floor_to, format_ts, parse_iso, utc_now
from aegis_runtime.broker import create_broker, ensure_deployed_streams, publish
from aegis_storage.clients import open_clients
from aegis_storage.errors import StorageError
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

EXIT_FAILED = 1


def windows_between(start: datetime, end: datetime) -> list[datetime]:
    """The 5-minute windows that overlap ``[start, end)``."""
    first = floor_to(start, WINDOW)
    count = max(0, -(-(end - first) // WINDOW))
    return [first + i * WINDOW for i in range(count)]


def aggregate(
    from_: Annotated[
        str, typer.Option("--from", help="Start, ISO-8601 UTC (e.g. 2026-11-30T03:00Z).")
    ],
    to: Annotated[str, typer.Option("--to", help="End (exclusive), ISO-8601 UTC.")],
    factory: Annotated[
        list[str] | None, typer.Option("--factory", help="Only this factory (repeatable).")
    ] = None,
    no_events: Annotated[
        bool, typer.Option("--no-events", help="Do not publish ObjectCreated events.")
    ] = False,
) -> None:
    """Re-aggregate the 5-minute windows of a time range into GRAPH#5M and processed_agg/."""
    try:
        start, end = parse_iso(from_, "--from"), parse_iso(to, "--to")
        factories = [validate_factory_id(f) for f in factory or []]
    except ContractError as err:
        raise typer.BadParameter(str(err)) from None
    if end <= start:
        raise typer.BadParameter("--to must be after --from")
    try:
        asyncio.run(_run(AggregatorSettings(), windows_between(start, end), factories, no_events))
    except StorageError as err:
        typer.echo(f"aggregate failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


async def _run(
    s: AggregatorSettings, windows: list[datetime], factories: list[str], no_events: bool
) -> None:
    broker = None if no_events else create_broker(s, name="aggregate-cli")

    async def announce(subject: str, event: ObjectCreated, *, msg_id: str) -> bool:
        return False if broker is None else await publish(broker, subject, event, msg_id=msg_id)

    try:
        if broker is not None:
            await ensure_deployed_streams(broker, s)
        async with open_clients(s.aws()) as clients:
            readmodel = ReadModel(clients.dynamodb, s.table)
            agg = Aggregator(
                readmodel=readmodel,
                store=ObjectStore(clients.s3, s.bucket),
                publish=announce,
                ttl=s.ttl,
                clock=utc_now,
                fresh_for=timedelta(seconds=s.fresh_for_s),
                fold_params=s.fold_params(),
                read_concurrency=s.aggregate_read_concurrency,
            )
            targets = factories or await readmodel.fleet_ids()
            for start in windows:
                run = await agg.run_window(start, targets, now=utc_now())
                typer.echo(
                    f"{format_ts(start)}  factories={run.factories}  samples={run.samples}"
                    + (f"  skipped={run.skipped_items}" if run.skipped_items else "")
                )
    finally:
        if broker is not None:
            await broker.stop()
    typer.echo(f"aggregate: {len(windows)} window(s) written")
