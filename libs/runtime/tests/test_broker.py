"""aegis_runtime.bus against a real NATS JetStream: streams, de-duplication, shared durable pull
consumers, redelivery with delay, dead letters. Every test uses its own stream and subjects."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import socket
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
import structlog
from faststream.nats import NatsBroker, NatsMessage, NatsRouter
from nats.js import JetStreamContext, api

from aegis_contracts.errors import ContractError
from aegis_contracts.subjects import DEAD_LETTER, STREAMS, StreamSpec, dead_letter_subject
from aegis_devstack.localservers import ManagedServer
from aegis_devstack.testing.waiting import eventually
from aegis_runtime import natsio
from aegis_runtime.bus import (
    DeadLetter,
    Outgoing,
    Poison,
    PublishFailed,
    RetryPolicy,
    StreamFull,
    StreamLimits,
    connect_options,
    create_broker,
    current_subject,
    dead_letter,
    delivery,
    durable_pull,
    ensure_streams,
    jstream,
    nats_ready,
    poison_reason,
    publish,
    publish_many,
    stop_consuming,
    stream_for,
)
from aegis_runtime.lifecycle import start_background
from aegis_runtime.logging import _AegisHandler, configure
from aegis_runtime.metrics import Metrics
from aegis_runtime.service import ServiceApp
from aegis_runtime.settings import AegisSettings
from aegis_storage.clients import AwsClients

pytestmark = pytest.mark.integration

DLQ_SPEC = next(s for s in STREAMS if s.name == "AEGIS_DLQ")
FAST_RETRY = RetryPolicy(first_delay=0.02, max_delay=0.1)


class NotYet(ConnectionError):
    """A failure whose handler knows a retry succeeds once ``retry_after_s`` has passed."""

    retry_after_s = 0.3


class Reading(pydantic.BaseModel):
    device_id: str
    value: float


@pytest.fixture
def settings(nats_url: str) -> AegisSettings:
    return AegisSettings(nats_url=nats_url)


@pytest.fixture
async def broker(settings: AegisSettings) -> AsyncIterator[NatsBroker]:
    broker = create_broker(settings, name="runtime-test")
    await broker.connect()
    yield broker
    await broker.stop()


@pytest.fixture
def js(broker: NatsBroker) -> JetStreamContext:
    return broker.connection.jetstream()


@pytest.fixture
def spec(unique_id: str) -> StreamSpec:
    return StreamSpec(
        name=f"TEST_{unique_id.upper().replace('-', '_')}",
        subjects=(f"test.{unique_id}.>",),
        max_age_seconds=300,
        duplicate_window_seconds=60,
    )


@pytest.fixture
async def stream(
    broker: NatsBroker, js: JetStreamContext, spec: StreamSpec
) -> AsyncIterator[StreamSpec]:
    await ensure_streams(broker, [spec])
    yield spec
    await js.delete_stream(spec.name)


@pytest.fixture
async def dlq(broker: NatsBroker, js: JetStreamContext, unique_id: str) -> AsyncIterator[str]:
    """The shared AEGIS_DLQ stream (never deleted) and a service name unique to this test."""
    await ensure_streams(broker, [DLQ_SPEC])
    service = f"svc-{unique_id}"
    yield service
    await js.purge_stream(DLQ_SPEC.name, subject=f"{DEAD_LETTER}.{service}.>")


async def _last_dead_letter(js: JetStreamContext, service: str, reason: str) -> DeadLetter:
    raw = await js.get_last_msg(DLQ_SPEC.name, dead_letter_subject(service, reason))
    assert raw.data is not None
    return DeadLetter.model_validate_json(raw.data)


async def _consumer(js: JetStreamContext, spec: StreamSpec, durable: str) -> api.ConsumerInfo:
    info: api.ConsumerInfo = await js.consumer_info(spec.name, durable)
    return info


def _outcomes(metrics: Metrics) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in metrics.messages_total.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                found[s.labels["outcome"]] = found.get(s.labels["outcome"], 0.0) + s.value
    return found


# -- pure helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delivery", "delay"), [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (500, 60.0)]
)
def test_retry_delay_doubles_up_to_the_cap(delivery: int, delay: float) -> None:
    assert RetryPolicy(first_delay=1.0, max_delay=60.0).delay(delivery) == delay


@pytest.mark.parametrize(
    ("subject", "stream"),
    [
        ("aegis.raw.f-01.plc", "AEGIS_RAW"),
        ("aegis.objects.created.state_snapshot", "AEGIS_EVENTS"),
        ("aegis.heartbeat.ingest", "AEGIS_EVENTS"),
        ("aegis.dlq.processor.invalid_payload", "AEGIS_DLQ"),
    ],
)
def test_stream_for_finds_the_capturing_stream(subject: str, stream: str) -> None:
    assert stream_for(subject).name == stream


@pytest.mark.parametrize("subject", ["aegis.raw", "aegis.rawx.f.plc", "other.raw.f.plc"])
def test_stream_for_refuses_uncaptured_subjects(subject: str) -> None:
    with pytest.raises(ValueError, match="no AEGIS stream"):
        stream_for(subject)


def test_every_connection_pings_its_server_as_the_settings_say() -> None:
    # without pings of its own a client trusts a silent server for as long as the operating
    # system keeps the TCP connection (nats-py's defaults: up to 6 minutes)
    options = connect_options(AegisSettings(nats_ping_interval_s=1.5, nats_max_outstanding_pings=3))
    assert (options["ping_interval"], options["max_outstanding_pings"]) == (1.5, 3)
    defaults = connect_options(AegisSettings())
    assert defaults["ping_interval"] * (defaults["max_outstanding_pings"] + 1) <= 15


def test_poison_reasons() -> None:
    assert poison_reason(Poison("bad reading!")) == "bad_reading_"
    assert poison_reason(ContractError("bad_factory_id", "nope")) == "bad_factory_id"
    with pytest.raises(pydantic.ValidationError) as caught:
        Reading.model_validate({"device_id": 1})
    assert poison_reason(caught.value) == "invalid_payload"
    assert poison_reason(TimeoutError()) is None
    assert poison_reason(RuntimeError("db down")) is None


def test_jstream_mirrors_the_spec_and_does_not_declare(spec: StreamSpec) -> None:
    stream = jstream(spec)
    assert stream.name == spec.name
    assert list(stream.subjects) == list(spec.subjects)
    assert stream.config.max_age == 300
    assert stream.config.duplicate_window == 60
    assert stream.config.storage is api.StorageType.FILE
    assert stream.declare is False


def test_durable_pull_needs_a_subject_when_the_stream_has_several(spec: StreamSpec) -> None:
    two = replace(spec, subjects=("a.>", "b.>"))
    with pytest.raises(ValueError, match="pass subject="):
        durable_pull(NatsRouter(), two, "workers")
    sub = durable_pull(NatsRouter(), spec, "workers", max_deliver=7, ack_wait=12)
    assert sub.config.max_deliver == 7
    assert sub.config.ack_wait == 12
    assert sub.config.ack_policy is api.AckPolicy.EXPLICIT


def test_dead_letter_envelope_round_trips_text_and_binary() -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    text = DeadLetter.wrap(
        service="s", reason="r", payload=b'{"a": 1}', detail="d", received_at=now
    )
    assert (text.payload_encoding, text.payload) == ("utf-8", '{"a": 1}')
    binary = DeadLetter.wrap(
        service="s", reason="r", payload=b"\xff\x00\xfe", detail="d", received_at=now
    )
    assert binary.payload_encoding == "base64"
    assert (
        DeadLetter.model_validate_json(binary.model_dump_json()).payload_bytes() == b"\xff\x00\xfe"
    )


# -- against NATS --------------------------------------------------------------------------------


async def test_ensure_streams_is_idempotent(
    broker: NatsBroker, js: JetStreamContext, spec: StreamSpec
) -> None:
    try:
        assert await ensure_streams(broker, [spec]) == {spec.name: "created"}
        assert await ensure_streams(broker, [spec]) == {spec.name: "unchanged"}
        config = (await js.stream_info(spec.name)).config
        assert config.subjects == list(spec.subjects)
        assert config.max_age == 300
        assert config.duplicate_window == 60
        assert config.storage == api.StorageType.FILE

        longer = replace(spec, max_age_seconds=600)
        assert await ensure_streams(broker, [longer]) == {spec.name: "updated"}
        assert (await js.stream_info(spec.name)).config.max_age == 600
    finally:
        await js.delete_stream(spec.name)


async def test_ensure_streams_from_many_replicas_at_once(
    broker: NatsBroker, js: JetStreamContext, spec: StreamSpec
) -> None:
    try:
        results = await asyncio.gather(*(ensure_streams(broker, [spec]) for _ in range(8)))
        assert all(r[spec.name] in {"created", "unchanged"} for r in results)
        names = [s.config.name for s in await js.streams_info()]
        assert names.count(spec.name) == 1
    finally:
        await js.delete_stream(spec.name)


async def test_same_msg_id_is_stored_once(
    broker: NatsBroker, js: JetStreamContext, stream: StreamSpec, unique_id: str
) -> None:
    subject = f"test.{unique_id}.raw"
    assert await publish(broker, subject, b"one", msg_id="m-1", stream=stream.name) is False
    assert await publish(broker, subject, b"one again", msg_id="m-1", stream=stream.name) is True
    assert await publish(broker, subject, b"two", msg_id="m-2", stream=stream.name) is False
    model = Reading(device_id="d-1", value=2.5)
    assert await publish(broker, subject, model, msg_id="m-3", stream=stream.name) is False

    info = await js.stream_info(stream.name)
    assert info.state.messages == 3
    first = await js.get_msg(stream.name, seq=1)
    assert first.data == b"one"
    assert first.headers is not None
    assert first.headers["Nats-Msg-Id"] == "m-1"
    third = await js.get_msg(stream.name, seq=3)
    assert third.data is not None
    assert Reading.model_validate_json(third.data) == model


async def test_a_publish_carries_exactly_the_headers_it_was_given(
    broker: NatsBroker, js: JetStreamContext, stream: StreamSpec, unique_id: str
) -> None:
    # through FastStream, as before it: no correlation id of its own, the body as encoded here
    subject = f"test.{unique_id}.headers"
    model = Reading(device_id="d-1", value=2.5)
    await publish(broker, subject, model, msg_id="h-1", stream=stream.name)
    await publish(broker, subject, model, msg_id="h-2", stream=stream.name, correlation_id="c-2")
    first = await js.get_msg(stream.name, seq=1)
    second = await js.get_msg(stream.name, seq=2)
    assert first.data == model.model_dump_json().encode()
    expected = {"Nats-Msg-Id": "h-1", "content-type": "application/json"}
    # and nats-py's own: the stream the server must store it in
    expected["Nats-Expected-Stream"] = stream.name
    assert first.headers == expected
    assert second.headers == {**expected, "Nats-Msg-Id": "h-2", "correlation_id": "c-2"}


async def test_publish_many_sends_all_then_waits_for_every_ack(
    broker: NatsBroker, js: JetStreamContext, stream: StreamSpec, unique_id: str
) -> None:
    subject = f"test.{unique_id}.many"
    model = Reading(device_id="d-1", value=2.5)
    batch = [Outgoing(subject, b"one", "n-1"), Outgoing(subject, model, "n-2")]
    assert await publish_many(broker, batch, stream=stream.name) == [False, False]
    again = [Outgoing(subject, b"one", "n-1"), Outgoing(subject, b"three", "n-3")]
    assert await publish_many(broker, again, stream=stream.name) == [True, False]
    info = await js.stream_info(stream.name)
    assert info.state.messages == 3
    with pytest.raises(PublishFailed):
        await publish_many(
            broker,
            [Outgoing(subject, b"four", "n-4"), Outgoing(f"nowhere.{unique_id}", b"x", None)],
            stream=stream.name,
            ack_timeout=1,
        )


async def test_concurrent_batches_each_get_their_own_acks_and_a_refusal_names_its_subject(
    broker: NatsBroker, js: JetStreamContext, stream: StreamSpec, unique_id: str
) -> None:
    """Many batches in flight on one connection: every publish gets its own ack back (a
    duplicate is told apart from a first), and a refusal fails its batch naming what it
    refused, without leaving the batch's other acks waiting."""
    subject = f"test.{unique_id}.acks"
    firsts = [Outgoing(subject, f"m-{n}".encode(), f"a-{n}") for n in range(40)]
    assert await publish_many(broker, firsts, stream=stream.name) == [False] * 40

    def batch(b: int) -> list[Outgoing]:  # odd positions repeat an earlier message's id
        return [
            Outgoing(subject, b"x", f"a-{b * 5 + i}" if i % 2 else f"b-{b}-{i}") for i in range(5)
        ]

    answers = await asyncio.gather(
        *(publish_many(broker, batch(b), stream=stream.name) for b in range(8))
    )
    assert answers == [[False, True, False, True, False]] * 8
    assert (await js.stream_info(stream.name)).state.messages == 40 + 8 * 3
    elsewhere = f"nowhere.{unique_id}"
    with pytest.raises(PublishFailed, match=elsewhere):
        await publish_many(
            broker,
            [Outgoing(elsewhere, b"x", None), Outgoing(subject, b"ok", "c-1")],
            stream=stream.name,
            ack_timeout=2,
        )

    async def the_other_is_stored() -> bool:
        return (await js.stream_info(stream.name)).state.messages == 40 + 8 * 3 + 1

    await eventually(the_other_is_stored, within=5, what="the batch's other message")


