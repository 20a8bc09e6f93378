"""Composition root of the cloud collectors: broker (heartbeats, ObjectCreated), storage clients,
the $SYS monitor, the fast and/or slow collector tasks, and the health/metrics server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta

import structlog
from faststream.nats import NatsBroker
from pydantic import BaseModel

from aegis_cloud_collector.collector import Collector, Probe, TierMetrics
from aegis_cloud_collector.mqtt_sys import SysMonitor
from aegis_cloud_collector.probes import FastProbes, ObjectCounter, SlowProbes
from aegis_cloud_collector.settings import CollectorSettings, Tier
from aegis_contracts.times import Clock, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.broker import create_broker, ensure_streams, nats_ready, publish
from aegis_runtime.health import HealthServer
from aegis_runtime.heartbeat import HeartbeatPublisher, instance_id
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients, open_client, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


class CollectorApp:
    """``await start()`` / ``await stop()``, or ``await run(stop_event)`` under run_service.
    After ``start()``, ``collectors[tier].tick()`` runs one window (tests drive it directly)."""

    def __init__(
        self, settings: CollectorSettings, *, clock: Clock = utc_now, background: bool = True
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.background = background
        self.owner = instance_id()
        self.metrics = Metrics(settings.service)
        self.tier_metrics = TierMetrics(self.metrics)
        self.broker: NatsBroker = create_broker(settings, name=settings.service)
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.health.add_check("nats", nats_ready(self.broker))
        self.health.add_check("storage", self._storage_ready)
        self.heartbeat = HeartbeatPublisher(
            self.broker,
            service=settings.service,
            readiness=self.health.readiness,
            interval=timedelta(seconds=settings.heartbeat_interval_s),
            clock=clock,
            instance=self.owner,
        )
        self.monitor: SysMonitor | None = None
        if "fast" in settings.collector_tiers:
            host, port, username, password = settings.mqtt_endpoint()
            self.monitor = SysMonitor(
                host,
                port,
                username=username,
                password=password,
                identifier=f"aegis-cloud-collector-{self.owner}"[:64],
                tls_context=settings.mqtt_tls_context(),
            )
        self.clients: AwsClients | None = None
        self.collectors: dict[Tier, Collector] = {}
        self._stack: AsyncExitStack | None = None

    async def _storage_ready(self) -> bool:
        if self.clients is None:
            return False
        await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        await self.clients.dynamodb.describe_table(TableName=self.settings.table)
        return True

    async def _publish(self, subject: str, event: BaseModel, *, msg_id: str) -> bool:
        return await publish(self.broker, subject, event, msg_id=msg_id)

    async def start(self) -> None:
        s = self.settings
        stack = self._stack = AsyncExitStack()
        try:
            await self.health.start()
            stack.push_async_callback(self.health.stop)
            self.clients = await stack.enter_async_context(open_clients(s.aws()))
            cloudwatch = None
            if "slow" in s.collector_tiers and s.cloudwatch:
                cloudwatch = await stack.enter_async_context(open_client("cloudwatch", s.aws()))
            await ensure_streams(self.broker)
            stack.push_async_callback(self.broker.stop)
            await self.broker.start()
            js = self.broker.connection.jetstream()
            store = ObjectStore(self.clients.s3, s.bucket)
            readmodel = ReadModel(self.clients.dynamodb, s.table)
            if self.monitor is not None and self.background:
                start_background(stack, self.monitor.run, "mqtt-sys")
            if self.background:
                start_background(stack, self.heartbeat.run, "cloud-collector-heartbeat")
            for tier in s.collector_tiers:
                if tier == "fast":
                    probes = FastProbes(s, js, self.clients, readmodel, self.monitor).probes()
                    interval, ttl = s.collector_fast_interval_s, s.ttl.cloud_fast_expiry
                else:
                    counter = ObjectCounter(store, grace=timedelta(seconds=s.objects_hour_grace_s))
                    probes = SlowProbes(s, self.clients, readmodel, counter, cloudwatch).probes()
                    interval, ttl = s.collector_slow_interval_s, s.ttl.cloud_slow_expiry
                collector = self.collectors[tier] = self._collector(
                    tier,
                    probes,
                    readmodel=readmodel,
                    store=store,
                    interval=timedelta(seconds=interval),
                    ttl=ttl,
                )
                if self.background:
                    start_background(stack, collector.run, f"cloud-collector-{tier}")
        except BaseException:
            await stack.aclose()
            raise
        log.info("cloud_collector_started", tiers=s.collector_tiers, owner=self.owner)

    def _collector(
        self,
        tier: Tier,
        probes: list[Probe],
        *,
        readmodel: ReadModel,
        store: ObjectStore,
        interval: timedelta,
        ttl: Callable[[datetime], int],
    ) -> Collector:
        return Collector(
            tier,
            probes,
            readmodel=readmodel,
            store=store,
            publish=self._publish,
            interval=interval,
            ttl=ttl,
            clock=self.clock,
            owner=self.owner,
            metrics=self.tier_metrics,
            timeout=self.settings.collector_check_timeout_s,
        )

    async def stop(self) -> None:
        """Stop the collectors (a running tick finishes), the heartbeat, then the clients."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()
        self.collectors = {}
        self.clients = None

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()


def create_app(
    settings: CollectorSettings | None = None, *, clock: Clock = utc_now, background: bool = True
) -> CollectorApp:
    """Build the collectors; nothing connects until ``start()``. ``background=False``: no tasks
    (no ticking, no heartbeats, no $SYS subscription); the caller drives ``tick()``."""
    return CollectorApp(settings or CollectorSettings(), clock=clock, background=background)


def main() -> None:
    settings = CollectorSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(create_app(settings).run)
