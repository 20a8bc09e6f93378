"""The durability the AWS overlay's three JetStream replicas claim (AEGIS_NATS_STREAM_REPLICAS=3),
on a real cluster of three local nats-servers with natsauth's identities: the admin creates the
streams as the overlay's ``aegis streams`` Job does; ingest publishes raw events its own way while
the raw stream's leader is killed (SIGKILL); every acknowledged event is in the stream exactly
once; the killed node comes back and catches up. A stream of one replica on the same cluster is
unavailable once its node is killed, so it is the three replicas that hold; and a service whose
settings say one replica leaves the three alone. (The nodes do not advertise each other to
clients, as in the overlay's NATS chart; the last test, an expected failure, shows why a cluster
that does advertise would strand a service with an identity after a node loss.)

Ingest's own handler, with its default retry budget, publishes through the same faults: the
leader killed, and the leader's node cut off from the others and from ingest for 30 s (a
partition: every packet dropped, no FIN, no RST), each node then on a host of a network of the
test's own (network namespaces, :mod:`aegis_devstack.testing.netlab`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import random
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nats.errors
import nats.js.errors
import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client
from nats.js import JetStreamManager, api

from aegis_contracts.archive import Archive, admit, raw_event_msg_id
from aegis_contracts.bus import ADMIN
from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import STREAMS, StreamSpec
from aegis_contracts.times import utc_now
from aegis_devstack.testing.devices import factory_state_message
from aegis_devstack.testing.natscluster import (
    NatsCluster,
    Node,
    nats_server_binary,
    start_cluster,
)
from aegis_devstack.testing.netlab import Network
from aegis_devstack.testing.waiting import eventually
from aegis_ingest.handlers import Inbound, IngestHandler, Outcome
from aegis_ingest.settings import IngestSettings
from aegis_runtime import natsio
from aegis_runtime.bus import (
    MSG_ID_HEADER,
    PublishFailed,
    StreamLimits,
    StreamSetupFailed,
    create_broker,
    ensure_deployed_streams,
    ensure_streams,
    publish,
    publish_raw_archived,
)
from aegis_runtime.bus import streams as bus_streams
from aegis_runtime.metrics import Metrics
from aegis_runtime.settings import AegisSettings
from aegis_storage.s3 import ObjectStore, PutResult

if TYPE_CHECKING:
    from aegis_devstack.testing.storage import Foundation

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
# how long the leader is frozen before it is killed: the publishers send to it meanwhile, far
# shorter than an election takes
FROZEN_S = 0.3
PASSWORDS = {ADMIN: "admin-pw", "ingest": "ingest-pw"}
# longer than a three-replica stream here takes to elect a new leader after a kill (4-9 s seen)
UNAVAILABLE_FOR_S = 10.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """With monitoring: a node says whom it follows (:func:`freeze_the_leader`)."""
    started = start_cluster(tmp_path, PASSWORDS, monitor=True)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def hosted_cluster(tmp_path: Path, network: Network) -> Iterator[NatsCluster]:
    """The cluster with each node on a host of the test's network (its own namespace), with
    monitoring, so that a node cut off from the rest still says what it believes."""
    hosts = [network.host(f"n{index}") for index in (1, 2, 3)]
    started = start_cluster(tmp_path, PASSWORDS, hosts=hosts, monitor=True)
    try:
        yield started
    finally:
        started.stop()


@contextlib.asynccontextmanager
async def deployed(cluster: NatsCluster) -> AsyncIterator[NatsBroker]:
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
async def admin(cluster: NatsCluster) -> AsyncIterator[NatsBroker]:
    async with deployed(cluster) as broker:
        yield broker


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


async def freeze_the_leader(cluster: NatsCluster, admin: NatsBroker) -> Node:
    """Stop (SIGSTOP) the raw stream's leader and return its node, once both other nodes, asked
    after the signal, still name it the leader. On a loaded machine the leadership can move
    between the question and the signal; a follower frozen instead is let go (SIGCONT) and the
    leader asked again."""
    seen: list[str | None] = []
    for _ in range(5):
        leader, _ = peers(await stream_info(admin))
        assert leader is not None
        node = cluster.node(leader)
        assert node.server.process is not None
        os.kill(node.server.process.pid, signal.SIGSTOP)
        others = [other for other in cluster.nodes if other is not node]
        seen = await asyncio.gather(
            *(asyncio.to_thread(other.stream_leader, RAW.name) for other in others)
        )
        if set(seen) == {leader}:
            return node
        os.kill(node.server.process.pid, signal.SIGCONT)
    raise AssertionError(f"the raw stream's leader kept moving: the others named {seen}")


def new_leader(broker: NatsBroker, old: str | None) -> Callable[[], Awaitable[bool]]:
    """Whether the raw stream has a leader, and not ``old`` (asked through ``broker``)."""

    async def elected() -> bool:
        try:
            leader, _ = peers(await stream_info(broker, wait=0.25))
        except (nats.errors.Error, TimeoutError):
            return False
        return leader not in (None, old)

    return elected


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
    last_began: float = 0.0  # when the latest attempt began
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
                began = tally.last_began = time.monotonic()
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
    # frozen first, so that the publishes sent to it now wait for an answer it never gives
    # (killed at once, it could have answered every one it had): then killed
    frozen = await freeze_the_leader(cluster, admin)
    frozen_at = time.monotonic()
    leader, doomed = frozen.name, frozen.server
    await asyncio.sleep(FROZEN_S)
    # and not before a publish was sent to it: on a busy machine the publishers may not have
    # run in those 0.3 s, and what was in flight then had been answered before the freeze
    await eventually(
        lambda: tally.last_began > frozen_at,
        within=10,
        interval=0.01,
        what="a publish sent while the leader was frozen",
    )
    acked_at_kill, in_flight_at_kill = len(tally.acked), tally.in_flight
    doomed.kill()
    killed_at = time.monotonic()
    await eventually(new_leader(admin, leader), within=20, what="a new leader of the raw stream")
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


def add_stream_spy(monkeypatch: pytest.MonkeyPatch, *, too_many_first: int = 0) -> list[int]:
    """Count natsio.add_stream's calls (each goes to the cluster); the first ``too_many_first``
    ask for four replicas, which three nodes cannot place (the cluster's own refusal, as a
    cluster still forming gives it)."""
    real = natsio.add_stream
    asked: list[int] = []

    async def spy(broker: NatsBroker, config: api.StreamConfig) -> bool:
        replicas = 4 if len(asked) < too_many_first else config.num_replicas
        asked.append(replicas)
        return await real(broker, dataclasses.replace(config, num_replicas=replicas))

    monkeypatch.setattr(natsio, "add_stream", spy)
    return asked


async def test_a_stream_refused_for_placement_is_asked_again_until_placed(
    admin: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = StreamSpec("AEGIS_PLACED_LATER", ("placed.>",), max_age_seconds=3600)
    asked = add_stream_spy(monkeypatch, too_many_first=2)
    assert await ensure_streams(admin, [spec], limits=StreamLimits(replicas=3)) == {
        spec.name: "created"
    }
    assert asked == [4, 4, 3]
    leader, followers = peers(await stream_info(admin, spec.name))
    assert leader is not None and len(followers) == 2


async def test_a_stream_that_cannot_be_placed_in_time_is_refused_naming_it(
    admin: NatsBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bus_streams, "PLACEMENT_WAIT_S", 1.5)
    spec = StreamSpec("AEGIS_NEVER_PLACED", ("never.>",), max_age_seconds=3600)
    asked = add_stream_spy(monkeypatch)
    with pytest.raises(StreamSetupFailed, match=r"AEGIS_NEVER_PLACED: .*no suitable peers"):
        await ensure_streams(admin, [spec], limits=StreamLimits(replicas=4))
    assert len(asked) >= 3  # asked again with back-off until the time was up
    with pytest.raises(nats.js.errors.NotFoundError):
        await _jsm(admin).stream_info(spec.name)


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


# -- ingest's own handler through the faults -----------------------------------------------------


def message_id_of(key: str) -> str:
    """The device's message id in a raw key (``raw/.../{message_id}.json``)."""
    return key.rsplit("/", 1)[1].removesuffix(".json")


