"""Glue of one RawArchived event: read, validate, normalize (domain), write S3 and the read model,
publish what was written. Every step is idempotent, so a redelivery is harmless:

0. The event must be what ingest archived: it names this bucket and the raw key its ids make, and
   an inline payload has the SHA-256 S3 keeps for that object (else it is dead-lettered as
   ``event_not_archived`` or ``event_payload_mismatch`` and nothing is written).
1. payload (inline or S3 GET) -> ``parse_device_message``; a ``ContractError`` propagates and the
   broker middleware dead-letters the event with its code; nothing is written.
2. event time (clock skew -> arrival time + flag; ``late`` when the day's report exists).
3. processed/ objects (+ risk_score for factory_state), deterministic bytes.
4. The new state, committed (:meth:`Processor._commit`): read LATEST; if the message's event time
   is not newer than its field group's, stop (older or duplicate). Otherwise compute the new
   image (the group, then risk and pipeline_status derived from the whole image), put it as
   HISTORY#STATE#{updated_at} (if absent), then replace LATEST on condition that it is still the
   version read; on conflict delete that HISTORY item, re-read and try again. Every HISTORY item
   names the state it replaced (``prev_updated_at``), so the items form a chain.
5. The state_snapshot object (the HISTORY item without ttl), ObjectCreated per object written,
   a ChangeEvent (old and new image) per commit.
6. Late data: when the objects went into an event-time hour that ended more than ``late_after``
   before they were written (the aggregator's last run of that hour may have listed it already),
   the factory-hour is marked (``LATE#{hour}``) after the writes, so the aggregator folds that
   hour's windows again and a daily report made from them includes these objects.
A redelivery first looks for the HISTORY item that an earlier delivery of the same message
wrote (:meth:`Processor._recover`): committed (LATEST is it, or a later item names it as its
predecessor) -> only the snapshot and events are redone; not committed but LATEST is still its
predecessor -> LATEST is rolled forward to it; otherwise it is an orphan, deleted, and the
message is handled afresh. So a crash at any point leaves every state exactly once in HISTORY,
in the snapshots and in LATEST (moto's TransactWriteItems runs at ~44/s, too slow to lean on).
Storage and broker errors propagate: the middleware nacks and the broker redelivers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Protocol, cast

import structlog

from aegis_contracts import keys, msgids
from aegis_contracts.errors import ContractError
from aegis_contracts.events import AlertBasis, ChangeEvent, RawArchived
from aegis_contracts.items import FactoryLatest
from aegis_contracts.keys import Dataset, ReportArtifact
from aegis_contracts.payloads import parse_device_message
from aegis_contracts.state import FactoryState, Reason, RiskRecord
from aegis_contracts.subjects import change_subject, object_created_subject
from aegis_contracts.times import (
    Clock,
    EventTime,
    TimeFlag,
    floor_to,
    format_ts,
    kst_report_date,
    parse_ts,
    resolve_event_time,
    truncate_ms,
)
from aegis_contracts.ttl import TtlSettings
from aegis_processor import domain
from aegis_processor.rules import RiskRules
from aegis_runtime.bus import Outgoing, Poison
from aegis_storage.encoding import Encoded, encode
from aegis_storage.errors import Conflict, NotFound, Transient
from aegis_storage.latemarks import LateMarks, TableLateMarks
from aegis_storage.objects import Objects
from aegis_storage.readmodel import LATEST_GROUPS, ReadModel
from aegis_storage.s3 import PutResult
from aegis_storage.states import FactoryStates, TableStates
from aegis_storage.tasks import all_of

log = structlog.get_logger(__name__)
# the stdlib logger under ``log``: its level is checked before a per-message line is built
_stdlog = logging.getLogger(__name__)

PRODUCER = "processor"
# dead-letter reasons of events that are not what ingest archived (forged or corrupted)
EVENT_NOT_ARCHIVED = "event_not_archived"
EVENT_PAYLOAD_MISMATCH = "event_payload_mismatch"
LATEST_ENTITY = "factory_latest"
# commits lost to other writers of the same LATEST before the message is nacked for later
COMMIT_ATTEMPTS = 8
# how far before arrival a redelivery looks for the HISTORY item an earlier delivery wrote
# (processing starts after arrival; the margin covers clocks of different hosts)
RECOVERY_MARGIN = timedelta(minutes=5)
_ITEM_ONLY = frozenset({"ttl"})
HOUR = timedelta(hours=1)
# a late-data marker outlives any aggregator outage its catch-up covers (at most a week)
LATE_MARK_TTL_S = 8 * 86_400
_CACHE_LIMIT = 8192


class Publish(Protocol):
    """Publish events (subject, event, de-duplication id) together; wait until all are stored."""

    def __call__(self, events: Sequence[Outgoing]) -> Awaitable[list[bool]]: ...


@dataclass(frozen=True, slots=True)
class Commit:
    """A state that became LATEST: the image before (None: the first), the image after, and its
    updated_at (the HISTORY sort key and the snapshot name)."""

    old: dict[str, Any] | None
    new: dict[str, Any]
    at: datetime


def _latest_fields(item: dict[str, Any]) -> dict[str, Any]:
    """An item's LATEST fields: a HISTORY item without ``ttl``, a LATEST as is."""
    return {k: v for k, v in item.items() if k not in _ITEM_ONLY}