async def test_publish_to_a_subject_no_stream_captures_fails(
    broker: NatsBroker, stream: StreamSpec, unique_id: str
) -> None:
    with pytest.raises(PublishFailed):
        await publish(
            broker, f"nowhere.{unique_id}", b"x", msg_id=None, stream=stream.name, ack_timeout=1
        )


async def test_nats_ready_reflects_the_connection(settings: AegisSettings) -> None:
    broker = create_broker(settings, name="ready-test")
    check = nats_ready(broker, wait=0.1)
    assert await check() is False  # not connected yet
    await broker.connect()
    assert await check() is True
    await broker.stop()


def _unacknowledged_limit_ms(client: natsio.Client) -> int:
    # the socket under nats-py's TCP transport
    sock = client._transport._io_writer.get_extra_info("socket")
    limit: int = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
    return limit


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux's TCP_USER_TIMEOUT")
async def test_a_connection_is_given_up_when_data_waits_as_long_as_its_pings_may(
    private_nats: ManagedServer,
) -> None:
    # 1.5 s pings, 3 of them unanswered: the socket drops data unacknowledged for 6 s, on the
    # first connection and on each reconnection, the service's and the dashboard feed's alike
    settings = AegisSettings(
        nats_url=private_nats.url, nats_ping_interval_s=1.5, nats_max_outstanding_pings=3
    )
    broker = create_broker(settings, name="unacknowledged-test")
    await broker.connect()
    feed = await natsio.connect(connect_options(settings), max_reconnect_attempts=-1)
    try:
        clients = [natsio.client(broker), feed]
        assert [_unacknowledged_limit_ms(c) for c in clients] == [6000, 6000]
        before = [c.stats["reconnects"] for c in clients]
        private_nats.restart()
        await eventually(
            lambda: all(
                c.is_connected and c.stats["reconnects"] > n
                for c, n in zip(clients, before, strict=True)
            ),
            within=20,
            what="both reconnected",
        )
        assert [_unacknowledged_limit_ms(c) for c in clients] == [6000, 6000]
    finally:
        await feed.close()
        await broker.stop()


