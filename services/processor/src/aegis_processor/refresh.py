"""The 1-minute refresh: pipeline_status and staleness risk of every factory.

The fleet is refreshed shard by shard (the fleet index's shards, ``keys.FLEET_SHARDS``): for each
shard, each window (``refresh_interval_s``, 60 s) is claimed with a conditional write, so N
replicas refresh each shard once per window, and the replicas share a tick: each claims a shard,
starts refreshing it, and claims the next one still free once all of it has started, beginning
at a shard of its own (a hash of its owner id). So a tick of thousands of factories spreads over
the processor replicas instead of falling on one, and a replica's pipe stays full from shard to
shard. After downtime the missed windows (at most ``catchup``) are claimed too; the refresh is a
function of "now", so one run of a shard covers every window won for it. A shard's factories
come from the fleet index (what it reads is what it returns) and are refreshed ``concurrency``
at a time.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import structlog

from aegis_contracts import keys
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
        if processor.readmodel is None:
            raise ValueError("the refresh reads the fleet and claims its windows in the read model")
        self.processor = processor
        self.readmodel = processor.readmodel
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
        """Claim the due windows shard by shard, and refresh each shard won.
        Returns how many factories were written (0 when other replicas had every shard)."""
        now = truncate_ms(self.clock())
        due = self.windows_due(now)
        if not due:
            return 0
        self._last = due[-1]
        slots = asyncio.Semaphore(self.concurrency)
        waiting = [0]  # factories listed but not started yet
        all_started = asyncio.Event()

        async def refresh(item: dict[str, Any]) -> bool:
            async with slots:
                waiting[0] -= 1
                if waiting[0] == 0:
                    all_started.set()
                return await self.processor.refresh_factory(item, now, tick_after=self.interval)

        first = keys.fleet_shard(self.owner)  # a stable hash, the same on every host
        won_shards = 0
        tasks: list[asyncio.Task[bool]] = []
        async with asyncio.TaskGroup() as group:
            for n in range(keys.FLEET_SHARDS):
                shard = (first + n) % keys.FLEET_SHARDS
                if not await self._claim(shard, due, now):
                    continue
                won_shards += 1
                factories = await self.readmodel.factory_latest_items(shard=shard)
                if not factories:
                    continue
                waiting[0] += len(factories)
                all_started.clear()
                tasks += [group.create_task(refresh(item)) for item in factories]
                # the next shard is claimed once this one's factories have all started: the
                # pipe stays full, and a replica holds no more shards than it is working on
                await all_started.wait()
        written = sum(1 for t in tasks if t.result())
        if won_shards:
            log.info("refresh_ran", windows=len(due), shards=won_shards, factories_written=written)
        return written

    async def _claim(self, shard: int, due: list[datetime], now: datetime) -> bool:
        """Claim every due window of ``shard``; True when this replica won any of them."""
        readmodel = self.readmodel
        won = False
        for window in due:
            won |= await readmodel.claim_window(
                f"{JOB}-{shard}",
                window,
                owner=self.owner,
                now=now,
                ttl=expires_at(now, CLAIM_TTL_S),
            )
        return won

    async def run(self, stop: asyncio.Event) -> None:
        """Tick at every window start until ``stop``; a failing tick is logged and retried at
        the next window (the claim of a failed window is lost: the next one covers it)."""
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("refresh_failed")
            await until_next_window(stop, self.clock, self.interval)
