"""A factory-hour's 5-minute window folds, brought up to date against a listing of the hour.

The processed/ objects of one factory and one UTC hour (four datasets, partitioned by event
time) are the truth. Each window fold records the objects it was made from (``inputs``), and
lives under ``report`` in the window's processed_agg/ object. :func:`current_windows` lists
what is stored for the hour, compares the union of the stored inputs with the hour's listing,
reads only the objects no window has (and, for a window that gained or lost one, the rest of
that window's objects), and folds those windows again. So:

- the aggregator, running window W, reads each object about once (the ones that landed since the
  last run) and writes the windows that changed; objects of windows after W are left for their
  own run;
- the reporter merges the hour from its windows, reading objects only where the windows are
  missing or behind the listing (late data not re-aggregated yet, a window object deleted): the
  report is the same as one made from every object.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pydantic
import structlog

from aegis_contracts import keys
from aegis_contracts.keys import Dataset
from aegis_contracts.state import FactoryState, ImageSnapshotRef, InfraState, RiskRecord
from aegis_contracts.times import floor_to
from aegis_folds.folds import FactoryWindow, FoldParams, InputEntry, fold_factory_window
from aegis_storage.errors import NotFound
from aegis_storage.objects import Objects
from aegis_storage.s3 import ObjectInfo
from aegis_storage.tasks import all_of

log = structlog.get_logger(__name__)

WINDOW = keys.GRAPH_BUCKET
HOUR = timedelta(hours=1)
FACTORY_DATASETS = (
    Dataset.FACTORY_STATE,
    Dataset.RISK_SCORE,
    Dataset.INFRA_STATE,
    Dataset.IMAGE_SNAPSHOT,
)
MODELS: dict[str, type[pydantic.BaseModel]] = {
    Dataset.FACTORY_STATE.value: FactoryState,
    Dataset.RISK_SCORE.value: RiskRecord,
    Dataset.INFRA_STATE.value: InfraState,
    Dataset.IMAGE_SNAPSHOT.value: ImageSnapshotRef,
}
REPORT_FIELD = "report"

Record = FactoryState | RiskRecord | InfraState | ImageSnapshotRef


async def hour_entries(
    store: Objects, factory_id: str, hour: datetime
) -> list[tuple[str, ObjectInfo]]:
    """The processed/ objects of one factory-hour, as ``(dataset, object)``, dataset by dataset."""
    entries: list[tuple[str, ObjectInfo]] = []
    for dataset in FACTORY_DATASETS:
        prefix = keys.processed_hour_prefix(factory_id, dataset, hour)
        entries.extend([(dataset.value, o) async for o in store.list_objects(prefix)])
    return entries


@dataclass(slots=True)
class StoredWindow:
    """A window's processed_agg/ object as stored: its whole body and its fold (None when it has
    none usable: written before windows carried folds, damaged, other fold parameters)."""

    key: str
    body: dict[str, Any]
    fold: FactoryWindow | None


@dataclass(slots=True)
class HourWindows:
    """The windows of a factory-hour after :func:`current_windows`."""

    stored: dict[datetime, StoredWindow] = field(default_factory=dict)
    folds: dict[datetime, FactoryWindow] = field(default_factory=dict)
    changed: set[datetime] = field(default_factory=set)  # folded again by this call
    objects_read: int = 0
    windows_read: int = 0


async def stored_windows(
    store: Objects, factory_id: str, hour: datetime, params: FoldParams
) -> dict[datetime, StoredWindow]:
    """The processed_agg/ objects of the hour, by window start."""
    found: dict[datetime, StoredWindow] = {}
    prefix = keys.processed_agg_hour_prefix(factory_id, hour)
    for info in [o async for o in store.list_objects(prefix)]:
        try:
            start = keys.parse_key(info.key).at
            body = await store.get_json(info.key)
        except (NotFound, ValueError) as err:
            log.warning("window_object_unreadable", key=info.key, error=str(err))
            continue
        if start is None or not isinstance(body, dict):
            continue
        fold: FactoryWindow | None = None
        try:
            fold = FactoryWindow.model_validate(body[REPORT_FIELD])
        except (KeyError, TypeError, pydantic.ValidationError):
            fold = None
        if fold is not None and (fold.params != params or fold.window_start != start):
            fold = None
        found[start] = StoredWindow(info.key, body, fold)
    return found


async def current_windows(
    store: Objects,
    factory_id: str,
    hour: datetime,
    entries: Sequence[tuple[str, ObjectInfo]],
    params: FoldParams,
    *,
    upto: datetime | None = None,
    ensure: Iterable[datetime] = (),
    concurrency: asyncio.Semaphore | None = None,
) -> HourWindows:
    """The hour's window folds, current against ``entries`` (its listing). Objects of windows
    starting after ``upto`` are left unread (windows still open: the aggregator leaves them for a
    later run); ``ensure`` are given a fold even when they have no object (the window being
    aggregated)."""
    slots = concurrency or asyncio.Semaphore(32)
    result = HourWindows(stored=await stored_windows(store, factory_id, hour, params))
    result.windows_read = len(result.stored)
    present = {(info.key, info.etag): dataset for dataset, info in entries}
    owner: dict[tuple[str, str], datetime] = {}
    for start, window in result.stored.items():
        if window.fold is not None:
            result.folds[start] = window.fold
            owner.update({(e.key, e.etag): start for e in window.fold.inputs})
    limit = min(range_of(hour)[-1], upto or range_of(hour)[-1])
    # windows that lost an object (rewritten, deleted) are folded again from what is there
    dirty = {start for pair, start in owner.items() if pair not in present}
    dirty |= {w for w in ensure if w not in result.folds}

    async def read(pairs: Sequence[tuple[str, str]]) -> list[tuple[InputEntry, Record | None]]:
        async def one(key: str, etag: str) -> tuple[InputEntry, Record | None]:
            dataset = present[(key, etag)]
            async with slots:
                body = await store.get_bytes(key)
            result.objects_read += 1
            entry = InputEntry(dataset=dataset, key=key, etag=etag)
            try:
                return entry, MODELS[dataset].model_validate_json(body)  # type: ignore[return-value]
            except pydantic.ValidationError:
                log.warning("object_skipped", key=key, reason="does not parse")
                return entry, None

        return await all_of(*(one(k, e) for k, e in pairs))

    records: defaultdict[datetime, list[tuple[InputEntry, Record | None]]] = defaultdict(list)
    for entry, record in await read(sorted(p for p in present if p not in owner)):
        start = _window_of(record, hour, limit)
        if start <= limit:  # a later window's object waits for that window's own run
            records[start].append((entry, record))
            dirty.add(start)

    for start in sorted(dirty):
        stored = result.folds.get(start)
        if stored is not None:  # folded again from all its objects: those it had are read again
            had = sorted({(e.key, e.etag) for e in stored.inputs} & present.keys())
            records[start].extend(await read(had))
        result.folds[start] = _fold(factory_id, start, params, records.get(start, []))
        result.changed.add(start)
    return result


def _window_of(record: Record | None, hour: datetime, limit: datetime) -> datetime:
    """The window a record belongs to; one without an event time (it does not parse), or with one
    outside the hour (a foreign object in the partition), is kept by the window being run."""
    if record is None:
        return limit
    start = floor_to(record.meta.event_time, WINDOW)
    return start if hour <= start < hour + HOUR else limit


def _fold(
    factory_id: str,
    start: datetime,
    params: FoldParams,
    found: Sequence[tuple[InputEntry, Record | None]],
) -> FactoryWindow:
    of: defaultdict[str, list[Any]] = defaultdict(list)
    for entry, record in found:
        if record is not None:
            of[entry.dataset].append(record)
    return fold_factory_window(
        factory_id=factory_id,
        start=start,
        end=start + WINDOW,
        params=params,
        inputs=[e for e, _ in found],
        factory_states=of[Dataset.FACTORY_STATE.value],
        risks=of[Dataset.RISK_SCORE.value],
        infras=of[Dataset.INFRA_STATE.value],
        images=of[Dataset.IMAGE_SNAPSHOT.value],
        skipped=sum(1 for _, r in found if r is None),
    )


def range_of(hour: datetime) -> list[datetime]:
    """The twelve window starts of an hour."""
    return [hour + i * WINDOW for i in range(int(HOUR / WINDOW))]


def covers(folds: Iterable[FactoryWindow], entries: Sequence[tuple[str, ObjectInfo]]) -> bool:
    """True when the folds were made from exactly the listed objects."""
    had = sorted((e.key, e.etag) for w in folds for e in w.inputs)
    return had == sorted((info.key, info.etag) for _, info in entries)