async def test_durable_pull_consumer_shares_work_between_replicas(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    unique_id: str,
) -> None:
    subject = f"test.{unique_id}.work"
    seen: list[tuple[int, bytes]] = []
    replicas = [create_broker(settings, name=f"replica-{i}") for i in range(2)]
    for index, replica in enumerate(replicas):

        def make_handler(index: int) -> Callable[[bytes], Awaitable[None]]:
            async def handle(body: bytes) -> None:
                await asyncio.sleep(0.005)  # some work, so both replicas get fetches in
                seen.append((index, body))

            return handle

        durable_pull(replica, stream, "workers", subject=subject, batch_size=4, fetch_timeout=0.5)(
            make_handler(index)
        )
    for replica in replicas:
        await replica.start()
    try:
        for n in range(50):
            await publish(broker, subject, f"job-{n}".encode(), msg_id=f"w-{n}", stream=stream.name)

        async def all_acked() -> bool:
            info = await _consumer(js, stream, "workers")
            return info.num_pending == 0 and info.num_ack_pending == 0 and len(seen) >= 50

        await eventually(all_acked)
    finally:
        for replica in replicas:
            await replica.stop()

    bodies = Counter(body for _, body in seen)
    assert len(seen) == 50
    assert set(bodies) == {f"job-{n}".encode() for n in range(50)}
    assert max(bodies.values()) == 1  # each message went to exactly one replica
    per_replica = Counter(index for index, _ in seen)
    assert per_replica[0] > 0
    assert per_replica[1] > 0
    info = await _consumer(js, stream, "workers")
    assert info.num_redelivered == 0
    assert (await js.stream_info(stream.name)).state.consumer_count == 1