class CountingStore(ObjectStore):
    """The real object store, counting the attempts of ingest's handler: each begins with the
    raw object's put."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store._clients, store.bucket)
        self.attempts: Counter[str] = Counter()

    async def put_immutable(self, key: str, body: bytes, **options: Any) -> PutResult:
        self.attempts[message_id_of(key)] += 1
        return await super().put_immutable(key, body, **options)


@dataclass
class Feed:
    """Device messages handed to ingest's real handler the way the MQTT broker hands them: at
    most ``settings.max_concurrency`` at once (the slots of ingest's reader, its Receive Maximum
    in front), each acknowledged when the handler says so, and handed again when the handler
    deferred it (the broker delivers what was not acknowledged again)."""

    handler: IngestHandler
    store: CountingStore
    factory: str = field(default_factory=lambda: f"f-{random.getrandbits(32):08x}")
    published: int = 0
    acked: dict[str, float] = field(default_factory=dict)  # message id: when it was acked
    ack_times: list[float] = field(default_factory=list)
    first_handed: dict[str, float] = field(default_factory=dict)
    deferred: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    longest_handling_s: float = 0.0  # one delivery, from the handler's start to its outcome
    waiting: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    # what the device sent: a redelivery carries the same bytes
    payloads: dict[str, bytes] = field(default_factory=dict)

    async def device(self, rate: float, stop: asyncio.Event, count: int | None = None) -> None:
        """Publish ``rate`` messages a second until ``stop`` is set or ``count`` are out."""
        began = time.monotonic()
        while not stop.is_set() and (count is None or self.published < count):
            message_id = f"msg-{self.published:08d}"
            self.payloads[message_id] = factory_state_message(self.factory, message_id, utc_now())
            self.waiting.put_nowait(message_id)
            self.published += 1
            ahead = began + self.published / rate - time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, ahead))

    async def deliver(self) -> None:
        """Hand messages to the handler until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(self.handler.settings.max_concurrency):
                group.create_task(self._slot())

    async def _slot(self) -> None:
        while True:
            message_id = await self.waiting.get()
            self.first_handed.setdefault(message_id, time.monotonic())
            inbound = Inbound(
                topic=f"aegis/{self.factory}/factory_state",
                payload=self.payloads[message_id],
                qos=1,
                received_at=utc_now(),
            )
            self.in_flight += 1
            began = time.monotonic()
            try:
                outcome = await self.handler.handle(inbound)
            finally:
                self.in_flight -= 1
            self.longest_handling_s = max(self.longest_handling_s, time.monotonic() - began)
            if outcome.acknowledge:
                assert message_id not in self.acked, f"{message_id} acknowledged twice"
                self.acked[message_id] = time.monotonic()
                self.ack_times.append(self.acked[message_id])
            else:
                assert message_id not in self.acked, f"{message_id} deferred after its ack"
                self.deferred[message_id] += 1
                self.waiting.put_nowait(message_id)

    def longest_gap(self, since: float = 0.0, until: float = math.inf) -> float:
        """The longest time between two acknowledgements in a row, of those that end after
        ``since`` and begin before ``until``."""
        pairs = itertools.pairwise(sorted(self.ack_times))
        return max((b - a for a, b in pairs if b > since and a < until), default=0.0)

    def all_acked(self) -> bool:
        return len(self.acked) == self.published

    def redelivered_until_acked(self) -> bool:
        """Every message the handler deferred (its budget spent: not acknowledged) was handed
        again, and acknowledged at last; the deferrals are the handler's own count."""
        counted = self.handler.metrics.total("messages_total", outcome=Outcome.DEFERRED.value)
        return set(self.deferred) <= set(self.acked) and counted == self.deferred.total()


