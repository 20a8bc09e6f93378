"""The ingest service against real Mosquitto, NATS JetStream and the S3 emulator, run in-process.

Each test has its own bucket, factory id, MQTT client id and share group, and its own service name
(so its dead letters land on ``aegis.dlq.ingest-{id}.*``). The subscription is ``aegis/+/+`` like
production, so an ingest here may also see other tests' traffic: assertions look for this test's
factory ids and payloads, and count metrics as "at least".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import aiomqtt
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from aegis_contracts.events import RawArchived
from aegis_contracts.ids import MAX_PAYLOAD_BYTES, derive_message_id
from aegis_contracts.keys import raw_key, raw_prefix
from aegis_contracts.subjects import DEAD_LETTER, raw_subject
from aegis_contracts.times import parse_ts
from aegis_devstack.localservers import free_port, start_private_nats
from aegis_devstack.testing.serving import serving
from aegis_devstack.testing.streams import dead_letters, messages_on
from aegis_devstack.testing.waiting import eventually
from aegis_ingest.app import IngestApp, create_app
from aegis_ingest.settings import IngestSettings
from aegis_runtime.bus import MSG_ID_HEADER

if TYPE_CHECKING:
    from aegis_devstack.testing.storage import Foundation

pytestmark = pytest.mark.integration

RAW_STREAM, DLQ_STREAM = "AEGIS_RAW", "AEGIS_DLQ"


@pytest.fixture
def settings(ingest_settings: IngestSettings) -> IngestSettings:
    return ingest_settings


@pytest.fixture
def factory(unique_id: str) -> str:
    return f"f-{unique_id}"


@contextlib.asynccontextmanager
async def running(app: IngestApp) -> AsyncIterator[IngestApp]:
    """Run ``app`` until the block ends, once it has subscribed; then stop it gracefully."""
    async with serving(app, app.subscribed):
        yield app


@pytest.fixture
async def publisher(mqtt_url: str, unique_id: str) -> AsyncIterator[aiomqtt.Client]:
    url = urlsplit(mqtt_url)
    client = aiomqtt.Client(
        url.hostname or "127.0.0.1",
        url.port or 1883,
        identifier=f"pub-{unique_id}",
        protocol=aiomqtt.ProtocolVersion.V5,
    )
    async with client:
        yield client


@pytest.fixture
async def js(
    nats_url: str, settings: IngestSettings, factory: str
) -> AsyncIterator[JetStreamContext]:
    nc: NatsClient = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        yield js
    finally:
        # the shared streams outlive the test: remove what this test put there
        with contextlib.suppress(NotFoundError):
            await js.purge_stream(RAW_STREAM, subject=f"aegis.raw.{factory}.>")
        with contextlib.suppress(NotFoundError):
            await js.purge_stream(DLQ_STREAM, subject=f"{DEAD_LETTER}.{settings.service}.>")
        await nc.close()


def sample(app: IngestApp, name: str, **labels: str) -> float:
    return app.metrics.total(name, **labels)


async def publish_burst(publisher: aiomqtt.Client, factory: str, prefix: str, count: int) -> None:
    """``count`` QoS 1 messages at once (concurrent publishes): the broker gets a backlog to
    spread over the group's sessions faster than ingest archives it."""
    topic = f"aegis/{factory}/factory_state"
    await asyncio.gather(
        *(
            publisher.publish(topic, device_payload(factory, f"{prefix}-{i:05d}"), qos=1)
            for i in range(count)
        )
    )


def device_payload(factory: str, message_id: str | None, **body: Any) -> bytes:
    doc: dict[str, Any] = {
        "factory_id": factory,
        "device_id": "edge-1",
        "emitted_at": "2026-11-30T10:00:00Z",
        "schema_version": "1",
        "sensors": {"temperature_c": 21.5},
        **body,
    }
    if message_id is not None:
        doc["message_id"] = message_id
    return json.dumps(doc).encode()