async def test_a_consumer_whose_first_fetch_says_empty_the_plain_way_keeps_its_one_pull_loop(
    settings: AegisSettings,
    stream: StreamSpec,
    unique_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """nats-py says an empty fetch with a plain ``TimeoutError`` when the fetch's time ran out
    before its second request (a busy start). FastStream's pull loop passes over nats-py's own
    ``TimeoutError`` only: the plain one ended the loop, and FastStream started it again with an
    ERROR and a traceback in the log. The consumer's very first fetch says it so here: the same
    loop (one task) goes on and handles the message published afterwards."""
    fetch = natsio.PullSubscription.fetch
    callers: list[asyncio.Task[Any] | None] = []

    async def first_fetch_plain_timeout(self: Any, *args: Any, **kwargs: Any) -> Any:
        callers.append(asyncio.current_task())
        if len(callers) == 1:
            raise TimeoutError  # as nats-py's deadline path raises it
        return await fetch(self, *args, **kwargs)

    monkeypatch.setattr(natsio.PullSubscription, "fetch", first_fetch_plain_timeout)
    subject = f"test.{unique_id}.first"
    handled: list[bytes] = []
    consumer = create_broker(settings, name="first-fetch")

    @durable_pull(consumer, stream, "first", subject=subject, fetch_timeout=0.2)
    async def handle(body: bytes) -> None:
        handled.append(body)

    await consumer.start()
    try:
        await eventually(lambda: len(callers) >= 2, what="a fetch after the first")
        await publish(consumer, subject, b"after", msg_id=f"first-{unique_id}", stream=stream.name)
        await eventually(lambda: handled == [b"after"], what="the message handled")
    finally:
        await consumer.stop()
    assert len(set(callers)) == 1, "the pull loop was started again"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure("json", "INFO", stream=out)
    yield out
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _AegisHandler)]:
        root.removeHandler(handler)
        handler.close()
    structlog.reset_defaults()


