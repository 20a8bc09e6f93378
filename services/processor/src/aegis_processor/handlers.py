"""Glue of one RawArchived event: read, validate, normalize (domain), write S3 and the read model,
publish what was written. Every step is idempotent, so a redelivery is harmless:

1. payload (inline or S3 GET) -> ``parse_device_message``; a ``ContractError`` propagates and the
   broker middleware dead-letters the event with its code; nothing is written.
2. event time (clock skew -> arrival time + flag; ``late`` when the day's report exists).
3. processed/ objects (+ risk_score for factory_state), deterministic bytes.
4. LATEST partial update guarded by event time; when applied, the derived fields (risk,
   pipeline_status) are recomputed from the new image and written conditionally, then
   HISTORY#STATE and the state_snapshot object. A redelivery whose message LATEST already holds
   finishes those downstream writes instead.
5. ObjectCreated per object written, ChangeEvent per LATEST write.
Storage and broker errors propagate: the middleware nacks and the broker redelivers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol, TypeVar

import structlog
from pydantic import BaseModel

from aegis_contracts import keys
from aegis_contracts.events import ChangeEvent, ObjectCreated, RawArchived
from aegis_contracts.items import FactoryLatest
from aegis_contracts.keys import Dataset, ReportArtifact
from aegis_contracts.payloads import parse_device_message
from aegis_contracts.state import FactoryState, RiskRecord
from aegis_contracts.subjects import change_subject, object_created_subject
from aegis_contracts.times import (
    Clock,
    EventTime,
    TimeFlag,
    format_ts,
    kst_report_date,
    parse_ts,
    resolve_event_time,
    truncate_ms,
)
from aegis_contracts.ttl import TtlSettings
from aegis_processor import domain
from aegis_processor.rules import RiskRules
from aegis_runtime.broker import Poison
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.readmodel import LatestChange, ReadModel
from aegis_storage.s3 import ObjectStore, PutResult

log = structlog.get_logger(__name__)

PRODUCER = "processor"
LATEST_ENTITY = "factory_latest"
# conditional writes of the derived fields lost to other writers before giving up (they recompute)
DERIVE_ATTEMPTS = 3
HISTORY_ATTEMPTS = 50
_CACHE_LIMIT = 8192
_T = TypeVar("_T")


class Publish(Protocol):
    """Publish ``event`` to ``subject`` with de-duplication id ``msg_id``."""

    def __call__(self, subject: str, event: BaseModel, *, msg_id: str) -> Awaitable[bool]: ...


@dataclass(slots=True)
class Outcome:
    """What handling one event did (for the summary log line and tests)."""

    latest: str = "none"  # applied | redelivery | older | none
    objects: list[str] = field(default_factory=list)
    changes: int = 0
    history_at: datetime | None = None


async def all_of(*coros: Coroutine[Any, Any, _T]) -> list[_T]:
    """Run concurrently; if one fails the rest are cancelled and its own error is raised (not an
    ExceptionGroup), so the broker middleware classifies it as usual."""
    tasks: list[asyncio.Task[_T]] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as eg:
        first = eg.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]


class Processor:
    """Handles RawArchived events and refreshes LATEST; shared by the consumer and the refresh."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        readmodel: ReadModel,
        publish: Publish,
        rules: RiskRules,
        ttl: TtlSettings,
        clock: Clock,
        report_check_cache_s: float = 60.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.readmodel = readmodel
        self.publish = publish
        self.rules = rules
        self.ttl = ttl
        self.clock = clock
        self.report_check_cache_s = report_check_cache_s
        self._monotonic = monotonic
        self._reports: dict[tuple[str, date], tuple[bool, float]] = {}

    # -- one raw event ---------------------------------------------------------------------

    async def _raw_payload(self, event: RawArchived) -> bytes:
        try:
            return await self.store.get_bytes(event.key)
        except NotFound:
            # S3 reads are strongly consistent: an event whose object is absent never succeeds
            # (wrong bucket, deleted by hand); retrying would only delay the dead letter
            raise Poison(
                "raw_object_missing", f"{event.key} is not in s3://{self.store.bucket}"
            ) from None

    async def handle(self, event: RawArchived) -> Outcome:
        structlog.contextvars.bind_contextvars(
            factory_id=event.factory_id, message_id=event.message_id
        )
        payload = (
            event.payload_text.encode("utf-8")
            if event.payload_text is not None
            else await self._raw_payload(event)
        )
        message = parse_device_message(
            event.source_type, payload, topic_factory_id=event.factory_id
        )
        now = truncate_ms(self.clock())  # stored times have ms precision
        event_time = await self._event_time(event, message.emitted_at)
        state = domain.normalize(message, event, event_time)
        fid, mid, group = event.factory_id, event.message_id, domain.LATEST_GROUP[event.source_type]
        state_body = state.model_dump_json().encode()
        bodies = {
            keys.processed_key(fid, domain.DATASET[event.source_type], event_time.at, mid): (
                state_body
            )
        }
        if isinstance(state, FactoryState):
            record = RiskRecord(meta=state.meta, risk=domain.message_risk(state, self.rules))
            key = keys.processed_key(fid, Dataset.RISK_SCORE, event_time.at, mid)
            bodies[key] = record.model_dump_json().encode()

        # the processed objects and the LATEST update are independent: run them together
        puts = [self.store.put_bytes(k, b) for k, b in bodies.items()]
        apply = self.readmodel.apply_latest(
            fid,
            group=group,
            event_time=event_time.at,
            fields={group: json.loads(state_body)},
            updated_at=now,
        )
        *written, change = await all_of(*puts, apply)
        outcome = Outcome()
        created: list[PutResult] = [w for w in written if isinstance(w, PutResult)]
        changes: list[LatestChange] = []
        assert isinstance(change, LatestChange)
        if change.applied:
            outcome.latest = "applied"
            changes.append(change)
            assert change.new_image is not None
            image, owned, derived_changes = await self._derive(fid, change.new_image, now)
            changes += derived_changes
            if owned:
                at, snap = await self._history(fid, image, now)
                created.append(snap)
                outcome.history_at = at
        else:
            latest = await self.readmodel.get_latest(fid)
            held = ((latest or {}).get(group) or {}).get("meta", {}).get("message_id")
            if latest is not None and held == mid:
                outcome.latest = "redelivery"
                r_at, r_snap, derived_changes = await self._finish_redelivery(fid, latest, now)
                changes += derived_changes
                if r_snap is not None:
                    created.append(r_snap)
                outcome.history_at = r_at
            else:
                outcome.latest = "older"
        outcome.objects = [p.key for p in created]
        outcome.changes = len(changes)
        await self._announce(fid, created, changes, now)
        log.debug(
            "raw_processed",
            latest=outcome.latest,
            event_time=format_ts(event_time.at),
            flags=sorted(event_time.flags),
            objects=len(created),
        )
        return outcome

    async def _event_time(self, event: RawArchived, emitted_at: datetime) -> EventTime:
        resolved = resolve_event_time(emitted_at, event.received_at)
        if TimeFlag.CLOCK_SKEW in resolved.flags:
            return resolved
        day = kst_report_date(resolved.at)
        # a day's report is written after that KST day ends: only older days can have one
        if day >= kst_report_date(event.received_at):
            return resolved
        exists = await self._report_exists(event.factory_id, day)
        return resolve_event_time(emitted_at, event.received_at, report_exists_for=lambda _: exists)

    async def _report_exists(self, factory_id: str, day: date) -> bool:
        cache_key = (factory_id, day)
        cached = self._reports.get(cache_key)
        now = self._monotonic()
        if cached is not None and (cached[0] or now - cached[1] < self.report_check_cache_s):
            return cached[0]
        exists = await self.store.exists(keys.report_key(day, factory_id, ReportArtifact.REPORT))
        if len(self._reports) >= _CACHE_LIMIT:
            self._reports.clear()
        self._reports[cache_key] = (exists, now)
        return exists

    # -- derived fields, HISTORY, snapshot ---------------------------------------------------

    async def _derive(
        self, factory_id: str, image: dict[str, Any], now: datetime, *, force: bool = False
    ) -> tuple[dict[str, Any], bool, list[LatestChange]]:
        """Bring risk and pipeline_status of ``image`` (LATEST as just written or read) up to date.

        Returns the image LATEST now has, whether this call owns its snapshot (it wrote it, or
        the image is the caller's own write), and the LATEST writes made. A conditional write
        that loses to another writer re-reads and recomputes; when the fresh assessment then
        matches what is stored, the other writer owns that state's snapshot."""
        owned = True
        for _ in range(DERIVE_ATTEMPTS):
            view = FactoryLatest.model_validate(image)
            fresh = domain.derive(view, self.rules, now)
            if not force and domain.same_assessment(
                view.risk, view.pipeline_status, fresh, self.rules
            ):
                return image, owned, []
            seen = view.updated_at
            # strictly after what it replaces: each LATEST version has its own updated_at
            updated_at = truncate_ms(now)
            if seen is not None and updated_at <= seen:
                updated_at = seen + timedelta(milliseconds=1)
            change = await self.readmodel.set_latest(
                factory_id,
                {
                    "risk": fresh.risk.model_dump(mode="json"),
                    "pipeline_status": fresh.pipeline_status.model_dump(mode="json"),
                    "updated_at": format_ts(updated_at),
                },
                if_updated_at=format_ts(seen) if seen is not None else None,
                must_exist=True,
            )
            if change.applied:
                assert change.new_image is not None
                return change.new_image, True, [change]
            owned = force = False  # another writer was just here: its state is fresh
            latest = await self.readmodel.get_latest(factory_id)
            if latest is None:
                break
            image = latest
        log.info("derive_contended", factory_id=factory_id)
        return image, False, []

    def _snapshot_model(self, image: dict[str, Any], at: datetime) -> FactoryLatest:
        data = {k: v for k, v in image.items() if k != "ttl"}
        data["sk"] = keys.history_state_sk(at)
        data["updated_at"] = format_ts(at)
        return FactoryLatest.model_validate(data)

    async def _history(
        self, factory_id: str, image: dict[str, Any], now: datetime
    ) -> tuple[datetime, PutResult]:
        """HISTORY#STATE#{updated_at} (ttl) and the state_snapshot object (the same, no ttl)."""
        at = parse_ts(str(image["updated_at"]))
        snapshot = self._snapshot_model(image, at)
        used = await self.readmodel.put_history_state(
            factory_id,
            self._snapshot_model(image, at),
            updated_at=at,
            ttl=self.ttl.history_expiry(now),
        )
        if used != at:
            snapshot = self._snapshot_model(image, used)
        put = await self.store.put_bytes(
            keys.state_snapshot_key(factory_id, used), snapshot.model_dump_json().encode()
        )
        return used, put

    async def _finish_redelivery(
        self, factory_id: str, latest: dict[str, Any], now: datetime
    ) -> tuple[datetime | None, PutResult | None, list[LatestChange]]:
        """LATEST holds this message: a previous delivery got that far. Finish what it may not
        have: the derived fields, then HISTORY (put-if-absent) and the snapshot."""
        image, owned, changes = await self._derive(factory_id, latest, now)
        if changes:  # the crash came before the derived write: a new state, a new snapshot
            at, put = await self._history(factory_id, image, now)
            return at, put, changes
        if not owned:  # another writer moved LATEST on and snapshots it
            return None, None, []
        at = parse_ts(str(image["updated_at"]))
        snapshot = self._snapshot_model(image, at)
        item = {**snapshot.model_dump(mode="json"), "ttl": self.ttl.history_expiry(now)}
        try:
            await self.readmodel.put_item(item, if_absent=True)
        except Conflict:
            # already there (or that millisecond went to another snapshot): the object must be
            # exactly the stored item without its ttl
            existing = await self.readmodel.get_item(snapshot.pk, snapshot.sk)
            if existing is not None:
                snapshot = self._snapshot_model(existing, at)
        put = await self.store.put_bytes(
            keys.state_snapshot_key(factory_id, at), snapshot.model_dump_json().encode()
        )
        return at, put, []

    # -- the 1-minute refresh ------------------------------------------------------------------

    async def refresh_factory(
        self, item: dict[str, Any], now: datetime, *, tick_after: timedelta
    ) -> bool:
        """Recompute pipeline_status and staleness risk of one FACTORY LATEST item. Written (with
        HISTORY, snapshot and events) when the assessment changed, or when LATEST has not been
        written for ``tick_after`` (the tick's snapshot; a factory whose messages keep LATEST
        fresh already has snapshots that recent). Returns True when it wrote."""
        factory_id = str(item.get("factory_id") or str(item["pk"]).removeprefix("FACTORY#"))
        updated = item.get("updated_at")
        due = updated is None or now - parse_ts(str(updated)) >= tick_after
        image, _, changes = await self._derive(factory_id, item, now, force=due)
        if not changes:
            return False
        _, snap = await self._history(factory_id, image, now)
        await self._announce(factory_id, [snap], changes, now)
        return True

    # -- events ----------------------------------------------------------------------------------

    async def _announce(
        self,
        factory_id: str,
        created: list[PutResult],
        changes: list[LatestChange],
        now: datetime,
    ) -> None:
        sends = [
            self.publish(
                object_created_subject(_family(put.key)),
                ObjectCreated(
                    bucket=self.store.bucket,
                    key=put.key,
                    size_bytes=put.size_bytes,
                    etag=put.etag,
                    producer=PRODUCER,
                    created_at=now,
                ),
                msg_id=f"oc:{put.key}",
            )
            for put in created
        ]
        pk = keys.factory_pk(factory_id)
        for change in changes:
            new = change.new_image or {}
            sends.append(
                self.publish(
                    change_subject(LATEST_ENTITY),
                    ChangeEvent(
                        table=self.readmodel.table,
                        pk=pk,
                        sk=keys.LATEST_SK,
                        event_name="MODIFY" if change.old_image else "INSERT",
                        old_image=change.old_image,
                        new_image=change.new_image,
                        producer=PRODUCER,
                        at=now,
                    ),
                    msg_id=f"chg:{pk}:{keys.LATEST_SK}:{new.get('updated_at')}",
                )
            )
        await all_of(*(_awaited(s) for s in sends))


async def _awaited(aw: Awaitable[bool]) -> bool:
    return await aw


def _family(key: str) -> str:
    """The dataset word of a processed/ key (``processed/{f}/{dataset}/...``)."""
    return key.split("/", 3)[2]
