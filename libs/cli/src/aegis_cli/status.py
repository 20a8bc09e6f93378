"""``aegis status``: the fleet from the read model's FACTORY LATEST items and the platform's own
health from CLOUD#infra LATEST, as tables or one JSON document (``{"factories": [...],
"cloud_infra": {...}}``).

The formatting is pure (items and ``now`` in, rows out); :func:`load_status` is the one read.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from aegis_cli import exitcodes
from aegis_contracts.errors import ContractError
from aegis_contracts.times import Clock, format_ts, parse_ts, utc_now
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.errors import NotFound, StorageError
from aegis_storage.readmodel import ReadModel
from aegis_storage.tasks import all_of

if TYPE_CHECKING:
    from aegis_runtime.settings import AegisSettings

EXIT_FAILED = exitcodes.FAILED
EXIT_AT_LEVEL = exitcodes.FOUND  # --fail-on: a factory at or above that level

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


@dataclass(frozen=True, slots=True)
class CloudTierRow:
    tier: str
    status: str
    updated_at: str | None
    age_s: float | None
    problems: list[str]  # "CODE (check): detail" of each check that is not ok

    @property
    def freshness(self) -> str:
        return format_age(self.age_s)


@dataclass(frozen=True, slots=True)
class CloudView:
    overall_status: str
    tiers: list[CloudTierRow]


def cloud_view(item: Mapping[str, Any] | None, now: datetime) -> CloudView:
    """CLOUD#infra LATEST as one row per tier (``-`` for a tier that never ran)."""
    item = item or {}
    tiers = []
    for tier in ("fast", "slow"):
        raw = item.get(tier)
        snapshot: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        stamp, age = _age(item.get(f"{tier}_updated_at"), now)
        problems = [
            f"{c.get('reason')} ({c.get('name')})" + (f": {c['detail']}" if c.get("detail") else "")
            for c in snapshot.get("checks") or []
            if isinstance(c, Mapping) and c.get("status") not in (None, "NORMAL")
        ]
        tiers.append(CloudTierRow(tier, str(snapshot.get("status") or "-"), stamp, age, problems))
    return CloudView(str(item.get("overall_status") or "-"), tiers)


def cloud_json(view: CloudView) -> dict[str, Any]:
    return {
        "overall_status": view.overall_status,
        "tiers": [{**asdict(row), "freshness": row.freshness} for row in view.tiers],
    }


def cloud_table(view: CloudView) -> Table:
    table = Table(
        title=f"cloud infra: {view.overall_status}",
        title_justify="left",
        title_style=LEVEL_STYLE.get(view.overall_status, ""),
    )
    for name in ("collector", "status", "updated", "not ok"):
        table.add_column(name)
    for row in view.tiers:
        table.add_row(
            row.tier,
            Text(row.status, style=LEVEL_STYLE.get(row.status, "")),
            row.freshness,
            "\n".join(row.problems) or "-",
        )
    return table


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


def at_or_above(rows: Iterable[FleetRow], level: str) -> list[FleetRow]:
    """The rows whose level is ``level`` (WARNING or CRITICAL) or worse."""
    rank = _LEVEL_ORDER[level]
    return [r for r in rows if _LEVEL_ORDER.get(r.level, 3) <= rank]


def summary_line(rows: list[FleetRow]) -> str:
    counts = {level: sum(r.level == level for r in rows) for level in _LEVEL_ORDER}
    return (
        f"{len(rows)} factories: {counts['CRITICAL']} critical, {counts['WARNING']} warning, "
        f"{counts['NORMAL']} normal"
    )


async def load_status(
    aws: AwsConfig, table: str
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The fleet's LATEST items and CLOUD#infra LATEST."""
    async with open_clients(aws) as clients:
        return await _read(ReadModel(clients.items, table))


async def _read(model: ReadModel) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    # all_of: when one read fails the other is cancelled before the clients close, not left to
    # fail against a closed session after the command has already said what went wrong
    items, cloud = await all_of(model.factory_latest_items(), model.get_cloud_latest())
    return cast("list[dict[str, Any]]", items), cast("dict[str, Any] | None", cloud)


def run_status(
    settings: AegisSettings,
    *,
    json_output: bool = False,
    watch: bool = False,
    interval: float = 2.0,
    clock: Clock = utc_now,
    fail_on: str | None = None,
) -> int:
    """The ``aegis status`` command: an exit code, output on stdout, errors on stderr.
    ``fail_on`` (WARNING or CRITICAL): exit :data:`EXIT_AT_LEVEL` when a factory is at it or
    above (one reading, not with ``watch``)."""
    try:
        if watch:
            asyncio.run(_watch(settings, interval, json_output, clock))
        else:
            items, cloud = asyncio.run(load_status(settings.aws(), settings.table))
            now = clock()
            rows = fleet_rows(items, now)
            _print(rows, cloud_view(cloud, now), json_output, settings, now)
            if fail_on is not None and (found := at_or_above(rows, fail_on)):
                names = ", ".join(f"{r.factory_id} ({r.level})" for r in found)
                print(f"status: at or above {fail_on}: {names}", file=sys.stderr)
                return EXIT_AT_LEVEL
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
        return exitcodes.report(
            f"status: cannot read the read model at {_where(settings)}: {err}", err
        )
    return 0


def _where(settings: AegisSettings) -> str:
    return settings.aws_endpoint_url or f"AWS {settings.region}"


def _title(settings: AegisSettings, now: datetime) -> str:
    return f"AEGIS fleet ({settings.table} @ {_where(settings)}) at {format_ts(now)}"


def status_json(rows: list[FleetRow], cloud: CloudView) -> dict[str, Any]:
    return {"factories": rows_json(rows), "cloud_infra": cloud_json(cloud)}


def _print(
    rows: list[FleetRow],
    cloud: CloudView,
    json_output: bool,
    settings: AegisSettings,
    now: datetime,
) -> None:
    if json_output:
        print(json.dumps(status_json(rows, cloud), indent=2), flush=True)
        return
    console = Console()
    console.print(_renderable(rows, cloud, settings, now))


def _renderable(
    rows: list[FleetRow], cloud: CloudView, settings: AegisSettings, now: datetime
) -> Group:
    return Group(
        fleet_table(rows, title=_title(settings, now)), summary_line(rows), cloud_table(cloud)
    )


async def _watch(settings: AegisSettings, interval: float, json_output: bool, clock: Clock) -> None:
    """Refresh every ``interval`` seconds: a live table on a terminal, one JSON document per line
    with --json (or when not a terminal)."""
    console = Console()
    async with open_clients(settings.aws()) as clients:
        model = ReadModel(clients.items, settings.table)
        if json_output or not console.is_terminal:
            while True:
                items, cloud = await _read(model)
                now = clock()
                rows, view = fleet_rows(items, now), cloud_view(cloud, now)
                if json_output:
                    print(json.dumps(status_json(rows, view)), flush=True)
                else:
                    _print(rows, view, False, settings, now)
                await asyncio.sleep(interval)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                items, cloud = await _read(model)
                now = clock()
                rows, view = fleet_rows(items, now), cloud_view(cloud, now)
                live.update(_renderable(rows, view, settings, now), refresh=True)
                await asyncio.sleep(interval)
