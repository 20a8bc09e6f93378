"""``aegis report``: generate or backfill the daily reports of one KST date.

Runs the same code as the service for ``--date`` (or ``--today``: the day so far), for every
factory with data that day and ``cloud-infra``, or only the ``--factory`` targets; no claim is
taken, and a re-run rewrites the same bytes (hourly intermediates whose input is unchanged are
reused). ObjectCreated and ``report_generated`` events are published unless ``--no-events``.
Exit codes: 0 done, 1 a storage failure, 2 bad options.
"""

from __future__ import annotations

import asyncio
from datetime import date
from typing import Annotated

import typer

from aegis_contracts.errors import ContractError
from aegis_contracts.events import ObjectCreated, SystemEvent
from aegis_contracts.keys import report_target
from aegis_contracts.times import kst_report_date, utc_now
from aegis_reporter.app import build_reporter
from aegis_reporter.settings import ReporterSettings
from aegis_runtime.broker import create_broker, ensure_deployed_streams, publish
from aegis_storage.clients import open_clients
from aegis_storage.errors import StorageError

EXIT_FAILED = 1


def report_date(text: str | None, today: bool, now_date: date) -> date:
    """The date asked for: ``--date`` (not after today, KST), or today with ``--today``."""
    if text is None:
        if not today:
            raise typer.BadParameter("give --date YYYY-MM-DD or --today")
        return now_date
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"--date {text!r} is not YYYY-MM-DD") from None
    if day > now_date:
        raise typer.BadParameter(f"--date {day} is after today ({now_date} KST)")
    if today and day != now_date:
        raise typer.BadParameter(f"--today is {now_date} (KST), not {day}")
    return day


def report(
    date_: Annotated[
        str | None, typer.Option("--date", help="The KST report date, YYYY-MM-DD.")
    ] = None,
    factory: Annotated[
        list[str] | None,
        typer.Option("--factory", help="Only this factory, or cloud-infra (repeatable)."),
    ] = None,
    today: Annotated[
        bool, typer.Option("--today", help="Today (KST) so far; the same as --date of today.")
    ] = False,
    no_events: Annotated[
        bool, typer.Option("--no-events", help="Do not publish ObjectCreated/report events.")
    ] = False,
) -> None:
    """Generate (or backfill) the daily reports of one KST date into reports/daily/."""
    day = report_date(date_, today, kst_report_date(utc_now()))
    try:
        targets = [report_target(f) for f in factory or []]
    except ContractError as err:
        raise typer.BadParameter(str(err)) from None
    try:
        asyncio.run(_run(ReporterSettings(), day, targets, no_events))
    except StorageError as err:
        typer.echo(f"report failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


async def _run(s: ReporterSettings, day: date, targets: list[str], no_events: bool) -> None:
    broker = None if no_events else create_broker(s, name="report-cli")

    async def announce(subject: str, event: ObjectCreated | SystemEvent, *, msg_id: str) -> bool:
        return False if broker is None else await publish(broker, subject, event, msg_id=msg_id)

    try:
        if broker is not None:
            await ensure_deployed_streams(broker, s)
        async with open_clients(s.aws()) as clients:
            reporter = build_reporter(s, clients, announce, utc_now)
            chosen = targets or await reporter.targets()
            written = 0
            for target in chosen:
                typer.echo(f"{day}  {target}: reading …")
                run = await reporter.run_target(day, target)
                if run.report_key is None:
                    typer.echo(f"{day}  {target}: no processed data that day, nothing written")
                    continue
                written += 1
                typer.echo(
                    f"{day}  {target}: {run.worst_level or 'NO DATA'}, {run.incidents} incident(s); "
                    f"{run.objects} objects, hours read {len(run.hours_read)}, "
                    f"reused {len(run.hours_reused)}; {run.generator} -> "
                    f"s3://{s.bucket}/{run.report_key}"
                )
    finally:
        if broker is not None:
            await broker.stop()
    typer.echo(f"report: {written} report(s) written for {day}")
