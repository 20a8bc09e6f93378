"""The simulator's shell: one MQTT v5 connection, the S3 uploads of image snapshots, and the loops
that drive :class:`aegis_simulator.domain.Fleet` in real time (scheduled) or as fast as allowed (load).

Errors: :class:`BrokerUnreachable` when the first connection fails (the CLI exits 2 with the URL).
A failed publish or upload is counted and logged, never fatal: a simulator keeps simulating.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import aiomqtt
import structlog
from botocore.exceptions import BotoCoreError

from aegis_contracts.times import Clock, utc_now
from aegis_runtime.redact import redact_url
from aegis_runtime.settings import AegisSettings
from aegis_simulator.domain import (
    DEFAULT_INFLIGHT,
    Emission,
    Fleet,
    ScenarioSpec,
    scaled_intervals,
)
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 5.0


class BrokerLost(Exception):
    """The connection to the broker dropped during a run (the service reconnects)."""


class BrokerUnreachable(Exception):
    """The MQTT broker did not accept the connection."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to the MQTT broker at {url}: {reason}")
        self.url = url


@dataclass(frozen=True, slots=True)
class MqttTarget:
    url: str
    host: str
    port: int
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_context: ssl.SSLContext | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, url: str) -> MqttTarget:
        parts = urlsplit(url)
        if parts.scheme not in {"mqtt", "tcp", "mqtts", "ssl"} or not parts.hostname:
            raise ValueError(
                f"MQTT URL {redact_url(url)!r} is not mqtt://host[:port] (mqtts:// for TLS)"
            )
        tls = parts.scheme in {"mqtts", "ssl"}
        return cls(
            url=redact_url(url),
            host=parts.hostname,
            port=parts.port or (8883 if tls else 1883),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls_context=ssl.create_default_context() if tls else None,
        )

    @classmethod
    def from_settings(cls, settings: AegisSettings) -> MqttTarget:
        """The broker of ``settings``: its identity (AEGIS_MQTT_USERNAME/PASSWORD) and TLS."""
        host, port, username, password = settings.mqtt_endpoint()
        return cls(
            url=redact_url(settings.mqtt_url),
            host=host,
            port=port,
            username=username,
            password=password,
            tls_context=settings.mqtt_tls_context(),
        )


@dataclass(frozen=True, slots=True)
class RunOptions:
    factories: Sequence[str]
    scenarios: Sequence[ScenarioSpec] = ()
    duration_s: float | None = None
    rate: float | None = None
    seed: int | None = None
    qos: int = 1
    images: bool = True
    load: bool = False
    inflight: int = DEFAULT_INFLIGHT
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))