async def test_message_is_archived_byte_identical_and_announced(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    js: JetStreamContext,
    factory: str,
) -> None:
    topic = f"aegis/{factory}/factory_state"
    payload = device_payload(factory, "msg-happy-0001") + b"  \n"  # odd bytes survive verbatim
    async with running(create_app(settings)) as app:
        assert await app.health.readiness() == {"mqtt": True, "nats": True}
        await publisher.publish(topic, payload, qos=1)

        async def archived() -> bool:
            return len(await foundation.store.list_keys(raw_prefix(factory))) == 1

        await eventually(archived)
        [key] = await foundation.store.list_keys(raw_prefix(factory))
        assert await foundation.store.get_bytes(key) == payload
        head = await foundation.store.head(key)
        assert head is not None
        meta = head["Metadata"]
        assert meta["topic"] == topic and meta["qos"] == "1"
        received_at = parse_ts(meta["received_at"])
        assert key == raw_key(factory, "factory_state", received_at, "msg-happy-0001")

        async def announced() -> bool:
            return bool(await messages_on(js, RAW_STREAM, raw_subject(factory, "factory_state")))

        await eventually(announced)
        [msg] = await messages_on(js, RAW_STREAM, raw_subject(factory, "factory_state"))
        assert msg.headers[MSG_ID_HEADER] == key  # de-duplication per raw object
        assert msg.headers["correlation_id"] == "msg-happy-0001"  # the consumers' message id
        event = RawArchived.model_validate_json(msg.data)
        assert (event.key, event.bucket, event.topic) == (key, foundation.bucket, topic)
        assert event.message_id == "msg-happy-0001" and not event.message_id_derived
        assert event.payload_text == payload.decode() and event.size_bytes == len(payload)
        assert event.received_at == received_at
        assert sample(app, "messages_total", outcome="archived") >= 1


async def test_duplicate_and_conflicting_message_id_leave_the_first_body(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    js: JetStreamContext,
    factory: str,
) -> None:
    topic = f"aegis/{factory}/infra_state"
    first = device_payload(factory, "msg-dup-0001", network={"rtt_ms": 3})
    second = device_payload(factory, "msg-dup-0001", network={"rtt_ms": 999})
    async with running(create_app(settings)) as app:
        await publisher.publish(topic, first, qos=1)
        await publisher.publish(topic, first, qos=1)  # what a QoS 1 redelivery looks like

        async def both_handled() -> bool:
            done = sample(app, "messages_total", outcome="archived") + sample(
                app, "messages_total", outcome="duplicate"
            )
            return done >= 2

        await eventually(both_handled)
        # only now the conflicting body, so that "first" is unambiguous
        await publisher.publish(topic, second, qos=1)

        async def conflict_dead_lettered() -> bool:
            return bool(await dead_letters(js, settings.service, "message_id_conflict"))

        await eventually(conflict_dead_lettered)
        keys = await foundation.store.list_keys(raw_prefix(factory))
        assert len(keys) == 1 and keys[0].endswith("/msg-dup-0001.json")
        assert await foundation.store.get_bytes(keys[0]) == first
        [letter] = await dead_letters(js, settings.service, "message_id_conflict")
        assert letter.payload_bytes() == second
        assert letter.message_id == "msg-dup-0001" and letter.subject == topic
        # one event: the duplicate's publish was dropped by JetStream's de-duplication
        assert len(await messages_on(js, RAW_STREAM, raw_subject(factory, "infra_state"))) == 1

        # the same device message_id from another factory is another message, not a duplicate
        other = f"{factory}-b"
        try:
            await publisher.publish(f"aegis/{other}/infra_state", first, qos=1)

            async def other_announced() -> bool:
                return bool(await messages_on(js, RAW_STREAM, raw_subject(other, "infra_state")))

            await eventually(other_announced)
        finally:
            await js.purge_stream(RAW_STREAM, subject=f"aegis.raw.{other}.>")
        assert sample(app, "messages_total", outcome="duplicate") >= 1
        assert sample(app, "dead_letters_total", reason="message_id_conflict") >= 1