async def test_a_consumer_stopped_while_events_flow_leaves_none_unacknowledged(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    unique_id: str,
) -> None:
    """A rolling restart's view of one consumer: stopped (as a service stops: consumers first,
    the connection after) and replaced, twelve times, while events flow and handlers are busy.
    Every event is handled once and acknowledged, none waits for its ack wait (300 s here) to be
    delivered again: a stop hands back nothing it fetched and did not settle."""
    subject = f"test.{unique_id}.flow"
    seen: list[bytes] = []
    busy_at_stop: list[int] = []
    in_flight = 0

    def replica() -> NatsBroker:
        service = create_broker(settings, name="flowing")

        @durable_pull(
            service, stream, "flow", subject=subject, batch_size=8, fetch_timeout=0.5, ack_wait=300
        )
        async def handle(body: bytes) -> None:
            nonlocal in_flight
            in_flight += 1
            try:
                await asyncio.sleep(0.02 + 0.01 * (len(seen) % 5))
                seen.append(body)
            finally:
                in_flight -= 1

        return service

    flowing = asyncio.Event()
    flowing.set()
    published = 0

    async def flow() -> None:
        nonlocal published
        while flowing.is_set():
            await publish(
                broker, subject, f"e-{published}".encode(), msg_id=None, stream=stream.name
            )
            published += 1
            await asyncio.sleep(0.004)

    feeder = asyncio.create_task(flow())
    current = replica()
    await current.start()
    try:
        for n in range(12):
            await asyncio.sleep(0.07 + 0.03 * (n % 4))
            busy_at_stop.append(in_flight)
            await stop_consuming(current)
            await current.stop()
            current = replica()
            await current.start()
        flowing.clear()
        await feeder

        async def all_acked() -> bool:
            info = await _consumer(js, stream, "flow")
            return info.num_pending == 0 and info.num_ack_pending == 0

        await eventually(all_acked, within=10, what="every event acknowledged")
    finally:
        flowing.clear()
        await feeder
        await current.stop()
    assert sum(1 for busy in busy_at_stop if busy) >= 3, busy_at_stop  # stops met busy handlers
    assert sorted(seen) == sorted(f"e-{n}".encode() for n in range(published))
    assert (await _consumer(js, stream, "flow")).num_redelivered == 0


class _SlowToStop(ServiceApp):
    """A service with one consumer and a background task that takes a while to finish (a
    periodic run caught mid-way by the stop)."""

    def __init__(self, settings: AegisSettings, stream: StreamSpec, subject: str) -> None:
        super().__init__(settings, background=False)
        self.handled: list[bytes] = []

        @durable_pull(self.broker, stream, "slow", subject=subject, batch_size=8, fetch_timeout=0.5)
        async def handle(body: bytes) -> None:
            await asyncio.sleep(0.01)
            self.handled.append(body)

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        async def run(stop: asyncio.Event) -> None:
            await stop.wait()
            await asyncio.sleep(1.0)  # the run in progress finishes

        start_background(stack, run, "slow-run")


