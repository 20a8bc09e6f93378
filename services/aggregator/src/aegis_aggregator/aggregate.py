"""GraphAggregator5m: every completed 5-minute window, for every factory, the
statistics of its state snapshots as GRAPH#5M#{bucket_start} and a processed_agg/ object.

Windows and replicas:
- a window ``[start, start + 5 min)`` is due once ``delay`` has passed after its end (snapshots
  committed just before the end have landed by then);
- each window is claimed with a conditional write (``CLAIM#graph-5m``), run for every factory, and
  then marked done; a claim never finished (its replica died) can be taken over after ``lease``;
- every tick looks back ``catchup`` (24 h) and runs the windows without a finished claim, oldest
  first: after downtime the missed windows are filled in. Never before the first window that
  became due while an aggregator ran on the table (``CLAIM#graph-5m`` / ``FIRST``, recorded once
  by the very first tick: the window not yet due then, or the oldest claim already there), so a
  fresh deployment does not aggregate a day of empty windows;
- the input: while HISTORY#STATE still holds the whole window (it starts after
  ``now - history_ttl + HISTORY_MARGIN``), one Query per factory; an older window is read from
  the state_snapshot objects (``processed/{f}/state_snapshot/…/hh=/{updated_at}.json``, the
  HISTORY item without ``ttl``, kept forever): one LIST of the window's hour partition (a window
  never crosses an hour), starting at the window's start and selected by key name, then one GET
  per snapshot. The same snapshots either way, so the same output. An item or object that does
  not parse (or names another factory or time than its key) is skipped and counted;
- at most ``concurrency`` factories at once, and at most ``concurrency`` snapshot GETs at once;
- the output depends only on the window's snapshots: a re-run writes the same bytes (the GRAPH
  item's ``ttl`` counts from the window's end, not from when it was computed). A window whose
  GRAPH item would already have expired (its end + graph_bucket_ttl_hours is past) gets its
  processed_agg/ object and event, but no GRAPH item.

The processed_agg/ object also keeps, under ``report``, the window's fold of the factory's
processed/ records by event time (:mod:`aegis_folds.windows`): what the daily report needs, so a
report merges 288 windows instead of reading every object of the day. Each run lists the
window's hour and reads the objects no window of the hour has yet: late ones (the window they
belong to is folded again and rewritten) and those of the hour's windows already over (catching
up reads each object once); objects of windows still open wait for their own run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol

import pydantic
import structlog

from aegis_aggregator.stats import window_stats
from aegis_contracts import keys, msgids
from aegis_contracts.errors import ContractError
from aegis_contracts.events import ObjectCreated
from aegis_contracts.items import FactoryLatest, Graph5m, HistoryState
from aegis_contracts.keys import Dataset, KeyFamily
from aegis_contracts.subjects import object_created_subject
from aegis_contracts.times import Clock, floor_to, format_ts, parse_ts, truncate_ms
from aegis_contracts.ttl import TtlSettings, expires_at
from aegis_folds.folds import FoldParams
from aegis_folds.windows import REPORT_FIELD, current_windows, hour_entries
from aegis_runtime.heartbeat import instance_id
from aegis_storage.errors import NotFound
from aegis_storage.latemarks import LateMarks, LateTable, TableLateMarks
from aegis_storage.objects import Objects
from aegis_storage.periodic import PeriodicWork
from aegis_storage.s3 import PutResult, to_json_bytes
from aegis_storage.states import StatesTable
from aegis_storage.tasks import all_of, map_bounded

log = structlog.get_logger(__name__)

JOB = "graph-5m"
WINDOW = keys.GRAPH_BUCKET
HOUR = timedelta(hours=1)
PRODUCER = "aggregator"
# a claim outlives its window's stay in the catch-up horizon (else the window would run again)
CLAIM_TTL_S = 3 * 86_400
OBJECT_FAMILY = "metrics_5m"
CATCHUP = timedelta(hours=24)
# a window is read from HISTORY#STATE only while it starts at least this long after
# now - history_ttl (an item's ttl counts from when the processor wrote it, just after its
# updated_at); older windows are read from the state_snapshot objects
HISTORY_MARGIN = timedelta(minutes=10)


class Source(StrEnum):
    """Where a window's snapshots were read from."""

    HISTORY = "history"  # HISTORY#STATE items (a Query per factory)
    SNAPSHOTS = "snapshots"  # state_snapshot objects (a LIST per factory, a GET per snapshot)


