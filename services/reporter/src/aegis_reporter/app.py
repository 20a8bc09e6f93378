"""Composition root of the reporter: the service shell (broker, clients, health, heartbeat) and
the daily schedule."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import AsyncExitStack
from datetime import timedelta

import structlog

from aegis_contracts.times import Clock, utc_now
from aegis_reporter.generators import BedrockGenerator, ReportGenerator, TemplateGenerator
from aegis_reporter.report import Publish, Reporter
from aegis_reporter.settings import ReporterSettings
from aegis_runtime import logging as aegis_logging
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


def generator_for(settings: ReporterSettings) -> ReportGenerator:
    if settings.report_generator == "bedrock":
        return BedrockGenerator(
            model_id=settings.report_bedrock_model_id, aws=settings.bedrock_aws()
        )
    return TemplateGenerator()


def build_reporter(
    settings: ReporterSettings, clients: AwsClients, publish_event: Publish, clock: Clock
) -> Reporter:
    """The reporter the service and ``aegis report`` both run."""
    s = settings
    return Reporter(
        store=ObjectStore(clients, s.bucket),
        readmodel=ReadModel(clients.items, s.table),
        publish=publish_event,
        clock=clock,
        generator=generator_for(s),
        concurrency=s.report_concurrency,
        gap_s=s.report_gap_s,
        offline_s=s.report_offline_s,
        cadence_s=s.report_cadence_s,
        alpha=s.report_sketch_alpha,
        run_at=timedelta(minutes=s.report_run_at_minutes),
        catchup_days=s.report_catchup_days,
        lease=timedelta(seconds=s.report_claim_lease_s),
    )


class ReporterApp(ServiceApp):
    """``await run(stop_event)`` under run_service; tests drive ``reporter.tick()`` directly."""

    settings: ReporterSettings

    def __init__(self, settings: ReporterSettings, *, clock: Clock = utc_now) -> None:
        super().__init__(settings, clock=clock)
        self.days = self.metrics.counter(
            "reporter_days_total", "KST days reported by this replica."
        )
        self.failures = self.metrics.counter(
            "reporter_tick_failures_total", "Schedule checks that failed (retried at the next)."
        )
        self.reporter: Reporter | None = None

    async def tick(self, stop: asyncio.Event | None = None) -> int:
        if self.reporter is None:
            raise RuntimeError("the reporter is not started")
        days = await self.reporter.tick(stop)
        self.days.inc(len(days))
        return len(days)

    async def _loop(self, stop: asyncio.Event) -> None:
        """Check for due days now, then at each day's run time (at least every poll_s)."""
        assert self.reporter is not None
        while not stop.is_set():
            try:
                await self.tick(stop)
            except Exception:
                self.failures.inc()
                log.exception("report_tick_failed")
            now = self.clock()
            wait = (self.reporter.next_due(now) - now).total_seconds()
            wait = min(max(wait, 0.05), self.settings.report_poll_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        self.reporter = build_reporter(s, clients, self.publish, self.clock)
        start_background(stack, self._loop, "reporter-schedule")
        log.info(
            "reporter_started",
            owner=self.reporter.owner,
            catchup_days=s.report_catchup_days,
            generator=s.report_generator,
        )


def main() -> None:
    settings = ReporterSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(ReporterApp(settings).run)