async def test_hostile_topic_and_oversize_are_dead_lettered_and_service_keeps_serving(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    js: JetStreamContext,
    factory: str,
    unique_id: str,
) -> None:
    marker = f"hostile-{unique_id}".encode()
    oversize = b'{"pad": "' + b"x" * MAX_PAYLOAD_BYTES + b'"}'
    async with running(create_app(settings)) as app:
        await publisher.publish("aegis/../factory_state", marker, qos=1)
        await publisher.publish(f"aegis/{factory.upper()}/factory_state", marker, qos=1)
        await publisher.publish(f"aegis/{factory}/camera_state", marker, qos=1)
        await publisher.publish(f"aegis/{factory}/factory_state", oversize, qos=1)
        # malformed JSON on a valid topic is archived as received (the processor rejects it later)
        malformed = b'{"message_id": "msg-bad-json-01", "sensors": {'
        await publisher.publish(f"aegis/{factory}/factory_state", malformed, qos=1)
        valid = device_payload(factory, "msg-after-0001")
        await publisher.publish(f"aegis/{factory}/factory_state", valid, qos=1)

        async def all_handled() -> bool:
            mine = [
                d
                for d in await dead_letters(js, settings.service, "invalid_topic")
                if d.payload_bytes() == marker
            ]
            too_large = await dead_letters(js, settings.service, "payload_too_large")
            keys = await foundation.store.list_keys(raw_prefix(factory))
            return len(mine) == 3 and len(too_large) == 1 and len(keys) == 2

        await eventually(all_handled)
        invalid = {
            d.subject
            for d in await dead_letters(js, settings.service, "invalid_topic")
            if d.payload_bytes() == marker
        }
        assert invalid == {
            "aegis/../factory_state",
            f"aegis/{factory.upper()}/factory_state",
            f"aegis/{factory}/camera_state",
        }
        [big] = await dead_letters(js, settings.service, "payload_too_large")
        assert big.payload_bytes() == oversize[: settings.dead_letter_prefix_bytes]
        assert str(len(oversize)) in big.detail
        assert big.message_id == derive_message_id(f"aegis/{factory}/factory_state", oversize)

        # nothing under a made-up key; the two archived objects are the valid-topic ones
        bodies = {
            await foundation.store.get_bytes(k)
            for k in await foundation.store.list_keys(raw_prefix(factory))
        }
        assert bodies == {malformed, valid}
        for prefix in ("raw/../", "raw/F-", f"raw/{factory.upper()}"):
            assert await foundation.store.list_keys(prefix) == []
        assert sample(app, "dead_letters_total", reason="invalid_topic") >= 3
        assert sample(app, "dead_letters_total", reason="payload_too_large") >= 1


async def test_unacknowledged_message_is_redelivered_to_the_same_session(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    js: JetStreamContext,
    factory: str,
) -> None:
    """Manual ack proof: with S3 unreachable the message is never acknowledged (the broker keeps
    redelivering it to the session); a healthy ingest resuming the same session archives it."""
    topic = f"aegis/{factory}/factory_state"
    payload = device_payload(factory, "msg-redeliver-01")
    broken = settings.model_copy(
        update={"aws_endpoint_url": f"http://127.0.0.1:{free_port()}", "aws_max_attempts": 1}
    )
    async with running(create_app(broken)) as app:
        await publisher.publish(topic, payload, qos=1)

        async def redelivered() -> bool:
            # deferred twice = the broker sent it again after the reconnect: it was never acked
            return sample(app, "messages_total", outcome="deferred") >= 2

        await eventually(redelivered)
        assert await foundation.store.list_keys(raw_prefix(factory)) == []

    async with running(create_app(settings)) as app:

        async def archived() -> bool:
            # the object is listed as soon as the put returns, the count a moment later
            return sample(app, "messages_total", outcome="archived") >= 1

        await eventually(archived)
        [key] = await foundation.store.list_keys(raw_prefix(factory))
        assert key.endswith("/msg-redeliver-01.json")
        assert await foundation.store.get_bytes(key) == payload

        async def announced() -> bool:
            return bool(await messages_on(js, RAW_STREAM, raw_subject(factory, "factory_state")))

        await eventually(announced)


