"""``aegis replay`` with the processor running in-process (real NATS JetStream, S3/DynamoDB emulator).

Ingest's publish is played with a Nats-Msg-Id of its own: it stands for an original that left
JetStream's 2-minute duplicate window long ago. The replay then sends ingest's own id (the raw
key), so the processor sees the message again, as it does for any replay of data older than the
window, and must rewrite exactly what it wrote the first time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from faststream.nats import NatsBroker

from aegis_alert_dispatcher.app import DispatcherApp
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_contracts.archive import Archive, admit
from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import KeyFamily, parse_key
from aegis_contracts.subjects import raw_subject
from aegis_contracts.times import truncate_ms
from aegis_devstack.testing.devices import factory_state_message
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook
from aegis_orchestration.model import Job
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_processor.app import ProcessorApp
from aegis_processor.app import create_app as create_processor
from aegis_processor.settings import ProcessorSettings
from aegis_runtime.bus import create_broker, ensure_streams, publish, publish_raw_archived
from aegis_runtime.settings import AegisSettings
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


# -- a replay pages nobody and starts no job (unless --notify) --------------------------------


def fire_job(factory: str, url: str) -> Job:
    """Calls ``url`` when ``factory`` first turns CRITICAL (LATEST inserted CRITICAL)."""
    return Job.model_validate(
        {
            "id": f"on-fire-{factory}",
            "job_name": f"fire at {factory}",
            "trigger_type": "BizObject",
            "object_id": "factory_latest",
            "trigger_sub_type": "*",
            "trigger_condition_expr": (
                f'AND(StringEQ([$.afterData.factory_id], "{factory}"), '
                'StringEQ([$.afterData.risk.level], "CRITICAL"))'
            ),
            "steps": [
                {
                    "id": "call",
                    "step_type": "TASK",
                    "step_sub_type": "HTTP_WEBHOOK",
                    "is_start_point": True,
                }
            ],
            "params": [
                {
                    "id": "u",
                    "step_id": "call",
                    "param_key": "url",
                    "source_type": "STATIC",
                    "param_value": url,
                }
            ],
        }
    )


async def test_a_replayed_fire_is_processed_but_pages_nobody_and_starts_no_job(
    foundation: Any,
    aws_endpoint: str,
    private_nats: Any,
    webhook: FakeWebhook,
    unique_id: str,
) -> None:
    """Two factories' fire messages sit in raw/ and were never processed (as after an outage
    that lost their events). ``aegis replay`` of the first: processed/ and LATEST are written,
    and its snapshot and change reach the alert dispatcher and the orchestrator marked replayed:
    no Slack message, no webhook. ``--notify`` for the second: one of each."""
    store, nats_url = foundation.store, private_nats.url
    quiet, loud = f"q-{unique_id}", f"l-{unique_id}"
    at = truncate_ms(datetime.now(UTC)) - timedelta(seconds=5)
    for factory in (quiet, loud):
        body = factory_state_message(factory, f"m-{factory}-fire", at, fire=True)
        decision = admit(f"aegis/{factory}/factory_state", body, at, 1, bucket=store.bucket)
        assert isinstance(decision, Archive)
        await store.put_immutable(decision.key, body, metadata=decision.metadata)

    common = {
        "aws_endpoint_url": aws_endpoint,
        "bucket": foundation.bucket,
        "table": foundation.table,
        "nats_url": nats_url,
        "heartbeat_interval_s": 60,
    }
    processor = create_processor(
        ProcessorSettings(
            **common, durable=f"p-{unique_id}", processor_fetch_timeout_s=0.3, refresh_enabled=False
        )
    )
    dispatcher = DispatcherApp(
        DispatcherSettings(
            **common,
            slack_webhook_url=webhook.url,
            alert_durable=f"a-{unique_id}",
            alert_fetch_timeout_s=0.3,
        )
    )
    orchestrator = OrchestratorApp(
        OrchestratorSettings(
            **common,
            orchestrator_durable=f"o-{unique_id}",
            orchestrator_jobs_file="",
            orchestrator_schedule_tick_s=3600,
            job_egress_allow=["127.0.0.1"],  # the webhook stand-in is local http
        ),
        clock=lambda: datetime.now(UTC),
        environment={},
    )
    broker = create_broker(AegisSettings(nats_url=nats_url), name="replay-test-client")
    apps = [processor, dispatcher, orchestrator]
    try:
        for app in apps:
            await app.start()
        await broker.connect()
        assert orchestrator.store is not None
        for factory in (quiet, loud):
            await orchestrator.store.register(fire_job(factory, f"{webhook.url}/job/{factory}"))
        await orchestrator.refresh()

        async def send(event: RawArchived) -> bool:
            return await publish_raw_archived(broker, event)

        window = {"start": at, "end": at + timedelta(seconds=1), "sources": ALL}
        summary = await replay(store, send, factory_id=quiet, **window)
        assert summary.requeued == 1

        def replayed_decisions() -> float:
            value = dispatcher.metrics.registry.get_sample_value(
                "aegis_alert_decisions_total",
                {"outcome": "replayed", "action": "", "severity": ""},
            )
            return value or 0.0

        await eventually(lambda: replayed_decisions() >= 1, within=20, what="the replayed snapshot")
        latest = await foundation.readmodel.get_latest(quiet)
        assert latest is not None and latest["risk"]["level"] == "CRITICAL"  # processed
        assert await store.list_keys(f"processed/{quiet}/factory_state/")

        loud_summary = await replay(store, send, factory_id=loud, notify=True, **window)
        assert loud_summary.requeued == 1
        await eventually(
            lambda: {r.path for r in webhook.requests} >= {"/hook", f"/hook/job/{loud}"},
            within=20,
            what="the --notify replay's Slack message and webhook call",
        )
        await asyncio.sleep(0.5)  # the quiet factory's events were handled before the loud ones
        paths = sorted(r.path for r in webhook.requests)
        assert paths == ["/hook", f"/hook/job/{loud}"]  # one Slack message, one job's call
        assert loud in json.dumps(webhook.delivered) and quiet not in json.dumps(webhook.delivered)
    finally:
        await broker.stop()
        for app in reversed(apps):
            await app.stop()