async def test_a_stopping_service_takes_no_new_message_while_its_tasks_finish(
    nats_url: str,
    aws_endpoint: str,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    unique_id: str,
) -> None:
    """Asked to stop with a backlog waiting, a service settles what it holds and fetches
    nothing more, though its background task takes a second to finish: the backlog is left,
    unacknowledged by no one, to the replicas that go on."""
    subject = f"test.{unique_id}.backlog"
    await publish_many(
        broker,
        [Outgoing(subject, f"b-{n}".encode(), f"b-{unique_id}-{n}") for n in range(400)],
        stream=stream.name,
    )
    settings = AegisSettings(
        service=f"slow-{unique_id}", nats_url=nats_url, aws_endpoint_url=aws_endpoint
    )
    app = _SlowToStop(settings, stream, subject)
    await app.start()
    try:
        await eventually(lambda: len(app.handled) >= 16, within=10, what="work under way")
    finally:
        at_stop = len(app.handled)
        await app.stop()
    info = await _consumer(js, stream, "slow")
    assert len(app.handled) - at_stop <= 8  # the batch it held, no more
    assert info.num_ack_pending == 0
    assert info.num_pending == 400 - len(app.handled) > 0  # the fault hit with work waiting


async def test_a_stopping_consumer_drops_a_pull_requests_end_from_its_buffer_and_fetches_nothing_more(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    unique_id: str,
) -> None:
    """The server ends a pull request with a status message (No Messages, Request Timeout); one
    that arrives after its fetch gave up waits in the consumer's buffer. A consumer stopping
    with one there drops it and asks the server for nothing more: the message published while
    it stops is left, unacknowledged by no one, to the replicas that go on."""
    subject = f"test.{unique_id}.late"
    holding, release = asyncio.Event(), asyncio.Event()
    handled: list[bytes] = []
    service = create_broker(settings, name="late")

    consumer = durable_pull(
        service, stream, "late", subject=subject, batch_size=4, fetch_timeout=0.5
    )

    @consumer
    async def handle(body: bytes) -> None:
        handled.append(body)
        holding.set()
        await release.wait()

    await service.start()
    try:
        await publish(broker, subject, b"first", msg_id=None, stream=stream.name)
        await asyncio.wait_for(holding.wait(), 10)
        # while the pull loop is in the handler, a pull request of the consumer's own inbox
        # that finds nothing: the server's No Messages waits in the buffer, as a late end does
        subscription = consumer.subscription
        assert subscription is not None and subscription.pending_msgs == 0
        await natsio.client(broker).publish(
            subscription._nms,
            json.dumps({"batch": 1, "no_wait": True}).encode(),
            reply=subscription._deliver,
        )
        await eventually(lambda: subscription.pending_msgs == 1, what="the status in the buffer")

        async def no_request_waiting() -> bool:  # the loop's last fetch has expired
            return (await _consumer(js, stream, "late")).num_waiting == 0

        await eventually(no_request_waiting, within=10, what="no pull request left")
        await publish(broker, subject, b"second", msg_id=None, stream=stream.name)
        fetch = subscription.fetch
        stopping = asyncio.create_task(stop_consuming(service))
        await eventually(lambda: subscription.fetch is not fetch, what="the stop under way")
        release.set()  # the loop leaves the handler for its next fetch, with the status buffered
        await asyncio.wait_for(stopping, 30)
    finally:
        release.set()
        await service.stop()
    info = await _consumer(js, stream, "late")
    assert handled == [b"first"]
    assert info.num_pending == 1 and info.num_ack_pending == 0


