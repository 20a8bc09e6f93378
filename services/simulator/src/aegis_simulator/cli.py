"""``aegis simulate``: the device simulator and load generator (plugged into ``aegis`` through the
``aegis.commands`` entry point). Connection settings come from ``AEGIS_*``.

Exit codes: 0 a clean run, 1 a run with publish or upload errors, 2 bad options or an unreachable
broker (the message names the URL).

Import-light: ``aegis --help`` imports this module, so the MQTT client is imported in the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from aegis_cli import exitcodes
from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType
from aegis_simulator.domain import (
    DEFAULT_INFLIGHT,
    SCENARIO_SYNTAX,
    ScenarioError,
    ScenarioKind,
    factory_ids,
    parse_scenarios,
)

if TYPE_CHECKING:
    from aegis_runtime.settings import AegisSettings
    from aegis_simulator.runner import RunOptions, Stats

EXIT_ERRORS = exitcodes.FAILED
EXIT_UNREACHABLE = 2

T = TypeVar("T")


def simulate(  # noqa: PLR0917 - a Typer command: one parameter per option
    factories: Annotated[
        str | None,
        typer.Option(help="Comma-separated factory ids [default: factory-a,factory-b,factory-c]."),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option(min=1, max=10_000, help="Simulate N factories: factory-001 … factory-N."),
    ] = None,
    duration: Annotated[
        float | None,
        typer.Option(min=0.1, help="Stop after this many seconds [default: until Ctrl-C]."),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Messages per second for the whole fleet (the source mix is kept). "
            "Default: every factory publishes factory_state every 5 s, infra_state every 15 s, "
            "image_snapshot every 60 s (±10 % jitter).",
        ),
    ] = None,
    scenario: Annotated[
        list[str] | None,
        typer.Option(
            "--scenario",
            help=f"{escape(SCENARIO_SYNTAX)}, repeatable; e.g. fire@factory-b+30. "
            f"Names: {', '.join(k.value for k in ScenarioKind)}.",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for reproducible values.")] = None,
    qos: Annotated[int, typer.Option(min=0, max=2, help="MQTT QoS of every publish.")] = 1,
    no_images: Annotated[
        bool, typer.Option("--no-images", help="Publish no image snapshots (no S3 uploads).")
    ] = False,
    load: Annotated[
        bool,
        typer.Option(
            "--load", help="Benchmark: publish as fast as allowed, up to --rate, --inflight deep."
        ),
    ] = False,
    inflight: Annotated[
        int, typer.Option(min=1, max=10_000, help="Publishes awaiting their PUBACK at once.")
    ] = DEFAULT_INFLIGHT,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print the summary as one JSON document instead of a table."),
    ] = False,
) -> None:
    """Simulate factory edge gateways publishing MQTT telemetry (and a load generator).

    Image snapshots are uploaded to S3 under image_snapshot/ before their metadata is published.
    Ctrl-C stops cleanly and prints the summary.

    Exit codes: 0 a clean run, 1 publish or upload errors, 2 bad options or the broker not
    reachable (the message names the URL).
    """
    from aegis_runtime.settings import AegisSettings  # noqa: PLC0415 - import-light module
    from aegis_simulator.runner import BrokerUnreachable, RunOptions, Stats  # noqa: PLC0415

    settings = AegisSettings()
    try:
        fleet = factory_ids(factories, count)
        scenarios = parse_scenarios(scenario or [])
    except (ContractError, ScenarioError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    for spec in scenarios:
        if spec.factory_id is not None and spec.factory_id not in fleet:
            raise typer.BadParameter(
                f"scenario {spec.kind.value} names {spec.factory_id}, not in {','.join(fleet)}",
                param_hint="--scenario",
            )
    options = RunOptions(
        factories=fleet,
        scenarios=scenarios,
        duration_s=duration,
        rate=rate,
        seed=seed,
        qos=qos,
        images=not no_images,
        load=load,
        inflight=inflight,
    )
    console = Console(stderr=True)
    stats = Stats()
    try:
        _run_with_signals(lambda stop: _run_with_progress(options, settings, stop, stats, console))
    except BrokerUnreachable as err:
        typer.echo(f"simulate: {err}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if json_output:
        typer.echo(json.dumps(summary_json(stats, options)))
    else:
        Console().print(summary_table(stats, options))
    errors = sum(stats.errors.values())
    if errors:
        typer.echo(f"simulate: {errors} errors (see the log above)", err=True)
        raise typer.Exit(EXIT_ERRORS)


def _run_with_signals(main: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run ``main(stop)``; the first Ctrl-C/SIGTERM sets ``stop``, a second one cancels."""

    async def supervise() -> T:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        task = asyncio.ensure_future(main(stop))

        def on_signal() -> None:
            if stop.is_set():
                task.cancel()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        try:
            return await task
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    return asyncio.run(supervise())


