"""``aegis replay``: feed a factory's raw/ objects of a time range back to the processor, exactly as
ingest fed them (raw/ is what reprocessing reads).

The range is by arrival time, like raw/'s partitions: the day partitions that overlap
``[start, end)`` are listed and each object's ``received_at`` (ingest's metadata) decides. The
RawArchived event is rebuilt by ingest's own code (:func:`aegis_contracts.archive.archived_again`)
and published the way ingest publishes it (:func:`aegis_runtime.bus.publish_raw_archived`):
same event, same Nats-Msg-Id. Inside JetStream's duplicate window (2 min) the queue drops it;
older data is processed again, and the processor's writes are idempotent (processed/ objects
rewritten byte for byte, LATEST never moved backwards).

The event is marked ``replayed``: whatever the processor makes of it (objects, a LATEST commit
when the replayed message is newer than LATEST) is announced as replayed, and the alert
dispatcher and the workflow triggers leave it alone, so a replay never pages anyone or calls a
webhook. ``notify=True`` (``--notify``) sends the events unmarked: they alert and trigger as new
data would.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import structlog

from aegis_contracts.archive import DEFAULT_INLINE_MAX_BYTES, archived_again
from aegis_contracts.errors import ContractError
from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import KeyFamily, parse_key, raw_day_prefix
from aegis_contracts.times import parse_ts
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.progress import Quiet, Tracker

log = structlog.get_logger("aegis_storage_tools.replay")

Publish = Callable[[RawArchived], Awaitable[bool]]  # True when the queue called it a duplicate


@dataclass(slots=True)
class ReplaySummary:
    found: int = 0
    requeued: int = 0
    skipped: int = 0
    failed: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def days_between(start: datetime, end: datetime) -> list[date]:
    """The UTC days that overlap ``[start, end)``."""
    last = (end - timedelta(milliseconds=1)).date()
    return [start.date() + timedelta(days=i) for i in range((last - start.date()).days + 1)]


class Pacer:
    """At most ``rate`` starts per second (0: no limit), so live traffic keeps flowing."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.clock = clock
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def wait(self) -> None:
        if not self.interval:
            return
        async with self._lock:
            now = self.clock()
            if self._next > now:
                await asyncio.sleep(self._next - now)
            self._next = max(now, self._next) + self.interval


async def raw_keys_in(
    store: ObjectStore,
    factory_id: str,
    sources: Sequence[SourceType],
    start: datetime,
    end: datetime,
) -> list[str]:
    keys: list[str] = []
    for source in sources:
        for day in days_between(start, end):
            keys += await store.list_keys(raw_day_prefix(factory_id, source, day))
    return keys


async def replay(
    store: ObjectStore,
    publish: Publish | None,
    *,
    factory_id: str,
    sources: Sequence[SourceType],
    start: datetime,
    end: datetime,
    rate: float = 200.0,
    concurrency: int = 16,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    tracker: Tracker | None = None,
    notify: bool = False,
) -> ReplaySummary:
    """Re-queue the raw objects of ``factory_id`` that arrived in ``[start, end)``; with
    ``publish=None`` (a dry run) only count them. ``inline_max_bytes`` must be ingest's setting
    (AEGIS_PAYLOAD_INLINE_MAX_BYTES), or the rebuilt event differs from the original."""
    tracker = tracker or Quiet()
    summary = ReplaySummary()
    keys = await raw_keys_in(store, factory_id, sources, start, end)
    tracker.stage("replay", len(keys))
    one_key = _Replayer(
        store, publish, (start, end), Pacer(rate), summary, inline_max_bytes, notify
    )
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str) -> None:
        async with gate:
            await one_key(key)
        tracker.advance()

    async with asyncio.TaskGroup() as tasks:
        for key in keys:
            tasks.create_task(one(key))
    log.info(
        "replay_finished",
        factory_id=factory_id,
        found=summary.found,
        requeued=summary.requeued,
        skipped=summary.skipped,
        failed=summary.failed,
        dry_run=publish is None,
        notify=notify,
    )
    return summary


@dataclass(slots=True)
class _Replayer:
    store: ObjectStore
    publish: Publish | None
    window: tuple[datetime, datetime]
    pacer: Pacer
    summary: ReplaySummary
    inline_max_bytes: int
    notify: bool

    async def __call__(self, key: str) -> None:  # noqa: PLR0911 - one return per outcome
        store, publish, summary, (start, end) = self.store, self.publish, self.summary, self.window
        try:
            if parse_key(key).family is not KeyFamily.RAW:
                return  # raw_metadata.json and the like: not a message
        except ContractError:
            summary.skip("not_a_contract_key")
            return
        try:
            if publish is None:  # a dry run reads metadata only
                head = await store.head(key) or {}
                metadata = dict(head.get("Metadata") or {})
                body = None
            else:
                stored = await store.get_object(key)
                metadata, body = stored.metadata, stored.body
            received_at = parse_ts(metadata.get("received_at", ""))
        except StorageError as err:
            summary.failed += 1
            log.warning("replay_read_failed", key=key, error=str(err))
            return
        except ValueError:
            summary.skip("not_ingested")
            return
        if not start <= received_at < end:
            return  # same day partition, outside the range: not found
        summary.found += 1
        if publish is None or body is None:
            return
        try:
            archive = archived_again(
                key, body, metadata, bucket=store.bucket, inline_max_bytes=self.inline_max_bytes
            )
        except ContractError as err:
            summary.skip("not_ingested")
            log.warning("replay_skipped", key=key, reason=str(err))
            return
        await self.pacer.wait()
        try:
            event = archive.event
            duplicate = await publish(
                event if self.notify else event.model_copy(update={"replayed": True})
            )
        except Exception as err:  # the broker's errors: count, log, go on with the rest
            summary.failed += 1
            log.warning("replay_publish_failed", key=key, error=f"{type(err).__name__}: {err}")
            return
        if duplicate:
            summary.skip("duplicate_in_window")
        else:
            summary.requeued += 1
