"""MQTT in, read model out, through the real ingest and processor processes; and what a crash of
either, a restart of NATS or of the MQTT broker, or a storage outage, does to a stream of 600
messages: nothing, in effect."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import nats
import pytest

from aegis_contracts import keys
from aegis_contracts.keys import parse_key
from aegis_contracts.times import format_ts
from aegis_devstack.testing.outage import OutageProxy
from aegis_devstack.testing.waiting import eventually

from .conftest import Pipeline, publish_all, stream_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FACTORIES = 10
PER_FACTORY = 30  # 300 messages


async def processed_count(p: Pipeline) -> int:
    return sum("/factory_state/" in k for k in await p.store.list_keys("processed/"))


async def converged(p: Pipeline, total: int, within: float = 180) -> None:
    async def all_processed() -> bool:
        return await processed_count(p) >= total

    try:
        await eventually(all_processed, within=within, what=f"{total} processed messages")
    except AssertionError:
        raise AssertionError(
            f"ingest:\n{p.log_tail('ingest')}\nprocessor:\n{p.log_tail('processor')}"
        ) from None


async def assert_exactly_once_in_effect(
    p: Pipeline, factories: list[str], start: datetime, per_factory: int = PER_FACTORY
) -> None:
    raw = await p.store.list_keys("raw/")
    raw_ids = Counter(parse_key(k).message_id for k in raw)
    assert len(raw_ids) == len(factories) * per_factory
    assert set(raw_ids.values()) == {1}  # one raw object per message, none twice

    processed = await p.store.list_keys("processed/")
    by_dataset = Counter(parse_key(k).dataset or parse_key(k).family for k in processed)
    assert by_dataset[keys.Dataset.FACTORY_STATE] == len(factories) * per_factory
    assert by_dataset[keys.Dataset.RISK_SCORE] == len(factories) * per_factory

    newest = format_ts(start + timedelta(seconds=per_factory - 1))
    for f in factories:
        latest = await p.readmodel.get_latest(f)
        assert latest is not None, f
        assert latest["last_factory_state_at"] == newest, f  # never moved backwards
        assert latest["factory_state"]["meta"]["message_id"] == f"{f}-{per_factory - 1:06d}"
        history = await p.readmodel.history_states(
            f, start - timedelta(hours=1), start + timedelta(hours=2), now=start
        )
        applied = Counter(h["factory_state"]["meta"]["message_id"] for h in history)
        assert applied, f
        assert set(applied.values()) == {1}, f"{f}: a message was applied twice: {applied}"
        snapshots = await p.store.list_keys(keys.processed_prefix(f, "state_snapshot"))
        assert len(snapshots) == len(history), f


async def dead_letters(p: Pipeline) -> int:
    """Messages on the (private) NATS's dead-letter stream."""
    nc = await nats.connect(p.nats.url)
    try:
        info = await nc.jetstream().stream_info("AEGIS_DLQ")
        return int(info.state.messages)
    finally:
        await nc.close()


async def run_with_fault(
    p: Pipeline,
    now: datetime,
    fault: Callable[[], Awaitable[None]],
    recover: Callable[[], Awaitable[None]],
    *,
    after_processed: int = 90,
    per_factory: int = PER_FACTORY,
) -> None:
    """Half the stream, then ``fault`` once ``after_processed`` messages are through; the other
    half goes out while the faulted part is down (or, for the broker, right after it restarted),
    so the fault always hits with work outstanding; then ``recover``."""
    factories = p.factories(FACTORIES)
    p.start("ingest")
    p.start("processor")
    await p.ready("ingest", "processor")
    messages = stream_of(factories, per_factory, now)
    half = len(messages) // 2
    await publish_all(p.mqtt.url, messages[:half])

    async def progressed() -> bool:
        return await processed_count(p) >= after_processed

    await eventually(progressed, within=120, what=f"{after_processed} messages processed")
    await fault()
    processed_at_fault = await processed_count(p)
    await publish_all(p.mqtt.url, messages[half:])
    await recover()
    assert processed_at_fault < len(messages)
    await converged(p, len(messages))
    await assert_exactly_once_in_effect(p, factories, now, per_factory)