class Publish(Protocol):
    def __call__(self, subject: str, event: ObjectCreated, *, msg_id: str) -> Awaitable[bool]: ...


@dataclass(frozen=True, slots=True)
class LateFold:
    """A factory-hour folded again for late data: the window objects rewritten, and whether its
    marker was cleared (False: more came late meanwhile, the next tick folds it again)."""

    factory_id: str
    hour: datetime
    keys: list[str]
    cleared: bool


@dataclass(slots=True)
class WindowRun:
    """What one replica did with one window."""

    start: datetime
    source: Source = Source.HISTORY
    factories: int = 0
    samples: int = 0
    skipped_items: int = 0
    keys: list[str] = field(default_factory=list)


class AggregatorTable(PeriodicWork, StatesTable, LateTable, Protocol):
    """What the aggregator needs of the table: its windows' claims, the factories' HISTORY and
    its graphs, the late-data marks (DynamoDB's, or the in-memory one in unit tests)."""


class Aggregator:
    def __init__(
        self,
        *,
        readmodel: AggregatorTable,
        store: Objects,
        publish: Publish,
        ttl: TtlSettings,
        clock: Clock,
        delay: timedelta = timedelta(seconds=15),
        lease: timedelta = timedelta(minutes=2),
        fresh_for: timedelta = timedelta(seconds=60),
        catchup: timedelta = CATCHUP,
        concurrency: int = 8,
        owner: str | None = None,
        fold_params: FoldParams | None = None,
        read_concurrency: int = 32,
        late: LateMarks | None = None,
    ) -> None:
        self.readmodel = readmodel
        self.late: LateMarks = late or TableLateMarks(readmodel)
        self.store = store
        self.publish = publish
        self.ttl = ttl
        self.clock = clock
        self.delay = delay
        self.lease = lease
        self.fresh_for = fresh_for
        # how far back a tick looks: ``catchup`` of windows, the newest due one included
        self.catchup = catchup
        self.claim_ttl_s = max(CLAIM_TTL_S, int(catchup.total_seconds()) + 86_400)
        self.concurrency = concurrency
        self._gets = asyncio.Semaphore(concurrency)
        self._reads = asyncio.Semaphore(read_concurrency)
        self.owner = owner or instance_id()
        # the oldest window an aggregator may run on this table (read once, it never changes)
        self.first: datetime | None = None
        # must equal the reporter's (AEGIS_REPORT_GAP_S, AEGIS_REPORT_SKETCH_ALPHA), else the
        # reporter does not use the windows and reads the objects
        self.fold_params = fold_params or FoldParams(gap_s=60.0, alpha=0.005)

    def newest_due(self, now: datetime) -> datetime:
        """The start of the newest window that is due (over, and ``delay`` passed)."""
        return floor_to(now - self.delay, WINDOW) - WINDOW

    def due_windows(self, now: datetime) -> list[datetime]:
        """The completed windows of the catch-up horizon, oldest first (at least the newest)."""
        newest = self.newest_due(now)
        count = max(1, self.catchup // WINDOW)
        return [newest - i * WINDOW for i in range(count - 1, -1, -1)]

    def reads_history(self, start: datetime, now: datetime) -> bool:
        """True while HISTORY#STATE still holds all of the window that starts at ``start``."""
        expired_before = now - timedelta(hours=self.ttl.history_ttl_hours)
        return start > expired_before + HISTORY_MARGIN

    async def tick(self) -> list[WindowRun]:
        """Run every due window from ``first`` on that no replica has finished and this one can
        claim, oldest first."""
        now = truncate_ms(self.clock())
        horizon = self.due_windows(now)
        claims = None
        if self.first is None:
            # claims already there (an aggregator ran before this table had the record) count
            claims = await self.readmodel.window_claims(
                JOB, horizon[0], horizon[-1] + WINDOW, now=now
            )
            not_yet_due = floor_to(now - self.delay, WINDOW)
            oldest = min([not_yet_due, *(parse_ts(start) for start in claims)])
            self.first = await self.readmodel.first_window(JOB, oldest, now=now)
        first = self.first
        due = [start for start in horizon if start >= first]
        if not due:
            return []
        if claims is None:
            claims = await self.readmodel.window_claims(JOB, due[0], due[-1] + WINDOW, now=now)
        factories: list[str] | None = None
        runs: list[WindowRun] = []
        for start in due:
            now = truncate_ms(self.clock())  # a long catch-up: every claim carries its own time
            won = await self.readmodel.claim_pending(
                JOB,
                start,
                claims=claims,
                owner=self.owner,
                now=now,
                ttl=expires_at(now, self.claim_ttl_s),
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
                source=run.source.value,
                factories=run.factories,
                samples=run.samples,
                skipped_items=run.skipped_items,
            )
        return runs

    async def run_window(
        self, start: datetime, factories: list[str], *, now: datetime
    ) -> WindowRun:
        """Aggregate one window for ``factories`` (bounded concurrency); idempotent."""
        source = Source.HISTORY if self.reads_history(start, now) else Source.SNAPSHOTS
        run = WindowRun(start=start, source=source)

        async def one(factory_id: str) -> None:
            graph, skipped = await self.aggregate(factory_id, start, now=now, source=source)
            key = keys.processed_agg_key(factory_id, start)
            run.factories += 1
            run.samples += graph.stats.samples
            run.skipped_items += skipped
            run.keys.append(key)

        # ``concurrency`` workers over the fleet, not a task per factory (thousands)
        await map_bounded(one, factories, self.concurrency)
        run.keys.sort()
        return run

    async def aggregate(
        self, factory_id: str, start: datetime, *, now: datetime, source: Source | None = None
    ) -> tuple[Graph5m, int]:
        """One factory's window: read, compute, write the object, the item, the event."""
        end = start + WINDOW
        if source is None:
            source = Source.HISTORY if self.reads_history(start, now) else Source.SNAPSHOTS
        if source is Source.HISTORY:
            snapshots, skipped = await self.history_snapshots(factory_id, start, end, now=now)
        else:
            snapshots, skipped = await self.object_snapshots(factory_id, start, end)
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
        if graph.ttl > int(now.timestamp()):  # an item already expired is not written
            await self.readmodel.put_item(graph)
        await self._announce(written, now=now)
        return graph, skipped

    async def _write_windows(
        self, factory_id: str, start: datetime, graph_body: dict[str, Any], *, now: datetime
    ) -> list[PutResult]:
        """The window's object (its statistics and its fold), and the objects of the hour's other
        windows whose folds changed: earlier ones that got late objects, and later ones already
        over (catching up, re-aggregating a range), so every object of the hour is read once."""
        return await self._fold_hour(
            factory_id,
            floor_to(start, HOUR),
            upto=max(start, self.newest_due(now)),
            current=(start, graph_body),
        )

    async def _fold_hour(
        self,
        factory_id: str,
        hour: datetime,
        *,
        upto: datetime,
        current: tuple[datetime, dict[str, Any]] | None = None,
    ) -> list[PutResult]:
        """Bring the hour's window folds up to date with its listing (windows up to ``upto``) and
        write every window object whose fold changed; ``current``: the window being aggregated
        and its statistics (written even when its fold did not change)."""
        entries = await hour_entries(self.store, factory_id, hour)
        windows = await current_windows(
            self.store,
            factory_id,
            hour,
            entries,
            self.fold_params,
            upto=upto,
            ensure=[] if current is None else [current[0]],
            concurrency=self._reads,
        )
        written: list[PutResult] = []
        todo = set(windows.changed) | (set() if current is None else {current[0]})
        for changed in sorted(todo):
            stored = windows.stored.get(changed)
            if current is not None and changed == current[0]:
                body = dict(current[1])
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

    async def _announce(self, written: list[PutResult], *, now: datetime) -> None:
        for put in written:  # announced once everything of the window is stored
            await self.publish(
                object_created_subject(OBJECT_FAMILY),
                self.store.created(put, producer=PRODUCER, at=now),
                msg_id=msgids.object_created(put.key, put.etag),
            )

    async def fold_late(self, now: datetime) -> list[LateFold]:
        """Fold again the factory-hours the processor marked late (objects written after the
        hour's last run listed it), then clear each marker unless another object came late
        meanwhile (it stays for the next tick). An hour whose last window is not due yet is
        left to that window's own run."""
        newest = self.newest_due(now)
        marked = [
            m
            for m in await self.late.late_hours(now=now)
            if parse_ts(str(m["hour_start"])) + HOUR - WINDOW <= newest
        ]

        async def one(marker: dict[str, Any]) -> LateFold:
            factory_id, hour = str(marker["factory_id"]), parse_ts(str(marker["hour_start"]))
            written = await self._fold_hour(factory_id, hour, upto=hour + HOUR - WINDOW)
            await self._announce(written, now=now)
            cleared = await self.late.clear(factory_id, hour, marks=int(marker["marks"]))
            log.info(
                "late_hour_folded",
                factory_id=factory_id,
                hour=format_ts(hour),
                windows=len(written),
                cleared=cleared,
            )
            return LateFold(factory_id, hour, [p.key for p in written], cleared)

        return await map_bounded(one, marked, self.concurrency)

    async def history_snapshots(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> tuple[list[FactoryLatest], int]:
        """The window's live HISTORY#STATE items (one Query) and how many did not parse."""
        items = await self.readmodel.history_states(factory_id, start, end, now=now)
        snapshots: list[FactoryLatest] = []
        skipped = 0
        for item in items:
            try:
                snapshots.append(HistoryState.model_validate(item))
            except pydantic.ValidationError as err:
                skipped += 1  # a foreign or damaged item never stops the window
                log.warning(
                    "history_item_skipped", factory_id=factory_id, sk=item.get("sk"), error=str(err)
                )
        return snapshots, skipped

    async def object_snapshots(
        self, factory_id: str, start: datetime, end: datetime
    ) -> tuple[list[FactoryLatest], int]:
        """The window's state_snapshot objects and how many were skipped: one LIST per hour
        partition the window touches, from the window's start, selected by key name (the
        snapshot's updated_at); then one GET per snapshot."""
        selected: list[str] = []
        hour = floor_to(start, HOUR)
        while hour < end:
            prefix = keys.processed_hour_prefix(factory_id, Dataset.STATE_SNAPSHOT, hour)
            low, high = max(start, hour), min(end, hour + HOUR)
            selected += await self.store.list_keys_between(
                prefix, prefix + format_ts(low), prefix + format_ts(high)
            )
            hour += HOUR
        read = await all_of(*(self._object(factory_id, k, start, end) for k in selected))
        snapshots = [s for s in read if s is not None]
        return snapshots, len(read) - len(snapshots)

    async def _object(
        self, factory_id: str, key: str, start: datetime, end: datetime
    ) -> FactoryLatest | None:
        """One state_snapshot object, or None (logged) when its name is no snapshot key of this
        factory and window, it is gone, or its body is not the snapshot its name says."""
        try:
            info = keys.parse_key(key)
            if (
                info.family is not KeyFamily.STATE_SNAPSHOT
                or info.factory_id != factory_id
                or info.at is None
                or not start <= info.at < end
            ):
                raise ContractError(
                    "foreign_key", "not a state_snapshot of this factory and window"
                )
            async with self._gets:
                body = await self.store.get_bytes(key)
            # the same validation as a HISTORY item's (python mode), without the ttl it never has
            snapshot = FactoryLatest.model_validate(json.loads(body))
            if snapshot.pk != keys.factory_pk(factory_id) or snapshot.updated_at != info.at:
                raise ContractError("foreign_body", "the body names another factory or time")
        except (NotFound, ValueError) as err:  # ContractError, ValidationError, bad JSON
            # a foreign, damaged or vanished object never stops the window
            log.warning("snapshot_object_skipped", factory_id=factory_id, key=key, error=str(err))
            return None
        return snapshot
