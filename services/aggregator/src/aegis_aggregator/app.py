"""Composition root of the aggregator: storage clients, the broker (ObjectCreated events and
heartbeats), the window loop, and the health/metrics server."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from datetime import timedelta

import structlog
from faststream.nats import NatsBroker

from aegis_aggregator.aggregate import WINDOW, Aggregator
from aegis_aggregator.settings import AggregatorSettings
from aegis_contracts.events import ObjectCreated
from aegis_contracts.times import Clock, floor_to, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.broker import create_broker, ensure_streams, nats_ready, publish
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


class AggregatorApp:
    """``await run(stop_event)`` under run_service; tests drive ``aggregator.tick()`` directly."""

    def __init__(self, settings: AggregatorSettings, *, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics(settings.service)
        self.windows = self.metrics.counter(
            "aggregator_windows_total", "5-minute windows aggregated by this replica."
        )
        self.samples = self.metrics.counter(
            "aggregator_samples_total", "HISTORY#STATE snapshots folded into windows."
        )
        self.skipped = self.metrics.counter(
            "aggregator_skipped_items_total", "HISTORY#STATE items that did not parse (skipped)."
        )
        self.failures = self.metrics.counter(
            "aggregator_tick_failures_total", "Ticks that failed (retried at the next one)."
        )
        self.broker: NatsBroker = create_broker(
            settings, name=settings.service, metrics=self.metrics
        )
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.health.add_check("nats", nats_ready(self.broker))
        self.health.add_check("storage", self._storage_ready)
        self.heartbeat = HeartbeatPublisher.for_service(self.broker, settings, self.health, clock)
        self.clients: AwsClients | None = None
        self.aggregator: Aggregator | None = None

    async def _storage_ready(self) -> bool:
        if self.clients is None:
            return False
        await self.clients.dynamodb.describe_table(TableName=self.settings.table)
        return True

    async def _publish(self, subject: str, event: ObjectCreated, *, msg_id: str) -> bool:
        return await publish(self.broker, subject, event, msg_id=msg_id)

    async def tick(self) -> int:
        """One pass over the due windows; returns how many this replica ran."""
        if self.aggregator is None:
            raise RuntimeError("the aggregator is not started")
        runs = await self.aggregator.tick()
        for run in runs:
            self.windows.inc()
            self.samples.inc(run.samples)
            self.skipped.inc(run.skipped_items)
        return len(runs)

    async def _loop(self, stop: asyncio.Event) -> None:
        """Tick just after each window is due; a failing tick is retried at the next window."""
        delay = timedelta(seconds=self.settings.aggregate_delay_s)
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                self.failures.inc()
                log.exception("aggregate_failed")
            now = self.clock()
            due = floor_to(now - delay, WINDOW) + WINDOW + delay
            wait = min(max((due - now).total_seconds(), 0.05), WINDOW.total_seconds())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        async with AsyncExitStack() as stack:
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            self.clients = await stack.enter_async_context(open_clients(s.aws()))
            stack.push_async_callback(self.broker.stop)
            await ensure_streams(self.broker)
            self.aggregator = Aggregator(
                readmodel=ReadModel(self.clients.dynamodb, s.table),
                store=ObjectStore(self.clients.s3, s.bucket),
                publish=self._publish,
                ttl=s.ttl,
                clock=self.clock,
                delay=timedelta(seconds=s.aggregate_delay_s),
                lease=timedelta(seconds=s.claim_lease_s),
                fresh_for=timedelta(seconds=s.fresh_for_s),
                catchup=s.catchup_windows,
                concurrency=s.factory_concurrency,
            )
            start_background(stack, self.heartbeat.run, "aggregator-heartbeat")
            log.info(
                "aggregator_started", owner=self.aggregator.owner, catchup=self.aggregator.catchup
            )
            await self._loop(stop)


def main() -> None:
    settings = AggregatorSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(AggregatorApp(settings).run)
