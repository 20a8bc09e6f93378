"""Composition root of the processor: broker, durable pull consumer on AEGIS_RAW, storage clients
(opened in ``start``), the 1-minute refresh task, and the health/metrics server."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from datetime import timedelta

import structlog

from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import STREAMS
from aegis_contracts.times import Clock, utc_now
from aegis_processor.handlers import Outcome, Processor
from aegis_processor.refresh import Refresher
from aegis_processor.rules import RiskRules, load_rules
from aegis_processor.settings import ProcessorSettings
from aegis_runtime import logging as aegis_logging
from aegis_runtime.bus import (
    Outgoing,
    RetryPolicy,
    delivery,
    durable_pull,
    publish_many,
)
from aegis_runtime.lifecycle import run_service, settle_heap, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients
from aegis_storage.fleetindex import FACTORIES
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

RAW_STREAM = next(s for s in STREAMS if s.name == "AEGIS_RAW")
# how far the processor's and the aggregator's clocks may disagree: an hour is late for the
# processor this much sooner than the aggregator's last run of it lists it
LATE_CLOCK_MARGIN_S = 5.0


class ProcessorApp(ServiceApp):
    """``await start()`` / ``await stop()``, or ``await run(stop_event)`` under run_service."""

    check_table = True

    def __init__(
        self,
        settings: ProcessorSettings,
        *,
        rules: RiskRules,
        clock: Clock = utc_now,
        settle: bool = False,
    ) -> None:
        super().__init__(
            settings,
            clock=clock,
            retry=RetryPolicy(
                first_delay=settings.retry_first_delay_s,
                max_delay=settings.retry_max_delay_s,
                max_deliver=settings.processor_max_deliver,
            ),
        )
        self.settings: ProcessorSettings = settings
        self.settle = settle  # a process of its own: settle_heap() once started
        self.rules = rules
        self.latest_outcomes = self.metrics.counter(
            "processor_latest_total",
            "Raw events by what they did to LATEST (applied, older, redelivery).",
            ("outcome",),
        )
        self.late_marks = self.metrics.counter(
            "processor_late_marks_total",
            "Raw events whose objects went into an hour already folded (the hour is marked).",
        )
        self.processor: Processor | None = None

        @durable_pull(
            self.broker,
            RAW_STREAM,
            settings.durable,
            subject=settings.subject,
            batch_size=settings.processor_batch_size,
            fetch_timeout=settings.processor_fetch_timeout_s,
            ack_wait=settings.processor_ack_wait_s,
            max_deliver=settings.processor_max_deliver,
            user=settings.nats_user,
        )
        async def on_raw_archived(event: RawArchived) -> None:
            await self.handle(event, redelivered=delivery() > 1)

    async def handle(self, event: RawArchived, *, redelivered: bool = False) -> Outcome:
        if self.processor is None:
            raise RuntimeError("the processor is not started")  # nacked: retried later
        outcome = await self.processor.handle(event, redelivered=redelivered)
        self.latest_outcomes.labels(outcome=outcome.latest).inc()
        if outcome.late_hour is not None:
            self.late_marks.inc()
        return outcome

    async def _publish(self, events: Sequence[Outgoing]) -> list[bool]:
        return await publish_many(self.broker, events)

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        self.processor = Processor(
            store=ObjectStore(clients, s.bucket),
            readmodel=ReadModel(clients.items, s.table, changes=self.publish_change),
            publish=self._publish,
            rules=self.rules,
            ttl=s.ttl,
            clock=self.clock,
            report_check_cache_s=s.report_check_cache_s,
            late_after=timedelta(seconds=max(0.0, s.aggregate_delay_s - LATE_CLOCK_MARGIN_S)),
        )
        self.backfill_fleet_index(stack, clients, FACTORIES)
        if s.refresh_enabled:
            refresher = Refresher(
                self.processor,
                interval=timedelta(seconds=s.refresh_interval_s),
                catchup=s.refresh_catchup_windows,
                clock=self.clock,
                concurrency=s.refresh_concurrency,
            )
            start_background(stack, refresher.run, "processor-refresh")

    async def start(self) -> None:
        await super().start()
        if self.settle:
            settle_heap()
        log.info(
            "processor_started", durable=self.settings.durable, rules_version=self.rules.version
        )

    async def stop(self) -> None:
        """The consumer (it takes no new raw event; those in flight finish or are nacked), then
        the refresh, the clients and the health server (ServiceApp's order)."""
        await super().stop()
        self.processor = None


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