def assert_stored_once(feed: Feed, stored: Counter[str]) -> None:
    """Every message the handler acknowledged is in the stream exactly once, and nothing else
    is; every message it deferred (not acknowledged: its budget spent) was handed again until
    it was acknowledged; and every message published was acknowledged at last."""
    assert feed.redelivered_until_acked()
    assert feed.all_acked() and set(stored) == set(feed.acked)
    assert set(stored.values()) == {1}


def budget_floor_s(settings: IngestSettings) -> float:
    """The shortest time ingest's retries of one delivery can span: every delay between its
    attempts at the low end of its jitter (half)."""
    return sum(
        0.5 * min(settings.ingest_retry_max_delay_s, settings.ingest_retry_first_delay_s * 2**n)
        for n in range(settings.ingest_retry_attempts - 1)
    )


@contextlib.asynccontextmanager
async def feeding(
    settings: IngestSettings, broker: NatsBroker, foundation: Foundation
) -> AsyncIterator[Feed]:
    """A :class:`Feed` of a new factory's messages to ingest's handler on ``broker``, delivering
    while the block runs."""
    store = CountingStore(foundation.store)
    handler = IngestHandler(
        settings=settings, store=store, broker=broker, metrics=Metrics(settings.service)
    )
    feed = Feed(handler, store)
    delivering = asyncio.create_task(feed.deliver())
    try:
        yield feed
    finally:
        delivering.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await delivering


