"""Composition root of the ingest service: MQTT shared subscription -> immutable raw/ object ->
RawArchived on JetStream, with acknowledgement to the MQTT broker only after both succeeded; a
gateway's upload request is answered on the same connection (handlers.py).

``create_app(settings=None)`` builds an :class:`IngestApp`; ``await app.run(stop)`` serves until
``stop`` is set. ``main()`` is the ``aegis-ingest`` console script (SIGTERM -> graceful stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from typing import Any, TypeVar

import aiomqtt
import structlog
from faststream.nats import NatsBroker

from aegis_contracts.subjects import STREAMS
from aegis_contracts.times import utc_now
from aegis_ingest.handlers import Inbound, IngestHandler, Reply
from aegis_ingest.mqtt import Acker, create_client
from aegis_ingest.settings import IngestSettings
from aegis_runtime import tracing
from aegis_runtime.bus import create_broker, ensure_deployed_streams, nats_ready
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher, is_alive, last_heartbeats
from aegis_runtime.lifecycle import run_service, settle_heap, start_background
from aegis_runtime.logging import configure
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import open_clients
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger("aegis_ingest")

_T = TypeVar("_T")
# ingest publishes raw events and dead letters only
# raw events, dead letters, and the heartbeats on AEGIS_EVENTS
_STREAMS = STREAMS
# on stop, after unsubscribing, the session counts as drained once no message came for this long
DRAIN_IDLE_S = 1.0
# on stop, the time replicas stopping together get to announce it before one decides to hand over
HAND_OVER_SETTLE_S = 1.0


class _Redeliver(Exception):
    """A message was deferred: recycle the MQTT connection so that the broker redelivers it
    (MQTT v5 resends unacknowledged messages only when the session reconnects)."""


class _Backoff:
    """Exponential reconnect delays with jitter, so N replicas do not reconnect in lockstep."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap, self.failures = first, cap, 0

    def next(self) -> float:
        delay = min(self.cap, self.first * 2.0 ** min(self.failures, 20))
        self.failures += 1
        return delay * random.uniform(0.5, 1.0)  # noqa: S311 (jitter, not cryptography)

    def reset(self) -> None:
        self.failures = 0


