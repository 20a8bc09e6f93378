"""GraphAggregator5m (DESIGN §2): every completed 5-minute window, for every factory, the
statistics of its HISTORY#STATE snapshots as GRAPH#5M#{bucket_start} and a processed_agg/ object.

Windows and replicas:
- a window ``[start, start + 5 min)`` is due once ``delay`` has passed after its end (snapshots
  committed just before the end have landed by then);
- each window is claimed with a conditional write (``CLAIM#graph-5m``), run for every factory, and
  then marked done; a claim never finished (its replica died) can be taken over after ``lease``;
- every tick looks back over the windows HISTORY#STATE still holds (its TTL) and runs the ones
  without a finished claim, oldest first: after downtime the missed windows are filled in;
- the output depends only on the window's snapshots: a re-run writes the same bytes (the GRAPH
  item's ``ttl`` counts from the window's end, not from when it was computed).

The processed_agg/ object also keeps, under ``report``, the window's fold of the factory's
processed/ records by event time (:mod:`aegis_folds.windows`): what the daily report needs, so a
report merges 288 windows instead of reading every object of the day. Each run lists the
window's hour, reads the objects no window of the hour has yet (late ones included: the window
they belong to is folded again and rewritten), and leaves the objects of later windows to their
own run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import pydantic
import structlog

from aegis_aggregator.stats import window_stats
from aegis_contracts import keys
from aegis_contracts.events import ObjectCreated
from aegis_contracts.items import Graph5m, HistoryState
from aegis_contracts.subjects import object_created_subject
from aegis_contracts.times import Clock, floor_to, format_ts, truncate_ms
from aegis_contracts.ttl import TtlSettings, expires_at
from aegis_folds.folds import FoldParams
from aegis_folds.windows import REPORT_FIELD, current_windows, hour_entries
from aegis_runtime.heartbeat import instance_id
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore, PutResult, to_json_bytes

log = structlog.get_logger(__name__)

JOB = "graph-5m"
WINDOW = keys.GRAPH_BUCKET
PRODUCER = "aggregator"
CLAIM_TTL_S = 3 * 86_400
OBJECT_FAMILY = "metrics_5m"


class Publish(Protocol):
    def __call__(self, subject: str, event: ObjectCreated, *, msg_id: str) -> Awaitable[bool]: ...


@dataclass(slots=True)
class WindowRun:
    """What one replica did with one window."""

    start: datetime
    factories: int = 0
    samples: int = 0
    skipped_items: int = 0
    keys: list[str] = field(default_factory=list)


class Aggregator:
    def __init__(
        self,
        *,
        readmodel: ReadModel,
        store: ObjectStore,
        publish: Publish,
        ttl: TtlSettings,
        clock: Clock,
        delay: timedelta = timedelta(seconds=15),
        lease: timedelta = timedelta(minutes=2),
        fresh_for: timedelta = timedelta(seconds=60),
        catchup: int | None = None,
        concurrency: int = 8,
        owner: str | None = None,
        fold_params: FoldParams | None = None,
        read_concurrency: int = 32,
    ) -> None:
        self.readmodel = readmodel
        self.store = store
        self.publish = publish
        self.ttl = ttl
        self.clock = clock
        self.delay = delay
        self.lease = lease
        self.fresh_for = fresh_for
        # how far back a tick looks: as far as HISTORY#STATE still holds whole windows
        self.catchup = catchup if catchup is not None else int(ttl.history_ttl_hours * 12) - 1
        self._slots = asyncio.Semaphore(concurrency)
        self._reads = asyncio.Semaphore(read_concurrency)
        self.owner = owner or instance_id()
        # must equal the reporter's (AEGIS_REPORT_GAP_S, AEGIS_REPORT_SKETCH_ALPHA), else the
        # reporter does not use the windows and reads the objects
        self.fold_params = fold_params or FoldParams(gap_s=60.0, alpha=0.005)

    def due_windows(self, now: datetime) -> list[datetime]:
        """Completed windows from the oldest HISTORY still holds to the newest, oldest first."""
        newest = floor_to(now - self.delay, WINDOW) - WINDOW
        return [newest - i * WINDOW for i in range(self.catchup, -1, -1)]

    async def tick(self) -> list[WindowRun]:
        """Run every due window that no replica has finished and this one can claim."""
        now = truncate_ms(self.clock())
        due = self.due_windows(now)
        claims = await self.readmodel.window_claims(JOB, due[0], due[-1] + WINDOW, now=now)
        factories: list[str] | None = None
        runs: list[WindowRun] = []
        for start in due:
            won = await self.readmodel.claim_pending(
                JOB,
                start,
                claims=claims,
                owner=self.owner,
                now=now,
                ttl=expires_at(now, CLAIM_TTL_S),
                lease=self.lease,
            )
            if not won:
                continue
            if factories is None:
                factories = await self.readmodel.fleet_ids()
            run = await self.run_window(start, factories, now=now)
            await self.readmodel.finish_window(JOB, start, owner=self.owner, now=now)
            runs.append(run)
            log.info(
                "window_aggregated",
                window_start=format_ts(start),
                factories=run.factories,
                samples=run.samples,
                skipped_items=run.skipped_items,
            )
        return runs

    async def run_window(
        self, start: datetime, factories: list[str], *, now: datetime
    ) -> WindowRun:
        """Aggregate one window for ``factories`` (bounded concurrency); idempotent."""
        run = WindowRun(start=start)

        async def one(factory_id: str) -> None:
            async with self._slots:
                graph, skipped = await self.aggregate(factory_id, start, now=now)
            key = keys.processed_agg_key(factory_id, start)
            run.factories += 1
            run.samples += graph.stats.samples
            run.skipped_items += skipped
            run.keys.append(key)

        await asyncio.gather(*(one(f) for f in factories))
        run.keys.sort()
        return run

    async def aggregate(
        self, factory_id: str, start: datetime, *, now: datetime
    ) -> tuple[Graph5m, int]:
        """One factory's window: read, compute, write the object, the item, the event."""
        end = start + WINDOW
        items = await self.readmodel.history_states(factory_id, start, end, now=now)
        snapshots: list[HistoryState] = []
        skipped = 0
        for item in items:
            try:
                snapshots.append(HistoryState.model_validate(item))
            except pydantic.ValidationError as err:
                skipped += 1  # a foreign or damaged item never stops the window
                log.warning(
                    "history_item_skipped", factory_id=factory_id, sk=item.get("sk"), error=str(err)
                )
        stats = window_stats(snapshots, start, end, fresh_for=self.fresh_for)
        graph = Graph5m(
            pk=keys.factory_pk(factory_id),
            sk=keys.graph_5m_sk(start),
            factory_id=factory_id,
            bucket_start=start,
            bucket_end=end,
            stats=stats,
            ttl=expires_at(end, self.ttl.graph_bucket_ttl_hours * 3600),
        )
        graph_body = graph.model_dump(mode="json", exclude={"pk", "sk", "ttl"})
        written = await self._write_windows(factory_id, start, graph_body, now=now)
        await self.readmodel.put_item(graph)
        for put in written:  # announced once everything of the window is stored
            await self.publish(
                object_created_subject(OBJECT_FAMILY),
                ObjectCreated(
                    bucket=self.store.bucket,
                    key=put.key,
                    size_bytes=put.size_bytes,
                    etag=put.etag,
                    producer=PRODUCER,
                    created_at=now,
                ),
                msg_id=f"oc:{put.key}:{put.etag}",
            )
        return graph, skipped

    async def _write_windows(
        self, factory_id: str, start: datetime, graph_body: dict[str, Any], *, now: datetime
    ) -> list[PutResult]:
        """The window's object (its statistics and its fold), and the objects of the hour's other
        windows whose folds changed: earlier ones that got late objects, and later ones already
        over (catching up, re-aggregating a range), so every object of the hour is read once."""
        hour = floor_to(start, timedelta(hours=1))
        entries = await hour_entries(self.store, factory_id, hour)
        windows = await current_windows(
            self.store,
            factory_id,
            hour,
            entries,
            self.fold_params,
            upto=max(start, floor_to(now - self.delay, WINDOW) - WINDOW),
            ensure=[start],
            concurrency=self._reads,
        )
        written: list[PutResult] = []
        for changed in sorted(windows.changed | {start}):
            stored = windows.stored.get(changed)
            if changed == start:
                body = dict(graph_body)
            elif stored is not None:
                body = {k: v for k, v in stored.body.items() if k != REPORT_FIELD}
            else:  # not aggregated yet (a later window of a range), or its claim was lost
                body = {
                    "factory_id": factory_id,
                    "bucket_start": format_ts(changed),
                    "bucket_end": format_ts(changed + WINDOW),
                }
            body[REPORT_FIELD] = windows.folds[changed].model_dump(mode="json")
            key = keys.processed_agg_key(factory_id, changed)
            written.append(await self.store.put_bytes(key, to_json_bytes(body)))
        return written
