"""``aegis report``: generate or backfill the daily reports of KST dates.

Runs the same code as the service for ``--date`` (or ``--today``: the day so far), or for every
date of ``--from``..``--to`` (a backfill, with a progress bar on stderr), for every factory with
data or alert incidents that day and ``cloud-infra`` (then the fleet's alert incidents,
fleet-incidents-summary.json), or only the ``--factory`` targets; no claim is taken, and a
re-run rewrites the same bytes (hourly intermediates whose input is unchanged are reused).
ObjectCreated and ``report_generated`` events are published unless ``--no-events``.
Exit codes: :mod:`aegis_cli.exitcodes`.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the command.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from datetime import date, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from aegis_cli import exitcodes
from aegis_cli.progress import progress_bar

if TYPE_CHECKING:
    from aegis_reporter.report import TargetRun
    from aegis_reporter.settings import ReporterSettings
    from aegis_reporter.summary import AlertSection

EXIT_FAILED = exitcodes.FAILED
MAX_DAYS = 366  # one --from/--to run at most: a year of reports


def _parse_day(text: str, option: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{option} {text!r} is not YYYY-MM-DD") from None


def report_date(text: str | None, today: bool, now_date: date) -> date:
    """The date asked for: ``--date`` (not after today, KST), or today with ``--today``."""
    if text is None:
        if not today:
            raise typer.BadParameter("give --date YYYY-MM-DD, --today, or --from and --to")
        return now_date
    day = _parse_day(text, "--date")
    if day > now_date:
        raise typer.BadParameter(f"--date {day} is after today ({now_date} KST)")
    if today and day != now_date:
        raise typer.BadParameter(f"--today is {now_date} (KST), not {day}")
    return day


def report_dates(
    date_: str | None,
    today: bool,
    from_: str | None,
    to: str | None,
    now_date: date,
) -> list[date]:
    """The dates asked for: one (``--date``, ``--today``) or ``--from``..``--to`` inclusive."""
    if from_ is None and to is None:
        return [report_date(date_, today, now_date)]
    if date_ is not None or today:
        raise typer.BadParameter("give --from/--to, or --date/--today, not both")
    if from_ is None or to is None:
        raise typer.BadParameter("--from and --to go together")
    first, last = _parse_day(from_, "--from"), _parse_day(to, "--to")
    if last < first:
        raise typer.BadParameter(f"--to {last} is before --from {first}")
    if last > now_date:
        raise typer.BadParameter(f"--to {last} is after today ({now_date} KST)")
    days = (last - first).days + 1
    if days > MAX_DAYS:
        raise typer.BadParameter(f"{days} days: at most {MAX_DAYS} in one run")
    return [first + timedelta(days=i) for i in range(days)]


def report(  # noqa: PLR0917 - a Typer command: one parameter per option
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
    from_: Annotated[
        str | None,
        typer.Option("--from", help="Backfill from this KST date, YYYY-MM-DD (with --to)."),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option("--to", help="Backfill to this KST date, inclusive (with --from)."),
    ] = None,
    no_events: Annotated[
        bool, typer.Option("--no-events", help="Do not publish ObjectCreated/report events.")
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print one JSON document at the end: {"days": [{"date", "targets": [...]}], '
            '"written"}.',
        ),
    ] = False,
    progress: Annotated[
        bool | None,
        typer.Option(
            "--progress/--no-progress", help="The bar on stderr. Default: when stderr is a tty."
        ),
    ] = None,
) -> None:
    """Generate (or backfill) the daily reports of KST dates into reports/daily/.

    One date (--date, --today) or every date from --from to --to, oldest first. A failure stops
    the run; the days reported before it stay written, and a re-run rewrites the same bytes.

    Exit codes: 0 done, 1 failed, 2 bad options, 5 NATS or S3/DynamoDB not reachable (NATS:
    within AEGIS_NATS_CONNECT_TIMEOUT_S; --no-events needs no NATS).
    """
    from aegis_contracts.errors import ContractError  # noqa: PLC0415
    from aegis_contracts.keys import report_target  # noqa: PLC0415
    from aegis_contracts.times import kst_report_date, utc_now  # noqa: PLC0415
    from aegis_reporter.settings import ReporterSettings  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415

    days = report_dates(date_, today, from_, to, kst_report_date(utc_now()))
    try:
        targets = [report_target(f) for f in factory or []]
    except ContractError as err:
        raise typer.BadParameter(str(err)) from None
    done: list[dict[str, Any]] = []
    try:
        asyncio.run(
            _run(
                ReporterSettings(),
                days,
                targets,
                no_events,
                done=done,
                quiet=json_output,
                progress=progress,
            )
        )
    except StorageError as err:
        where = f" on {done[-1]['date']}" if done and done[-1]["date"] else ""
        raise typer.Exit(exitcodes.report(f"report failed{where}: {err}", err)) from None
    written = sum(1 for d in done for t in d["targets"] if t["report_key"])
    if json_output:
        typer.echo(json.dumps({"days": done, "written": written}))
    elif len(days) == 1:
        typer.echo(f"report: {written} report(s) written for {days[0]}")
    else:
        typer.echo(f"report: {written} report(s) written for {days[0]} to {days[-1]}")


def _target_json(run: TargetRun) -> dict[str, Any]:
    row = asdict(run)
    row["day"] = run.day.isoformat()
    del row["alerts"]  # in the summary; the fleet's totals are made from it
    return row


async def _run(
    s: ReporterSettings,
    days: list[date],
    targets: list[str],
    no_events: bool,
    *,
    done: list[dict[str, Any]],
    quiet: bool = False,
    progress: bool | None = None,
) -> None:
    """Report ``days`` in order; ``done`` gets one entry per day as it starts (what a failure
    leaves behind is in it)."""
    from aegis_contracts.events import ObjectCreated, SystemEvent  # noqa: PLC0415
    from aegis_contracts.times import utc_now  # noqa: PLC0415
    from aegis_reporter.app import build_reporter  # noqa: PLC0415
    from aegis_runtime.bus import (  # noqa: PLC0415
        connect_broker,
        create_broker,
        ensure_deployed_streams,
        publish,
    )
    from aegis_storage.clients import open_clients  # noqa: PLC0415

    broker = None if no_events else create_broker(s, name="report-cli")

    async def announce(subject: str, event: ObjectCreated | SystemEvent, *, msg_id: str) -> bool:
        return False if broker is None else await publish(broker, subject, event, msg_id=msg_id)

    def say(line: str) -> None:
        if not quiet:
            typer.echo(line)

    try:
        if broker is not None:
            await connect_broker(broker, s)
            await ensure_deployed_streams(broker, s)
        async with open_clients(s.aws()) as clients:
            reporter = build_reporter(s, clients, announce, utc_now)
            chosen = targets or await reporter.targets()
            with progress_bar(len(days) * len(chosen), "report", progress) as bar:
                for day in days:
                    runs: list[dict[str, Any]] = []
                    done.append({"date": day.isoformat(), "targets": runs})
                    live = await reporter.live_incidents()
                    sections: dict[str, AlertSection | None] = {}
                    for target in chosen:
                        bar.describe(f"{day} {target}")
                        run = await reporter.run_target(day, target, live=live)
                        sections[run.target] = run.alerts
                        runs.append(_target_json(run))
                        bar.advance()
                        if run.report_key is None:
                            say(f"{day}  {target}: no processed data that day, nothing written")
                            continue
                        say(
                            f"{day}  {target}: {run.worst_level or 'NO DATA'}, "
                            f"{run.incidents} incident(s); {run.objects} objects, hours read "
                            f"{len(run.hours_read)}, reused {len(run.hours_reused)}; "
                            f"{run.generator} -> s3://{s.bucket}/{run.report_key}"
                        )
                    if not targets:  # the whole fleet: its alert incidents' totals too
                        key = await reporter.write_fleet(day, sections)
                        done[-1]["fleet_key"] = key
                        say(f"{day}  fleet alert incidents -> s3://{s.bucket}/{key}")
    finally:
        if broker is not None:
            await broker.stop()
