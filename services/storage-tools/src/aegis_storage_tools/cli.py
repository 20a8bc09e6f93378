"""``aegis migrate plan|run``, ``aegis replay``, ``aegis seal raw|schedule`` and ``aegis audit raw``.

Exit codes (:mod:`aegis_cli.exitcodes`): 0 done; 1 something failed (see the summary and the
journal); 2 bad options; 3 conflicts (destinations with another body, left untouched, their
sources kept); 5 S3/DynamoDB (or NATS, for a replay) not reachable. ``aegis audit raw`` has its
own: 0 intact, 3 not sealed, 4 differs, 1 error.

Import-light: ``aegis --help`` imports this module, so the SDKs are imported in the commands.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from aegis_cli import exitcodes
from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType, validate_factory_id
from aegis_contracts.keys import factory as key_factory
from aegis_contracts.times import parse_iso, utc_now

if TYPE_CHECKING:
    from aegis_contracts.events import RawArchived
    from aegis_storage_tools.audit import PartitionAudit
    from aegis_storage_tools.migrate import Plan, Summary
    from aegis_storage_tools.replay import ReplaySummary
    from aegis_storage_tools.rules import RuleSet
    from aegis_storage_tools.seal import SealResult
    from aegis_storage_tools.settings import StorageToolsSettings

EXIT_FAILED = exitcodes.FAILED
EXIT_CONFLICTS = exitcodes.FOUND

migrate_app = typer.Typer(
    name="migrate",
    help="Move legacy prefixes onto the storage contract: plan, then run.",
    no_args_is_help=True,
)

RulesOpt = Annotated[
    Path | None, typer.Option("--rules", help="A TOML file of [[rule]] tables.", exists=True)
]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        help="datasets-processing (datasets/->raw/, processing/->prod/) or aegis-legacy.",
    ),
]
SidecarsOpt = Annotated[
    str,
    typer.Option(
        "--sidecars",
        help=(
            "datasets-processing: where *.success checkpoints go: 'prod/' (default) or 'beside' "
            "the object."
        ),
    ),
]
ProgressOpt = Annotated[
    bool | None, typer.Option("--progress/--no-progress", help="Default: when stderr is a tty.")
]


def _rules(rules: Path | None, preset_name: str | None, sidecars: str) -> RuleSet:
    from aegis_storage_tools.rules import BESIDE, RuleError, load_rules, preset  # noqa: PLC0415

    if (rules is None) == (preset_name is None):
        raise typer.BadParameter("give exactly one of --rules FILE or --preset NAME")
    try:
        if rules is not None:
            return load_rules(rules)
        assert preset_name is not None
        return preset(preset_name, sidecars=sidecars if sidecars == BESIDE else "prod/")
    except RuleError as err:
        raise typer.BadParameter(str(err)) from None


@migrate_app.command("plan")
def migrate_plan(  # noqa: PLR0917 - typer options are parameters
    rules: RulesOpt = None,
    preset_name: PresetOpt = None,
    sidecars: SidecarsOpt = "prod/",
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the plan as one JSON document instead (for scripts)."),
    ] = False,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the plan as JSON to this file.")
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """What a run would move: objects and bytes per rule, conflicts, skips; per rule whether
    the storage-tools role may delete its sources (`run` refuses a rule it may not, unless
    --keep-sources); what --purge-versions would free (the sources' versions, listed). Changes
    nothing.

    Exit codes: 0 nothing in the way, 1 failed, 2 bad options, 3 conflicts, 5 S3 not reachable.
    """
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage_tools.migrate import plan  # noqa: PLC0415
    from aegis_storage_tools.progress import progress_bar  # noqa: PLC0415
    from aegis_storage_tools.rules import describe  # noqa: PLC0415
    from aegis_storage_tools.settings import StorageToolsSettings  # noqa: PLC0415

    ruleset = _rules(rules, preset_name, sidecars)
    settings = StorageToolsSettings()

    async def go() -> Plan:
        async with open_clients(settings.aws()) as clients:
            with progress_bar(progress) as tracker:
                store = ObjectStore(clients, settings.bucket)
                return await plan(store, ruleset, tracker, versions=True)

    try:
        the_plan = asyncio.run(go())
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"migrate plan failed: {err}", err)) from None
    code = EXIT_CONFLICTS if the_plan.conflicts else exitcodes.OK
    if out is not None:
        out.write_text(json.dumps(the_plan.as_dict(), indent=1), encoding="utf-8")
    if json_output:
        typer.echo(json.dumps(the_plan.as_dict() | {"exit_code": code}))
        raise typer.Exit(code)
    for line in describe(ruleset.rules):
        typer.echo(f"rule  {line}")
    for name, t in sorted(the_plan.totals().items()):
        typer.echo(
            f"  {name:<12} objects={t.objects} bytes={t.bytes} copy={t.copy} "
            f"already-there={t.present} conflicts={t.conflicts}"
        )
    for reason, n in sorted(the_plan.skip_counts().items()):
        typer.echo(f"  skipped {reason}: {n}")
    for line in the_plan.notes():
        typer.echo(line)
    for c in the_plan.conflicts:
        typer.echo(f"  CONFLICT {c.move.source} -> {c.detail}", err=True)
    raise typer.Exit(code)


@migrate_app.command("run")
def migrate_run(  # noqa: PLR0917 - typer options are parameters
    rules: RulesOpt = None,
    preset_name: PresetOpt = None,
    sidecars: SidecarsOpt = "prod/",
    no_delete: Annotated[
        bool, typer.Option("--no-delete", help="Copy and verify only; keep every source.")
    ] = False,
    keep_sources: Annotated[
        bool,
        typer.Option(
            "--keep-sources",
            help="Sources the storage-tools role may not delete (under raw/): copy and verify "
            "them, keep them, and write their deletes for the raw break-glass role (a folder "
            "beside the journal). Without it such a rule is refused before anything is copied.",
        ),
    ] = False,
    purge_versions: Annotated[
        bool,
        typer.Option(
            "--purge-versions",
            help="After the deletes, delete every version and delete marker of each source this "
            "run deleted (the bucket is versioned: they stay otherwise). Recorded in the journal.",
        ),
    ] = False,
    journal: Annotated[
        Path | None,
        typer.Option(
            "--journal",
            help="The journal/summary JSON (added to on re-runs); default: migrate-journal.json "
            "in the state directory (AEGIS_STATE_DIR).",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, max=512, help="Parallel copies.")
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """Copy (server-side), verify size and ETag, seal the raw partitions copied into, then
    delete the sources in batches of 1000.

    Every raw partition a verified copy lies in whose UTC day is over plus grace
    (AEGIS_SEAL_GRACE_HOURS) is sealed as `aegis seal raw` seals it (a supplement when it was
    sealed before); the others are the daily run's. Safe to interrupt: running it again
    finishes the job and does nothing twice. Prints one JSON summary.

    Exit codes: 0 done, 1 a copy, seal, delete or purge failed, 2 bad options (a rule whose sources
    the role may not delete, without --keep-sources, too: nothing done), 3 conflicts, 5 S3 not
    reachable."""
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage_tools.migrate import (  # noqa: PLC0415
        CopyOptions,
        Journal,
        Migrator,
        SourcesNotDeletable,
    )
    from aegis_storage_tools.progress import progress_bar  # noqa: PLC0415
    from aegis_storage_tools.seal import Sealer  # noqa: PLC0415
    from aegis_storage_tools.settings import StorageToolsSettings  # noqa: PLC0415

    ruleset = _rules(rules, preset_name, sidecars)
    for flag, given in (("--keep-sources", keep_sources), ("--purge-versions", purge_versions)):
        if given and no_delete:
            raise typer.BadParameter(f"{flag} is about the deletes: not with --no-delete")
    settings = StorageToolsSettings()
    journal = journal or settings.state_path("migrate-journal.json")
    options = CopyOptions(
        concurrency=concurrency or settings.migrate_concurrency,
        multipart_threshold=settings.migrate_multipart_threshold_bytes,
        part_bytes=settings.migrate_part_bytes,
    )

    async def go() -> Summary:
        async with open_clients(settings.aws()) as clients:
            with progress_bar(progress) as tracker:
                store = ObjectStore(clients, settings.bucket)
                migrator = Migrator(
                    store,
                    ruleset,
                    journal=Journal(journal),
                    options=options,
                    tracker=tracker,
                    sealer=Sealer(store, concurrency=settings.seal_concurrency),
                    seal_grace=timedelta(hours=settings.seal_grace_hours),
                )
                return await migrator.run(
                    delete=not no_delete, keep_sources=keep_sources, purge_versions=purge_versions
                )

    try:
        summary = asyncio.run(go())
    except SourcesNotDeletable as err:
        typer.echo(f"migrate run refused: {err}", err=True)
        raise typer.Exit(exitcodes.USAGE) from None
    except StorageError as err:
        raise typer.Exit(
            exitcodes.report(f"migrate run failed: {err} (journal: {journal})", err)
        ) from None
    typer.echo(json.dumps(asdict(summary) | {"journal": str(journal)}))
    if summary.handover:
        _print_handover(summary.handover, summary.kept)
    if summary.failed or summary.sealed.get("failed"):
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(EXIT_CONFLICTS if summary.conflicts else 0)


def _print_handover(folder: str, kept: int) -> None:
    """Tell the operator what to hand the break-glass role (stderr: stdout is the summary)."""
    commands = [
        line
        for line in Path(folder, "commands.sh").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith(("#", "set "))
    ]
    typer.echo(
        f"{kept} sources were copied and verified but kept: the storage-tools role may not "
        f"delete them. Their keys: {folder}/keys.txt. To delete them, run as the raw "
        f"break-glass role (with MFA): sh {folder}/commands.sh, that is:",
        err=True,
    )
    for line in commands[:3]:
        typer.echo(f"  {line}", err=True)
    if len(commands) > 3:
        typer.echo(f"  ... and {len(commands) - 3} more batches (commands.sh)", err=True)


def replay(  # noqa: PLR0917 - typer options are parameters
    factory: Annotated[str, typer.Option("--factory", help="The factory id.")],
    from_: Annotated[
        str, typer.Option("--from", help="Arrival time from, ISO-8601 UTC (2026-11-30T03:00Z).")
    ],
    to: Annotated[str, typer.Option("--to", help="Arrival time to (exclusive), ISO-8601 UTC.")],
    source: Annotated[
        list[SourceType] | None, typer.Option("--source", help="Only this source (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be re-queued; publish nothing.")
    ] = False,
    rate: Annotated[
        float | None, typer.Option(min=0, help="Messages per second at most (0: no limit).")
    ] = None,
    notify: Annotated[
        bool,
        typer.Option(
            "--notify",
            help="Let the replayed data alert and trigger workflows as new data would "
            "(by default a replay pages nobody and starts no job).",
        ),
    ] = False,
    progress: ProgressOpt = None,
) -> None:
    """Feed a factory's raw/ objects of a time range back to the processor, as ingest did.

    Same event and Nats-Msg-Id as ingest; the processor rewrites processed/ identically and never
    moves LATEST backwards. The events are marked replayed: no Slack message, no triggered job,
    unless --notify. Prints found / requeued / skipped / failed as one JSON document.

    Exit codes: 0 done, 1 something failed, 2 bad options, 5 NATS (within
    AEGIS_NATS_CONNECT_TIMEOUT_S) or S3 not reachable."""
    from aegis_runtime.bus import (  # noqa: PLC0415
        connect_broker,
        create_broker,
        ensure_deployed_streams,
        publish_raw_archived,
    )
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage_tools.progress import progress_bar  # noqa: PLC0415
    from aegis_storage_tools.replay import replay as run_replay  # noqa: PLC0415
    from aegis_storage_tools.settings import StorageToolsSettings  # noqa: PLC0415

    try:
        factory_id = validate_factory_id(factory)
        start, end = parse_iso(from_, "--from"), parse_iso(to, "--to")
    except ContractError as err:
        raise typer.BadParameter(str(err)) from None
    if end <= start:
        raise typer.BadParameter("--to must be after --from")
    settings = StorageToolsSettings()
    sources = source or list(SourceType)

    async def go() -> ReplaySummary:
        broker = None if dry_run else create_broker(settings, name="aegis-replay")
        try:
            publish = None
            if broker is not None:
                await connect_broker(broker, settings)
                await ensure_deployed_streams(broker, settings)
                connected = broker

                async def publish_one(event: RawArchived) -> bool:
                    return await publish_raw_archived(
                        connected, event, ack_timeout=settings.nats_ack_timeout_seconds
                    )

                publish = publish_one
            async with open_clients(settings.aws()) as clients:
                with progress_bar(progress) as tracker:
                    return await run_replay(
                        ObjectStore(clients, settings.bucket),
                        publish,
                        factory_id=factory_id,
                        sources=sources,
                        start=start,
                        end=end,
                        rate=settings.replay_rate if rate is None else rate,
                        concurrency=settings.replay_concurrency,
                        inline_max_bytes=settings.payload_inline_max_bytes,
                        tracker=tracker,
                        notify=notify,
                    )
        finally:
            if broker is not None:
                await broker.stop()

    try:
        summary = asyncio.run(go())
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"replay failed: {err}", err)) from None
    typer.echo(json.dumps(asdict(summary) | {"dry_run": dry_run, "notify": notify}))
    raise typer.Exit(EXIT_FAILED if summary.failed else 0)


seal_app = typer.Typer(
    name="seal",
    help="Seal raw/ partitions: a manifest per factory, source type and UTC day, written once.",
    no_args_is_help=True,
)
audit_app = typer.Typer(
    name="audit",
    help="Check raw/ partitions against their seals.",
    no_args_is_help=True,
)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON (for scripts).")]


def _day(text: str) -> date:
    try:
        return datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a date YYYY-MM-DD", param_hint="--date"
        ) from None


def _factory(name: str) -> str:
    try:
        return key_factory(name)
    except ContractError as err:
        raise typer.BadParameter(str(err), param_hint="--factory") from None


def _under(prefix: str | None) -> str:
    """A folder under raw/ to work below (``--prefix``); raw/ itself when none is given."""
    from aegis_contracts.keys import RAW_PREFIX  # noqa: PLC0415

    if prefix is None:
        return RAW_PREFIX
    folder = prefix if prefix.endswith("/") else f"{prefix}/"
    if not folder.startswith(RAW_PREFIX) or "//" in folder or ".." in folder.split("/"):
        raise typer.BadParameter(
            f"{prefix!r} is no folder under raw/ (e.g. raw/country=us/ or raw/factory-a/)",
            param_hint="--prefix",
        )
    return folder


PrefixOpt = Annotated[
    str | None,
    typer.Option(
        "--prefix",
        help="Only partitions under this folder of raw/: a dataset's (raw/country=us/) or a "
        "factory's (raw/factory-a/).",
    ),
]


@seal_app.command("raw")
def seal_raw(  # noqa: PLR0917 - typer options are parameters
    day: Annotated[
        str | None,
        typer.Option("--date", help="Seal this UTC day (YYYY-MM-DD); it must be over plus grace."),
    ] = None,
    factory: Annotated[
        list[str] | None,
        typer.Option("--factory", help="Only this factory (repeatable). Default: all under raw/."),
    ] = None,
    prefix: PrefixOpt = None,
    grace_hours: Annotated[
        float | None,
        typer.Option(
            "--grace-hours",
            min=0,
            help="Hours after a day ends before it is sealed (AEGIS_SEAL_GRACE_HOURS, 2).",
        ),
    ] = None,
    days: Annotated[
        int | None,
        typer.Option(
            "--days",
            min=1,
            max=366,
            help="Without --date: the newest due days to look at (AEGIS_SEAL_LOOKBACK_DAYS, 7).",
        ),
    ] = None,
    all_days: Annotated[
        bool,
        typer.Option(
            "--all-days",
            help="Every due day that has a partition, however old (lists the day folders): "
            "after a migration, or for a layout found in place.",
        ),
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Seal raw/ partitions whose UTC day is over plus grace.

    Writes raw_metadata.json at the root of each partition: one
    factory, source type and day (raw/F/SOURCE/yyyy=/mm=/dd=/), or a
    dataset partition (raw/country=us/category=news/date=YYYY-MM-DD/,
    where migrated legacy datasets land): counts, bytes, first and
    last arrival, schema versions, and every object's size, ETag and
    SHA-256 (one GET per object). Without --date: every partition of
    the newest --days due days; --all-days: of every due day found. A
    sealed partition gets a supplement, raw_metadata.late-NNNN.json,
    for the objects that arrived after its seal, if any. Nothing is
    rewritten (If-None-Match): running it again, or from two places at
    once, is safe. One summary line per partition.

    Exit codes: 0 done, 1 a partition failed, 2 bad options, 5 S3 not reachable.
    """
    from aegis_contracts.seal import days_to_seal, seal_due  # noqa: PLC0415
    from aegis_storage_tools.settings import StorageToolsSettings  # noqa: PLC0415

    settings = StorageToolsSettings()
    now = utc_now()
    grace = timedelta(hours=settings.seal_grace_hours if grace_hours is None else grace_hours)
    if sum(given is not None for given in (day, days, all_days or None)) > 1:
        raise typer.BadParameter("give one of --date, --days or --all-days")
    chosen: list[date] | None
    if day is not None:
        chosen = [_day(day)]
        if not seal_due(chosen[0], now, grace):
            raise typer.BadParameter(
                f"{day} is not over plus {grace} yet (UTC): its objects may still arrive",
                param_hint="--date",
            )
    elif all_days:
        chosen = None
    else:
        chosen = days_to_seal(now, grace, days or settings.seal_lookback_days)
    factories = [_factory(name) for name in factory] if factory else None
    under = _under(prefix)
    code = run_seal(settings, chosen, factories, under=under, grace=grace, json_output=json_output)
    raise typer.Exit(code)


def run_seal(
    settings: StorageToolsSettings,
    days: list[date] | None,
    factories: list[str] | None = None,
    *,
    under: str | None = None,
    grace: timedelta,
    json_output: bool = False,
    clock: Callable[[], datetime] = utc_now,
) -> int:
    """One ``aegis seal raw`` run (the command's, and each of ``aegis seal schedule``'s): seal,
    print one line per partition (or the JSON document), and return the exit code."""
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage_tools.seal import Outcome, Sealer  # noqa: PLC0415

    async def go() -> list[SealResult]:
        async with open_clients(settings.aws()) as clients:
            store = ObjectStore(clients, settings.bucket)
            sealer = Sealer(store, clock=clock, concurrency=settings.seal_concurrency)
            return await sealer.seal(days, factories, under=under or "raw/", grace=grace)

    try:
        results = asyncio.run(go())
    except StorageError as err:
        return exitcodes.report(f"seal raw failed: {err}", err)
    shown = [r for r in results if r.outcome is not Outcome.EMPTY]
    counts = Counter(r.outcome.value for r in results)
    looked_at = "every due day" if days is None else f"{len(days)} days"
    if json_output:
        typer.echo(
            json.dumps(
                {
                    "days": None if days is None else [d.isoformat() for d in days],
                    "partitions": [r.as_dict() for r in shown],
                    "totals": {o.value: counts.get(o.value, 0) for o in Outcome},
                }
            )
        )
    else:
        for r in shown:
            detail = [f"objects={r.objects} bytes={r.bytes}"] if r.key else []
            if r.ignored:
                detail.append(f"ignored={r.ignored} (no message; see aegis audit raw)")
            typer.echo(" ".join([f"{r.outcome.value:<18}", r.partition.prefix, *detail]))
            if r.error:
                typer.echo(f"  {r.error}", err=True)
        summary = " ".join(f"{o.value.replace(' ', '_')}={counts.get(o.value, 0)}" for o in Outcome)
        typer.echo(f"seal raw: {len(shown)} partitions of {looked_at}: {summary}")
    return EXIT_FAILED if counts.get(Outcome.FAILED.value) else 0


@seal_app.command("schedule")
def seal_schedule() -> None:
    """Run `aegis seal raw` every day at AEGIS_SEAL_SCHEDULE_UTC (02:30) and
    once at start (AEGIS_SEAL_ON_START), until stopped (SIGTERM, Ctrl-C).

    The seal-raw service of compose and of `make run`; a Kubernetes
    CronJob and an ECS EventBridge schedule run `aegis seal raw`
    themselves. Serves /healthz, /readyz and /metrics on
    AEGIS_HEALTH_PORT. A run that fails is logged (seal_schedule_failed)
    and tried again at the next time; the service keeps running.
    """
    from aegis_storage_tools.schedule import main  # noqa: PLC0415

    main()


@audit_app.command("raw")
def audit_raw(  # noqa: PLR0917 - typer options are parameters
    factory: Annotated[
        str | None, typer.Option("--factory", help="The factory id (or --prefix).")
    ] = None,
    day: Annotated[
        str | None,
        typer.Option("--date", help="The UTC day (YYYY-MM-DD); with --prefix, every day if none."),
    ] = None,
    prefix: PrefixOpt = None,
    source_type: Annotated[
        SourceType | None,
        typer.Option("--source-type", help="Only this source type. Default: every one found."),
    ] = None,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep", help="Also read every object again and check its SHA-256 (a GET each)."
        ),
    ] = False,
    json_output: JsonOpt = False,
) -> None:
    """Check raw/ partitions against their seals: a factory's of one day
    (--factory F --date D), or every partition under a folder
    (--prefix raw/country=us/ [--date D]), dataset partitions included.

    A listing gives each object's size and ETag; every object missing,
    added (in no manifest, e.g. a late arrival not sealed yet) or
    changed is named. --deep also reads every object again and checks
    the SHA-256 of its bytes.

    Exit codes (the worst partition decides): 0 intact, 3 not sealed
    (or nothing there), 4 differs (listed), 1 error (could not
    verify), 2 bad options, 5 S3 not reachable.
    """
    from aegis_storage.clients import open_clients  # noqa: PLC0415
    from aegis_storage.errors import StorageError  # noqa: PLC0415
    from aegis_storage.s3 import ObjectStore  # noqa: PLC0415
    from aegis_storage_tools.audit import Auditor, exit_code  # noqa: PLC0415
    from aegis_storage_tools.settings import StorageToolsSettings  # noqa: PLC0415

    if (factory is None) == (prefix is None):
        raise typer.BadParameter("give --factory (with --date) or --prefix")
    if factory is not None and day is None:
        raise typer.BadParameter("--factory needs --date", param_hint="--date")
    if prefix is not None and source_type is not None:
        raise typer.BadParameter("--source-type goes with --factory", param_hint="--source-type")
    factory_id = None if factory is None else _factory(factory)
    the_day = None if day is None else _day(day)
    under = None if prefix is None else _under(prefix)
    settings = StorageToolsSettings()

    async def go() -> list[PartitionAudit]:
        async with open_clients(settings.aws()) as clients:
            store = ObjectStore(clients, settings.bucket)
            auditor = Auditor(store, deep=deep, concurrency=settings.seal_concurrency)
            if under is not None:
                return await auditor.audit_under(under, the_day)
            assert factory_id is not None and the_day is not None
            return await auditor.audit(
                factory_id, the_day, None if source_type is None else [source_type]
            )

    try:
        audits = asyncio.run(go())
    except StorageError as err:
        raise typer.Exit(exitcodes.report(f"audit raw failed: {err}", err)) from None
    code = exit_code(audits)
    if json_output:
        typer.echo(json.dumps({"partitions": [a.as_dict() for a in audits], "exit_code": code}))
        raise typer.Exit(code)
    if not audits:
        where = under or factory_id
        when = f" on {the_day.isoformat()}" if the_day else ""
        typer.echo(f"not sealed: no raw/ partition of {where}{when}")
    for a in audits:
        _print_audit(a)
    raise typer.Exit(code)


def _print_audit(audit: PartitionAudit) -> None:
    what = f"objects={audit.objects} documents={audit.documents}" + (" deep" if audit.deep else "")
    typer.echo(f"{audit.status.value:<11} {audit.partition.prefix} {what}")
    if audit.error:
        typer.echo(f"  {audit.error}", err=True)
    if audit.diff is None:
        return
    for key in audit.diff.missing:
        typer.echo(f"  missing {key}")
    for key in audit.diff.added:
        typer.echo(f"  added   {key}")
    for change in audit.diff.changed:
        typer.echo(f"  changed {change.key} ({', '.join(change.what)})")