async def test_a_message_flows_from_mqtt_to_the_read_model(pipeline: Pipeline, now: datetime):
    p = pipeline
    (f,) = p.factories(1)
    p.start("ingest")
    p.start("processor")
    await p.ready("ingest", "processor")
    ((topic, payload),) = stream_of([f], 1, now)
    await publish_all(p.mqtt.url, [(topic, payload)])

    async def visible() -> bool:
        return await p.readmodel.get_latest(f) is not None

    await eventually(visible, within=30, what="LATEST")
    raw_key = keys.raw_key(f, "factory_state", datetime.now(now.tzinfo), f"{f}-000000")
    assert await p.store.get_bytes(raw_key) == payload
    latest = await p.readmodel.get_latest(f)
    assert latest is not None
    assert latest["last_factory_state_at"] == format_ts(now)


async def test_processor_killed_mid_stream_loses_and_repeats_nothing(
    pipeline: Pipeline, now: datetime
):
    async def crash() -> None:
        pipeline.kill("processor")

    async def restart() -> None:
        pipeline.start("processor")

    await run_with_fault(pipeline, now, crash, restart)


async def test_ingest_killed_mid_stream_loses_and_repeats_nothing(
    pipeline: Pipeline, now: datetime
):
    async def crash() -> None:
        pipeline.kill("ingest")

    async def restart() -> None:
        pipeline.start("ingest")  # the same client id resumes the broker's session

    # half the stream is published while ingest is dead: only the broker's session holds it
    await run_with_fault(pipeline, now, crash, restart)


async def test_nats_restart_mid_stream_loses_and_repeats_nothing(pipeline: Pipeline, now: datetime):
    async def stop_nats() -> None:
        pipeline.nats.stop()

    async def start_nats() -> None:
        pipeline.nats.restart()

    # ingest takes MQTT messages it cannot publish: it must leave them unacknowledged
    await run_with_fault(pipeline, now, stop_nats, start_nats)


async def test_storage_down_for_10_s_mid_stream_loses_and_repeats_nothing(
    pipeline: Pipeline, now: datetime
):
    """The S3/DynamoDB endpoint refuses every connection for 10 s (its data kept) while half the
    stream arrives: ingest archives nothing and acknowledges nothing meanwhile (the broker keeps
    the messages), nothing is dead-lettered for a transient outage, and afterwards every message
    is in raw/, processed/ and LATEST once."""
    proxy = OutageProxy(int(pipeline.aws_endpoint.rsplit(":", 1)[1]))
    proxy.up()
    pipeline.aws_endpoint = proxy.url  # the services go through the proxy; the test does not
    raw_at_outage = 0

    async def storage_down() -> None:
        nonlocal raw_at_outage
        proxy.down()
        raw_at_outage = len(await pipeline.store.list_keys("raw/"))

    async def storage_up() -> None:
        await asyncio.sleep(10)
        # nothing was archived while the storage was down
        assert len(await pipeline.store.list_keys("raw/")) == raw_at_outage
        proxy.up()

    try:
        # a shorter stream than the other faults' (the outage itself takes 10 s)
        await run_with_fault(
            pipeline, now, storage_down, storage_up, after_processed=75, per_factory=30
        )
    finally:
        proxy.close()
    assert await dead_letters(pipeline) == 0


async def test_mqtt_broker_restart_mid_stream_loses_and_repeats_nothing(
    pipeline: Pipeline, now: datetime
):
    async def restart_broker() -> None:
        # Mosquitto saves sessions, subscriptions and queued messages on shutdown: ingest must
        # resume its persistent session, and what it had not acknowledged comes again; the half
        # published right after the restart (before ingest is back) waits in that session
        pipeline.mqtt.stop()
        pipeline.mqtt.restart()

    async def nothing() -> None:
        return None

    await run_with_fault(pipeline, now, restart_broker, nothing)
