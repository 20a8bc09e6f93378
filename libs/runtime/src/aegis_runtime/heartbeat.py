"""Service heartbeats on the queue: every replica says it is alive and whether it is ready.

Each replica publishes a :class:`~aegis_contracts.events.Heartbeat` on
``aegis.heartbeat.{service}.{instance}`` every ``interval`` (and one with ``stopping=True`` on a
clean stop). The fast cloud collector reads the last message of every heartbeat subject from the
AEGIS_EVENTS stream (:func:`last_heartbeats`): no extra store, no subscription to keep alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pydantic
import structlog

from aegis_contracts.events import Heartbeat
from aegis_contracts.subjects import HEARTBEAT, heartbeat_subject
from aegis_contracts.times import Clock, format_ts, truncate_ms, utc_now
from aegis_runtime import natsio
from aegis_runtime.bus import BrokerError, publish, stream_for

if TYPE_CHECKING:
    from faststream.nats import NatsBroker

    from aegis_runtime.health import HealthServer
    from aegis_runtime.settings import AegisSettings

log = structlog.get_logger(__name__)

Readiness = Callable[[], Awaitable[dict[str, bool]]]


def instance_id() -> str:
    """``{host}-{pid}-{random}``, safe as a subject token and unique per process start."""
    host = re.sub(r"[^A-Za-z0-9_-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


class HeartbeatPublisher:
    """``await run(stop)`` in a task: a heartbeat now and every ``interval`` until ``stop``."""

    def __init__(
        self,
        broker: NatsBroker,
        *,
        service: str,
        readiness: Readiness,
        interval: timedelta = timedelta(seconds=10),
        clock: Clock = utc_now,
        instance: str | None = None,
        version: str | None = None,
    ) -> None:
        self.broker = broker
        self.service = service
        self.readiness = readiness
        self.interval = interval
        self.clock = clock
        self.instance = instance or instance_id()
        self.version = version
        self.started_at = truncate_ms(clock())
        self.subject = heartbeat_subject(service, self.instance)
        # set by :meth:`announce_stopping`: every later beat says so, the periodic ones too
        self.stopping = False
        # numbers the beats' message ids: two beats in one millisecond (a stop during a
        # periodic beat) are two messages, not a duplicate JetStream drops
        self.beats = 0

    @classmethod
    def for_service(
        cls,
        broker: NatsBroker,
        settings: AegisSettings,
        health: HealthServer,
        clock: Clock = utc_now,
    ) -> HeartbeatPublisher:
        """The heartbeat of a service: its name and interval from settings, readiness from its
        health server's checks."""
        return cls(
            broker,
            service=settings.service,
            readiness=health.readiness,
            interval=timedelta(seconds=settings.heartbeat_interval_s),
            clock=clock,
        )

    async def announce_stopping(self) -> Heartbeat:
        """Say now, before the service's own stop is done, that this replica is going away
        (its peers decide on it: an ingest replica hands its MQTT session over only to a peer
        that is not stopping too)."""
        self.stopping = True
        return await self.beat(stopping=True)

    async def beat(self, *, stopping: bool = False) -> Heartbeat:
        checks = await self.readiness()
        at = truncate_ms(self.clock())
        self.beats += 1
        msg_id = f"{self.subject}@{format_ts(at)}#{self.beats}"
        heartbeat = Heartbeat(
            service=self.service,
            instance=self.instance,
            at=at,
            started_at=self.started_at,
            interval_s=self.interval.total_seconds(),
            ready=all(checks.values()),
            checks=checks,
            stopping=stopping or self.stopping,
            version=self.version,
        )
        await publish(self.broker, self.subject, heartbeat, msg_id=msg_id)
        return heartbeat

    async def run(self, stop: asyncio.Event) -> None:
        """A failed beat (NATS down) is logged and tried again at the next interval."""
        while not stop.is_set():
            try:
                await self.beat()
            except BrokerError as err:
                log.warning("heartbeat_failed", error=str(err))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval.total_seconds())
        with contextlib.suppress(BrokerError):
            await self.beat(stopping=True)


async def last_heartbeats(broker: NatsBroker, service: str | None = None) -> list[Heartbeat]:
    """The last heartbeat of every replica (of ``service``, or of all) that ever sent one
    (within the stream's max age): read from the stream (JetStream API,
    :mod:`aegis_runtime.natsio`), not subscribed to."""
    stream = stream_for(f"{HEARTBEAT}.service.instance").name
    subjects_filter = f"{HEARTBEAT}.{service}.>" if service else f"{HEARTBEAT}.>"
    state = await natsio.stream_state(broker, stream, subjects_filter=subjects_filter)
    if state is None:
        return []
    subjects = sorted((state.subjects or {}).keys())
    beats: list[Heartbeat] = []
    for subject in subjects:
        data = await natsio.last_message(broker, stream, subject)
        if data is None:
            continue
        try:
            beats.append(Heartbeat.model_validate_json(data))
        except pydantic.ValidationError:
            log.warning("heartbeat_unreadable", subject=subject)
    return beats


def freshest_by_service(beats: list[Heartbeat]) -> dict[str, list[Heartbeat]]:
    """Replicas grouped by service, freshest first."""
    grouped: dict[str, list[Heartbeat]] = {}
    for beat in sorted(beats, key=lambda b: b.at, reverse=True):
        grouped.setdefault(beat.service, []).append(beat)
    return grouped


def is_alive(beat: Heartbeat, now: datetime, *, missed: float = 3.0) -> bool:
    """Alive: not stopping, and the last beat is newer than ``missed`` intervals."""
    return not beat.stopping and (now - beat.at).total_seconds() <= missed * beat.interval_s
