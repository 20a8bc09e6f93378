"""Composition root of the alert dispatcher: a durable pull consumer of ObjectCreated events,
S3/DynamoDB clients, an aiohttp session for the Slack webhook, heartbeats and health."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import aiohttp
import structlog
from faststream.nats import NatsBroker

from aegis_alert_dispatcher.decide import Policy
from aegis_alert_dispatcher.dispatcher import (
    SERVICE,
    UNDELIVERABLE,
    Dispatcher,
    Result,
    dead_letter_body,
)
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_alert_dispatcher.slack import SlackWebhook
from aegis_contracts.events import ObjectCreated, SystemEvent
from aegis_contracts.subjects import OBJECT_CREATED, STREAMS, system_subject
from aegis_contracts.times import Clock, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.broker import (
    create_broker,
    dead_letter,
    durable_pull,
    ensure_streams,
    nats_ready,
    publish,
)
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

EVENTS_STREAM = next(s for s in STREAMS if s.name == "AEGIS_EVENTS")


class DispatcherApp:
    """``await run(stop)`` under run_service; tests call ``start()``/``stop()`` or ``run``."""

    def __init__(self, settings: DispatcherSettings, *, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics(settings.service)
        self.decisions = self.metrics.counter(
            "alert_decisions_total",
            "Alert decisions by outcome (sent, suppressed_cooldown, waiting_observations, "
            "stale, resolved, undeliverable, ...) and action.",
            ("outcome", "action", "severity"),
        )
        self.webhook_attempts = self.metrics.counter(
            "slack_webhook_attempts_total",
            "POSTs to the Slack webhook by HTTP status.",
            ("status",),
        )
        self.broker: NatsBroker = create_broker(
            settings, name=settings.service, metrics=self.metrics
        )
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.health.add_check("nats", nats_ready(self.broker))
        self.health.add_check("storage", self._storage_ready)
        self.heartbeat = HeartbeatPublisher.for_service(self.broker, settings, self.health, clock)
        self.clients: AwsClients | None = None
        self.dispatcher: Dispatcher | None = None
        self._stack: AsyncExitStack | None = None

        @durable_pull(
            self.broker,
            EVENTS_STREAM,
            settings.alert_durable,
            subject=f"{OBJECT_CREATED}.>",
            batch_size=settings.batch_size,
            fetch_timeout=settings.fetch_timeout_s,
            ack_wait=settings.ack_wait_s,
            max_deliver=settings.max_deliver,
        )
        async def on_object_created(event: ObjectCreated) -> None:
            await self.handle(event)

    async def handle(self, event: ObjectCreated) -> list[Result]:
        if self.dispatcher is None:
            raise RuntimeError("the dispatcher is not started")  # nacked: retried later
        return await self.dispatcher.handle(event)

    def _count(self, result: Result) -> None:
        self.decisions.labels(
            outcome=result.outcome,
            action=result.action.value if result.action else "",
            severity=result.severity or "",
        ).inc()

    def _count_attempt(self, status: int | None) -> None:
        self.webhook_attempts.labels(status=str(status) if status is not None else "error").inc()

    async def _storage_ready(self) -> bool:
        if self.clients is None:
            return False
        await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        return True

    async def _dead_letter(self, record: dict[str, Any], detail: str, message_id: str) -> None:
        await dead_letter(
            self.broker,
            service=SERVICE,
            reason=UNDELIVERABLE,
            payload=dead_letter_body(record),
            detail=detail,
            message_id=message_id,
        )

    async def _announce(self, detail: dict[str, Any], msg_id: str) -> None:
        event = SystemEvent(kind="alert_sent", producer=SERVICE, at=self.clock(), detail=detail)
        await publish(self.broker, system_subject("alert_sent"), event, msg_id=msg_id)

    async def start(self) -> None:
        s = self.settings
        stack = self._stack = AsyncExitStack()
        try:
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            self.clients = await stack.enter_async_context(open_clients(s.aws()))
            session = await stack.enter_async_context(aiohttp.ClientSession())
            webhook = s.slack_webhook_url.get_secret_value() if s.slack_webhook_url else None
            sender = (
                SlackWebhook(
                    webhook,
                    session,
                    max_attempts=s.slack_max_attempts,
                    first_delay=s.slack_first_delay_s,
                    max_delay=s.slack_max_delay_s,
                    timeout=s.slack_timeout_s,
                    on_attempt=self._count_attempt,
                )
                if webhook
                else None
            )
            self.dispatcher = Dispatcher(
                store=ObjectStore(self.clients.s3, s.bucket),
                readmodel=ReadModel(self.clients.dynamodb, s.table),
                sender=sender,
                dead_letter=self._dead_letter,
                announce=self._announce,
                policy=Policy(
                    cooldown_critical=timedelta(seconds=s.alert_cooldown_critical_s),
                    cooldown_warning=timedelta(seconds=s.alert_cooldown_warning_s),
                    cloud_warning_observations=s.alert_cloud_warning_observations,
                ),
                ttl=s.ttl,
                dashboard_url=s.dashboard_url,
                clock=self.clock,
                triggers=s.alert_trigger_prefixes,
                on_result=self._count,
            )
            await ensure_streams(self.broker)
            stack.push_async_callback(self.broker.stop)
            await self.broker.start()
            start_background(stack, self.heartbeat.run, "alert-dispatcher-heartbeat")
        except BaseException:
            await stack.aclose()
            raise
        log.info(
            "alert_dispatcher_started", webhook=bool(webhook), triggers=s.alert_trigger_prefixes
        )

    async def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        self.dispatcher = None
        self.clients = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()


def main() -> None:
    settings = DispatcherSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(DispatcherApp(settings).run)
