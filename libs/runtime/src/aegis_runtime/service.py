"""The shell every AEGIS service process shares (health, metrics, heartbeats, graceful
shutdown): metrics, a broker, ``/healthz`` ``/readyz`` ``/metrics`` with NATS and storage
readiness, a heartbeat, AWS clients opened in :meth:`ServiceApp.start` and everything closed in
reverse order by :meth:`ServiceApp.stop`.

A service subclasses it: registers its consumers on ``self.broker`` in ``__init__``, builds its
parts in :meth:`ServiceApp.setup` (the clients are open then; a periodic loop goes on
``start_background(stack, ...)``), and is run by ``run_service(app.run)``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import TYPE_CHECKING

import pydantic
import structlog

from aegis_contracts import msgids
from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import change_subject
from aegis_contracts.times import Clock, utc_now
from aegis_runtime import natsio
from aegis_runtime.bus import (
    RetryPolicy,
    create_broker,
    ensure_deployed_streams,
    nats_ready,
    publish,
    stop_consuming,
)
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher
from aegis_runtime.lifecycle import start_background
from aegis_runtime.metrics import Metrics
from aegis_storage import fleetindex
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.items import Change

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime

    from faststream.nats import NatsBroker

    from aegis_runtime.settings import AegisSettings

log = structlog.get_logger(__name__)


def change_message(
    change: Change, *, table: str, producer: str, at: datetime
) -> tuple[str, ChangeEvent, str]:
    """The subject (``aegis.changes.{entity}``), ChangeEvent and ``Nats-Msg-Id`` announcing a
    read-model write: the id is the item, the event and a digest of the new image, so the same
    write announced twice within the duplicate window is stored once."""
    event = ChangeEvent(
        table=table,
        pk=change.pk,
        sk=change.sk,
        event_name=change.event_name,
        old_image=change.old_image,
        new_image=change.new_image,
        producer=producer,
        at=at,
    )
    digest = hashlib.sha256(
        json.dumps(change.new_image or change.old_image, sort_keys=True, default=str).encode()
    ).hexdigest()[:32]
    msg_id = msgids.change(change.pk, change.sk, change.event_name, digest)
    return change_subject(change.entity), event, msg_id


async def announce_change(
    broker: NatsBroker, change: Change, *, table: str, producer: str, at: datetime
) -> None:
    """Announce a read-model write (:func:`change_message`). A failure raises
    (``PublishFailed``); a read model's change sink logs it, the write stays. Services announce
    through :meth:`ServiceApp.publish_change`; commands that write the read model through
    :func:`change_sink`."""
    subject, event, msg_id = change_message(change, table=table, producer=producer, at=at)
    await publish(broker, subject, event, msg_id=msg_id)


def change_sink(
    broker: NatsBroker, settings: AegisSettings, clock: Clock = utc_now
) -> Callable[[Change], Awaitable[None]]:
    """A ``ReadModel`` change sink announcing as ``settings.service`` on ``broker``: what a
    command (``aegis aggregate``, ``aegis alerts resend``) gives the read model it writes, so its
    writes fire jobs and refresh dashboards as the service's own do."""

    async def sink(change: Change) -> None:
        await announce_change(
            broker, change, table=settings.table, producer=settings.service, at=clock()
        )

    return sink


class ConnectionClosed(RuntimeError):
    """NATS gave the service's connection up for good (see :meth:`ServiceApp.run`)."""


def _last_error(broker: NatsBroker) -> str:
    try:
        error = natsio.client(broker).last_error
    except Exception:  # no connection state to read: the close says enough
        return "unknown"
    return repr(error) if error is not None else "none"