class IngestApp:
    def __init__(self, settings: IngestSettings, *, settle: bool = False) -> None:
        self.settings = settings
        self.settle = settle  # a process of its own: settle_heap() once started
        self.metrics = Metrics(settings.service)
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.broker: NatsBroker = create_broker(settings, name=settings.service)
        self.mqtt_connected = False
        self.subscribed = asyncio.Event()  # set while a subscription is live (tests wait on it)
        self.health.add_check("mqtt", self._mqtt_ready)
        self.health.add_check("nats", nats_ready(self.broker))
        self.heartbeat = HeartbeatPublisher.for_service(self.broker, settings, self.health)
        self.tracer = tracing.tracer(settings, "aegis_ingest")  # a no-op one unless tracing is on
        self._tasks: set[asyncio.Task[None]] = set()
        self._received = 0  # messages read from MQTT, all sessions
        self.handed_over = 0  # messages read after unsubscribing, when stopping (a hand-over)
        self.hand_over_settle_s = HAND_OVER_SETTLE_S
        self._waiting_since: float | None = None  # loop time the reader began to wait for one

    async def _mqtt_ready(self) -> bool:
        return self.mqtt_connected

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; then finish (and ack) in-flight messages and disconnect."""
        s = self.settings
        async with AsyncExitStack() as stack:
            clients = await stack.enter_async_context(open_clients(s.aws()))
            stack.push_async_callback(self.broker.stop)
            await ensure_deployed_streams(self.broker, s, _STREAMS)
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            start_background(stack, self.heartbeat.run, "ingest-heartbeat")
            handler = IngestHandler(
                settings=s,
                store=ObjectStore(clients, s.bucket),
                broker=self.broker,
                metrics=self.metrics,
                stopping=stop,
            )
            if self.settle:
                settle_heap()
            log.info(
                "ingest_started",
                client_id=s.mqtt_client_id,
                subscription=s.subscription,
                bucket=s.bucket,
                max_inflight=s.mqtt_max_inflight,
                max_concurrency=s.max_concurrency,
            )
            try:
                await self._consume(handler, stop)
            finally:
                await self._drain()

    async def _consume(self, handler: IngestHandler, stop: asyncio.Event) -> None:
        s = self.settings
        slots = asyncio.Semaphore(s.max_concurrency)
        backoff = _Backoff(s.mqtt_reconnect_min_s, s.mqtt_reconnect_max_s)
        while not stop.is_set():
            try:
                await self._session(handler, stop, slots, backoff)
            except (aiomqtt.MqttError, _Redeliver) as err:
                delay = backoff.next()
                log.warning("mqtt_disconnected", error=str(err) or repr(err), retry_in_s=delay)
                async with _halt_on(stop) as halt:
                    await _first(asyncio.sleep(delay), halt)

    async def _session(
        self,
        handler: IngestHandler,
        stop: asyncio.Event,
        slots: asyncio.Semaphore,
        backoff: _Backoff,
    ) -> None:
        """One MQTT connection: subscribe, hand messages to workers, ack each when it is safe."""
        s = self.settings
        client = create_client(s)
        acker = Acker(client)
        redeliver = asyncio.Event()
        try:
            async with client, _halt_on(stop, redeliver) as halt:
                self.mqtt_connected = True
                await client.subscribe(s.subscription, qos=1)
                self.subscribed.set()
                backoff.reset()
                log.info("mqtt_subscribed", subscription=s.subscription)
                # one reader for the whole session, cancelled when ``halt`` is done: racing each
                # wait against ``halt`` cost a task and an asyncio.wait per message
                reader = asyncio.ensure_future(self._read(client, handler, acker, slots, redeliver))
                try:
                    await _first(asyncio.shield(reader), halt)
                    if (
                        stop.is_set()
                        and not redeliver.is_set()
                        and not reader.done()
                        and await self._others_take_over()
                    ):
                        await self._hand_over(client, reader)
                finally:
                    await _cancel(reader)
                # leaving on purpose: let in-flight messages finish so their PUBACKs go out
                # before DISCONNECT (paho writes packets in the order they were queued)
                await self._drain()
        finally:
            acker.close()
            self.mqtt_connected = False
            self.subscribed.clear()
        if redeliver.is_set() and not stop.is_set():
            raise _Redeliver("a message was deferred; reconnecting for its redelivery")

    async def _others_take_over(self) -> bool:
        """Whether another replica of this service is alive to take the group's messages (its
        last heartbeat fresh and not stopping). Replicas stopping at the same time (a shutdown
        of the whole service) say so in their last heartbeat: after ``HAND_OVER_SETTLE_S`` each
        sees the others stopping and keeps its session, so the broker queues the group's
        messages for the sessions until they return. A replica that sees no other alive keeps
        it at once (no other can be stopping either). Unknown (NATS down): keep it too."""
        try:
            async with asyncio.timeout(5 * HAND_OVER_SETTLE_S):
                await self.heartbeat.announce_stopping()
        except Exception as err:  # NATS down: the peers cannot be asked either; keep the session
            log.warning("mqtt_session_kept", reason="replicas unknown", error=str(err) or repr(err))
            return False
        others = await self._others_alive()
        if others:  # one of them may be stopping too, and not have said so yet
            await asyncio.sleep(self.hand_over_settle_s)
            others = await self._others_alive()
        if others == []:
            log.info("mqtt_session_kept", reason="no other replica alive to take over")
        return bool(others)

    async def _others_alive(self) -> list[str] | None:
        """The other replicas whose last heartbeat is fresh and not stopping; None when the
        heartbeats cannot be read (said in the log)."""
        try:
            async with asyncio.timeout(5 * HAND_OVER_SETTLE_S):
                beats = await last_heartbeats(self.broker, self.settings.service)
        except Exception as err:  # any failure: keep the session, the safe side
            log.warning("mqtt_session_kept", reason="replicas unknown", error=str(err) or repr(err))
            return None
        now = utc_now()
        return [
            b.instance for b in beats if b.instance != self.heartbeat.instance and is_alive(b, now)
        ]

    async def _hand_over(self, client: aiomqtt.Client, reader: asyncio.Future[None]) -> None:
        """Leave the group without stranding messages: unsubscribe, so the broker routes the
        group's messages to the other replicas from now on, then go on reading what it had
        already queued for this session until, with a free slot, none has come for
        ``DRAIN_IDLE_S`` (at most
        ``ingest_shutdown_grace_s``). A replica removed for good (a scale-down) thus leaves no
        messages in a session nobody will resume; one that restarts resumes an empty session
        and subscribes again."""
        s = self.settings
        loop = asyncio.get_running_loop()
        received = self._received
        try:
            await asyncio.wait_for(client.unsubscribe(s.subscription), DRAIN_IDLE_S * 5)
        except (aiomqtt.MqttError, TimeoutError) as err:
            log.warning("mqtt_unsubscribe_failed", error=str(err) or repr(err))
            return
        deadline = loop.time() + s.ingest_shutdown_grace_s
        while not reader.done():
            now = loop.time()
            # idle: the reader has a free slot and has waited this long for a message (a reader
            # waiting for a slot is busy, whatever the time of the last message)
            waiting = self._waiting_since
            idle_until = now + DRAIN_IDLE_S if waiting is None else waiting + DRAIN_IDLE_S
            if now >= idle_until or now >= deadline:
                break
            await asyncio.wait([reader], timeout=min(idle_until, deadline) - now)
        self.handed_over += self._received - received
        log.info(
            "mqtt_session_handed_over",
            subscription=s.subscription,
            drained=self._received - received,
            complete=loop.time() < deadline,
        )

    async def _read(
        self,
        client: aiomqtt.Client,
        handler: IngestHandler,
        acker: Acker,
        slots: asyncio.Semaphore,
        redeliver: asyncio.Event,
    ) -> None:
        """Hand each message of the session to a worker, a free slot first, then the next message
        (the rest wait at the broker). Cancelled while waiting for a slot, the permit is handed
        on; while waiting for a message, it stays queued (unacked, redelivered next session)."""
        messages = aiter(client.messages)

        async def reply(topic: str, payload: bytes) -> None:
            # an upload request's answer, on the session the request came from
            await client.publish(topic, payload, qos=1)

        while True:
            await slots.acquire()
            self._waiting_since = asyncio.get_running_loop().time()
            try:
                message = await anext(messages)
            except BaseException:
                slots.release()
                raise
            finally:
                self._waiting_since = None
            self._received += 1
            payload = message.payload
            inbound = Inbound(
                topic=message.topic.value,
                payload=payload if isinstance(payload, bytes) else str(payload).encode(),
                qos=message.qos,
                received_at=utc_now(),
            )
            task = asyncio.create_task(
                self._work(
                    handler=handler,
                    inbound=inbound,
                    reply=reply,
                    mid=message.mid,
                    acker=acker,
                    slots=slots,
                    redeliver=redeliver,
                )
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _work(
        self,
        *,
        handler: IngestHandler,
        inbound: Inbound,
        reply: Reply,
        mid: int,
        acker: Acker,
        slots: asyncio.Semaphore,
        redeliver: asyncio.Event,
    ) -> None:
        try:
            with tracing.consuming(
                self.tracer,
                "mqtt receive",
                {
                    "messaging.system": "mqtt",
                    "messaging.destination.name": inbound.topic,
                    "messaging.message.body.size": len(inbound.payload),
                },
            ):
                outcome = await handler.handle(inbound, reply)
            if outcome.acknowledge:
                acker.ack(mid, inbound.qos)
            elif inbound.qos > 0:
                redeliver.set()
        finally:
            slots.release()

    async def _drain(self) -> None:
        """Wait for in-flight messages, at most ``ingest_shutdown_grace_s``; cancel the rest
        (they stay unacknowledged and the broker redelivers them)."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(
            set(self._tasks), timeout=self.settings.ingest_shutdown_grace_s
        )
        if pending:
            log.warning("inflight_abandoned", count=len(pending))
            for task in pending:
                task.cancel()
            await asyncio.wait(pending)


