"""Composition root of the aggregator: the service shell (broker, clients, health, heartbeat) and
the window loop."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from datetime import timedelta

import structlog

from aegis_aggregator.aggregate import WINDOW, Aggregator
from aegis_aggregator.settings import AggregatorSettings
from aegis_contracts.times import Clock, floor_to, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


class AggregatorApp(ServiceApp):
    """``await run(stop_event)`` under run_service; tests drive ``aggregator.tick()`` directly."""

    settings: AggregatorSettings

    def __init__(self, settings: AggregatorSettings, *, clock: Clock = utc_now) -> None:
        super().__init__(settings, clock=clock)
        self.windows = self.metrics.counter(
            "aggregator_windows_total", "5-minute windows aggregated by this replica."
        )
        self.samples = self.metrics.counter(
            "aggregator_samples_total", "State snapshots folded into windows."
        )
        self.skipped = self.metrics.counter(
            "aggregator_skipped_items_total",
            "HISTORY#STATE items or state_snapshot objects that did not parse (skipped).",
        )
        self.late_hours = self.metrics.counter(
            "aggregator_late_hours_total",
            "Factory-hours folded again because objects came after their last window ran.",
        )
        self.failures = self.metrics.counter(
            "aggregator_tick_failures_total", "Ticks that failed (retried at the next one)."
        )
        self.aggregator: Aggregator | None = None

    async def tick(self) -> int:
        """One pass over the due windows, then over the factory-hours marked late; returns how
        many windows this replica ran."""
        if self.aggregator is None:
            raise RuntimeError("the aggregator is not started")
        runs = await self.aggregator.tick()
        for run in runs:
            self.windows.inc()
            self.samples.inc(run.samples)
            self.skipped.inc(run.skipped_items)
        folded = await self.aggregator.fold_late(self.clock())
        self.late_hours.inc(len(folded))
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

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        self.aggregator = Aggregator(
            readmodel=ReadModel(clients.items, s.table, changes=self.publish_change),
            store=ObjectStore(clients, s.bucket),
            publish=self.publish,
            ttl=s.ttl,
            clock=self.clock,
            delay=timedelta(seconds=s.aggregate_delay_s),
            lease=timedelta(seconds=s.claim_lease_s),
            fresh_for=timedelta(seconds=s.fresh_for_s),
            catchup=timedelta(hours=s.catchup_hours),
            concurrency=s.factory_concurrency,
            fold_params=s.fold_params(),
            read_concurrency=s.aggregate_read_concurrency,
        )
        start_background(stack, self._loop, "aggregator-windows")
        log.info(
            "aggregator_started",
            owner=self.aggregator.owner,
            catchup_hours=self.aggregator.catchup.total_seconds() / 3600,
        )


def main() -> None:
    settings = AggregatorSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(AggregatorApp(settings).run)
