"""``aegis aggregate``: re-aggregate 5-minute windows by hand (after a replay or a backfill).

Runs the same code as the service, for every window in ``[--from, --to)`` (aligned to 5 minutes),
without claims: an operator's re-run rewrites the same keys. Windows older than HISTORY#STATE
holds are read from the state_snapshot objects, so any range can be rewritten. ObjectCreated
events and the change events of the windows written are published as the service's are
(``--no-events`` to skip both). Exit codes: :mod:`aegis_cli.exitcodes`.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the command.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aegis_cli import exitcodes
from aegis_contracts.keys import GRAPH_BUCKET as WINDOW  # aegis_aggregator.aggregate.WINDOW
from aegis_contracts.times import floor_to

if TYPE_CHECKING:
    from aegis_aggregator.settings import AggregatorSettings

EXIT_FAILED = exitcodes.FAILED


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
        bool, typer.Option("--no-events", help="Do not publish ObjectCreated or change events.")
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document at the end: {"windows": [{"start", "factories", '
            '"samples", "skipped"}], "written"}.',
        ),
    ] = False,
) -> None:
    """Re-aggregate the 5-minute windows of a time range into GRAPH#5M and processed_agg/.

    Exit codes: 0 done, 1 failed, 2 bad options, 5 NATS or S3/DynamoDB not reachable (NATS:
    within AEGIS_NATS_CONNECT_TIMEOUT_S; --no-events needs no NATS).
    """
    from aegis_aggregator.settings import AggregatorSettings  # noqa: PLC0415
    from aegis_contracts.errors import ContractError  # noqa: PLC0415
    from aegis_contracts.ids import validate_factory_id  # noqa: PLC0415
    from aegis_contracts.times import parse_iso  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415

    try:
        start, end = parse_iso(from_, "--from"), parse_iso(to, "--to")
        factories = [validate_factory_id(f) for f in factory or []]
    except ContractError as err:
        raise typer.BadParameter(str(err)) from None
    if end <= start:
        raise typer.BadParameter("--to must be after --from")
    try:
        rows = asyncio.run(
            _run(
                AggregatorSettings(),
                windows_between(start, end),
                factories,
                no_events,
                quiet=json_output,
            )
        )
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"aggregate failed: {err}", err)) from None
    if json_output:
        typer.echo(json.dumps({"windows": rows, "written": len(rows)}))
    else:
        typer.echo(f"aggregate: {len(rows)} window(s) written")


async def _run(
    s: AggregatorSettings,
    windows: list[datetime],
    factories: list[str],
    no_events: bool,
    *,
    quiet: bool = False,
) -> list[dict[str, Any]]:
    from aegis_aggregator.aggregate import Aggregator  # noqa: PLC0415
    from aegis_contracts.events import ObjectCreated  # noqa: PLC0415
    from aegis_contracts.times import format_ts, utc_now  # noqa: PLC0415
    from aegis_runtime.bus import (  # noqa: PLC0415
        connect_broker,
        create_broker,
        ensure_deployed_streams,
        publish,
    )
    from aegis_runtime.service import change_sink  # noqa: PLC0415
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415

    rows: list[dict[str, Any]] = []
    broker = None if no_events else create_broker(s, name="aggregate-cli")

    async def announce(subject: str, event: ObjectCreated, *, msg_id: str) -> bool:
        return False if broker is None else await publish(broker, subject, event, msg_id=msg_id)

    try:
        if broker is not None:
            await connect_broker(broker, s)
            await ensure_deployed_streams(broker, s)
        async with open_clients(s.aws()) as clients:
            # its windows and cleared late-data markers are announced as the service's are
            changes = None if broker is None else change_sink(broker, s)
            readmodel = ReadModel(clients.items, s.table, changes=changes)
            agg = Aggregator(
                readmodel=readmodel,
                store=ObjectStore(clients, s.bucket),
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
                rows.append(
                    {
                        "start": format_ts(start),
                        "factories": run.factories,
                        "samples": run.samples,
                        "skipped": run.skipped_items,
                    }
                )
                if not quiet:
                    typer.echo(
                        f"{format_ts(start)}  factories={run.factories}  samples={run.samples}"
                        + (f"  skipped={run.skipped_items}" if run.skipped_items else "")
                    )
    finally:
        if broker is not None:
            await broker.stop()
    return rows