async def _run_with_progress(
    options: RunOptions,
    settings: AegisSettings,
    stop: asyncio.Event,
    stats: Stats,
    console: Console,
) -> Stats:
    from aegis_runtime.redact import redact_url  # noqa: PLC0415 - import-light module
    from aegis_simulator.runner import MqttTarget, run  # noqa: PLC0415

    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn() if options.duration_s else TextColumn(""),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    ) as progress:
        task = progress.add_task(
            "connecting", total=options.duration_s or None, detail=redact_url(settings.mqtt_url)
        )
        connected = asyncio.Event()

        async def refresh() -> None:
            while True:
                await asyncio.sleep(0.5)
                if not connected.is_set():
                    continue
                errors = sum(stats.errors.values())
                progress.update(
                    task,
                    description="simulating" if not stop.is_set() else "stopping",
                    completed=stats.elapsed_s,
                    detail=f"{stats.total_sent} sent, {stats.rate:.1f} msg/s, {errors} errors",
                )

        ticker = asyncio.create_task(refresh())
        try:
            return await run(
                options,
                mqtt_url=MqttTarget.from_settings(settings),
                aws=settings.aws(),
                bucket=settings.bucket,
                stop=stop,
                stats=stats,
                on_connected=connected.set,
            )
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker


def summary_json(stats: Stats, options: RunOptions) -> dict[str, Any]:
    """What :func:`summary_table` shows, for scripts."""
    return {
        "run_id": options.run_id,
        "factories": len(options.factories),
        "mode": "load" if options.load else "scheduled",
        "elapsed_s": round(stats.elapsed_s, 3),
        "sent": {source.value: stats.sent.get(source.value, 0) for source in SourceType},
        "total": stats.total_sent,
        "rate": round(stats.rate, 3),
        "tags": dict(stats.tags),
        "images_uploaded": stats.images_uploaded,
        "image_bytes": stats.image_bytes,
        "puback_latency_ms": {"p50": stats.latency_ms(0.5), "p99": stats.latency_ms(0.99)},
        "errors": {kind: stats.errors.get(kind, 0) for kind in ("publish", "upload")},
    }


def summary_table(stats: Stats, options: RunOptions) -> Table:
    """Messages sent per source, rate achieved, errors: one row per source plus totals."""
    mode = "load" if options.load else "scheduled"
    table = Table(
        title=f"aegis simulate: {len(options.factories)} factories, {mode}, "
        f"{stats.elapsed_s:.1f} s, run {options.run_id}"
    )
    table.add_column("source")
    table.add_column("sent", justify="right")
    table.add_column("msg/s", justify="right")
    for source in SourceType:
        n = stats.sent.get(source.value, 0)
        table.add_row(
            source.value, str(n), f"{n / stats.elapsed_s:.2f}" if stats.elapsed_s else "-"
        )
    table.add_row("total", str(stats.total_sent), f"{stats.rate:.2f}", end_section=True)
    for tag in ("duplicate", "reordered", "clock_skew"):
        if stats.tags.get(tag):
            table.add_row(f"  of which {tag}", str(stats.tags[tag]), "")
    table.add_row("images uploaded", str(stats.images_uploaded), f"{stats.image_bytes} B")
    p50, p99 = stats.latency_ms(0.5), stats.latency_ms(0.99)
    if p50 is not None and p99 is not None:
        table.add_row("PUBACK latency p50/p99", f"{p50:.1f}/{p99:.1f} ms", "")
    for kind in ("publish", "upload"):
        table.add_row(f"errors: {kind}", str(stats.errors.get(kind, 0)), "")
    return table
