"""The durability the AWS overlay's three JetStream replicas claim (AEGIS_NATS_STREAM_REPLICAS=3),
on a real cluster of three local nats-servers with natsauth's identities: the admin creates the
streams as the overlay's ``aegis streams`` Job does; ingest publishes raw events its own way while
the raw stream's leader is killed (SIGKILL); every acknowledged event is in the stream exactly
once; the killed node comes back and catches up. A stream of one replica on the same cluster is
unavailable once its node is killed, so it is the three replicas that hold; and a service whose
settings say one replica leaves the three alone. (The nodes do not advertise each other to
clients, as in the overlay's NATS chart; the last test, an expected failure, shows why a cluster
that does advertise would strand a service with an identity after a node loss.)"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.js import JetStreamManager, api

from aegis_cli.natsauth import ADMIN
from aegis_contracts.archive import Archive, admit, raw_event_msg_id
from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import STREAMS, StreamSpec
from aegis_contracts.times import utc_now
from aegis_devstack.testing.natscluster import NatsCluster, nats_server_binary, start_cluster
from aegis_devstack.testing.waiting import eventually
from aegis_ingest.settings import IngestSettings
from aegis_runtime.broker import (
    MSG_ID_HEADER,
    PublishFailed,
    StreamLimits,
    create_broker,
    ensure_deployed_streams,
    ensure_streams,
    publish,
    publish_raw_archived,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        nats_server_binary() is None,
        reason="nats-server is not installed (apt install nats-server)",
    ),
]

RAW = next(spec for spec in STREAMS if spec.name == "AEGIS_RAW")
EVENTS = 300
# ingest handles this many device messages at once (each its own put and publish)
IN_FLIGHT = 8
PASSWORDS = {ADMIN: "admin-pw", "ingest": "ingest-pw"}
# longer than a three-replica stream here takes to elect a new leader after a kill (4-9 s seen)
UNAVAILABLE_FOR_S = 10.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    started = start_cluster(tmp_path, PASSWORDS)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def admin(cluster: NatsCluster) -> AsyncIterator[NatsBroker]:
    """The admin identity with the overlay's settings; it has created the streams, as the
    overlay's ``aegis streams`` Job does (every stream on all three nodes)."""
    settings = cluster.settings(ADMIN, nats_stream_replicas=3)
    broker = create_broker(settings, name="streams")
    try:
        assert set((await ensure_deployed_streams(broker, settings)).values()) == {"created"}
        yield broker
    finally:
        await broker.stop()


@pytest.fixture
async def ingest(cluster: NatsCluster) -> AsyncIterator[tuple[NatsBroker, IngestSettings]]:
    """Ingest's broker and settings (its identity, streams checked, not managed; one replica,
    the default, as a service started without the overlay's settings would have)."""
    settings = IngestSettings(**cluster.identity("ingest"))
    broker = create_broker(settings, name=settings.service)
    try:
        yield broker, settings
    finally:
        await broker.stop()


def _jsm(broker: NatsBroker, timeout: float = 1.0) -> JetStreamManager:
    client: Client = broker.config.connection_state.connection
    return client.jsm(timeout=timeout)


async def stream_info(
    broker: NatsBroker, name: str = RAW.name, wait: float = 1.0
) -> api.StreamInfo:
    return await _jsm(broker, wait).stream_info(name)


def peers(info: api.StreamInfo) -> tuple[str | None, list[api.PeerInfo]]:
    """The stream's leader and its other replicas."""
    assert info.cluster is not None
    return info.cluster.leader, list(info.cluster.replicas or [])


def raw_events(count: int) -> list[RawArchived]:
    """The events ingest would publish for ``count`` device messages (its own ``admit``)."""
    factory = f"f-{random.getrandbits(32):08x}"
    events = []
    for n in range(count):
        payload = json.dumps(
            {"message_id": f"m-{n:05d}", "factory_id": factory, "sensors": {"co_ppm": n}}
        ).encode()
        decision = admit(f"aegis/{factory}/factory_state", payload, utc_now(), 1, bucket="raw")
        assert isinstance(decision, Archive)
        events.append(decision.event)
    return events


@dataclass
class Tally:
    """What the publishers saw: per event its ack time, and the attempts JetStream refused."""

    acked: dict[str, float] = field(default_factory=dict)
    first_tried: dict[str, float] = field(default_factory=dict)
    # when the attempt that was acknowledged began
    acked_attempt_began: list[float] = field(default_factory=list)
    duplicates: int = 0  # acks that said "already stored": a retry of an event the stream had
    failures: Counter[str] = field(default_factory=Counter)  # by the NATS error under them
    in_flight: int = 0
    halfway: asyncio.Event = field(default_factory=asyncio.Event)


