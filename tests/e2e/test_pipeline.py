"""MQTT in, read model out, through the real ingest and processor processes; and what a crash of
either, a restart of NATS or of the MQTT broker, or a storage outage, does to a stream of 120 to
160 messages from ten factories: nothing, in effect. A crash and the outage land while one named
message is held in flight at the emulator (aegis_devstack.testing.holds)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import nats
import pytest

from aegis_contracts import keys
from aegis_contracts.keys import parse_key
from aegis_contracts.times import format_ts
from aegis_devstack.testing.holds import Holds
from aegis_devstack.testing.outage import OutageProxy
from aegis_devstack.testing.waiting import eventually

from .conftest import Pipeline, publish_all, stream_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FACTORIES = 10
PER_FACTORY = 16  # 160 messages
# the tests that hold one named message: a shorter stream is enough around it (120 messages)
HELD_PER_FACTORY = 12


async def processed_count(p: Pipeline) -> int:
    return sum("/factory_state/" in k for k in await p.store.list_keys("processed/"))


async def converged(p: Pipeline, total: int, within: float = 180) -> None:
    async def all_processed() -> bool:
        return await processed_count(p) >= total

    try:
        await eventually(all_processed, within=within, what=f"{total} processed messages")
    except AssertionError:
        raise AssertionError(f"{p.log_tail('ingest')}\n{p.log_tail('processor')}") from None


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
    window = (start - timedelta(hours=1), start + timedelta(hours=2))

    async def commits_done() -> bool:
        # the processed objects are written beside the commit of LATEST and HISTORY, and the
        # state snapshot after it: all processed objects present leaves the last commits in flight
        for f in factories:
            latest = await p.readmodel.get_latest(f)
            if latest is None or latest["last_factory_state_at"] != newest:
                return False
            history = await p.readmodel.history_states(f, *window, now=start)
            snapshots = await p.store.list_keys(keys.processed_prefix(f, "state_snapshot"))
            if len(snapshots) != len(history):
                return False
        return True

    with contextlib.suppress(AssertionError):  # not settled: the checks below say what is wrong
        await eventually(commits_done, within=60, what=f"every factory's LATEST at {newest}")
    for f in factories:
        latest = await p.readmodel.get_latest(f)
        assert latest is not None, f
        assert latest["last_factory_state_at"] == newest, f  # never moved backwards
        assert latest["factory_state"]["meta"]["message_id"] == f"{f}-{per_factory - 1:06d}"
        history = await p.readmodel.history_states(f, *window, now=start)
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
    after_processed: int = 48,
    per_factory: int = PER_FACTORY,
) -> None:
    """Half the stream, then ``fault`` once ``after_processed`` messages are through; the other
    half goes out while the faulted part is down (or, for the broker, right after it restarted)
    and is not all through before ``recover``: the fault had work outstanding."""
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
    await publish_all(p.mqtt.url, messages[half:])
    # the fault held work back: what was published during it is not all through yet
    assert await processed_count(p) < len(messages)
    await recover()
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


async def start_and_publish_first_half(
    p: Pipeline, now: datetime, per_factory: int = PER_FACTORY
) -> tuple[list[str], list[tuple[str, bytes]]]:
    factories = p.factories(FACTORIES)
    messages = stream_of(factories, per_factory, now)
    await start_and_publish(p, messages[: len(messages) // 2])
    return factories, messages


async def start_and_publish(p: Pipeline, messages: list[tuple[str, bytes]]) -> None:
    p.start("ingest")
    p.start("processor")
    await p.ready("ingest", "processor")
    await publish_all(p.mqtt.url, messages)


def named_alone(
    messages: list[tuple[str, bytes]], factory: str, named: str
) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]]]:
    """The first half of ``messages`` with none of ``factory``'s but ``named``, and the rest:
    published in that order, no later message of the factory can be processed before ``named``
    is committed (a newer state committed first would make ``named`` an older one, which no
    HISTORY item records)."""
    half = messages[: len(messages) // 2]
    own = f"aegis/{factory}/"
    first = [m for m in half if not m[0].startswith(own) or f'"{named}"' in m[1].decode()]
    return first, [m for m in messages if m not in first]


async def history_ids(p: Pipeline, factory: str, now: datetime) -> list[str]:
    history = await p.readmodel.history_states(
        factory, now - timedelta(hours=1), now + timedelta(hours=2), now=now
    )
    return [h["factory_state"]["meta"]["message_id"] for h in history]


async def test_processor_killed_between_a_messages_history_put_and_its_latest_commit_applies_it_once(
    pipeline: Pipeline, now: datetime
):
    """The emulator holds the processor's LATEST commit of one named message (its HISTORY item
    already put) and the processor is SIGKILLed right then; the commit never lands. Restarted,
    the processor finds that HISTORY item on the redelivery and rolls LATEST forward: the
    message is in HISTORY, the snapshots and LATEST once."""
    p = pipeline
    holds = Holds(p.aws_endpoint)
    factories = p.factories(FACTORIES)
    named = f"{factories[0]}-000000"
    hold = f"commit-{p.uid}"
    holds.arm(hold, "dynamodb", "PutItem", contains=['"LATEST"', f'"{named}"'])
    messages = stream_of(factories, HELD_PER_FACTORY, now)
    first, rest = named_alone(messages, factories[0], named)
    await start_and_publish(p, first)
    await pipeline.held(holds, hold, within=120)
    # mid-work: the message's HISTORY item is put, its LATEST commit is in flight
    assert named in await history_ids(p, factories[0], now)
    p.kill("processor")
    holds.abort(hold)  # the commit is never applied
    assert await p.readmodel.get_latest(factories[0]) is None  # its commit never landed
    p.start("processor")

    async def rolled_forward() -> bool:
        latest = await p.readmodel.get_latest(factories[0])
        return latest is not None and latest["factory_state"]["meta"]["message_id"] == named

    await eventually(rolled_forward, within=60, what="the redelivered message rolled forward")
    await publish_all(p.mqtt.url, rest)
    await converged(p, len(messages))
    await assert_exactly_once_in_effect(p, factories, now, HELD_PER_FACTORY)
    assert (await history_ids(p, factories[0], now)).count(named) == 1


async def test_ingest_killed_after_archiving_a_message_before_acknowledging_it_archives_it_once(
    pipeline: Pipeline, now: datetime
):
    """The emulator applies ingest's raw put of one named message and holds its answer, and
    ingest is SIGKILLed right then: the message is archived, but neither announced nor
    acknowledged to the broker. Restarted with the same session, ingest gets it again, finds it
    archived (If-None-Match) and announces it: one raw object, processed once."""
    p = pipeline
    holds = Holds(p.aws_endpoint)
    named = f"{p.factories(FACTORIES)[0]}-000005"
    hold = f"archive-{p.uid}"
    holds.arm(hold, "s3", "PutObject", contains=["/raw/", f"/{named}.json"], when="after")
    factories, messages = await start_and_publish_first_half(p, now, HELD_PER_FACTORY)
    await pipeline.held(holds, hold, within=120)
    p.kill("ingest")
    holds.abort(hold)
    # mid-work: archived, not announced (so not processed)
    assert [k for k in await p.store.list_keys("raw/") if f"/{named}.json" in k]
    assert not [k for k in await p.store.list_keys("processed/") if named in k]
    await publish_all(p.mqtt.url, messages[len(messages) // 2 :])
    p.start("ingest")  # the same client id resumes the broker's session
    await converged(p, len(messages))
    await assert_exactly_once_in_effect(p, factories, now, HELD_PER_FACTORY)


async def test_nats_restart_mid_stream_loses_and_repeats_nothing(pipeline: Pipeline, now: datetime):
    async def stop_nats() -> None:
        pipeline.nats.stop()

    async def start_nats() -> None:
        pipeline.nats.restart()

    # ingest takes MQTT messages it cannot publish: it must leave them unacknowledged
    await run_with_fault(pipeline, now, stop_nats, start_nats)


async def test_storage_cut_off_while_a_latest_commit_is_in_flight_loses_and_repeats_nothing(
    pipeline: Pipeline, now: datetime
):
    """The emulator holds the processor's LATEST commit of one named message; the S3/DynamoDB
    endpoint then refuses every connection for 10 s (its data kept), cutting that request off in
    flight, and the emulator applies it all the same: the write stands, its answer is lost, as
    when a network fails mid-request. Meanwhile the rest of the stream arrives: ingest
    archives nothing and acknowledges nothing, nothing is dead-lettered for a transient outage.
    Afterwards every message is in raw/, processed/ and LATEST once, the named one too (its
    retried commit finds itself already applied)."""
    emulator = pipeline.aws_endpoint
    holds = Holds(emulator)  # the emulator itself, not through the proxy
    proxy = OutageProxy(int(emulator.rsplit(":", 1)[1]))
    proxy.up()
    # the services go through the proxy; the test does not
    pipeline.settings["AEGIS_AWS_ENDPOINT_URL"] = proxy.url
    factories = pipeline.factories(FACTORIES)
    named = f"{factories[0]}-000000"
    hold = f"commit-{pipeline.uid}"
    holds.arm(hold, "dynamodb", "PutItem", contains=['"LATEST"', f'"{named}"'])
    messages = stream_of(factories, HELD_PER_FACTORY, now)
    first, rest = named_alone(messages, factories[0], named)
    try:
        await start_and_publish(pipeline, first)
        await pipeline.held(holds, hold, within=120)
        proxy.down()  # the commit's connection is cut while the emulator holds it
        holds.release(hold)  # ... and then it is applied: its answer never reaches the processor

        async def applied() -> bool:
            latest = await pipeline.readmodel.get_latest(factories[0])
            return latest is not None and latest["factory_state"]["meta"]["message_id"] >= named

        await eventually(applied, within=10, what="the held commit applied")
        raw_at_outage = len(await pipeline.store.list_keys("raw/"))
        await publish_all(pipeline.mqtt.url, rest)
        await asyncio.sleep(10)
        # nothing was archived while the storage was down
        assert len(await pipeline.store.list_keys("raw/")) == raw_at_outage
        proxy.up()
        await converged(pipeline, len(messages))
        await assert_exactly_once_in_effect(pipeline, factories, now, HELD_PER_FACTORY)
        assert (await history_ids(pipeline, factories[0], now)).count(named) == 1
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
