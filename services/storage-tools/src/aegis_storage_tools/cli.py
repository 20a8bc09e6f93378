"""``aegis migrate plan|run`` and ``aegis replay``.

Exit codes: 0 done; 1 something failed (see the summary and the journal); 2 bad options;
3 conflicts (destinations with another body, left untouched, their sources kept).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from aegis_contracts.errors import ContractError
from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType, validate_factory_id
from aegis_contracts.times import parse_iso
from aegis_runtime.broker import create_broker, ensure_deployed_streams, publish_raw_archived
from aegis_storage.clients import open_clients
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.migrate import CopyOptions, Journal, Migrator, Plan, Summary, plan
from aegis_storage_tools.progress import progress_bar
from aegis_storage_tools.replay import ReplaySummary
from aegis_storage_tools.replay import replay as run_replay
from aegis_storage_tools.rules import BESIDE, RuleError, RuleSet, describe, load_rules, preset
from aegis_storage_tools.settings import StorageToolsSettings

EXIT_FAILED = 1
EXIT_CONFLICTS = 3

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
def migrate_plan(
    rules: RulesOpt = None,
    preset_name: PresetOpt = None,
    sidecars: SidecarsOpt = "prod/",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the plan as JSON here.")
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """What a run would move: objects and bytes per rule, conflicts, skips. Changes nothing."""
    ruleset = _rules(rules, preset_name, sidecars)
    settings = StorageToolsSettings()

    async def go() -> Plan:
        async with open_clients(settings.aws()) as clients:
            with progress_bar(progress) as tracker:
                return await plan(ObjectStore(clients.s3, settings.bucket), ruleset, tracker)

    try:
        the_plan = asyncio.run(go())
    except StorageError as err:
        typer.echo(f"migrate plan failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    for line in describe(ruleset.rules):
        typer.echo(f"rule  {line}")
    for name, t in sorted(the_plan.totals().items()):
        typer.echo(
            f"  {name:<12} objects={t.objects} bytes={t.bytes} copy={t.copy} "
            f"already-there={t.present} conflicts={t.conflicts}"
        )
    for reason, n in sorted(the_plan.skip_counts().items()):
        typer.echo(f"  skipped {reason}: {n}")
    for c in the_plan.conflicts:
        typer.echo(f"  CONFLICT {c.move.source} -> {c.detail}", err=True)
    if json_out is not None:
        json_out.write_text(json.dumps(the_plan.as_dict(), indent=1), encoding="utf-8")
    raise typer.Exit(EXIT_CONFLICTS if the_plan.conflicts else 0)


@migrate_app.command("run")
def migrate_run(  # noqa: PLR0917 - typer options are parameters
    rules: RulesOpt = None,
    preset_name: PresetOpt = None,
    sidecars: SidecarsOpt = "prod/",
    no_delete: Annotated[
        bool, typer.Option("--no-delete", help="Copy and verify only; keep every source.")
    ] = False,
    journal: Annotated[
        Path, typer.Option("--journal", help="The journal/summary JSON (added to on re-runs).")
    ] = Path("aegis-migrate-journal.json"),
    concurrency: Annotated[
        int | None, typer.Option(min=1, max=512, help="Parallel copies.")
    ] = None,
    progress: ProgressOpt = None,
) -> None:
    """Copy (server-side), verify size and ETag, then delete the sources in batches of 1000.

    Safe to interrupt: running it again finishes the job and does nothing twice."""
    ruleset = _rules(rules, preset_name, sidecars)
    settings = StorageToolsSettings()
    options = CopyOptions(
        concurrency=concurrency or settings.migrate_concurrency,
        multipart_threshold=settings.migrate_multipart_threshold_bytes,
        part_bytes=settings.migrate_part_bytes,
    )

    async def go() -> Summary:
        async with open_clients(settings.aws()) as clients:
            with progress_bar(progress) as tracker:
                migrator = Migrator(
                    ObjectStore(clients.s3, settings.bucket),
                    ruleset,
                    journal=Journal(journal),
                    options=options,
                    tracker=tracker,
                )
                return await migrator.run(delete=not no_delete)

    try:
        summary = asyncio.run(go())
    except StorageError as err:
        typer.echo(f"migrate run failed: {err} (journal: {journal})", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(json.dumps(asdict(summary) | {"journal": str(journal)}))
    if summary.failed:
        raise typer.Exit(EXIT_FAILED)
    raise typer.Exit(EXIT_CONFLICTS if summary.conflicts else 0)


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
    unless --notify. Prints found / requeued / skipped / failed."""
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
                await broker.connect()
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
                        ObjectStore(clients.s3, settings.bucket),
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
        typer.echo(f"replay failed: {err}", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    typer.echo(json.dumps(asdict(summary) | {"dry_run": dry_run, "notify": notify}))
    raise typer.Exit(EXIT_FAILED if summary.failed else 0)