async def publish_as_ingest(
    broker: NatsBroker, settings: IngestSettings, events: list[RawArchived], tally: Tally
) -> None:
    """Publish every event the way ingest does, ``IN_FLIGHT`` at once: ``publish_raw_archived``
    with ingest's ack timeout; on failure its backoff and another attempt. (After its last
    attempt ingest defers the message and the MQTT broker delivers it again: the same event,
    under the same Nats-Msg-Id, so attempts continue here until one is acknowledged.)"""
    queue = iter(events)

    async def worker() -> None:
        for event in queue:
            msg_id = raw_event_msg_id(event)
            tally.first_tried[msg_id] = time.monotonic()
            attempt = 0
            while True:
                attempt += 1
                began = time.monotonic()
                tally.in_flight += 1
                try:
                    duplicate = await publish_raw_archived(
                        broker, event, ack_timeout=settings.nats_ack_timeout_s
                    )
                except PublishFailed as err:
                    tally.failures[type(err.__cause__).__name__] += 1
                    delay = settings.ingest_retry_first_delay_s * 2 ** min(attempt - 1, 8)
                    await asyncio.sleep(min(settings.ingest_retry_max_delay_s, delay))
                    continue
                finally:
                    tally.in_flight -= 1
                tally.acked[msg_id] = time.monotonic()
                tally.acked_attempt_began.append(began)
                tally.duplicates += duplicate
                if len(tally.acked) == len(events) // 2:
                    tally.halfway.set()
                break

    async with asyncio.TaskGroup() as group:
        for _ in range(IN_FLIGHT):
            group.create_task(worker())


async def stored_msg_ids(broker: NatsBroker, info: api.StreamInfo) -> list[str]:
    """The Nats-Msg-Id of every message in the stream, sequence by sequence (a gap raises)."""
    jsm = _jsm(broker, timeout=5.0)
    ids = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        msg = await jsm.get_msg(RAW.name, seq)
        ids.append((msg.headers or {})[MSG_ID_HEADER])
    return ids


async def test_three_replicas_lose_nothing_when_the_leader_is_killed(
    cluster: NatsCluster,
    admin: NatsBroker,
    ingest: tuple[NatsBroker, IngestSettings],
) -> None:
    broker, settings = ingest
    # 1. created the deployment's way: three replicas, a leader and two followers, all current
    info = await stream_info(admin)
    assert info.config.num_replicas == 3
    leader, followers = peers(info)
    assert leader is not None and len(followers) == 2
    assert all(p.current and not p.offline for p in followers)
    # ingest's own start-up finds the streams as they should be (its settings say one replica)
    assert set((await ensure_deployed_streams(broker, settings)).values()) == {"unchanged"}

    # 2. publish while the stream's leader is killed halfway
    events = raw_events(EVENTS)
    tally = Tally()
    publishing = asyncio.create_task(publish_as_ingest(broker, settings, events, tally))
    await asyncio.wait_for(tally.halfway.wait(), 30)
    leader, followers = peers(await stream_info(admin))
    assert leader is not None
    acked_at_kill, in_flight_at_kill = len(tally.acked), tally.in_flight
    cluster.node(leader).server.kill()
    killed_at = time.monotonic()

    async def new_leader() -> bool:
        try:
            now_leader, _ = peers(await stream_info(admin, wait=0.25))
        except (nats.errors.Error, TimeoutError):
            return False
        return now_leader not in (None, leader)

    await eventually(new_leader, within=20, what="a new leader of the raw stream")
    elected_s = time.monotonic() - killed_at
    await asyncio.wait_for(publishing, 40)

    acked_after_kill = sum(1 for t in tally.acked.values() if t > killed_at)
    tried_after_kill = sum(1 for t in tally.first_tried.values() if t > killed_at)
    # the first acknowledged publish that began after the kill
    resumed_s = min(t for t in tally.acked_attempt_began if t > killed_at) - killed_at
    assert acked_at_kill < EVENTS and in_flight_at_kill > 0, "the kill hit while work was going"
    assert acked_after_kill > 0 and tried_after_kill > 0
    assert tally.failures.total() > 0, "publishes in flight to the killed leader were confirmed"
    assert len(tally.acked) == EVENTS

    # 3. every acknowledged event is stored exactly once
    info = await stream_info(admin)
    now_leader, _ = peers(info)
    assert now_leader != leader
    ids = await stored_msg_ids(admin, info)
    expected = {raw_event_msg_id(event) for event in events}
    lost = expected - set(ids)
    duplicated = {msg_id: n for msg_id, n in Counter(ids).items() if n > 1}
    assert not lost and not duplicated
    assert info.state.messages == len(ids) == EVENTS
    # the new leader still knows every id: a redelivered event is a duplicate, not a second copy
    redelivered = [await publish_raw_archived(broker, event) for event in events[:20]]
    assert all(redelivered)
    assert (await stream_info(admin)).state.messages == EVENTS

    # 4. the killed node comes back and catches up from the others
    restarted_at = time.monotonic()
    cluster.node(leader).server.restart()

    async def all_current() -> bool:
        try:
            now = await stream_info(admin)
        except (nats.errors.Error, TimeoutError):
            return False
        lead, others = peers(now)
        names = {lead, *(p.name for p in others)}
        return names == {node.name for node in cluster.nodes} and all(
            p.current and not p.offline and not p.lag for p in others
        )

    await eventually(all_current, within=20, what="all three replicas current")
    caught_up_s = time.monotonic() - restarted_at
    info = await stream_info(admin)
    assert info.state.messages == EVENTS and info.state.last_seq == EVENTS
    print(  # the measured numbers, shown with -rP
        f"published={EVENTS} acked_at_kill={acked_at_kill} in_flight_at_kill={in_flight_at_kill} "
        f"acked_after_kill={acked_after_kill} first_tried_after_kill={tried_after_kill} "
        f"failed_attempts={dict(tally.failures)} duplicate_acks={tally.duplicates} lost={len(lost)} "
        f"duplicated={len(duplicated)} killed={leader} new_leader={now_leader} "
        f"election_s={elected_s:.2f} publishing_resumed_s={resumed_s:.2f} "
        f"catch_up_s={caught_up_s:.2f}"
    )


