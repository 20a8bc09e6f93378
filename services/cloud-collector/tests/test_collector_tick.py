"""A collector's tick on the in-memory table and bucket (no server): what it files when a probe
fails or hangs, and that replicas sharing a table run each window once. The same tick against
the emulator and real NATS: test_collector.py."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

from aegis_cloud_collector.collector import Collector, Context, Probe, TierMetrics
from aegis_contracts import keys
from aegis_contracts.cloud import CloudCheck
from aegis_contracts.state import Level
from aegis_devstack.testing.builders import FakeClock
from aegis_runtime.metrics import Metrics
from aegis_storage.memorytable import MemoryTable
from aegis_storage.objects import MemoryObjects

T0 = datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC)


async def fine(context: Context) -> list[CloudCheck]:
    return [CloudCheck.ok("fine", 1)]


def collector(
    probes: list[Probe],
    table: MemoryTable,
    bucket: MemoryObjects,
    clock: FakeClock,
    *,
    metrics: Metrics | None = None,
    published: list[str] | None = None,
    owner: str = "test",
) -> Collector:
    async def publish(subject: str, event: Any, *, msg_id: str) -> bool:
        if published is not None:
            published.append(msg_id)
        return True

    return Collector(
        "fast",
        probes,
        readmodel=table,
        store=bucket,
        publish=publish,
        interval=timedelta(minutes=1),
        ttl=lambda now: int(now.timestamp()) + 60,
        clock=clock,
        owner=owner,
        metrics=TierMetrics(metrics or Metrics(f"cloud-collector-{owner}")),
        timeout=0.2,
    )


async def test_a_failing_or_hanging_probe_does_not_kill_the_tick() -> None:
    async def broken(context: Context) -> list[CloudCheck]:
        raise RuntimeError("boom")

    async def hanging(context: Context) -> list[CloudCheck]:
        await asyncio.sleep(30)
        return []

    published: list[str] = []
    metrics = Metrics("cloud-collector-test")
    table, bucket = MemoryTable(), MemoryObjects("aegis-test")
    probes = [
        Probe("fine", fine),
        Probe("broken", broken),
        Probe("hanging", hanging, Level.CRITICAL),
    ]
    snapshot = await collector(
        probes, table, bucket, FakeClock(T0), metrics=metrics, published=published
    ).tick()
    assert snapshot is not None
    assert {c.name: (c.status, c.reason) for c in snapshot.checks} == {
        "broken": (Level.WARNING, "CHECK_FAILED"),
        "fine": (Level.NORMAL, "OK"),
        "hanging": (Level.CRITICAL, "CHECK_FAILED"),
    }
    # filed: the object, then LATEST, then the event naming the object
    key = keys.cloud_infra_key("fast", T0)
    assert await bucket.exists(key)
    latest = await table.get_cloud_latest()
    assert latest is not None and latest["overall_status"] == "CRITICAL"
    assert published == [f"oc:{key}"]
    rendered = metrics.render().decode()
    assert 'aegis_cloud_check_status{check="hanging",tier="fast"} 2.0' in rendered
    assert 'aegis_cloud_ticks_total{outcome="written",tier="fast"} 1.0' in rendered


async def test_replicas_sharing_a_table_run_each_window_once() -> None:
    table, bucket, clock = MemoryTable(), MemoryObjects("aegis-test"), FakeClock(T0)
    one, two = (
        collector([Probe("fine", fine)], table, bucket, clock, owner=name) for name in ("a", "b")
    )
    for _ in range(3):
        runs = await asyncio.gather(one.tick(), two.tick())
        assert sum(run is not None for run in runs) == 1
        assert await one.tick() is None  # and a replica does not run its window twice
        clock.advance(60)
    history = await table.cloud_history("fast", T0, T0 + timedelta(minutes=3), now=T0)
    assert len(history) == 3
    assert len(await bucket.list_keys(keys.cloud_infra_prefix("fast"))) == 3