# how long the raw stream may answer 503 to its reading after a fault: a node back from a
# partition may cost an election after the cluster looked whole (seen: over 10 s on two workers)
READ_WITHIN_S = 60.0


async def stored_message_ids(broker: NatsBroker, factory: str) -> Counter[str]:
    """How many times each message id of ``factory`` is in the raw stream (read again while
    JetStream is between leaders, for :data:`READ_WITHIN_S` at most)."""
    deadline, reads = time.monotonic() + READ_WITHIN_S, 0
    while time.monotonic() < deadline:
        reads += 1
        try:
            info = await stream_info(broker, wait=5.0)
            keys = await stored_msg_ids(broker, info)
        except nats.js.errors.ServiceUnavailableError:
            await asyncio.sleep(1.0)
            continue
        return Counter(message_id_of(k) for k in keys if k.startswith(f"raw/{factory}/"))
    raise AssertionError(
        f"JetStream unavailable for {READ_WITHIN_S:g} s of reading the raw stream ({reads} reads)"
    )


def ingest_settings(cluster: NatsCluster, foundation: Foundation, endpoint: str) -> IngestSettings:
    """Ingest's settings against ``cluster`` and this test's bucket: every retry, timeout and
    ping setting its default."""
    return IngestSettings(
        **cluster.identity("ingest"), aws_endpoint_url=endpoint, bucket=foundation.bucket
    )


async def test_ingests_own_retries_carry_every_message_through_a_leader_kill_once(
    cluster: NatsCluster, admin: NatsBroker, foundation: Foundation, aws_endpoint: str
) -> None:
    settings = ingest_settings(cluster, foundation, aws_endpoint)
    broker = create_broker(settings, name=settings.service)
    try:
        await ensure_deployed_streams(broker, settings)
        async with feeding(settings, broker, foundation) as feed:
            stop = asyncio.Event()
            device = asyncio.create_task(feed.device(rate=40, stop=stop, count=EVENTS))
            await eventually(
                lambda: len(feed.acked) >= EVENTS // 4,
                within=20,
                what="a quarter acknowledged",
            )
            # frozen, then killed with messages in the handler's hands (waiting on it): nothing
            # awaited between look and kill
            doomed = await freeze_the_leader(cluster, admin)
            leader = doomed.name
            await eventually(
                lambda: feed.in_flight > 0, within=10, what="messages in the handler's hands"
            )
            acked_at_kill, in_flight_at_kill = len(feed.acked), feed.in_flight
            doomed.server.kill()
            killed_at = time.monotonic()
            await eventually(
                new_leader(admin, leader), within=20, what="a new leader of the raw stream"
            )
            elected_s = time.monotonic() - killed_at
            await device
            await eventually(feed.all_acked, within=40, what="every message acknowledged")
        stored = await stored_message_ids(admin, feed.factory)
    finally:
        await broker.stop()

    # the election hit messages the handler held: some were in its hands at the kill and were
    # acknowledged after it, and those that took more than one attempt were all waiting on it
    across = [
        m for m, t in feed.acked.items() if t > killed_at and feed.first_handed[m] < killed_at
    ]
    retried = {m: n for m, n in feed.store.attempts.items() if n > 1}
    assert in_flight_at_kill > 0 and acked_at_kill < EVENTS
    assert across and retried and all(feed.acked[m] > killed_at for m in retried)
    # (a message whose budget ran out, if the election outlasted it, was handed again)
    assert len(feed.acked) == EVENTS
    assert_stored_once(feed, stored)
    print(  # the measured numbers, shown with -rP
        f"published={feed.published} acked_at_kill={acked_at_kill} "
        f"in_flight_at_kill={in_flight_at_kill} acked_across_kill={len(across)} "
        f"retried={len(retried)} most_attempts={max(feed.store.attempts.values())} "
        f"(budget {settings.ingest_retry_attempts} a delivery) "
        f"deferred={sum(feed.deferred.values())} election_s={elected_s:.2f} "
        f"longest_handling_s={feed.longest_handling_s:.2f} "
        f"budget_floor_s={budget_floor_s(settings):.2f} "
        f"longest_gap_between_acks_s={feed.longest_gap():.2f}"
    )


PARTITION_S = 30.0  # the longest a partition lasts (it ends once all it must show was seen)
# how long the cluster must stay whole after a partition to count as recovered
WHOLE_FOR_S = 3.0
# messages a second from the device while the partition test runs
PARTITION_RATE = 10