async def test_one_replica_is_gone_with_its_node(cluster: NatsCluster, admin: NatsBroker) -> None:
    # the starting condition matters: AEGIS_NATS_STREAM_REPLICAS=1 on the same cluster
    single = StreamSpec("AEGIS_ONE_REPLICA", ("one.>",), max_age_seconds=3600)
    await ensure_streams(admin, [single], limits=StreamLimits(replicas=1))
    for n in range(5):
        await publish(admin, "one.event", b"{}", msg_id=f"one-{n}", stream=single.name)
    info = await stream_info(admin, single.name)
    holder, others = peers(info)
    assert info.state.messages == 5 and holder is not None and not others
    cluster.node(holder).server.kill()
    killed_at = time.monotonic()
    # for longer than the three-replica stream takes to elect a new leader, nobody takes over:
    # neither its messages nor a new one can be reached
    while time.monotonic() - killed_at < UNAVAILABLE_FOR_S:
        with pytest.raises(PublishFailed):
            await publish(
                admin, "one.event", b"{}", msg_id="one-late", stream=single.name, ack_timeout=0.5
            )
        with pytest.raises((nats.errors.Error, TimeoutError)):
            await _jsm(admin, timeout=0.5).get_msg(single.name, 1)
        await asyncio.sleep(0.25)

    # while the three-replica raw stream, hit by the same fault, takes raw events again
    async def raw_accepts() -> bool:
        try:
            await publish_raw_archived(admin, raw_events(1)[0], ack_timeout=0.5)
        except PublishFailed:
            return False
        return True

    await eventually(raw_accepts, within=20, what="the raw stream accepting events again")


async def test_a_start_with_one_replica_keeps_the_three(
    cluster: NatsCluster, admin: NatsBroker
) -> None:
    # a start-up that manages the streams (`aegis streams` or a service run with the base
    # settings, which say one replica) must not lower what the deployment raised
    one = cluster.settings(ADMIN, nats_stream_replicas=1)
    broker = create_broker(one, name="streams-one-replica")
    try:
        outcome = await ensure_deployed_streams(broker, one)
    finally:
        await broker.stop()
    assert set(outcome.values()) == {"unchanged"}
    for spec in STREAMS:
        info = await stream_info(admin, spec.name)
        leader, followers = peers(info)
        assert info.config.num_replicas == 3
        assert leader is not None and len(followers) == 2


async def test_a_service_reconnects_when_the_nodes_advertise(tmp_path: Path) -> None:
    """A service that names one node, on a cluster whose nodes advertise each other (nats-server's
    default): when that node dies it reconnects to one it only heard of, with its identity
    (an option of the connection, not user info of the URL it was given)."""
    cluster = start_cluster(tmp_path, PASSWORDS, advertise=True)
    try:
        first = cluster.nodes[0]
        # one URL, as a deployment names a load balancer or a Service in front of the nodes
        settings = IngestSettings(**(cluster.identity("ingest") | {"nats_url": first.url}))
        broker = create_broker(settings, name=settings.service)
        await broker.connect()
        client: Client = broker.config.connection_state.connection
        try:
            assert len(client.discovered_servers) >= 2
            first.server.kill()
            await eventually(lambda: not client.is_connected, what="ingest disconnected")
            await eventually(lambda: broker.ping(0.5), within=3, what="ingest reconnected")
        finally:
            reconnecting = client._reconnection_task
            if reconnecting is not None and reconnecting.done() and not reconnecting.cancelled():
                reconnecting.exception()  # the refusal that ended it: seen, not reported at exit
            await client.close()
    finally:
        cluster.stop()
