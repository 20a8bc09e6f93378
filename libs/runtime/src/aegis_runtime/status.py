"""``aegis status``: the fleet from the read model's FACTORY LATEST items, as a table or JSON.

The formatting is pure (items and ``now`` in, rows out); :func:`load_fleet` is the one read.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from aegis_contracts.errors import ContractError
from aegis_contracts.times import Clock, format_ts, parse_ts, utc_now
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.errors import NotFound, StorageError
from aegis_storage.readmodel import ReadModel

if TYPE_CHECKING:
    from aegis_runtime.settings import AegisSettings

EXIT_FAILED = 1

LEVEL_STYLE = {"NORMAL": "green", "WARNING": "yellow", "CRITICAL": "bold red"}
PIPELINE_STYLE = {"OK": "green", "DEGRADED": "yellow", "STALE": "yellow", "OFFLINE": "red"}
_LEVEL_ORDER = {"CRITICAL": 0, "WARNING": 1, "NORMAL": 2}


@dataclass(frozen=True, slots=True)
class FleetRow:
    factory_id: str
    level: str
    score: float | None
    reasons: list[str]
    last_factory_state_at: str | None
    age_s: float | None
    pipeline: str
    updated_at: str | None

    @property
    def freshness(self) -> str:
        return format_age(self.age_s)


def format_age(seconds: float | None) -> str:
    """``4s ago``, ``3m ago``, ``2h ago``, ``5d ago``; ``never`` without data; ``in 9m`` ahead."""
    if seconds is None:
        return "never"
    if seconds < 0:
        return f"in {_span(-seconds)}"
    return f"{_span(seconds)} ago"


def _span(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86_400:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def _age(stamp: Any, now: datetime) -> tuple[str | None, float | None]:
    if not isinstance(stamp, str):
        return None, None
    try:
        return stamp, (now - parse_ts(stamp)).total_seconds()
    except ContractError:
        return stamp, None


def fleet_row(item: Mapping[str, Any], now: datetime) -> FleetRow:
    """One FACTORY LATEST item as a row; missing field groups show as ``-`` / ``NO_DATA``."""
    factory_id = str(item.get("factory_id") or str(item.get("pk", "")).removeprefix("FACTORY#"))
    raw_risk = item.get("risk")
    risk: Mapping[str, Any] = raw_risk if isinstance(raw_risk, Mapping) else {}
    pipeline = item.get("pipeline_status")
    reasons = [
        str(r.get("code"))
        for r in (risk.get("reasons") or [])
        if isinstance(r, Mapping) and r.get("code")
    ]
    score = risk.get("score")
    stamp, age = _age(item.get("last_factory_state_at"), now)
    return FleetRow(
        factory_id=factory_id,
        level=str(risk.get("level") or "-"),
        score=float(score) if isinstance(score, int | float) else None,
        reasons=reasons,
        last_factory_state_at=stamp,
        age_s=age,
        pipeline=str(pipeline.get("status") or "-") if isinstance(pipeline, Mapping) else "NO_DATA",
        updated_at=item.get("updated_at") if isinstance(item.get("updated_at"), str) else None,
    )


def fleet_rows(items: Iterable[Mapping[str, Any]], now: datetime) -> list[FleetRow]:
    """Rows sorted worst level first, then by factory id."""
    rows = [fleet_row(item, now) for item in items]
    return sorted(rows, key=lambda r: (_LEVEL_ORDER.get(r.level, 3), r.factory_id))


def rows_json(rows: Iterable[FleetRow]) -> list[dict[str, Any]]:
    return [{**asdict(row), "freshness": row.freshness} for row in rows]


def fleet_table(rows: list[FleetRow], *, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for name, justify in (
        ("factory", "left"),
        ("level", "left"),
        ("score", "right"),
        ("reasons", "left"),
        ("freshness", "right"),
        ("pipeline", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            row.factory_id,
            Text(row.level, style=LEVEL_STYLE.get(row.level, "")),
            "-" if row.score is None else f"{row.score:g}",
            ", ".join(row.reasons) or "-",
            row.freshness,
            Text(row.pipeline, style=PIPELINE_STYLE.get(row.pipeline, "")),
        )
    if not rows:
        table.add_row("(no factories in the read model yet)", "", "", "", "", "")
    return table


def summary_line(rows: list[FleetRow]) -> str:
    counts = {level: sum(r.level == level for r in rows) for level in _LEVEL_ORDER}
    return (
        f"{len(rows)} factories: {counts['CRITICAL']} critical, {counts['WARNING']} warning, "
        f"{counts['NORMAL']} normal"
    )


async def load_fleet(aws: AwsConfig, table: str) -> list[dict[str, Any]]:
    async with open_clients(aws) as clients:
        return await ReadModel(clients.dynamodb, table).factory_latest_items()


def run_status(
    settings: AegisSettings,
    *,
    json_output: bool = False,
    watch: bool = False,
    interval: float = 2.0,
    clock: Clock = utc_now,
) -> int:
    """The ``aegis status`` command: an exit code, output on stdout, errors on stderr."""
    try:
        if watch:
            asyncio.run(_watch(settings, interval, json_output, clock))
        else:
            items = asyncio.run(load_fleet(settings.aws(), settings.table))
            _print(fleet_rows(items, clock()), json_output, settings, clock())
    except KeyboardInterrupt:
        return 0
    except NotFound as err:
        print(
            f"status: table {settings.table} not found at {_where(settings)} ({err}); "
            "run `aegis bootstrap` first",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except (StorageError, BotoCoreError) as err:
        print(f"status: cannot read the read model at {_where(settings)}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def _where(settings: AegisSettings) -> str:
    return settings.aws_endpoint_url or f"AWS {settings.region}"


def _title(settings: AegisSettings, now: datetime) -> str:
    return f"AEGIS fleet ({settings.table} @ {_where(settings)}) at {format_ts(now)}"


def _print(rows: list[FleetRow], json_output: bool, settings: AegisSettings, now: datetime) -> None:
    if json_output:
        print(json.dumps(rows_json(rows), indent=2), flush=True)
        return
    console = Console()
    console.print(fleet_table(rows, title=_title(settings, now)))
    console.print(summary_line(rows))


async def _watch(settings: AegisSettings, interval: float, json_output: bool, clock: Clock) -> None:
    """Refresh every ``interval`` seconds: a live table on a terminal, one JSON document per line
    with --json (or when not a terminal)."""
    console = Console()
    async with open_clients(settings.aws()) as clients:
        model = ReadModel(clients.dynamodb, settings.table)
        if json_output or not console.is_terminal:
            while True:
                rows = fleet_rows(await model.factory_latest_items(), clock())
                if json_output:
                    print(json.dumps(rows_json(rows)), flush=True)
                else:
                    _print(rows, False, settings, clock())
                await asyncio.sleep(interval)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                now = clock()
                rows = fleet_rows(await model.factory_latest_items(), now)
                live.update(
                    Group(fleet_table(rows, title=_title(settings, now)), summary_line(rows)),
                    refresh=True,
                )
                await asyncio.sleep(interval)
