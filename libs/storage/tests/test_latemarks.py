"""One contract for late-data marks, run against DynamoDB (the emulator; integration) and the
in-memory marks (no server)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from aegis_contracts.times import floor_to, format_ts, utc_now
from aegis_storage.latemarks import LateMarks, MemoryLateMarks, TableLateMarks

# hours of today, not of a fixed day: the markers' TTLs (a day after NOW) are still ahead when
# the table is a real one that deletes expired items
HOUR = floor_to(utc_now(), timedelta(hours=1)) - timedelta(hours=3)
NOW = HOUR + timedelta(hours=2)
TTL = int((NOW + timedelta(days=1)).timestamp())


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.integration)])
def marks(request: pytest.FixtureRequest) -> LateMarks:
    if request.param == "memory":
        return MemoryLateMarks()
    return TableLateMarks(request.getfixturevalue("foundation").readmodel)


async def test_every_mark_counts_and_the_hours_are_listed_oldest_first(marks: LateMarks) -> None:
    later = HOUR + timedelta(hours=1)
    await marks.mark("factory-b", later, now=NOW, ttl=TTL)
    await marks.mark("factory-a", HOUR, now=NOW, ttl=TTL)
    await marks.mark("factory-a", HOUR, now=NOW + timedelta(seconds=5), ttl=TTL)

    found = await marks.late_hours(now=NOW)

    assert [(m["factory_id"], m["hour_start"], m["marks"]) for m in found] == [
        ("factory-a", format_ts(HOUR), 2),
        ("factory-b", format_ts(later), 1),
    ]


async def test_a_marker_is_cleared_only_while_it_holds_the_count_read(marks: LateMarks) -> None:
    await marks.mark("factory-a", HOUR, now=NOW, ttl=TTL)
    await marks.mark("factory-a", HOUR, now=NOW, ttl=TTL)
    assert not await marks.clear("factory-a", HOUR, marks=1)  # a mark came after the read
    assert [m["marks"] for m in await marks.late_hours(now=NOW)] == [2]
    assert await marks.clear("factory-a", HOUR, marks=2)
    assert await marks.late_hours(now=NOW) == []
    assert not await marks.clear("factory-a", HOUR, marks=2)  # nothing left to clear


async def test_an_expired_marker_is_not_listed(marks: LateMarks) -> None:
    await marks.mark("factory-a", HOUR, now=NOW, ttl=int(NOW.timestamp()))
    assert await marks.late_hours(now=NOW) == []
