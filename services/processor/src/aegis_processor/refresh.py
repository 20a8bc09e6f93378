"""The 1-minute refresh (DESIGN §2): pipeline_status and staleness risk of every factory.

Each window (``refresh_interval_s``, 60 s) is claimed with a conditional write, so N replicas run
it once. After downtime the missed windows (at most ``catchup``) are claimed too; the refresh is
a function of "now", so one run covers every window a replica won in a tick. The fleet comes
from the read model's fleet index (what it reads is what it returns), and factories are
refreshed ``concurrency`` at a time, so a tick of thousands of factories ends well inside its
minute.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import structlog

from aegis_contracts.times import Clock, floor_to, truncate_ms
from aegis_contracts.ttl import expires_at
from aegis_processor.handlers import Processor
from aegis_runtime.heartbeat import instance_id
from aegis_runtime.lifecycle import until_next_window

log = structlog.get_logger(__name__)

JOB = "refresh"
CLAIM_TTL_S = 2 * 86_400


class Refresher:
    def __init__(
        self,
        processor: Processor,
        *,
        interval: timedelta,
        catchup: int,
        clock: Clock,
        owner: str | None = None,
        concurrency: int = 32,
    ) -> None:
        self.processor = processor
        self.concurrency = concurrency
        self.interval = interval
        self.catchup = catchup
        self.clock = clock
        self.owner = owner or instance_id()
        self._last: datetime | None = None

    def windows_due(self, now: datetime) -> list[datetime]:
        """The windows to claim at ``now``: the current one and the missed ones before it."""
        current = floor_to(now, self.interval)
        oldest = current - self.catchup * self.interval
        start = oldest if self._last is None else max(oldest, self._last + self.interval)
        count = int((current - start) / self.interval) + 1
        return [start + i * self.interval for i in range(max(0, count))]

    async def tick(self) -> int:
        """Claim the due windows; if this replica won any, refresh every factory once.
        Returns how many factories were written (0 when another replica had the windows)."""
        now = truncate_ms(self.clock())
        due = self.windows_due(now)
        if not due:
            return 0
        readmodel = self.processor.readmodel
        won = [
            w
            for w in due
            if await readmodel.claim_window(
                JOB, w, owner=self.owner, now=now, ttl=expires_at(now, CLAIM_TTL_S)
            )
        ]
        self._last = due[-1]
        if not won:
            return 0
        slots = asyncio.Semaphore(self.concurrency)

        async def refresh(item: dict[str, Any]) -> bool:
            async with slots:
                return await self.processor.refresh_factory(item, now, tick_after=self.interval)

        fleet = await readmodel.factory_latest_items()
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(refresh(item)) for item in fleet]
        written = sum(1 for t in tasks if t.result())
        log.info("refresh_ran", windows=len(won), factories_written=written)
        return written

    async def run(self, stop: asyncio.Event) -> None:
        """Tick at every window start until ``stop``; a failing tick is logged and retried at
        the next window (the claim of a failed window is lost: the next one covers it)."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("refresh_failed")
            await until_next_window(stop, self.clock, self.interval)