@contextlib.asynccontextmanager
async def _halt_on(*events: asyncio.Event) -> AsyncIterator[asyncio.Future[None]]:
    """A future that is done once any of ``events`` is set: one watcher for the whole block,
    where waiting on the events themselves took two tasks per message."""
    halt: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def watch() -> None:
        waiters = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if not halt.done():
            halt.set_result(None)

    watcher = asyncio.create_task(watch())
    try:
        yield halt
    finally:
        watcher.cancel()
        await asyncio.wait([watcher])


async def _cancel(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has settled (its own clean-up done)."""
    if not task.done():
        task.cancel()
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


async def _first(awaitable: Awaitable[_T], halt: asyncio.Future[None]) -> _T | None:
    """The result of ``awaitable``, or None (and it is cancelled) when ``halt`` is done first."""
    task = asyncio.ensure_future(awaitable)
    either: list[asyncio.Future[Any]] = [task, halt]
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            # settle it here: a cancelled Semaphore.acquire hands its permit on, a cancelled
            # queue read leaves the message in the queue (unacked, redelivered next session)
            await asyncio.wait([task])
    if task.cancelled():
        return None
    return task.result()


def create_app(settings: IngestSettings | None = None, *, settle: bool = False) -> IngestApp:
    """``settle``: the app owns its process (the console script); see ``settle_heap``."""
    return IngestApp(settings or IngestSettings(), settle=settle)


def main() -> None:
    settings = IngestSettings()
    configure(settings.log_format, settings.log_level)
    app = create_app(settings, settle=True)
    run_service(app.run, shutdown_timeout=settings.ingest_shutdown_grace_s + 10)