async def test_stop_mid_stream_loses_nothing_and_the_next_session_finishes(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    factory: str,
) -> None:
    """SIGTERM of the only replica while a stream is flowing: with no other replica alive to
    take the group's messages it keeps its session and subscription, at once (no other can be
    stopping either: the wait for others to say so is an hour here, and the stop ends all the
    same), so in-flight messages are acked, the rest (and what devices publish meanwhile) wait
    in the broker for the session, and the next run of the same session archives every one."""
    count = 300  # twice this stays under a broker's default limit of 1,000 queued per session
    # slow archiving (two at a time): the replica is still busy when it stops
    slow = settings.model_copy(update={"mqtt_max_inflight": 2, "max_concurrency": 2})
    async with running(create_app(slow)) as app:
        app.hand_over_settle_s = 3600
        publishing = asyncio.create_task(publish_burst(publisher, factory, "msg-stream", count))

        async def some_archived() -> bool:
            return sample(app, "messages_total", outcome="archived") >= 10

        await eventually(some_archived)
        at_stop = sample(app, "messages_total", outcome="archived")
    await publishing
    first_run = sample(app, "messages_total", outcome="archived")
    # devices go on publishing while no ingest is connected: queued for the kept session
    await publish_burst(publisher, factory, "msg-down", count)

    async with running(create_app(settings)) as app:

        async def all_archived() -> bool:
            return len(await foundation.store.list_keys(raw_prefix(factory))) == 2 * count

        await eventually(all_archived, within=60)
    keys = await foundation.store.list_keys(raw_prefix(factory))
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == sorted(
        f"{prefix}-{i:05d}.json" for prefix in ("msg-down", "msg-stream") for i in range(count)
    )
    assert at_stop < count, "the replica should have been stopped mid-stream"
    assert first_run < 2 * count and not app.handed_over


async def test_replicas_stopping_together_keep_their_sessions(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    factory: str,
    unique_id: str,
) -> None:
    """The whole service stops at once (both replicas signalled together): each sees the
    other stopping, so neither hands its session over; what was queued for them and what
    devices publish while both are down waits for the sessions, and nothing is lost."""
    count = 300  # twice this stays under a broker's default limit of 1,000 queued per session
    # slow archiving (two at a time): the replicas are still busy when they stop
    slow = {"mqtt_max_inflight": 2, "max_concurrency": 2}
    ids = [f"ingest-{unique_id}", f"ingest-{unique_id}-b"]

    def apps(limits: dict[str, int]) -> list[IngestApp]:
        return [
            create_app(settings.model_copy(update={**limits, "mqtt_client_id": cid})) for cid in ids
        ]

    first = apps(slow)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(app.run(stop)) for app in first]
    await eventually(lambda: all(app.subscribed.is_set() for app in first))
    publishing = asyncio.create_task(publish_burst(publisher, factory, "msg-both", count))

    async def some_archived() -> bool:
        return sum(sample(app, "messages_total", outcome="archived") for app in first) >= 10

    await eventually(some_archived)
    at_stop = sum(sample(app, "messages_total", outcome="archived") for app in first)
    stop.set()
    async with asyncio.timeout(30):
        await asyncio.gather(*tasks)
    await publishing
    # devices go on publishing while the whole service is down: queued for the kept sessions
    await publish_burst(publisher, factory, "msg-down", count)

    second = apps({"mqtt_max_inflight": 64, "max_concurrency": 64})
    async with running(second[0]), running(second[1]):

        async def all_archived() -> bool:
            return len(await foundation.store.list_keys(raw_prefix(factory))) == 2 * count

        await eventually(all_archived, within=60)
    assert at_stop < count, "the replicas should have been stopped mid-stream"
    assert not any(app.handed_over for app in first), "a replica handed over with none to take it"


