"""``aegis replay`` with the processor running in-process (real NATS JetStream, S3/DynamoDB emulator).

Ingest's publish is played with a Nats-Msg-Id of its own: it stands for an original that left
JetStream's 2-minute duplicate window long ago. The replay then sends ingest's own id (the raw
key), so the processor sees the message again, as it does for any replay of data older than the
window, and must rewrite exactly what it wrote the first time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from faststream.nats import NatsBroker

from aegis_contracts.archive import Archive, admit
from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import KeyFamily, parse_key
from aegis_contracts.subjects import raw_subject
from aegis_contracts.times import truncate_ms
from aegis_processor.app import ProcessorApp
from aegis_runtime.broker import create_broker, ensure_streams, publish, publish_raw_archived
from aegis_runtime.settings import AegisSettings
from aegis_runtime.testing.waiting import eventually
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.replay import replay

pytestmark = pytest.mark.integration

ALL = list(SourceType)


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[NatsBroker]:
    broker = create_broker(AegisSettings(nats_url=nats_url), name="replay-test-client")
    await broker.connect()
    await ensure_streams(broker)
    yield broker
    await broker.stop()


@pytest.fixture
async def processor(run_processor: Any, unique_id: str) -> AsyncIterator[ProcessorApp]:
    async with run_processor(f"aegis.raw.f-{unique_id}.>") as app:
        yield app


def handled(app: ProcessorApp) -> float:
    return sum(
        s.value
        for fam in app.metrics.messages_total.collect()
        for s in fam.samples
        if s.name.endswith("_total")
    )


async def ingest_long_ago(
    store: ObjectStore, broker: NatsBroker, factory: str, received_at: datetime
) -> list[Archive]:
    """Archive and announce four messages as ingest does, under a stand-in Nats-Msg-Id."""
    out = []
    for i, (source, body) in enumerate(
        [
            ("factory_state", {"sensors": {"temperature_c": 24.0, "co_ppm": 5.0}}),
            ("factory_state", {"sensors": {"temperature_c": 30.0, "co_ppm": 80.0}}),
            ("infra_state", {"host": {"cpu_pct": 20.0}, "pipeline": {"detector": "ok"}}),
            ("infra_state", {"host": {"cpu_pct": 90.0}, "pipeline": {"detector": "degraded"}}),
        ]
    ):
        at = received_at + timedelta(seconds=i)
        payload = json.dumps(
            {
                "message_id": f"m-{factory}-{i:02d}",
                "factory_id": factory,
                "device_id": "edge-1",
                "emitted_at": (at - timedelta(milliseconds=300)).isoformat(),
                "schema_version": "1.0",
                **body,
            }
        ).encode()
        decision = admit(f"aegis/{factory}/{source}", payload, at, 1, bucket=store.bucket)
        assert isinstance(decision, Archive)
        await store.put_immutable(decision.key, payload, metadata=decision.metadata)
        await publish(
            broker,
            raw_subject(factory, decision.source_type),
            decision.event,
            msg_id=f"long-ago:{decision.key}",
        )
        out.append(decision)
    return out


async def processed(store: ObjectStore, factory: str) -> dict[str, bytes]:
    return {k: await store.get_bytes(k) for k in await store.list_keys(f"processed/{factory}/")}


async def until_handled(app: ProcessorApp, count: int) -> None:
    async def done() -> bool:
        return handled(app) >= count

    await eventually(done, what=f"{count} messages handled")


def message_objects(objects: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in objects.items() if parse_key(k).family is KeyFamily.PROCESSED}


async def test_a_replay_restores_deleted_processed_objects_byte_for_byte(
    foundation: Any, broker: NatsBroker, processor: ProcessorApp, unique_id: str
) -> None:
    store, factory = foundation.store, f"f-{unique_id}"
    start = truncate_ms(datetime.now(UTC)) - timedelta(minutes=1)
    await ingest_long_ago(store, broker, factory, start)
    await until_handled(processor, 4)
    original = await processed(store, factory)
    latest = await foundation.readmodel.get_latest(factory)
    lost = message_objects(original)
    assert len(lost) == 6  # factory_state + risk_score twice, infra_state twice
    await store.delete_many(sorted(lost))

    async def send(event: RawArchived) -> bool:
        return await publish_raw_archived(broker, event)

    dry = await replay(
        store, None, factory_id=factory, sources=ALL, start=start, end=start + timedelta(minutes=1)
    )
    assert (dry.found, dry.requeued) == (4, 0)
    summary = await replay(
        store, send, factory_id=factory, sources=ALL, start=start, end=start + timedelta(minutes=1)
    )
    assert (summary.found, summary.requeued, summary.skipped, summary.failed) == (4, 4, 0, 0)
    await until_handled(processor, 8)
    assert await processed(store, factory) == original  # restored, byte for byte; nothing new
    assert await foundation.readmodel.get_latest(factory) == latest  # never backwards

    again = await replay(
        store, send, factory_id=factory, sources=ALL, start=start, end=start + timedelta(minutes=1)
    )
    assert (again.requeued, again.reasons) == (0, {"duplicate_in_window": 4})  # the queue de-dups


async def test_a_replay_of_an_intact_range_changes_nothing(
    foundation: Any, broker: NatsBroker, processor: ProcessorApp, unique_id: str
) -> None:
    store, factory = foundation.store, f"f-{unique_id}"
    start = truncate_ms(datetime.now(UTC)) - timedelta(minutes=1)
    await ingest_long_ago(store, broker, factory, start)
    await until_handled(processor, 4)
    before = await processed(store, factory)
    latest = await foundation.readmodel.get_latest(factory)
    now = datetime.now(UTC)
    history = await foundation.readmodel.history_states(
        factory, now - timedelta(days=1), now + timedelta(days=1), now=now
    )

    async def send(event: RawArchived) -> bool:
        return await publish_raw_archived(broker, event)

    # only the two infra_state messages: --source narrows the replay
    summary = await replay(
        store,
        send,
        factory_id=factory,
        sources=[SourceType.INFRA_STATE],
        start=start,
        end=start + timedelta(minutes=1),
    )
    assert (summary.found, summary.requeued) == (2, 2)
    await until_handled(processor, 6)
    assert await processed(store, factory) == before
    assert await foundation.readmodel.get_latest(factory) == latest
    now = datetime.now(UTC)
    assert (
        await foundation.readmodel.history_states(
            factory, now - timedelta(days=1), now + timedelta(days=1), now=now
        )
        == history
    )