async def test_transient_error_is_nacked_and_redelivered(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    unique_id: str,
    json_log: io.StringIO,
) -> None:
    subject = f"test.{unique_id}.flaky"
    metrics = Metrics("flaky")
    service = create_broker(settings, name="flaky", metrics=metrics, retry=FAST_RETRY)
    router = NatsRouter()  # the middleware reaches subscribers declared on routers too
    deliveries: list[int] = []
    told: list[int] = []  # what delivery() says: the same, without a context parameter
    subjects: list[str] = []  # and current_subject()

    @durable_pull(router, stream, "flaky", subject=subject, fetch_timeout=0.5, max_deliver=3)
    async def handle(body: bytes, msg: NatsMessage) -> None:
        deliveries.append(msg.raw_message.metadata.num_delivered or 0)
        told.append(delivery())
        subjects.append(current_subject())
        if len(deliveries) < 3:
            raise NotYet("storage unavailable")

    service.include_router(router)
    await service.start()
    try:
        await publish(broker, subject, b"payload", msg_id="f-1", stream=stream.name)
        await eventually(lambda: _outcomes(metrics).get("ok") == 1)
        info = await _consumer(js, stream, "flaky")
        assert info.num_ack_pending == 0
    finally:
        await service.stop()

    assert deliveries == told == [1, 2, 3]
    assert subjects == [subject] * 3
    assert delivery() == 1 and current_subject() == ""  # outside a message
    assert _outcomes(metrics) == {"retried": 2, "ok": 1}
    summaries = [
        line
        for line in map(json.loads, json_log.getvalue().splitlines())
        if line["event"] == "message_handled"
    ]
    assert [(s["outcome"], s["delivery"]) for s in summaries] == [
        ("retried", 1),
        ("retried", 2),
        ("ok", 3),
    ]
    for summary in summaries:
        assert summary["service"] == "flaky"
        assert summary["message_id"] == "f-1"
        assert summary["subject"] == subject
        assert summary["duration_ms"] >= 0
    assert summaries[0]["level"] == "warning"
    assert "NotYet: storage unavailable" in summaries[0]["error"]
    assert summaries[0]["retry_in_s"] == FAST_RETRY.delay(1)
    # the last delivery is held back until the handler said a retry succeeds, not spent sooner
    assert summaries[1]["retry_in_s"] == NotYet.retry_after_s > FAST_RETRY.delay(2)


async def test_poison_message_is_dead_lettered_then_acked(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    dlq: str,
    unique_id: str,
) -> None:
    subject = f"test.{unique_id}.readings"
    metrics = Metrics(dlq)
    service = create_broker(settings, name=dlq, metrics=metrics, retry=FAST_RETRY)
    handled: list[Reading] = []

    @durable_pull(service, stream, "readings", subject=subject, fetch_timeout=0.5)
    async def handle(reading: Reading) -> None:
        if reading.value < 0:
            raise Poison("negative_reading", f"value {reading.value} is below zero")
        handled.append(reading)

    await service.start()
    try:
        await publish(broker, subject, b"\xffnot json", msg_id="p-1", stream=stream.name)
        await publish(
            broker, subject, Reading(device_id="d", value=-1), msg_id="p-2", stream=stream.name
        )
        await publish(
            broker, subject, Reading(device_id="d", value=1), msg_id="p-3", stream=stream.name
        )

        async def settled() -> bool:
            info = await _consumer(js, stream, "readings")
            return info.num_pending == 0 and info.num_ack_pending == 0 and len(handled) == 1

        await eventually(settled)
    finally:
        await service.stop()

    info = await _consumer(js, stream, "readings")
    assert info.num_redelivered == 0  # poison is not retried
    invalid = await _last_dead_letter(js, dlq, "invalid_payload")
    assert invalid.service == dlq
    assert invalid.subject == subject
    assert invalid.message_id == "p-1"
    assert invalid.deliveries == 1
    assert invalid.payload_encoding == "base64"
    assert invalid.payload_bytes() == b"\xffnot json"
    negative = await _last_dead_letter(js, dlq, "negative_reading")
    assert "below zero" in negative.detail
    assert Reading.model_validate_json(negative.payload_bytes()).value == -1
    assert negative.headers["Nats-Msg-Id"] == "p-2"
    assert _outcomes(metrics) == {"dead_lettered": 2, "ok": 1}
    assert metrics.dead_letters_total.labels(reason="negative_reading")._value.get() == 1


