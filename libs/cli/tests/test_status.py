"""``aegis status``: its two reads, and the formatting of items as stored in the read model →
rows, table, JSON."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from aegis_cli.status import (
    _read,
    at_or_above,
    cloud_table,
    cloud_view,
    fleet_row,
    fleet_rows,
    fleet_table,
    format_age,
    rows_json,
    status_json,
    summary_line,
)

NOW = datetime(2026, 11, 30, 10, 0, 4, 250_000, tzinfo=UTC)


def item(factory: str, **fields: Any) -> dict[str, Any]:
    return {"pk": f"FACTORY#{factory}", "sk": "LATEST", "factory_id": factory, **fields}


CRITICAL = item(
    "factory-b",
    risk={
        "score": 92.5,
        "level": "CRITICAL",
        "reasons": [
            {"code": "CO_HIGH", "severity": "CRITICAL", "detail": "co 120 ppm"},
            {"code": "FIRE_DETECTED", "severity": "CRITICAL", "detail": "cam-01"},
        ],
    },
    pipeline_status={"status": "OK", "checked_at": "2026-11-30T10:00:00.000Z"},
    last_factory_state_at="2026-11-30T10:00:00.000Z",
    updated_at="2026-11-30T10:00:00.100Z",
)
NORMAL = item(
    "factory-a",
    risk={"score": 0, "level": "NORMAL", "reasons": []},
    pipeline_status={"status": "OK"},
    last_factory_state_at="2026-11-30T09:57:04.250Z",
)
BARE = {"pk": "FACTORY#factory-c", "sk": "LATEST", "latest_image_snapshot": {}}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "never"),
        (0, "0s ago"),
        (4.9, "4s ago"),
        (59, "59s ago"),
        (60, "1m ago"),
        (3599, "59m ago"),
        (3600, "1h ago"),
        (86_400 * 3 + 5, "3d ago"),
        (-600, "in 10m"),
    ],
)
def test_format_age(seconds: float | None, text: str) -> None:
    assert format_age(seconds) == text


def test_row_of_a_full_item() -> None:
    row = fleet_row(CRITICAL, NOW)
    assert row.factory_id == "factory-b"
    assert (row.level, row.score, row.reasons) == ("CRITICAL", 92.5, ["CO_HIGH", "FIRE_DETECTED"])
    assert row.age_s == pytest.approx(4.25)
    assert row.freshness == "4s ago"
    assert row.pipeline == "OK"
    assert row.updated_at == "2026-11-30T10:00:00.100Z"


def test_row_of_an_item_without_field_groups() -> None:
    row = fleet_row(BARE, NOW)
    assert row.factory_id == "factory-c"  # from pk when factory_id is absent
    assert (row.level, row.score, row.reasons) == ("-", None, [])
    assert (row.freshness, row.pipeline) == ("never", "NO_DATA")


def test_row_tolerates_malformed_fields() -> None:
    row = fleet_row(
        item(
            "factory-d",
            risk={"score": "high", "reasons": [{"x": 1}, "junk"]},
            last_factory_state_at="yesterday",
        ),
        NOW,
    )
    assert (row.score, row.reasons, row.age_s, row.freshness) == (None, [], None, "never")
    assert row.last_factory_state_at == "yesterday"


def test_rows_sorted_worst_first() -> None:
    rows = fleet_rows([NORMAL, BARE, CRITICAL], NOW)
    assert [r.factory_id for r in rows] == ["factory-b", "factory-a", "factory-c"]
    assert rows[1].freshness == "3m ago"
    assert summary_line(rows) == "3 factories: 1 critical, 0 warning, 1 normal"


def test_json_rows() -> None:
    (doc,) = rows_json(fleet_rows([CRITICAL], NOW))
    assert doc == {
        "factory_id": "factory-b",
        "level": "CRITICAL",
        "score": 92.5,
        "reasons": ["CO_HIGH", "FIRE_DETECTED"],
        "last_factory_state_at": "2026-11-30T10:00:00.000Z",
        "age_s": pytest.approx(4.25),
        "pipeline": "OK",
        "updated_at": "2026-11-30T10:00:00.100Z",
        "freshness": "4s ago",
    }


def render(rows: Any) -> str:
    console = Console(width=140, record=True, color_system=None)
    console.print(fleet_table(rows, title="fleet"))
    return console.export_text()


def test_table_shows_every_column() -> None:
    text = render(fleet_rows([NORMAL, CRITICAL], NOW))
    for word in ("factory", "level", "score", "reasons", "freshness", "pipeline"):
        assert word in text
    line_b = next(line for line in text.splitlines() if "factory-b" in line)
    for cell in ("CRITICAL", "92.5", "CO_HIGH, FIRE_DETECTED", "4s ago", "OK"):
        assert cell in line_b
    line_a = next(line for line in text.splitlines() if "factory-a" in line)
    assert "NORMAL" in line_a and " 0 " in line_a and "3m ago" in line_a


def test_empty_table_says_so() -> None:
    assert "no factories" in render([])


CLOUD = {
    "pk": "CLOUD#infra",
    "sk": "LATEST",
    "overall_status": "CRITICAL",
    "fast_updated_at": "2026-11-30T10:00:00.000Z",
    "fast": {
        "tier": "fast",
        "status": "CRITICAL",
        "checks": [
            {"name": "mqtt", "status": "NORMAL", "reason": "OK", "detail": ""},
            {
                "name": "service:processor",
                "status": "CRITICAL",
                "reason": "SERVICE_DOWN",
                "detail": "processor: last heartbeat 95 s ago",
            },
            {"name": "dead_letters:x.y", "status": "WARNING", "reason": "DEAD_LETTERS"},
        ],
    },
}


def test_cloud_view_lists_each_tier_and_what_is_not_ok() -> None:
    view = cloud_view(CLOUD, NOW)
    assert view.overall_status == "CRITICAL"
    fast, slow = view.tiers
    assert (fast.tier, fast.status, fast.freshness) == ("fast", "CRITICAL", "4s ago")
    assert fast.problems == [
        "SERVICE_DOWN (service:processor): processor: last heartbeat 95 s ago",
        "DEAD_LETTERS (dead_letters:x.y)",
    ]
    assert (slow.status, slow.updated_at, slow.freshness, slow.problems) == ("-", None, "never", [])
    assert cloud_view(None, NOW).overall_status == "-"


def test_status_json_has_factories_and_cloud() -> None:
    doc = status_json(fleet_rows([CRITICAL], NOW), cloud_view(CLOUD, NOW))
    assert [r["factory_id"] for r in doc["factories"]] == ["factory-b"]
    cloud = doc["cloud_infra"]
    assert cloud["overall_status"] == "CRITICAL"
    assert cloud["tiers"][0]["freshness"] == "4s ago"
    assert cloud["tiers"][0]["problems"][0].startswith("SERVICE_DOWN")
    json.dumps(doc)  # plain JSON


def test_cloud_table() -> None:
    console = Console(width=140, record=True, color_system=None)
    console.print(cloud_table(cloud_view(CLOUD, NOW)))
    text = console.export_text()
    assert "cloud infra: CRITICAL" in text
    line = next(line for line in text.splitlines() if "fast" in line)
    assert "CRITICAL" in line and "4s ago" in line and "SERVICE_DOWN" in line
    assert "DEAD_LETTERS" in text
    assert next(line for line in text.splitlines() if "slow" in line).count("never") == 1


def test_at_or_above_a_level() -> None:
    now = datetime(2026, 11, 30, tzinfo=UTC)
    rows = fleet_rows(
        [
            {"factory_id": f"f-{level.lower()}", "risk": {"level": level}}
            for level in ("NORMAL", "WARNING", "CRITICAL")
        ]
        + [{"factory_id": "f-none"}],
        now,
    )
    assert [r.factory_id for r in at_or_above(rows, "CRITICAL")] == ["f-critical"]
    assert [r.factory_id for r in at_or_above(rows, "WARNING")] == ["f-critical", "f-warning"]


async def test_when_one_read_fails_the_other_is_cancelled_before_the_command_returns() -> None:
    """The fleet and the cloud are read together. When the cloud read fails, the fleet read must
    not go on after the command has closed its clients and said what went wrong: it would fail
    again against a closed session and print a traceback beside that message."""
    fleet_started, fleet_cancelled = asyncio.Event(), asyncio.Event()

    class Model:
        async def factory_latest_items(self) -> list[dict[str, Any]]:
            fleet_started.set()
            try:
                await asyncio.Event().wait()  # an endpoint still being retried
            except asyncio.CancelledError:
                fleet_cancelled.set()
                raise
            return []

        async def get_cloud_latest(self) -> dict[str, Any] | None:
            await fleet_started.wait()
            raise ConnectionRefusedError("storage")

    with pytest.raises(ConnectionRefusedError, match="storage"):
        await _read(Model())  # type: ignore[arg-type]
    assert fleet_cancelled.is_set()
