"""One collector tier (fast or slow): claim the window, run every probe concurrently, put each
check through its alerting rule (:mod:`aegis_cloud_collector.rules`: ``for``, clear, starting),
file the snapshot (S3 object, CLOUD#infra HISTORY and the tier's LATEST fields), announce the
object.

The rules' state (since when each check has been failing or passing) is in the snapshot itself:
the next run reads it back from the tier's LATEST, so it survives a restart of the collector and
is shared by its replicas. A collector that was stopped for longer than a few intervals starts
its rules afresh (see :mod:`aegis_cloud_collector.rules`).

Each window is claimed with a conditional write (``CLAIM#cloud-{tier}``), so N replicas run it once.
Missed windows are not caught up: a collector measures the present, so the next window's run is
the catch-up. A probe that raises or outlives ``timeout`` yields a CHECK_FAILED check; it never
kills the tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import pydantic
import structlog
from pydantic import BaseModel

from aegis_cloud_collector import rules
from aegis_cloud_collector.domain import failed_check
from aegis_cloud_collector.settings import Tier
from aegis_contracts import keys, msgids
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.state import Level
from aegis_contracts.subjects import object_created_subject
from aegis_contracts.times import Clock, floor_to, truncate_ms
from aegis_contracts.ttl import expires_at
from aegis_runtime.lifecycle import until_next_window
from aegis_runtime.metrics import Metrics
from aegis_storage.cloudlatest import CloudLatest
from aegis_storage.items import Leases
from aegis_storage.objects import Objects

if TYPE_CHECKING:
    from prometheus_client import Gauge

log = structlog.get_logger(__name__)

CLAIM_TTL_S = 2 * 86_400
PRODUCER = "cloud-collector"


class Publish(Protocol):
    def __call__(self, subject: str, event: BaseModel, *, msg_id: str) -> Awaitable[bool]: ...


LEVEL_VALUE = {Level.NORMAL: 0, Level.WARNING: 1, Level.CRITICAL: 2}


@dataclass(frozen=True, slots=True)
class Context:
    """What a probe gets: the run's time, the previous snapshot of its tier (its memory) and
    when this collector started (what has not been seen since is starting, for a grace)."""

    now: datetime
    previous: CloudSnapshot | None
    started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """A named piece of a collector run; ``on_failure`` is the level its CHECK_FAILED gets."""

    name: str
    run: Callable[[Context], Awaitable[list[CloudCheck]]]
    on_failure: Level = Level.WARNING


class TierMetrics:
    """Prometheus series of the collectors: each check's status and value, each tick's outcome."""

    def __init__(self, metrics: Metrics) -> None:
        self.status = metrics.gauge(
            "cloud_check_status", "Check status: 0 ok, 1 warning, 2 critical.", ("tier", "check")
        )
        # what a check measured, one metric name per unit (seconds in seconds, whatever the
        # check's own unit), so no series mixes milliseconds with messages
        seconds = metrics.gauge(
            "cloud_check_seconds",
            "What a check measured in seconds: ages, lags, latencies.",
            ("tier", "check"),
        )
        self.values: dict[str, tuple[Gauge, float]] = {
            "s": (seconds, 1.0),
            "ms": (seconds, 0.001),
            "messages": (
                metrics.gauge(
                    "cloud_check_messages",
                    "Messages waiting (a stream, a consumer).",
                    ("tier", "check"),
                ),
                1.0,
            ),
            "replicas": (
                metrics.gauge(
                    "cloud_check_replicas", "Replicas of a service seen alive.", ("tier", "check")
                ),
                1.0,
            ),
            "differences": (
                metrics.gauge(
                    "cloud_check_differences",
                    "Differences from the storage contract.",
                    ("tier", "check"),
                ),
                1.0,
            ),
            "windows": (
                metrics.gauge(
                    "cloud_check_windows", "Graph windows behind or missing.", ("tier", "check")
                ),
                1.0,
            ),
            "requests": (
                metrics.gauge(
                    "cloud_check_requests", "Requests a check counted.", ("tier", "check")
                ),
                1.0,
            ),
            "errors": (
                metrics.gauge("cloud_check_errors", "Errors a check counted.", ("tier", "check")),
                1.0,
            ),
        }
        self.ticks = metrics.counter(
            "cloud_ticks_total",
            "Collector ticks by outcome (written, not_claimed, failed).",
            ("tier", "outcome"),
        )
        self.seconds = metrics.histogram("cloud_tick_seconds", "Time of one run.", ("tier",))
        self._shown: dict[str, set[str]] = {}

    def record(self, snapshot: CloudSnapshot) -> None:
        tier = snapshot.tier
        names = {c.name for c in snapshot.checks}
        gauges = {self.status, *(gauge for gauge, _ in self.values.values())}
        for gone in self._shown.get(tier, set()) - names:  # a check that went away (a factory)
            for gauge in gauges:
                with contextlib.suppress(KeyError):
                    gauge.remove(tier, gone)
        self._shown[tier] = names
        for check in snapshot.checks:
            self.status.labels(tier=tier, check=check.name).set(LEVEL_VALUE[check.status])
            if check.value is not None and check.unit in self.values:
                gauge, scale = self.values[check.unit]
                gauge.labels(tier=tier, check=check.name).set(check.value * scale)


class CollectorTable(CloudLatest, Leases, Protocol):
    """What a collector needs of the table: the cloud's LATEST and HISTORY, and the claims that
    keep its replicas to one run a window (DynamoDB's, or the in-memory one in unit tests)."""


class Collector:
    def __init__(
        self,
        tier: Tier,
        probes: list[Probe],
        *,
        readmodel: CollectorTable,
        store: Objects,
        publish: Publish,
        interval: timedelta,
        ttl: Callable[[datetime], int],
        clock: Clock,
        owner: str,
        metrics: TierMetrics,
        timeout: float = 10.0,
        timing: rules.Timing | None = None,
    ) -> None:
        self.tier = tier
        self.probes = probes
        self.readmodel = readmodel
        self.store = store
        self.publish = publish
        self.interval = interval
        self.ttl = ttl
        self.clock = clock
        self.owner = owner
        self.metrics = metrics
        self.timeout = timeout
        # None: checks are reported as measured (no for, no clear)
        self.timing = timing
        self.started_at = truncate_ms(clock())
        self.job = f"cloud-{tier}"
        self._last: datetime | None = None

    async def previous(self) -> CloudSnapshot | None:
        """This tier's snapshot in CLOUD#infra LATEST (whichever replica wrote it)."""
        latest = await self.readmodel.get_cloud_latest() or {}
        body = latest.get(self.tier)
        if not isinstance(body, dict):
            return None
        try:
            return CloudSnapshot.model_validate(body)
        except pydantic.ValidationError:
            log.warning("cloud_previous_unreadable", tier=self.tier)
            return None

    async def collect(self, now: datetime) -> CloudSnapshot:
        """Run every probe concurrently (each bounded by ``timeout``) and build the snapshot."""
        started = time.perf_counter()
        previous = await self.previous()
        context = Context(now=now, previous=previous, started_at=self.started_at)
        results = await asyncio.gather(*(self._run(probe, context) for probe in self.probes))
        checks = [check for result in results for check in result]
        if self.timing is not None:
            checks = rules.evaluate(checks, previous, now, self.timing)
        return CloudSnapshot.of(
            self.tier,
            now,
            checks,
            collector=self.owner,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    async def _run(self, probe: Probe, context: Context) -> list[CloudCheck]:
        try:
            async with asyncio.timeout(self.timeout):
                return await probe.run(context)
        except Exception as err:
            log.warning("cloud_check_failed", tier=self.tier, check=probe.name, error=repr(err))
            return [failed_check(probe.name, probe.on_failure, err)]

    async def tick(self) -> CloudSnapshot | None:
        """Claim this window; if won, collect and file. None when the window was already run
        (by this replica or another)."""
        now = truncate_ms(self.clock())
        window = floor_to(now, self.interval)
        if window == self._last:
            return None
        self._last = window
        claimed = await self.readmodel.claim_window(
            self.job, window, owner=self.owner, now=now, ttl=expires_at(now, CLAIM_TTL_S)
        )
        if not claimed:
            self.metrics.ticks.labels(tier=self.tier, outcome="not_claimed").inc()
            return None
        with self.metrics.seconds.labels(tier=self.tier).time():
            snapshot = await self.collect(now)
            await self.file(snapshot)
        self.metrics.record(snapshot)
        self.metrics.ticks.labels(tier=self.tier, outcome="written").inc()
        log.info(
            "cloud_snapshot_written",
            tier=self.tier,
            status=snapshot.status.value,
            checks=len(snapshot.checks),
            reasons=[r.code for r in snapshot.reasons],
            pending=rules.pending(snapshot.checks),
            starting=rules.starting(snapshot.checks),
            duration_ms=snapshot.duration_ms,
        )
        return snapshot

    async def file(self, snapshot: CloudSnapshot) -> Level | None:
        """S3 object first (the long-term record), then the read model, then the event that
        tells the alert dispatcher; a re-run of the same snapshot rewrites the same things."""
        key = keys.cloud_infra_key(self.tier, snapshot.updated_at)
        put = await self.store.put_json(key, snapshot)
        overall = await self.readmodel.apply_cloud(snapshot, ttl=self.ttl(snapshot.updated_at))
        await self.publish(
            object_created_subject(keys.CLOUD_INFRA),
            self.store.created(put, producer=PRODUCER, at=snapshot.updated_at),
            msg_id=msgids.object_created(key),
        )
        return overall

    async def run(self, stop: asyncio.Event) -> None:
        """Tick at every window start until ``stop``; a failed tick is logged and counted, and the
        next window runs as usual."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                self.metrics.ticks.labels(tier=self.tier, outcome="failed").inc()
                log.exception("cloud_tick_failed", tier=self.tier)
            await until_next_window(stop, self.clock, self.interval)
