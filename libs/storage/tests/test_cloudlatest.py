"""One contract for the cloud's LATEST and HISTORY (aegis_storage.cloudlatest), run against
DynamoDB (the emulator; integration) and the in-memory table (no server): each tier keeps to its
own fields, overall_status is the worse of both, a tier never moves backwards, and the two tiers
writing at once never lose each other's fields or leave a stale overall_status."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts import keys
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.state import Level
from aegis_contracts.times import format_ts
from aegis_storage.cloudlatest import CloudLatest
from aegis_storage.memorytable import MemoryTable

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
TTL = int((T0 + timedelta(days=1)).timestamp())
REASON = {Level.NORMAL: "OK", Level.WARNING: "SOME_WARNING", Level.CRITICAL: "SOME_CRITICAL"}


def snap(tier: str, at: datetime, level: Level = Level.NORMAL) -> CloudSnapshot:
    check = CloudCheck(name=f"{tier}_probe", status=level, reason=REASON[level], value=1)
    return CloudSnapshot.of(tier, at, [check])  # type: ignore[arg-type]


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.integration)])
def cloud(request: pytest.FixtureRequest) -> CloudLatest:
    if request.param == "memory":
        return MemoryTable()
    readmodel: CloudLatest = request.getfixturevalue("foundation").readmodel
    return readmodel


async def test_each_tier_writes_its_own_fields_and_the_worse_status(cloud: CloudLatest) -> None:
    assert await cloud.apply_cloud(snap("fast", T0, Level.WARNING), ttl=TTL) is Level.WARNING
    assert await cloud.apply_cloud(snap("slow", T0, Level.NORMAL), ttl=TTL + 1) is Level.WARNING
    latest = await cloud.get_cloud_latest()
    assert latest is not None
    assert latest["fast"]["status"] == "WARNING" and latest["slow"]["status"] == "NORMAL"
    assert latest["fast_updated_at"] == latest["slow_updated_at"] == format_ts(T0)
    assert latest["overall_status"] == "WARNING"

    # slow turns critical: overall follows; fast recovers: overall stays critical (slow's)
    t1 = T0 + timedelta(minutes=5)
    assert await cloud.apply_cloud(snap("slow", t1, Level.CRITICAL), ttl=TTL + 1) is Level.CRITICAL
    assert await cloud.apply_cloud(snap("fast", t1, Level.NORMAL), ttl=TTL) is Level.CRITICAL
    t2 = t1 + timedelta(minutes=5)
    assert await cloud.apply_cloud(snap("slow", t2, Level.NORMAL), ttl=TTL + 1) is Level.NORMAL
    latest = await cloud.get_cloud_latest()
    assert latest is not None
    assert (latest["fast_updated_at"], latest["slow_updated_at"]) == (format_ts(t1), format_ts(t2))
    assert latest["overall_status"] == "NORMAL"

    # an older run is filed in HISTORY but leaves LATEST alone
    assert await cloud.apply_cloud(snap("fast", T0, Level.CRITICAL), ttl=TTL) is None
    assert (await cloud.get_cloud_latest() or {})["fast"]["status"] == "NORMAL"

    history = await cloud.cloud_history("fast", T0, t2, now=T0)
    assert [h["sk"] for h in history] == [
        keys.cloud_history_sk("fast", T0),
        keys.cloud_history_sk("fast", t1),
    ]
    assert history[0]["ttl"] == TTL and history[0]["status"] == "CRITICAL"  # the re-filed run
    slow = await cloud.cloud_history("slow", T0, t2 + timedelta(milliseconds=1), now=t2)
    assert [h["status"] for h in slow] == [
        "NORMAL",
        "CRITICAL",
        "NORMAL",
    ]


async def test_concurrent_tiers_never_overwrite_each_other(cloud: CloudLatest) -> None:
    rng = random.Random(4)
    fast_runs = [
        snap("fast", T0 + timedelta(minutes=i), rng.choice(list(Level))) for i in range(12)
    ]
    slow_runs = [
        snap("slow", T0 + timedelta(minutes=i, seconds=30), rng.choice(list(Level)))
        for i in range(12)
    ]

    async def write(runs: list[CloudSnapshot]) -> None:
        for run in runs:
            await cloud.apply_cloud(run, ttl=1)
            await asyncio.sleep(0)

    # each round: the two tiers race; afterwards both fields are the latest of each and the
    # overall status is the worse of those two (never a value computed from a stale read)
    for i in range(0, 12, 3):
        await asyncio.gather(write(fast_runs[i : i + 3]), write(slow_runs[i : i + 3]))
        latest = await cloud.get_cloud_latest()
        assert latest is not None
        fast, slow = fast_runs[i + 2], slow_runs[i + 2]
        assert latest["fast_updated_at"] == format_ts(fast.updated_at)
        assert latest["slow_updated_at"] == format_ts(slow.updated_at)
        assert latest["fast"]["status"] == fast.status.value
        assert latest["slow"]["status"] == slow.status.value
        assert latest["overall_status"] == Level.worst(fast.status, slow.status).value


async def test_two_replicas_of_one_tier_write_the_newer_run(cloud: CloudLatest) -> None:
    newer, older = snap("fast", T0 + timedelta(seconds=60)), snap("fast", T0, Level.CRITICAL)
    results = await asyncio.gather(cloud.apply_cloud(newer, ttl=1), cloud.apply_cloud(older, ttl=1))
    latest = await cloud.get_cloud_latest()
    assert latest is not None and latest["fast_updated_at"] == format_ts(newer.updated_at)
    assert latest["overall_status"] == "NORMAL"
    assert results[0] is Level.NORMAL