async def ingest_on_the_leader(
    cluster: NatsCluster, admin: NatsBroker, settings: IngestSettings
) -> tuple[NatsBroker, Node]:
    """Ingest's broker, connected to the node that leads the raw stream. A client takes one of
    the cluster's URLs at random, so brokers are started until one lands there: the leadership
    is left where it is (a forced step-down's election is won by one of the others at random,
    and may never fall on a given node)."""
    leader, _ = peers(await stream_info(admin))
    for _ in range(40):  # a third of them land on the leader: 40 misses are (2/3)**40 ~ 1e-7
        broker = create_broker(settings, name=settings.service)
        try:
            await ensure_deployed_streams(broker, settings)
            node = connected_node(cluster, broker)
        except BaseException:
            await broker.stop()
            raise
        if node is not None and node.name == leader:
            return broker, node
        await broker.stop()
    raise AssertionError(f"no ingest connected to {leader}, the raw stream's leader, in 40 tries")


def connected_node(cluster: NatsCluster, broker: NatsBroker) -> Node | None:
    client = natsio.client(broker)
    if not client.is_connected or client.connected_url is None:
        return None
    netloc = client.connected_url.netloc
    return next((node for node in cluster.nodes if f"{node.host}:{node.port}" == netloc), None)


@dataclass
class PartitionLog:
    """When each thing was first seen after the cut (monotonic seconds)."""

    ingest_disconnected: float | None = None
    ingest_reconnected: float | None = None
    ingest_reconnected_to: str | None = None
    majority_elected: float | None = None
    majority_leader: str | None = None
    minority_stepped_down: float | None = None


async def watch_partition(
    cluster: NatsCluster, cut: Node, ingest: NatsBroker, observer: NatsBroker, log: PartitionLog
) -> None:
    """Note when ingest drops its connection to the cut node and makes one to another, when
    the other two elect a leader among themselves, and when the cut node stops calling itself
    the leader (asked on its own host), until cancelled."""

    async def ingest_connection() -> None:
        while log.ingest_reconnected is None:
            node = connected_node(cluster, ingest)
            if node is None and log.ingest_disconnected is None:
                log.ingest_disconnected = time.monotonic()
            elif node is not None and node is not cut:
                log.ingest_reconnected = time.monotonic()
                log.ingest_reconnected_to = node.name
            await asyncio.sleep(0.05)

    async def majority() -> None:
        while log.majority_elected is None:
            with contextlib.suppress(nats.errors.Error, TimeoutError):
                leader, _ = peers(await stream_info(observer, wait=0.5))
                if leader not in (None, cut.name):
                    log.majority_elected, log.majority_leader = time.monotonic(), leader
            await asyncio.sleep(0.1)

    async def minority() -> None:
        while log.minority_stepped_down is None:
            if await asyncio.to_thread(cut.stream_leader, RAW.name) != cut.name:
                log.minority_stepped_down = time.monotonic()
            await asyncio.sleep(0.25)

    async with asyncio.TaskGroup() as group:
        for watch in (ingest_connection, majority, minority):
            group.create_task(watch())


async def cluster_whole(observer: NatsBroker, cluster: NatsCluster) -> bool:
    """A leader, and every other node a current replica of the raw stream."""
    try:
        leader, others = peers(await stream_info(observer, wait=0.5))
    except (nats.errors.Error, TimeoutError):
        return False
    names = {leader, *(p.name for p in others)}
    return (
        leader is not None
        and names == {node.name for node in cluster.nodes}
        and all(p.current and not p.offline and not p.lag for p in others)
    )


async def whole_again(observer: NatsBroker, cluster: NatsCluster, within: float) -> float:
    """Wait until the cluster has been whole for ``WHOLE_FOR_S`` running (a node back from a
    partition may still cost an election or two); when that began (monotonic seconds)."""
    deadline = time.monotonic() + within
    since: float | None = None
    while time.monotonic() < deadline:
        if await cluster_whole(observer, cluster):
            since = since or time.monotonic()
            if time.monotonic() - since >= WHOLE_FOR_S:
                return since
        else:
            since = None
        await asyncio.sleep(0.25)
    raise AssertionError(f"the cluster not whole for {WHOLE_FOR_S} s running within {within} s")