@dataclass(slots=True)
class Stats:
    """What a run did; the CLI's summary table and the service's metrics read it."""

    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    sent: Counter[str] = field(default_factory=Counter)  # by source type
    tags: Counter[str] = field(default_factory=Counter)  # duplicate, reordered, clock_skew
    errors: Counter[str] = field(default_factory=Counter)  # publish, upload
    images_uploaded: int = 0
    image_bytes: int = 0
    latencies: list[float] = field(default_factory=list)  # publish → PUBACK, seconds

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def elapsed_s(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def rate(self) -> float:
        return self.total_sent / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def latency_ms(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.asynccontextmanager
async def connect(
    target: MqttTarget, *, inflight: int, client_id: str
) -> AsyncIterator[aiomqtt.Client]:
    client = aiomqtt.Client(
        target.host,
        target.port,
        username=target.username,
        password=target.password,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        timeout=CONNECT_TIMEOUT_S,
        max_inflight_messages=max(20, inflight),
        tls_context=target.tls_context,
    )
    client.pending_calls_threshold = max(10, inflight * 2)
    try:
        await client.__aenter__()
    except aiomqtt.MqttError as err:
        raise BrokerUnreachable(target.url, str(err)) from None
    try:
        yield client
    finally:
        with contextlib.suppress(aiomqtt.MqttError):
            await client.__aexit__(None, None, None)


class Publisher:
    """Uploads a snapshot's binary, then publishes; counts everything in :class:`Stats`."""

    def __init__(
        self, client: aiomqtt.Client, store: ObjectStore | None, *, qos: int, stats: Stats
    ) -> None:
        self.client = client
        self.store = store
        self.qos = qos
        self.stats = stats
        self._failed: set[str] = set()  # ids whose image never reached S3: never announce them
        self._warned: set[str] = set()
        self.lost = asyncio.Event()

    @property
    def connected(self) -> bool:
        # aiomqtt does not reconnect by itself; its paho client knows whether the socket is up
        return bool(self.client._client.is_connected())

    async def send(self, emission: Emission) -> bool:
        if emission.message_id in self._failed:
            return False
        if emission.image is not None:
            if self.store is None:
                return False
            try:
                await self.store.put_bytes(
                    emission.image.key,
                    emission.image.body,
                    content_type=emission.image.content_type,
                )
            except (StorageError, BotoCoreError) as err:
                self._failed.add(emission.message_id)
                self._error("upload", err, key=emission.image.key)
                return False
            self.stats.images_uploaded += 1
            self.stats.image_bytes += len(emission.image.body)
        started = time.monotonic()
        try:
            await self.client.publish(emission.topic, emission.payload, qos=self.qos)
        except aiomqtt.MqttError as err:
            self._error("publish", err, topic=emission.topic)
            return False
        finally:
            if not self.connected:
                self.lost.set()
        self.stats.latencies.append(time.monotonic() - started)
        self.stats.sent[emission.source_type.value] += 1
        self.stats.tags.update(emission.tags)
        return True

    async def send_in_order(self, emissions: Sequence[Emission]) -> None:
        for emission in emissions:
            await self.send(emission)

    def _error(self, kind: str, err: Exception, **context: str) -> None:
        self.stats.errors[kind] += 1
        # the first failure of a kind is a warning with the reason; the rest are counted
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(f"{kind}_failed", error=str(err), **context)


async def _sleep_until(stop: asyncio.Event, seconds: float) -> None:
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)


class RateLimiter:
    """Paces starts at ``rate`` per second (no limit when None), without bursts after a stall."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1 / rate if rate else 0.0
        self._next = time.monotonic()

    async def wait(self, stop: asyncio.Event) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        slot = max(self._next, now)
        self._next = slot + self.interval
        await _sleep_until(stop, slot - now)


async def run(
    options: RunOptions,
    *,
    mqtt_url: str | MqttTarget,
    aws: AwsConfig,
    bucket: str,
    stop: asyncio.Event,
    clock: Clock = utc_now,
    stats: Stats | None = None,
    on_connected: Callable[[], None] | None = None,
) -> Stats:
    """Simulate until ``stop`` is set or ``duration_s`` passes; returns the run's statistics."""
    target = mqtt_url if isinstance(mqtt_url, MqttTarget) else MqttTarget.parse(mqtt_url)
    if target.username and (others := sorted(set(options.factories) - {target.username})):
        # a broker with device identities (mosquitto.prod.conf) drops another factory's messages
        log.warning("factories_not_this_identity", username=target.username, factories=others)
    stats = stats or Stats()
    start = clock()
    fleet = Fleet(
        options.factories,
        start=start,
        seed=options.seed,
        run_id=options.run_id,
        scenarios=options.scenarios,
        intervals=scaled_intervals(
            None if options.load else options.rate, len(options.factories), images=options.images
        ),
    )
    client_id = f"aegis-sim-{options.run_id}"
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(
            connect(target, inflight=options.inflight, client_id=client_id)
        )
        store = None
        if options.images:
            clients = await stack.enter_async_context(open_clients(aws))
            store = ObjectStore(clients, bucket)
        if on_connected is not None:
            on_connected()
        publisher = Publisher(client, store, qos=options.qos, stats=stats)
        stats.started = time.monotonic()
        deadline = None if options.duration_s is None else stats.started + options.duration_s
        log.info(
            "simulation_started",
            factories=len(options.factories),
            scenarios=[s.kind.value for s in options.scenarios],
            mode="load" if options.load else "scheduled",
            run_id=options.run_id,
        )
        try:
            if options.load:
                await _load(
                    fleet,
                    publisher=publisher,
                    options=options,
                    stop=stop,
                    deadline=deadline,
                    clock=clock,
                )
            else:
                await _scheduled(
                    fleet,
                    publisher=publisher,
                    options=options,
                    stop=stop,
                    deadline=deadline,
                    clock=clock,
                )
            if publisher.lost.is_set():
                raise BrokerLost(f"the connection to {target.url} was lost")
            await publisher.send_in_order(fleet.flush())
        finally:
            stats.finished = time.monotonic()
    log.info("simulation_finished", sent=stats.total_sent, errors=sum(stats.errors.values()))
    return stats


def _remaining(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()


async def _scheduled(
    fleet: Fleet,
    *,
    publisher: Publisher,
    options: RunOptions,
    stop: asyncio.Event,
    deadline: float | None,
    clock: Clock,
) -> None:
    """Real time: publish what is due, sleep until the next slot. Publishes of one factory keep
    their order (duplicate, out_of_order rely on it); factories run concurrently, bounded."""
    inflight = asyncio.Semaphore(options.inflight)

    async def send_group(group: list[Emission]) -> None:
        async with inflight:
            await publisher.send_in_order(group)

    async with asyncio.TaskGroup() as tg:
        while not stop.is_set() and not publisher.lost.is_set() and _remaining(deadline) > 0:
            groups: dict[str, list[Emission]] = {}
            for emission in fleet.due(clock()):
                groups.setdefault(emission.factory_id, []).append(emission)
            for group in groups.values():
                await inflight.acquire()  # backpressure: never more than inflight groups
                inflight.release()
                tg.create_task(send_group(group))
            wait = (fleet.next_due() - clock()).total_seconds()
            await _sleep_until(stop, min(wait, _remaining(deadline)))


async def _load(
    fleet: Fleet,
    *,
    publisher: Publisher,
    options: RunOptions,
    stop: asyncio.Event,
    deadline: float | None,
    clock: Clock,
) -> None:
    """Benchmark mode: ``inflight`` workers take the next message as soon as the limiter allows."""
    limiter = RateLimiter(options.rate)

    async def worker() -> None:
        while not stop.is_set() and not publisher.lost.is_set() and _remaining(deadline) > 0:
            await limiter.wait(stop)
            if stop.is_set() or _remaining(deadline) <= 0:
                return
            await publisher.send_in_order(fleet.take(clock()))

    async with asyncio.TaskGroup() as tg:
        for _ in range(max(1, options.inflight)):
            tg.create_task(worker())