async def test_retries_are_bounded_by_max_deliver(
    settings: AegisSettings,
    broker: NatsBroker,
    js: JetStreamContext,
    stream: StreamSpec,
    dlq: str,
    unique_id: str,
) -> None:
    subject = f"test.{unique_id}.doomed"
    metrics = Metrics(dlq)
    service = create_broker(settings, name=dlq, metrics=metrics, retry=FAST_RETRY)
    deliveries: list[int] = []

    @durable_pull(service, stream, "doomed", subject=subject, fetch_timeout=0.5, max_deliver=3)
    async def handle(body: bytes, msg: NatsMessage) -> None:
        deliveries.append(msg.raw_message.metadata.num_delivered or 0)
        raise RuntimeError("always fails")

    await service.start()
    try:
        await publish(broker, subject, b"doomed", msg_id="d-1", stream=stream.name)
        await eventually(lambda: _outcomes(metrics).get("dead_lettered") == 1)
    finally:
        await service.stop()

    assert deliveries == [1, 2, 3]
    assert _outcomes(metrics) == {"retried": 2, "dead_lettered": 1}
    letter = await _last_dead_letter(js, dlq, "retries_exhausted")
    assert letter.deliveries == 3
    assert "RuntimeError: always fails" in letter.detail
    assert "delivery 3 of 3" in letter.detail
    assert letter.payload == "doomed"
    assert (await _consumer(js, stream, "doomed")).num_ack_pending == 0


async def test_dead_letter_is_idempotent_per_message_and_reason(
    broker: NatsBroker, js: JetStreamContext, dlq: str
) -> None:
    async def send(reason: str, message_id: str | None, payload: bytes = b"{}") -> bool:
        return await dead_letter(
            broker,
            service=dlq,
            reason=reason,
            payload=payload,
            detail="bad",
            subject="aegis.raw.f-01.plc",
            headers={"x": "1"},
            message_id=message_id,
        )

    assert await send("invalid_payload", "m-1") is False
    assert await send("invalid_payload", "m-1") is True  # the redelivered message
    assert await send("other_reason", "m-1") is False
    assert await send("invalid_payload", None, b"a") is False
    assert await send("invalid_payload", None, b"a") is True  # id derived from subject + payload
    assert await send("invalid_payload", None, b"b") is False

    state = (await js.stream_info(DLQ_SPEC.name, subjects_filter=f"{DEAD_LETTER}.{dlq}.>")).state
    assert state.subjects == {
        dead_letter_subject(dlq, "invalid_payload"): 3,
        dead_letter_subject(dlq, "other_reason"): 1,
    }
    letter = await _last_dead_letter(js, dlq, "other_reason")
    assert (letter.reason, letter.detail, letter.headers) == ("other_reason", "bad", {"x": "1"})
    assert letter.received_at.tzinfo is not None


async def test_a_start_keeps_what_an_operator_raised_and_applies_the_deployments_bounds(
    broker: NatsBroker, js: JetStreamContext, spec: StreamSpec
) -> None:
    try:
        limits = StreamLimits(max_bytes={spec.name: 1024 * 1024})
        assert await ensure_streams(broker, [spec], limits=limits) == {spec.name: "created"}
        assert (await js.stream_info(spec.name)).config.max_bytes == 1024 * 1024
        # an operator raises the age and the bytes by hand (nats stream edit)
        raised = (await js.stream_info(spec.name)).config
        raised.max_age, raised.max_bytes = 3600.0, 8 * 1024 * 1024
        await js.update_stream(raised)
        # every later start, with the deployment's smaller values, leaves them
        assert await ensure_streams(broker, [spec], limits=limits) == {spec.name: "unchanged"}
        config = (await js.stream_info(spec.name)).config
        assert (config.max_age, config.max_bytes) == (3600.0, 8 * 1024 * 1024)
    finally:
        await js.delete_stream(spec.name)


async def test_a_full_subject_refuses_its_next_message_and_only_its_own(
    broker: NatsBroker, js: JetStreamContext, spec: StreamSpec
) -> None:
    bounded = replace(spec, bounded_per_subject=True)
    prefix = spec.subjects[0].removesuffix(".>")
    try:
        await ensure_streams(broker, [bounded], limits=StreamLimits(raw_max_per_factory=3))
        config = (await js.stream_info(spec.name)).config
        assert config.max_msgs_per_subject == 3 and config.discard == api.DiscardPolicy.NEW
        noisy = [Outgoing(f"{prefix}.noisy", b"{}", msg_id=f"noisy-{n}") for n in range(3)]
        await publish_many(broker, noisy, stream=spec.name)
        with pytest.raises(StreamFull, match="maximum messages per subject exceeded"):
            await publish(broker, f"{prefix}.noisy", b"{}", msg_id="noisy-3", stream=spec.name)
        # another subject (another factory) is not held back by the full one
        await publish(broker, f"{prefix}.quiet", b"{}", msg_id="quiet-0", stream=spec.name)
        info = await js.stream_info(spec.name)
        assert info.state.messages == 4  # nothing older was dropped to make room
    finally:
        await js.delete_stream(spec.name)