@pytest.mark.timeout(180)
async def test_a_partitioned_leader_steps_down_and_every_acked_message_is_stored_once(
    hosted_cluster: NatsCluster, network: Network, foundation: Foundation, aws_endpoint: str
) -> None:
    cluster = hosted_cluster
    settings = ingest_settings(cluster, foundation, aws_endpoint)
    async with contextlib.AsyncExitStack() as stack:
        admin = await stack.enter_async_context(deployed(cluster))
        # the hard case: ingest is connected to the node that leads the raw stream, so the
        # partition cuts ingest's own connection too, and nothing closes it
        broker, cut = await ingest_on_the_leader(cluster, admin, settings)
        stack.push_async_callback(broker.stop)
        assert cut.place is not None
        majority = [node for node in cluster.nodes if node is not cut]
        observer = create_broker(
            AegisSettings(
                **(cluster.identity(ADMIN) | {"nats_url": ",".join(n.url for n in majority)})
            ),
            name="observer",
        )
        stack.push_async_callback(observer.stop)
        await observer.connect()

        feed = await stack.enter_async_context(feeding(settings, broker, foundation))
        stop = asyncio.Event()
        device = asyncio.create_task(feed.device(rate=PARTITION_RATE, stop=stop))
        await eventually(lambda: len(feed.acked) >= 2 * PARTITION_RATE, what="acks before the cut")
        log = PartitionLog()
        acked_before_cut = len(feed.acked)
        network.cut(cut.place)
        cut_at = time.monotonic()
        watching = asyncio.create_task(watch_partition(cluster, cut, broker, observer, log))

        def partition_shown() -> bool:
            """Everything the partition must show was seen, and acknowledgements came from
            the majority for a second's worth of messages since ingest reconnected."""
            reconnected = log.ingest_reconnected
            return (
                watching.done()
                and reconnected is not None
                and (sum(1 for t in feed.acked.values() if t > reconnected) >= PARTITION_RATE)
            )

        # the partition lasts until then (at most PARTITION_S): what it must show is not sooner
        # for a longer one, and an assertion below names what was not seen within it
        with contextlib.suppress(AssertionError):
            await eventually(partition_shown, within=PARTITION_S, what="the partition shown")
        network.heal(cut.place)
        healed_at = time.monotonic()
        acked_during = sum(1 for t in feed.acked.values() if cut_at < t < healed_at)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        recovered_s = await whole_again(observer, cluster, within=75) - healed_at
        stop.set()
        await device
        await eventually(feed.all_acked, within=40, what="every message acknowledged")
        drained_s = time.monotonic() - healed_at
        stored = await stored_message_ids(observer, feed.factory)

    # the longest time without an acknowledgement while the partition lasted, and after it
    unavailable_s = feed.longest_gap(since=cut_at, until=healed_at)
    unavailable_after_heal_s = feed.longest_gap(since=healed_at)
    stale_within = (settings.nats_max_outstanding_pings + 1) * settings.nats_ping_interval_s
    # the minority's leader stepped down and the majority elected one, while the partition lasted
    assert log.minority_stepped_down is not None and log.minority_stepped_down < healed_at
    assert log.majority_elected is not None and log.majority_elected < healed_at
    assert log.majority_leader in {node.name for node in majority}
    # ingest gave its silent connection up by its pings, and took acknowledgements again from
    # the majority before the partition ended
    assert log.ingest_disconnected is not None
    assert log.ingest_disconnected - cut_at <= stale_within + 1.0
    assert log.ingest_reconnected is not None and log.ingest_reconnected < healed_at
    assert acked_before_cut > 0 and acked_during > 0 and unavailable_s < healed_at - cut_at
    assert_stored_once(feed, stored)
    print(  # the measured numbers, shown with -rP
        f"published={feed.published} acked_before_cut={acked_before_cut} "
        f"acked_during_partition={acked_during} deferred={sum(feed.deferred.values())} "
        f"most_attempts_at_one_message={max(feed.store.attempts.values())} "
        f"(budget {settings.ingest_retry_attempts} a delivery) "
        f"cut={cut.name} new_leader={log.majority_leader} partition_s={healed_at - cut_at:.2f} "
        f"majority_elected_s={log.majority_elected - cut_at:.2f} "
        f"minority_stepped_down_s={log.minority_stepped_down - cut_at:.2f} "
        f"ingest_gave_up_connection_s={log.ingest_disconnected - cut_at:.2f} "
        f"ingest_reconnected_s={log.ingest_reconnected - cut_at:.2f} "
        f"to={log.ingest_reconnected_to} "
        f"unavailable_s={unavailable_s:.2f} unavailable_after_heal_s={unavailable_after_heal_s:.2f} "
        f"recovered_after_heal_s={recovered_s:.2f} all_acked_after_heal_s={drained_s:.2f}"
    )