def _message_of(item: dict[str, Any], group: str) -> str | None:
    value = ((item.get(group) or {}).get("meta") or {}).get("message_id")
    return None if value is None else str(value)


@dataclass(slots=True)
class Outcome:
    """What handling one event did (for the summary log line and tests)."""

    latest: str = "none"  # applied | recovered | older | none
    objects: list[str] = field(default_factory=list)
    changes: int = 0
    history_at: datetime | None = None
    late_hour: datetime | None = None  # the factory-hour marked for folding again


class Processor:
    """Handles RawArchived events and refreshes LATEST; shared by the consumer and the refresh."""

    def __init__(
        self,
        *,
        store: Objects,
        readmodel: ReadModel | None,
        states: FactoryStates | None = None,
        late: LateMarks | None = None,
        publish: Publish,
        rules: RiskRules,
        ttl: TtlSettings,
        clock: Clock,
        report_check_cache_s: float = 60.0,
        latest_cache_size: int = 10_000,
        monotonic: Callable[[], float] = time.monotonic,
        late_after: timedelta = timedelta(seconds=10),
    ) -> None:
        self.store = store
        # the refresh's fleet reads and claims (none: the processor handles messages only)
        self.readmodel = readmodel
        if readmodel is None and (states is None or late is None):
            raise ValueError("without a read model, give the states and the late marks")
        # LATEST and HISTORY: the commit protocol's reads and conditional writes
        self.states: FactoryStates = (
            states if states is not None else TableStates(cast("ReadModel", readmodel))
        )
        self.late: LateMarks = (
            late if late is not None else TableLateMarks(cast("ReadModel", readmodel))
        )
        self.publish = publish
        self.rules = rules
        self.ttl = ttl
        self.clock = clock
        self.report_check_cache_s = report_check_cache_s
        # objects of an hour that ended longer ago than this are late for its windows
        self.late_after = late_after
        self._monotonic = monotonic
        self._reports: dict[tuple[str, date], tuple[bool, float]] = {}
        # LATEST per factory as last written or read here (saves a GET per message)
        self._known: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.latest_cache_size = latest_cache_size
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def _factory_lock(self, factory_id: str) -> AsyncIterator[None]:
        """One commit per factory at a time in this replica, so that messages of one factory
        fetched in the same batch do not all start from the same LATEST and all but one lose
        the conditional write. Replicas are still kept apart by the conditions alone."""
        lock, users = self._locks.setdefault(factory_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[factory_id]

    # -- one raw event ---------------------------------------------------------------------

    def _missing(self, event: RawArchived) -> Poison:
        # S3 reads are strongly consistent: an event whose object is absent never succeeds
        # (wrong bucket, deleted by hand); retrying would only delay the dead letter
        return Poison("raw_object_missing", f"{event.key} is not in s3://{self.store.bucket}")

    async def _raw_payload(self, event: RawArchived) -> bytes:
        try:
            return await self.store.get_bytes(event.key)
        except NotFound:
            raise self._missing(event) from None

    def _check_names_the_archive(self, event: RawArchived) -> None:
        """The event must name an object of the raw archive that ingest would have written for
        it: this bucket, a raw key of the event's factory, source type, arrival day and message
        id. Anything else is not an archived message (a forged or corrupted event)."""
        if event.bucket != self.store.bucket:
            raise Poison(
                EVENT_NOT_ARCHIVED,
                f"the event names bucket {event.bucket!r}; the archive is {self.store.bucket!r}",
            )
        try:
            expected = keys.raw_key(
                event.factory_id, event.source_type, event.received_at, event.message_id
            )
        except ContractError as err:
            raise Poison(EVENT_NOT_ARCHIVED, f"the event's ids make no raw key: {err}") from None
        if event.key != expected:
            raise Poison(
                EVENT_NOT_ARCHIVED,
                f"the event names {event.key!r:.200}; its factory, source, arrival day and "
                f"message id make {expected!r:.200}",
            )

    async def _archived_payload(self, event: RawArchived) -> bytes:
        """The message's bytes as the archive holds them (one GET of the raw object). An event
        that also carries the payload inline must carry exactly those bytes.

        A GET of a raw object (hundreds of bytes) is billed as the HEAD that would read the
        SHA-256 S3 keeps for it, and costs the processor less CPU through the object client
        (``make bench``: tests/bench/s3clients.py); comparing the bytes themselves is the
        stricter check."""
        self._check_names_the_archive(event)
        archived = await self._raw_payload(event)
        if event.payload_text is not None and event.payload_text.encode("utf-8") != archived:
            raise Poison(
                EVENT_PAYLOAD_MISMATCH,
                f"the event's inline payload ({len(event.payload_text.encode('utf-8'))} bytes) "
                f"is not the archived object {event.key}",
            )
        return archived

    async def handle(self, event: RawArchived, *, redelivered: bool = False) -> Outcome:
        structlog.contextvars.bind_contextvars(
            factory_id=event.factory_id, message_id=event.message_id
        )
        payload = await self._archived_payload(event)
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

        async def commit() -> tuple[str, Commit | None]:
            async with self._factory_lock(fid):
                if redelivered:
                    recovered = await self._recover(fid, group, mid, event.received_at, now)
                    if recovered is not None:
                        return "recovered", recovered
                fields = {group: json.loads(state_body)}
                done = await self._commit(fid, now, group=group, fields=fields, at=event_time.at)
                return ("applied" if done else "older"), done

        # the processed objects and the new state are independent: write them together (one
        # task group for all of them)
        *written, settled = await all_of(
            *(self.store.put_bytes(k, b) for k, b in bodies.items()),
            cast("Coroutine[Any, Any, Any]", commit()),
        )
        created = cast("list[PutResult]", written)
        latest, committed = cast("tuple[str, Commit | None]", settled)
        outcome = Outcome(latest=latest)
        outcome.late_hour = await self._mark_late(fid, event_time.at)
        if committed is not None:
            created.append(await self._snapshot(fid, committed))
            outcome.history_at = committed.at
            outcome.changes = 1
        outcome.objects = [p.key for p in created]
        await self._announce(
            fid, created, [committed] if committed else [], now, replayed=event.replayed
        )
        if _stdlog.isEnabledFor(logging.DEBUG):
            log.debug(
                "raw_processed",
                latest=outcome.latest,
                event_time=format_ts(event_time.at),
                flags=sorted(event_time.flags),
                objects=len(created),
            )
        return outcome

    async def _mark_late(self, factory_id: str, at: datetime) -> datetime | None:
        """Mark the factory-hour of event time ``at`` when it ended more than ``late_after``
        before now (read after the objects are stored: an aggregator run that listed the hour
        before they were there started after the mark's threshold, so it is marked)."""
        hour = floor_to(at, HOUR)
        written = truncate_ms(self.clock())
        if hour + HOUR + self.late_after > written:
            return None
        await self.late.mark(
            factory_id, hour, now=written, ttl=int(written.timestamp()) + LATE_MARK_TTL_S
        )
        return hour

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

    # -- committing a state: HISTORY, LATEST, snapshot -----------------------------------------

    async def _commit(
        self,
        factory_id: str,
        now: datetime,
        *,
        group: str | None = None,
        fields: dict[str, Any] | None = None,
        at: datetime | None = None,
        force: bool = False,
    ) -> Commit | None:
        """Commit the state LATEST gets from ``fields`` (a message's group, guarded by its event
        time ``at``) or, without a group, from re-deriving risk and pipeline_status (the refresh:
        only when the assessment changed, or ``force``). None when there is nothing to commit."""
        pk = keys.factory_pk(factory_id)
        floor = truncate_ms(now)  # moves past a millisecond found taken in HISTORY
        reread = False  # the cached LATEST may be stale: read it again
        for _ in range(COMMIT_ATTEMPTS):
            old = await self._latest(factory_id, fresh=reread)
            base = dict(old or {"pk": pk, "sk": keys.LATEST_SK, "factory_id": factory_id})
            if group is not None and fields is not None and at is not None:
                guard, stamp = LATEST_GROUPS[group], format_ts(at)
                if old is not None and old.get(guard) is not None and old[guard] >= stamp:
                    return None  # older than what LATEST holds, or this very message again
                base |= {group: fields[group], guard: stamp}
            elif old is None:
                return None  # nothing to refresh
            view = FactoryLatest.model_validate(_latest_fields(base))
            fresh = domain.derive(view, self.rules, now)
            if (
                group is None
                and not force
                and domain.same_assessment(view.risk, view.pipeline_status, fresh, self.rules)
            ):
                return None
            seen = None if old is None else old.get("updated_at")
            seen_at = None if seen is None else parse_ts(str(seen))
            updated_at = floor
            if seen_at is not None and updated_at <= seen_at:
                updated_at = seen_at + timedelta(milliseconds=1)
            # the validated view with what was derived (typed values: no second validation)
            state = view.model_copy(
                update={
                    "risk": fresh.risk,
                    "pipeline_status": fresh.pipeline_status,
                    "updated_at": updated_at,
                    "prev_updated_at": seen_at,
                }
            )
            # a group no message has set yet is absent, not null (the partial-update contract);
            # converted once for both writes
            encoded = encode(state, drop_none=True)
            image = encoded.plain
            history_sk = keys.history_state_sk(updated_at)
            history = encoded.with_fields(sk=history_sk, ttl=self.ttl.history_expiry(now))
            try:
                await self.states.add_history(history)
            except Conflict:
                # that millisecond holds a state: this one, when the SDK retried a put whose
                # answer was lost (then go on with it); else another's: read again, move on
                if await self.states.history_item(factory_id, history_sk) != history.plain:
                    floor = updated_at + timedelta(milliseconds=1)
                    reread = True
                    continue
            if await self._replace_latest(factory_id, encoded, expected=seen):
                self._remember(factory_id, image)
                return Commit(old=old, new=image, at=updated_at)
            # another writer replaced LATEST first: this state never was, so it is no history;
            # the refusal's check has just read that writer's LATEST into the cache
            await self.states.remove_history(factory_id, history_sk)
            reread = False
        raise Transient(f"LATEST of {factory_id} kept changing under {COMMIT_ATTEMPTS} attempts")

    async def _replace_latest(
        self, factory_id: str, state: Encoded | dict[str, Any], *, expected: Any
    ) -> bool:
        """Replace LATEST if it is still the version ``expected``. A refusal is checked against
        the table: a replace whose answer was lost and that the SDK retried is refused by its own
        success, and LATEST then is this very state (its ``updated_at`` is held by the HISTORY
        item this writer put), which counts as replaced."""
        if await self.states.replace_latest(
            factory_id, state, expected=None if expected is None else str(expected)
        ):
            return True
        plain = state.plain if isinstance(state, Encoded) else state
        return await self._latest(factory_id, fresh=True) == plain

    async def _latest(self, factory_id: str, *, fresh: bool) -> dict[str, Any] | None:
        """LATEST as this replica last wrote or read it, else read. A stale copy costs no
        correctness: the conditional replace refuses it and the next attempt reads afresh; and
        a copy's event-time guards are never newer than the table's, so "older" is decided
        right from it too."""
        if not fresh and factory_id in self._known:
            self._known.move_to_end(factory_id)
            return self._known[factory_id]
        latest = await self.states.latest(factory_id)
        if latest is not None:
            self._remember(factory_id, latest)
        return latest

    def _remember(self, factory_id: str, image: dict[str, Any]) -> None:
        self._known[factory_id] = image
        self._known.move_to_end(factory_id)
        while len(self._known) > self.latest_cache_size:
            self._known.popitem(last=False)

    async def _recover(
        self, factory_id: str, group: str, message_id: str, received_at: datetime, now: datetime
    ) -> Commit | None:
        """Finish what an earlier delivery of this message started (see the module docstring)."""
        items = await self.states.history(
            factory_id, received_at - RECOVERY_MARGIN, now + timedelta(seconds=1), now=now
        )
        # group values carry forward into later states: the first item holding it introduced it
        mine = next((i for i in items if _message_of(i, group) == message_id), None)
        if mine is None:
            return None
        at = parse_ts(str(mine["updated_at"]))
        state = {**_latest_fields(mine), "sk": keys.LATEST_SK}
        prev = mine.get("prev_updated_at")
        old = next((i for i in items if i.get("updated_at") == prev), None)
        old_image = None if old is None else {**_latest_fields(old), "sk": keys.LATEST_SK}
        latest = await self._latest(factory_id, fresh=True)
        current = None if latest is None else latest.get("updated_at")
        if current == mine["updated_at"] or any(
            i.get("prev_updated_at") == mine["updated_at"] for i in items
        ):
            return Commit(old=old_image, new=state, at=at)  # committed: redo snapshot and events
        if current == prev and await self._replace_latest(factory_id, state, expected=prev):
            return Commit(old=latest, new=state, at=at)  # rolled forward
        await self.states.remove_history(factory_id, str(mine["sk"]))
        return None

    async def _snapshot(self, factory_id: str, commit: Commit) -> PutResult:
        """processed/{f}/state_snapshot/…/{updated_at}.json: the HISTORY item without ``ttl``."""
        body = {**_latest_fields(commit.new), "sk": keys.history_state_sk(commit.at)}
        return await self.store.put_json(keys.state_snapshot_key(factory_id, commit.at), body)

    # -- the 1-minute refresh ------------------------------------------------------------------

    async def refresh_factory(
        self, item: dict[str, Any], now: datetime, *, tick_after: timedelta
    ) -> bool:
        """Recompute pipeline_status and staleness risk of one FACTORY LATEST item. Committed
        (HISTORY, LATEST, snapshot, events) when the assessment changed, or when LATEST has not
        been written for ``tick_after`` (the tick's snapshot; a factory whose messages keep
        LATEST fresh already has snapshots that recent). Returns True when it wrote."""
        factory_id = str(item.get("factory_id") or str(item["pk"]).removeprefix("FACTORY#"))
        updated = item.get("updated_at")
        due = updated is None or now - parse_ts(str(updated)) >= tick_after
        async with self._factory_lock(factory_id):
            known = self._known.get(factory_id)
            if known is None or str(known.get("updated_at", "")) <= str(item.get("updated_at", "")):
                # listed (an eventually consistent read): kept unless this replica's copy is newer
                self._remember(factory_id, item)
            committed = await self._commit(factory_id, now, force=due)
        if committed is None:
            return False
        snap = await self._snapshot(factory_id, committed)
        await self._announce(factory_id, [snap], [committed], now)
        return True

    # -- events ----------------------------------------------------------------------------------

    async def _announce(
        self,
        factory_id: str,
        created: list[PutResult],
        commits: list[Commit],
        now: datetime,
        *,
        replayed: bool = False,
    ) -> None:
        """ObjectCreated for every object written, a ChangeEvent for every commit; ``replayed``
        (the message came from ``aegis replay``) marks them all, so that alerts and triggers
        leave them alone."""
        snapshots = {keys.state_snapshot_key(factory_id, c.at): c for c in commits}
        events = []
        for put in created:
            event = self.store.created(put, producer=PRODUCER, at=now, replayed=replayed)
            if (commit := snapshots.get(put.key)) is not None:
                event = event.model_copy(update={"alert": alert_basis(commit)})
            events.append(
                Outgoing(
                    object_created_subject(_family(put.key)), event, msgids.object_created(put.key)
                )
            )
        pk = keys.factory_pk(factory_id)
        for change in commits:
            new = change.new
            events.append(
                Outgoing(
                    change_subject(LATEST_ENTITY),
                    ChangeEvent(
                        table=self.states.table,
                        pk=pk,
                        sk=keys.LATEST_SK,
                        event_name="MODIFY" if change.old else "INSERT",
                        old_image=change.old,
                        new_image=change.new,
                        producer=PRODUCER,
                        at=now,
                        replayed=replayed,
                    ),
                    msgids.latest_change(pk, keys.LATEST_SK, new.get("updated_at")),
                )
            )
        await self.publish(events)


def alert_basis(commit: Commit) -> AlertBasis:
    """The risk the dispatcher decides on, from the commit in hand (see :class:`AlertBasis`)."""

    def reasons(image: dict[str, Any]) -> list[Reason]:
        return [Reason.model_validate(r) for r in (image.get("risk") or {}).get("reasons") or []]

    if commit.old is not None:
        previous: list[Reason] | None = reasons(commit.old)
    else:  # the first state, or a redelivery whose predecessor left the history window
        previous = None if commit.new.get("prev_updated_at") else []
    return AlertBasis(at=commit.at, reasons=reasons(commit.new), previous_reasons=previous)


def _family(key: str) -> str:
    """The dataset word of a processed/ key (``processed/{f}/{dataset}/...``)."""
    return key.split("/", 3)[2]
