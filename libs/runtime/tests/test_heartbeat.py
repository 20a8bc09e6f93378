"""Heartbeats against a real NATS JetStream: a replica's beats are readable as the last message of
its subject, a clean stop is announced, and a silent replica ages out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from faststream.nats import NatsBroker

from aegis_contracts.events import Heartbeat
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.waiting import eventually
from aegis_runtime.bus import create_broker, ensure_streams
from aegis_runtime.heartbeat import (
    HeartbeatPublisher,
    freshest_by_service,
    instance_id,
    is_alive,
    last_heartbeats,
)
from aegis_runtime.settings import AegisSettings

pytestmark = pytest.mark.integration


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[NatsBroker]:
    broker = create_broker(AegisSettings(nats_url=nats_url), name="heartbeat-test")
    await ensure_streams(broker)
    try:
        yield broker
    finally:
        await broker.stop()


def test_instance_id_is_a_subject_token() -> None:
    ident = instance_id()
    assert ident and all(c.isalnum() or c in "_-" for c in ident)
    assert instance_id() != ident


async def test_beats_are_read_back_per_replica_and_a_stop_is_announced(
    broker: NatsBroker, unique_id: str
) -> None:
    service = f"svc-{unique_id}".lower()[:40]
    checks = {"nats": True, "storage": False}

    async def readiness() -> dict[str, bool]:
        return dict(checks)

    one = HeartbeatPublisher(
        broker, service=service, readiness=readiness, interval=timedelta(milliseconds=50)
    )
    two = HeartbeatPublisher(broker, service=service, readiness=readiness)
    await two.beat()
    stop = asyncio.Event()
    task = asyncio.create_task(one.run(stop))

    async def mine() -> dict[str, Heartbeat]:
        beats = freshest_by_service(await last_heartbeats(broker)).get(service, [])
        return {b.instance: b for b in beats}

    async def both_seen() -> bool:
        return set(await mine()) == {one.instance, two.instance}

    await eventually(both_seen, within=5, what="both replicas' heartbeats")
    first_at = (await mine())[one.instance].at

    async def one_beats_again() -> bool:
        return (await mine())[one.instance].at > first_at

    await eventually(one_beats_again, within=5, what="a later heartbeat")
    beat = (await mine())[one.instance]
    assert beat.ready is False and beat.checks == checks and not beat.stopping
    assert is_alive(beat, beat.at + timedelta(milliseconds=100))
    assert not is_alive(beat, beat.at + timedelta(milliseconds=200))

    stop.set()
    await task
    final = await mine()
    assert final[one.instance].stopping is True
    assert not is_alive(final[one.instance], final[one.instance].at)
    assert final[two.instance].stopping is False
    assert is_alive(final[two.instance], datetime.now(UTC))


async def test_a_stop_announced_in_the_millisecond_of_a_beat_is_not_dropped_as_its_duplicate(
    broker: NatsBroker, unique_id: str
) -> None:
    """A stop that comes while a periodic beat is being sent is announced in the same
    millisecond: its message is a message of its own, not a duplicate of that beat."""
    service = f"svc-{unique_id}".lower()[:40]

    async def readiness() -> dict[str, bool]:
        return {"nats": True}

    clock = FakeClock(datetime.now(UTC))  # stands still: both in one millisecond
    one = HeartbeatPublisher(broker, service=service, readiness=readiness, clock=clock)
    assert not (await one.beat()).stopping
    assert (await one.announce_stopping()).stopping
    [last] = await last_heartbeats(broker, service)
    assert last.stopping is True and last.at == one.started_at
