"""Composition root of the processor: broker, durable pull consumer on AEGIS_RAW, storage clients
(opened in ``start``), the 1-minute refresh task, and the health/metrics server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import timedelta

import structlog
from faststream.nats import NatsBroker

from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import STREAMS
from aegis_contracts.times import Clock, utc_now
from aegis_processor.handlers import Outcome, Processor
from aegis_processor.refresh import Refresher
from aegis_processor.rules import RiskRules, load_rules
from aegis_processor.settings import ProcessorSettings
from aegis_runtime import logging as aegis_logging
from aegis_runtime.broker import (
    Outgoing,
    RetryPolicy,
    create_broker,
    delivery,
    durable_pull,
    ensure_streams,
    nats_ready,
    publish_many,
)
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher
from aegis_runtime.lifecycle import run_service, settle_heap, start_background
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

RAW_STREAM = next(s for s in STREAMS if s.name == "AEGIS_RAW")


class ProcessorApp:
    """``await start()`` / ``await stop()``, or ``await run(stop_event)`` under run_service."""

    def __init__(
        self,
        settings: ProcessorSettings,
        *,
        rules: RiskRules,
        clock: Clock = utc_now,
        settle: bool = False,
    ) -> None:
        self.settings = settings
        self.settle = settle  # a process of its own: settle_heap() once started
        self.rules = rules
        self.clock = clock
        self.metrics = Metrics(settings.service)
        self.latest_outcomes = self.metrics.counter(
            "processor_latest_total",
            "Raw events by what they did to LATEST (applied, older, redelivery).",
            ("outcome",),
        )
        self.broker: NatsBroker = create_broker(
            settings,
            name=settings.service,
            metrics=self.metrics,
            retry=RetryPolicy(
                first_delay=settings.retry_first_delay_s,
                max_delay=settings.retry_max_delay_s,
                max_deliver=settings.max_deliver,
            ),
        )
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.health.add_check("nats", nats_ready(self.broker))
        self.health.add_check("storage", self._storage_ready)
        self.heartbeat = HeartbeatPublisher.for_service(self.broker, settings, self.health, clock)
        self.processor: Processor | None = None
        self.refresher: Refresher | None = None
        self.clients: AwsClients | None = None
        self._stack: AsyncExitStack | None = None
        self._refresh_stop = asyncio.Event()
        self._refresh_task: asyncio.Task[None] | None = None

        @durable_pull(
            self.broker,
            RAW_STREAM,
            settings.durable,
            subject=settings.subject,
            batch_size=settings.batch_size,
            fetch_timeout=settings.fetch_timeout_s,
            ack_wait=settings.ack_wait_s,
            max_deliver=settings.max_deliver,
        )
        async def on_raw_archived(event: RawArchived) -> None:
            await self.handle(event, redelivered=delivery() > 1)

    async def handle(self, event: RawArchived, *, redelivered: bool = False) -> Outcome:
        if self.processor is None:
            raise RuntimeError("the processor is not started")  # nacked: retried later
        outcome = await self.processor.handle(event, redelivered=redelivered)
        self.latest_outcomes.labels(outcome=outcome.latest).inc()
        return outcome

    async def _publish(self, events: Sequence[Outgoing]) -> list[bool]:
        return await publish_many(self.broker, events)

    async def _storage_ready(self) -> bool:
        if self.clients is None:
            return False
        await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        await self.clients.dynamodb.describe_table(TableName=self.settings.table)
        return True

    async def start(self) -> None:
        s = self.settings
        stack = self._stack = AsyncExitStack()
        try:
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            self.clients = await stack.enter_async_context(open_clients(s.aws()))
            store = ObjectStore(self.clients.s3, s.bucket)
            readmodel = ReadModel(self.clients.dynamodb, s.table)
            self.processor = Processor(
                store=store,
                readmodel=readmodel,
                publish=self._publish,
                rules=self.rules,
                ttl=s.ttl,
                clock=self.clock,
                report_check_cache_s=s.report_check_cache_s,
            )
            await ensure_streams(self.broker)
            stack.push_async_callback(self.broker.stop)
            await self.broker.start()
            start_background(stack, self.heartbeat.run, "processor-heartbeat")
            if s.refresh_enabled:
                self.refresher = Refresher(
                    self.processor,
                    interval=timedelta(seconds=s.refresh_interval_s),
                    catchup=s.refresh_catchup_windows,
                    clock=self.clock,
                )
                self._refresh_stop.clear()
                self._refresh_task = asyncio.create_task(
                    self.refresher.run(self._refresh_stop), name="processor-refresh"
                )
        except BaseException:
            await stack.aclose()
            raise
        if self.settle:
            settle_heap()
        log.info("processor_started", durable=s.durable, rules_version=self.rules.version)

    async def stop(self) -> None:
        """Stop the refresh, then the consumer (in-flight messages finish or are nacked), then
        the clients and the health server."""
        task, self._refresh_task = self._refresh_task, None
        if task is not None:
            self._refresh_stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        self.processor = None
        self.clients = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()


def create_app(
    settings: ProcessorSettings | None = None,
    *,
    rules: RiskRules | None = None,
    clock: Clock = utc_now,
    settle: bool = False,
) -> ProcessorApp:
    """Build the processor; nothing connects until ``start()``. ``settle``: the app owns its
    process (the console script), so it may take the garbage collector's settings in hand."""
    s = settings or ProcessorSettings()
    loaded = rules or load_rules(s.rules_file)
    return ProcessorApp(
        s,
        rules=loaded.with_staleness(s.stale_after_s, s.offline_after_s),
        clock=clock,
        settle=settle,
    )


def main() -> None:
    settings = ProcessorSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    app = create_app(settings, settle=True)
    run_service(app.run)