class ServiceApp:
    """``await start()`` / ``await stop()``, or ``await run(stop_event)`` under run_service."""

    def __init__(
        self,
        settings: AegisSettings,
        *,
        clock: Clock = utc_now,
        retry: RetryPolicy | None = None,
        background: bool = True,
    ) -> None:
        """``background=False``: no heartbeat task (and, by convention, no periodic loops of the
        service's own): a test drives the service's work itself."""
        self.settings = settings
        self.clock = clock
        self.background = background
        self.metrics = Metrics(settings.service)
        self.broker: NatsBroker = create_broker(
            settings,
            name=settings.service,
            metrics=self.metrics,
            retry=retry,
            graceful_timeout=settings.graceful_timeout_s,
            closed=self._connection_closed,
        )
        # set when NATS closed the connection for good while the service runs (see run)
        self.connection_lost = asyncio.Event()
        # set once start() has finished (everything up), cleared by stop()
        self.started = asyncio.Event()
        self._lost_reason = ""
        self._stopping = False
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.health.add_check("nats", nats_ready(self.broker))
        self.health.add_check("storage", self.storage_ready)
        self.heartbeat = HeartbeatPublisher.for_service(self.broker, settings, self.health, clock)
        self.clients: AwsClients | None = None
        self._stack: AsyncExitStack | None = None

    # storage readiness also asks for the table (services whose every message writes the read model)
    check_table = False

    async def storage_ready(self) -> bool:
        """Ready when the bucket answers (the clients are open and the endpoint reachable), and
        the table too with ``check_table``."""
        if self.clients is None:
            return False
        await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        if self.check_table:
            await self.clients.dynamodb.describe_table(TableName=self.settings.table)
        return True

    async def publish(self, subject: str, event: pydantic.BaseModel, *, msg_id: str) -> bool:
        return await publish(self.broker, subject, event, msg_id=msg_id)

    async def publish_change(self, change: Change) -> None:
        """Announce a read-model write on ``aegis.changes.{entity}`` (a ``ReadModel``'s change
        sink): see :func:`announce_change`."""
        await announce_change(
            self.broker,
            change,
            table=self.settings.table,
            producer=self.settings.service,
            at=self.clock(),
        )

    def backfill_fleet_index(
        self, stack: AsyncExitStack, clients: AwsClients, family: fleetindex.Family
    ) -> None:
        """Give the fleet index keys to this service's items written before the index, when the
        table asks (:mod:`aegis_storage.fleetindex`): at start and every
        ``fleet_index_check_s``, for as long as ``stack`` is open."""
        backfill = fleetindex.IndexBackfill(
            clients.dynamodb,
            self.settings.table,
            family,
            clock=self.clock,
            interval=timedelta(seconds=self.settings.fleet_index_check_s),
        )
        start_background(stack, backfill.run, "fleet-index-backfill")

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        """Build the service's parts; what it registers on ``stack`` is closed first on stop."""

    async def start(self) -> None:
        stack = self._stack = AsyncExitStack()
        try:
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            self.clients = await stack.enter_async_context(open_clients(self.settings.aws()))
            await ensure_deployed_streams(self.broker, self.settings)
            stack.push_async_callback(self._stop_broker)
            await self.setup(stack, self.clients)
            await self.broker.start()  # the consumers registered in __init__ start pulling
            if self.background:
                start_background(stack, self.heartbeat.run, f"{self.settings.service}-heartbeat")
        except BaseException:
            self._stack = None
            self._stopping = True  # the broker's close is ours
            await stack.aclose()
            raise
        self.started.set()
        # the effective settings, once: secrets are masked (SecretStr) or redacted (URLs) on output
        log.info(
            "service_started",
            service=self.settings.service,
            settings=self.settings.model_dump(mode="json"),
        )

    async def stop(self) -> None:
        """The consumers first: they take no new message, and those they hold finish (or are
        nacked) within the graceful timeout; then the heartbeat and the parts' tasks (which may
        still publish), the connection, the clients and the health server. A stopping replica
        leaves the queue's backlog to the others from the moment it is asked to stop."""
        self._stopping = True
        self.started.clear()
        stack, self._stack = self._stack, None
        if stack is not None:
            if not self.connection_lost.is_set():
                await stop_consuming(self.broker)
            await stack.aclose()
        self.clients = None

    async def run(self, stop: asyncio.Event) -> None:
        """Start, run until ``stop``, stop. When NATS closes the connection for good meanwhile
        (it refused the service's identity: nats-py does not reconnect after that), stop and
        raise :class:`ConnectionClosed`: the process exits non-zero and its supervisor
        (Kubernetes, ECS, compose) starts it again, with the credentials it is given now, rather
        than a replica living on unready and deaf."""
        self._stopping = False
        await self.start()
        try:
            stopped = asyncio.ensure_future(stop.wait())
            lost = asyncio.ensure_future(self.connection_lost.wait())
            try:
                await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                lost.cancel()
        finally:
            await self.stop()
        if self.connection_lost.is_set() and not stop.is_set():
            raise ConnectionClosed(self._lost_reason)

    async def _stop_broker(self) -> None:
        try:
            if not self.connection_lost.is_set():  # a start that failed half-way: consumers too
                await stop_consuming(self.broker)
            await self.broker.stop()
        except Exception as err:  # an ExceptionGroup of its consumers' unsubscribes, often
            if not self.connection_lost.is_set():
                raise
            # the connection is gone: the consumers cannot unsubscribe, nothing is left to settle
            log.info("broker_stopped_without_connection", error=repr(err)[:200])

    async def _connection_closed(self) -> None:
        if self._stopping:
            return  # our own close
        error = _last_error(self.broker)
        self._lost_reason = f"NATS closed the connection for good: {error}"
        log.error("nats_connection_closed", error=error, service=self.settings.service)
        self.connection_lost.set()
