"""Composition root of the cloud collectors: broker (heartbeats, ObjectCreated), storage clients,
the $SYS monitor, the fast and/or slow collector tasks, and the health/metrics server."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta

import structlog

from aegis_cloud_collector import rules
from aegis_cloud_collector.collector import Collector, Probe, TierMetrics
from aegis_cloud_collector.mqtt_sys import SysMonitor
from aegis_cloud_collector.probes import FastProbes, ObjectCounter, SlowProbes
from aegis_cloud_collector.settings import CollectorSettings, Tier
from aegis_contracts.times import Clock, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients, open_client
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


class CollectorApp(ServiceApp):
    """``await start()`` / ``await stop()``, or ``await run(stop_event)`` under run_service.
    After ``start()``, ``collectors[tier].tick()`` runs one window (tests drive it directly)."""

    check_table = True

    def __init__(
        self, settings: CollectorSettings, *, clock: Clock = utc_now, background: bool = True
    ) -> None:
        super().__init__(settings, clock=clock, background=background)
        self.settings: CollectorSettings = settings
        self.owner = self.heartbeat.instance
        self.tier_metrics = TierMetrics(self.metrics)
        self.monitor: SysMonitor | None = None
        if "fast" in settings.collector_tiers:
            host, port, username, password = settings.mqtt_endpoint()
            self.monitor = SysMonitor(
                host,
                port,
                username=username,
                password=password,
                identifier=f"aegis-cloud-collector-{self.owner}"[:64],
            )
        self.collectors: dict[Tier, Collector] = {}

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        stack.callback(self.collectors.clear)
        cloudwatch = None
        if "slow" in s.collector_tiers and s.cloudwatch:
            cloudwatch = await stack.enter_async_context(open_client("cloudwatch", s.aws()))
        store = ObjectStore(clients, s.bucket)
        readmodel = ReadModel(clients.items, s.table, changes=self.publish_change)
        if self.monitor is not None and self.background:
            start_background(stack, self.monitor.run, "mqtt-sys")
        for tier in s.collector_tiers:
            if tier == "fast":
                # the broker was connected by ensure_streams
                probes = FastProbes(s, self.broker, clients, readmodel, self.monitor).probes()
                interval, ttl = s.collector_fast_interval_s, s.ttl.cloud_fast_expiry
            else:
                counter = ObjectCounter(store, grace=timedelta(seconds=s.objects_hour_grace_s))
                probes = SlowProbes(s, clients, readmodel, counter, cloudwatch).probes()
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
            publish=self.publish,
            interval=interval,
            ttl=ttl,
            clock=self.clock,
            owner=self.owner,
            metrics=self.tier_metrics,
            timeout=self.settings.collector_check_timeout_s,
            timing=timing(self.settings, interval),
        )


# a previous snapshot older than this many of its tier's intervals (the collector was stopped) does
# not carry its rules' state over: the runs in between were not made
MAX_GAP_INTERVALS = 3


def timing(settings: CollectorSettings, interval: timedelta) -> rules.Timing:
    """The alerting rules' durations of a tier that runs every ``interval``."""
    return rules.Timing(
        for_s=settings.cloud_for_s,
        clear_s=settings.cloud_clear_s,
        max_gap_s=MAX_GAP_INTERVALS * interval.total_seconds(),
        for_by_reason=settings.cloud_for_by_reason,
        clear_by_reason=settings.cloud_clear_by_reason,
    )


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
