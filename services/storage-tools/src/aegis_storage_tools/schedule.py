"""``aegis seal schedule``: ``aegis seal raw`` every day at ``AEGIS_SEAL_SCHEDULE_UTC`` (02:30
UTC, the Kubernetes CronJob's and the ECS schedule's time), and once at start, where no cluster
schedules it: the ``seal-raw`` service of compose and of ``make run`` (``aegis up``).

A run is the one ``aegis seal raw`` makes without options (the newest due days, contract and
dataset partitions; idempotent, so the run at start and a run next to a manual one change
nothing twice). A machine that was asleep at the time runs once it is awake: the next run is due
from the last one, not from the time of waking. ``/healthz``, ``/readyz`` (the bucket answers)
and ``/metrics`` are served on ``AEGIS_HEALTH_PORT`` as every service's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from datetime import UTC, datetime, time, timedelta

import structlog

from aegis_contracts.seal import days_to_seal
from aegis_contracts.times import Clock, ensure_utc, utc_now
from aegis_runtime import logging as aegis_logging
from aegis_runtime.health import HealthServer
from aegis_runtime.lifecycle import run_service
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.seal import Outcome, Sealer
from aegis_storage_tools.settings import StorageToolsSettings

log = structlog.get_logger("aegis_storage_tools.schedule")

# the longest single wait: a clock changed or a machine woken meanwhile is noticed within it
MAX_WAIT_S = 300.0


def next_run(after: datetime, at: time) -> datetime:
    """The first instant strictly after ``after`` whose UTC time of day is ``at``."""
    after = ensure_utc(after)
    candidate = datetime.combine(after.date(), at, UTC)
    return candidate if candidate > after else candidate + timedelta(days=1)


class SealSchedule:
    """``await run(stop)`` under run_service; tests call :meth:`once` and :meth:`due` with
    their clock."""

    def __init__(self, settings: StorageToolsSettings, *, clock: Clock = utc_now) -> None:
        self.settings = settings
        self.clock = clock
        self.at = settings.seal_schedule_time()
        self.grace = timedelta(hours=settings.seal_grace_hours)
        self.metrics = Metrics(settings.service)
        self.runs = self.metrics.counter(
            "seal_runs_total", "Scheduled seal runs, by outcome (ok, failed).", ("outcome",)
        )
        self.partitions = self.metrics.counter(
            "seal_partitions_total", "Partitions of scheduled runs, by outcome.", ("outcome",)
        )
        self.last_run = self.metrics.gauge(
            "seal_last_run_timestamp_seconds", "When the last scheduled run ended (epoch s)."
        )
        self.health = HealthServer(self.metrics, settings.health_host, settings.health_port)
        self.clients: AwsClients | None = None
        self.next_at: datetime | None = None

    async def storage_ready(self) -> bool:
        if self.clients is None:
            return False
        await self.clients.s3.head_bucket(Bucket=self.settings.bucket)
        return True

    def due(self) -> bool:
        """Whether a run is due at the clock's time (the first one at once, when asked for)."""
        return self.next_at is None or self.clock() >= self.next_at

    async def once(self) -> dict[str, int]:
        """One run of ``aegis seal raw`` (the newest due days); partitions per outcome. The next
        run is due at the schedule's time after this one, whatever happened."""
        assert self.clients is not None
        now = self.clock()
        self.next_at = next_run(now, self.at)
        days = days_to_seal(now, self.grace, self.settings.seal_lookback_days)
        store = ObjectStore(self.clients, self.settings.bucket)
        sealer = Sealer(store, clock=self.clock, concurrency=self.settings.seal_concurrency)
        try:
            results = await sealer.seal(days)
        except StorageError as err:
            self.runs.labels(outcome="failed").inc()
            log.warning("seal_schedule_failed", error=str(err), next_at=self.next_at.isoformat())
            return {}
        counts = dict(Counter(r.outcome.value for r in results))
        for outcome, n in counts.items():
            self.partitions.labels(outcome=outcome).inc(n)
        failed = counts.get(Outcome.FAILED.value, 0)
        self.runs.labels(outcome="failed" if failed else "ok").inc()
        self.last_run.set(self.clock().timestamp())
        log.info(
            "seal_schedule_ran",
            days=[d.isoformat() for d in (days[0], days[-1])],
            partitions=counts,
            next_at=self.next_at.isoformat(),
        )
        return counts

    async def run(self, stop: asyncio.Event) -> None:
        self.health.add_check("storage", self.storage_ready)
        async with open_clients(self.settings.aws()) as clients, self.health:
            self.clients = clients
            if not self.settings.seal_on_start:
                self.next_at = next_run(self.clock(), self.at)
            log.info(
                "seal_schedule_started",
                at=self.at.isoformat("minutes"),
                on_start=self.settings.seal_on_start,
                lookback_days=self.settings.seal_lookback_days,
            )
            while not stop.is_set():
                if self.due():
                    await self.once()
                assert self.next_at is not None
                wait = (self.next_at - self.clock()).total_seconds()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=min(max(wait, 0.05), MAX_WAIT_S))


def main() -> None:
    settings = StorageToolsSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    run_service(SealSchedule(settings).run)