async def test_a_replica_leaving_for_good_hands_its_queued_messages_over_first(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    factory: str,
    unique_id: str,
) -> None:
    """Scale-down: two replicas share the stream; one stops mid-stream and never comes back.
    Seeing the other alive, it unsubscribes before it disconnects and archives what the broker
    had already queued for its session, so every message is archived by the two and none waits
    in a session nobody resumes (that would hold them until the session expired)."""
    count = 600
    staying = create_app(settings)
    # slower archiving (eight at a time): a backlog waits for the leaving replica when it stops
    leaving = create_app(
        settings.model_copy(
            update={
                "mqtt_max_inflight": 8,
                "max_concurrency": 8,
                "mqtt_client_id": f"ingest-{unique_id}-b",
                "ingest_shutdown_grace_s": 15,
            }
        )
    )

    async def archived() -> int:
        return len(await foundation.store.list_keys(raw_prefix(factory)))

    leaving.hand_over_settle_s = 0.05  # straight to the hand-over: the backlog is still there
    async with running(staying):
        async with running(leaving):
            await publish_burst(publisher, factory, "msg-leave", count)

            async def flowing() -> bool:
                return sample(leaving, "messages_total", outcome="archived") >= 10

            await eventually(flowing)
            archived_at_stop = await archived()

        async def all_archived() -> bool:
            return await archived() == count

        await eventually(all_archived, within=60)

    assert archived_at_stop < count, "the replica should have left mid-stream"
    assert leaving.handed_over > 0, "nothing waited for the leaving replica after it unsubscribed"
    assert not staying.handed_over
    keys = await foundation.store.list_keys(raw_prefix(factory))
    assert sorted(k.rsplit("/", 1)[1] for k in keys) == [
        f"msg-leave-{i:05d}.json" for i in range(count)
    ]


async def test_a_factory_flooding_the_queue_is_refused_at_its_bound_and_others_go_on(
    settings: IngestSettings,
    foundation: Foundation,
    publisher: aiomqtt.Client,
    factory: str,
    unique_id: str,
) -> None:
    """A device (or a stolen identity) floods while nothing consumes: its factory's backlog in
    the raw stream stops at its bound, the rest of its messages are archived and dead-lettered
    (queue_full, with the event to requeue), and another factory's messages still queue."""
    server = start_private_nats()  # the bound is per stream: not the machine's shared streams
    try:
        bounded = settings.model_copy(
            update={"nats_url": server.url, "nats_raw_max_per_factory": 3}
        )
        other = f"{factory}-other"
        async with running(create_app(bounded)) as app:
            for n in range(5):
                payload = device_payload(factory, f"flood-{n:04d}")
                await publisher.publish(f"aegis/{factory}/factory_state", payload, qos=1)
            calm = device_payload(other, "calm-0001")
            await publisher.publish(f"aegis/{other}/factory_state", calm, qos=1)
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            try:

                async def settled() -> bool:
                    full = await dead_letters(js, bounded.service, "queue_full")
                    queued = await messages_on(js, RAW_STREAM, raw_subject(other, "factory_state"))
                    return len(full) == 2 and len(queued) == 1

                await eventually(settled, within=30, what="3 queued, 2 dead-lettered, 1 other")
                queued = await messages_on(js, RAW_STREAM, raw_subject(factory, "factory_state"))
                letters = await dead_letters(js, bounded.service, "queue_full")
            finally:
                await nc.close()
            assert len(queued) == 3
            assert "maximum messages per subject exceeded" in letters[0].detail
            events = [RawArchived.model_validate_json(d.payload_bytes()) for d in letters]
            refused = {e.message_id for e in events}
            assert refused <= {f"flood-{n:04d}" for n in range(5)} and len(refused) == 2
            # nothing stored is lost: every message is in raw/, the refused ones requeueable
            keys = await foundation.store.list_keys(raw_prefix(factory))
            assert len(keys) == 5 and {e.key for e in events} <= set(keys)
            assert sample(app, "dead_letters_total", reason="queue_full") == 2
    finally:
        server.close()
