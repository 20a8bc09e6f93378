"""The TTL-expiry announcer: DynamoDB's own deletes of expired items, read from the table's
stream and announced on the bus like a writer's delete.

Every writer announces its read-model writes (:meth:`aegis_runtime.service.ServiceApp.publish_change`);
nobody writes when DynamoDB deletes an item whose ``ttl`` passed. The table's stream
(NEW_AND_OLD_IMAGES) reports such a delete as a REMOVE record whose ``userIdentity`` is
``{"type": "Service", "principalId": "dynamodb.amazonaws.com"}``; this module reads the stream and
announces each one as a ChangeEvent on ``aegis.changes.{entity}``: the same entity naming
(:func:`aegis_contracts.keys.change_entity`), the old image deserialized as the read model does,
event ``REMOVE``, ``expired`` set. BizObject jobs on a Delete then fire for expiries too.

- Every shard of the stream is read, open ones and closed ones not read to their end, a child
  only once its parent is finished (or gone from the stream).
- One replica at a time reads a shard: a lease (``STREAM#{reader}`` / ``LEASE#{shard}``) renewed
  while it reads; when its holder stops renewing it, another replica takes the shard over.
- A checkpoint per shard (``CHECKPOINT#{shard}``): the sequence number of the last record handled,
  written after the records before it were published; it never moves backwards. A fresh shard is
  read from TRIM_HORIZON, a known one AFTER_SEQUENCE_NUMBER.
- At least once: a record re-read after a crash before its checkpoint is published again with the
  same ``Nats-Msg-Id`` (named by its table, shard and sequence number), which JetStream stores once
  within its duplicate window.

The local emulator never expires items: there this never announces anything (its tests accept
every REMOVE instead of only TTL ones).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from botocore.exceptions import ClientError

from aegis_contracts import keys, msgids
from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import EXPIRING_ENTITIES, change_subject
from aegis_contracts.times import Clock, ensure_utc, format_ts
from aegis_runtime.metrics import Metrics
from aegis_storage.encoding import from_attributes, to_attributes
from aegis_storage.errors import Conflict, error_code, translated
from aegis_storage.readmodel import ReadModel

if TYPE_CHECKING:
    from aegis_storage.clients import AwsClients

log = structlog.get_logger(__name__)

# the reader of ``STREAM#{reader}``: the orchestrator's IAM policy lets it write ``STREAM#orch-*``
READER = "orch-expiry"
TTL_PRINCIPAL = "dynamodb.amazonaws.com"
# how long a checkpoint outlives its last write: far longer than a shard stays in the stream
# (records are kept 24 hours), so a checkpoint never expires under a shard still read
CHECKPOINT_TTL = timedelta(days=7)
# stream sequence numbers are numeric strings of 21 to 40 digits: zero-padded, they sort as numbers
_POSITION_DIGITS = 48
PAGE_LIMIT = 1000
# pages of one shard per round at most, so one busy shard does not starve the others
MAX_PAGES = 50

RecordFilter = Callable[[Mapping[str, Any]], bool]
Publish = Callable[..., Awaitable[bool]]


class StreamsClient(Protocol):  # the calls of aiobotocore's "dynamodbstreams" client used here
    async def describe_stream(self, **kwargs: Any) -> dict[str, Any]: ...
    async def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]: ...
    async def get_records(self, **kwargs: Any) -> dict[str, Any]: ...


def ttl_removal(record: Mapping[str, Any]) -> bool:
    """A stream record of DynamoDB's TTL process deleting an expired item (as AWS documents it:
    event REMOVE, ``userIdentity`` of type ``Service``, principal ``dynamodb.amazonaws.com``).
    A user's or service's delete carries no ``userIdentity``."""
    identity = record.get("userIdentity") or {}
    return (
        record.get("eventName") == "REMOVE"
        and identity.get("type") == "Service"
        and identity.get("principalId") == TTL_PRINCIPAL
    )


def position(sequence_number: str) -> str:
    """A sequence number as a string that sorts like the number (a checkpoint's condition)."""
    if not sequence_number.isdigit() or len(sequence_number) > _POSITION_DIGITS:
        raise ValueError(f"{sequence_number!r:.60} is not a stream sequence number")
    return sequence_number.zfill(_POSITION_DIGITS)


def expiry_msg_id(table: str, shard_id: str, sequence_number: str) -> str:
    """The ``Nats-Msg-Id`` of a record's announcement: the same record read twice is one message
    (the table too: shard ids are unique within a stream, not across tables)."""
    return msgids.expiry(table, shard_id, sequence_number)


class ExpiryAnnouncer:
    """One round (:meth:`poll`) reads every shard this replica holds or can take, from its
    checkpoint to what the stream has now; a background loop calls it every few seconds."""

    def __init__(
        self,
        *,
        clients: AwsClients,
        streams: StreamsClient,
        table: str,
        publish: Publish,
        producer: str,
        owner: str,
        clock: Clock,
        metrics: Metrics,
        lease: timedelta = timedelta(seconds=30),
        accept: RecordFilter = ttl_removal,
        entities: Sequence[str] = EXPIRING_ENTITIES,
        reader: str = READER,
        page_limit: int = PAGE_LIMIT,
        max_pages: int = MAX_PAGES,
    ) -> None:
        self._ddb = clients.dynamodb
        self._streams = streams
        self.table = table
        self._publish = publish
        self.producer = producer
        self.owner = owner
        self.clock = clock
        self.lease = lease
        self.accept = accept
        self.entities = frozenset(entities)
        self.reader = reader
        self.pk = keys.stream_reader_pk(reader)
        self.page_limit = page_limit
        self.max_pages = max_pages
        # no change sink: the bookkeeping written here is no entity's
        self.readmodel = ReadModel(clients.items, table)
        self._arn: str | None = None
        # per shard held: the end of the lease as last written
        self._held: dict[str, datetime] = {}
        # per shard held: where the next GetRecords goes on (kept between rounds, since an open
        # shard may answer a page with no records and still have more further on)
        self._iterators: dict[str, str] = {}
        self.read = metrics.counter(
            "orchestrator_expiry_records_read_total",
            "Records of the table's stream read by the expiry announcer.",
        )
        self.announced = metrics.counter(
            "orchestrator_expiries_announced_total",
            "Items deleted by their ttl and announced as REMOVE changes, by entity.",
            ("entity",),
        )
        self.skipped = metrics.counter(
            "orchestrator_expiries_skipped_total",
            "TTL removals not announced: items of no expiring entity (histories, claims, logs).",
        )
        self.lag = metrics.gauge(
            "orchestrator_expiry_lag_seconds",
            "Age of the last stream record the expiry announcer read (0 when caught up).",
        )

    # -- a round ----------------------------------------------------------------------------------

    async def poll(self) -> int:
        """Read every shard this replica may read now; returns the expiries announced."""
        arn = await self._stream_arn()
        if arn is None:
            return 0
        shards = await self._shards(arn)
        present = {s["ShardId"] for s in shards}
        marks = await self._checkpoints()
        finished = {shard for shard, mark in marks.items() if mark.get("finished") is True}
        announced = 0
        caught_up = True
        for shard in shards:
            shard_id = shard["ShardId"]
            if shard_id in finished:
                self._forget(shard_id)
                continue
            parent = shard.get("ParentShardId")
            if parent and parent in present and parent not in finished:
                continue  # its parent's records come first
            if not await self._hold(shard_id):
                self._forget(shard_id)
                continue
            try:
                count, done, behind = await self._read(arn, shard_id, marks.get(shard_id))
            except Exception:
                # from the checkpoint again next round: what was published is a duplicate then
                self._iterators.pop(shard_id, None)
                log.exception("expiry_shard_failed", shard=shard_id)
                caught_up = False
                continue
            announced += count
            caught_up = caught_up and not behind
            if done:
                finished.add(shard_id)
        if caught_up:
            self.lag.set(0)
        for shard_id in [s for s in self._held if s not in present]:
            self._forget(shard_id)  # trimmed away: nothing more to read
        return announced

    async def close(self) -> None:
        """Hand every held shard back at once (a stopping replica), so another takes over now."""
        for shard_id in list(self._held):
            try:
                await self.readmodel.release_lease(
                    self.pk, keys.stream_lease_sk(shard_id), owner=self.owner
                )
            except Exception:
                log.warning("expiry_lease_release_failed", shard=shard_id, exc_info=True)
            self._forget(shard_id)

    # -- the stream ---------------------------------------------------------------------------------

    async def _stream_arn(self) -> str | None:
        if self._arn is None:
            with translated(f"describe {self.table}"):
                desc = await self._ddb.describe_table(TableName=self.table)
            self._arn = desc["Table"].get("LatestStreamArn")
            if self._arn is None:
                log.warning("expiry_no_stream", table=self.table)
        return self._arn

    async def _shards(self, arn: str) -> list[dict[str, Any]]:
        shards: list[dict[str, Any]] = []
        start: str | None = None
        while True:
            request: dict[str, Any] = {"StreamArn": arn}
            if start:
                request["ExclusiveStartShardId"] = start
            with translated(f"describe stream of {self.table}"):
                desc = (await self._streams.describe_stream(**request))["StreamDescription"]
            if desc.get("StreamStatus") not in (None, "ENABLED", "ENABLING", "DISABLING"):
                self._arn = None  # disabled (maybe re-enabled as another stream): ask again
            shards.extend(desc.get("Shards", []))
            start = desc.get("LastEvaluatedShardId")
            if not start:
                return shards

    async def _iterator(self, arn: str, shard_id: str, after: str | None) -> str | None:
        request: dict[str, Any] = {"StreamArn": arn, "ShardId": shard_id}
        if after is None:
            request["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            request.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", SequenceNumber=after)
        try:
            resp = await self._streams.get_shard_iterator(**request)
        except ClientError as err:
            if after is None or error_code(err) != "TrimmedDataAccessException":
                raise
            # the checkpoint is older than the stream keeps: what lay between is lost
            log.warning("expiry_checkpoint_trimmed", shard=shard_id, after=after)
            return await self._iterator(arn, shard_id, None)
        iterator: str | None = resp.get("ShardIterator")
        return iterator

    async def _read(
        self, arn: str, shard_id: str, mark: Mapping[str, Any] | None
    ) -> tuple[int, bool, bool]:
        """Read one held shard on from where it was left: (expiries announced, whether the shard
        was read to its end, whether records may be left for the next round)."""
        after = str(mark["sequence_number"]) if mark and mark.get("sequence_number") else None
        iterator = self._iterators.get(shard_id) or await self._iterator(arn, shard_id, after)
        announced = 0
        for _ in range(self.max_pages):
            if iterator is None:
                await self._finish(shard_id)
                return announced, True, False
            if not await self._hold(shard_id):
                self._forget(shard_id)
                return announced, False, True
            try:
                page = await self._streams.get_records(
                    ShardIterator=iterator, Limit=self.page_limit
                )
            except ClientError as err:
                if error_code(err) != "ExpiredIteratorException":
                    raise
                self._iterators.pop(shard_id, None)  # 15 minutes old: from the checkpoint again
                return announced, False, True
            records: list[dict[str, Any]] = page.get("Records", [])
            for record in records:
                announced += await self._handle(shard_id, record)
            if records:
                last = str(records[-1]["dynamodb"]["SequenceNumber"])
                await self._checkpoint(shard_id, last)
            iterator = page.get("NextShardIterator")
            if iterator is not None:
                self._iterators[shard_id] = iterator
            if not records and iterator is not None:
                return announced, False, False  # caught up with an open shard
        return announced, False, True

    async def _handle(self, shard_id: str, record: Mapping[str, Any]) -> int:
        self.read.inc()
        body: Mapping[str, Any] = record.get("dynamodb") or {}
        at = _record_time(body.get("ApproximateCreationDateTime"))
        if at is not None:
            self.lag.set(max(0.0, (self.clock() - at).total_seconds()))
        if not self.accept(record):
            return 0
        old = from_attributes(body.get("OldImage") or {}) or None
        item_keys = body.get("Keys") or {}
        pk = (item_keys.get("pk") or {}).get("S")
        sk = (item_keys.get("sk") or {}).get("S")
        entity = keys.change_entity(pk, sk) if pk and sk else None
        sequence = str(body.get("SequenceNumber"))
        if entity is None or entity not in self.entities:
            self.skipped.inc()
            log.debug("expiry_skipped", pk=pk, sk=sk, entity=entity)
            return 0
        assert pk is not None and sk is not None
        event = ChangeEvent(
            table=self.table,
            pk=pk,
            sk=sk,
            event_name="REMOVE",
            old_image=old,
            new_image=None,
            producer=self.producer,
            at=at or self.clock(),
            expired=True,
        )
        await self._publish(
            change_subject(entity), event, msg_id=expiry_msg_id(self.table, shard_id, sequence)
        )
        self.announced.labels(entity=entity).inc()
        log.info("expiry_announced", entity=entity, pk=pk, sk=sk)
        return 1

    # -- bookkeeping in the read model ------------------------------------------------------------

    async def _checkpoints(self) -> dict[str, dict[str, Any]]:
        items = await self.readmodel.partition(self.pk, now=self.clock())
        prefix = keys.STREAM_CHECKPOINT_PREFIX
        return {
            str(i["sk"]).removeprefix(prefix): i for i in items if str(i["sk"]).startswith(prefix)
        }

    async def _checkpoint(self, shard_id: str, sequence_number: str) -> None:
        """Record ``sequence_number`` as handled, unless a later one already is (a replica that
        lost its lease while publishing never moves the checkpoint back)."""
        now = self.clock()
        values = to_attributes(
            {
                ":seq": sequence_number,
                ":pos": position(sequence_number),
                ":owner": self.owner,
                ":shard": shard_id,
                ":now": format_ts(now),
                ":ttl": int((now + CHECKPOINT_TTL).timestamp()),
            }
        )
        sk = keys.stream_checkpoint_sk(shard_id)
        try:
            with translated(f"checkpoint {self.pk}/{sk}"):
                await self._ddb.update_item(
                    TableName=self.table,
                    Key={"pk": {"S": self.pk}, "sk": {"S": sk}},
                    UpdateExpression=(
                        "SET sequence_number = :seq, #pos = :pos, #owner = :owner, "
                        "shard_id = :shard, updated_at = :now, #ttl = :ttl"
                    ),
                    ConditionExpression="attribute_not_exists(#pos) OR #pos < :pos",
                    ExpressionAttributeNames={"#pos": "position", "#owner": "owner", "#ttl": "ttl"},
                    ExpressionAttributeValues=values,
                )
        except Conflict:
            log.info("expiry_checkpoint_behind", shard=shard_id, sequence=sequence_number)

    async def _finish(self, shard_id: str) -> None:
        """A closed shard read to its end: its children may be read; its lease is given back."""
        now = self.clock()
        sk = keys.stream_checkpoint_sk(shard_id)
        with translated(f"finish {self.pk}/{sk}"):
            await self._ddb.update_item(
                TableName=self.table,
                Key={"pk": {"S": self.pk}, "sk": {"S": sk}},
                UpdateExpression="SET finished = :t, shard_id = :shard, updated_at = :now, #ttl = :ttl",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues=to_attributes(
                    {
                        ":t": True,
                        ":shard": shard_id,
                        ":now": format_ts(now),
                        ":ttl": int((now + CHECKPOINT_TTL).timestamp()),
                    }
                ),
            )
        log.info("expiry_shard_finished", shard=shard_id)
        await self.readmodel.release_lease(
            self.pk, keys.stream_lease_sk(shard_id), owner=self.owner
        )
        self._forget(shard_id)

    async def _hold(self, shard_id: str) -> bool:
        """Whether this replica holds the shard's lease (taking it when free or lapsed, renewing
        it once half of it has run)."""
        now = self.clock()
        until = now + self.lease
        sk = keys.stream_lease_sk(shard_id)
        held = self._held.get(shard_id)
        if held is not None:
            if held - now > self.lease / 2:
                return True
            if held > now and await self.readmodel.extend_lease(
                self.pk, sk, owner=self.owner, until=until
            ):
                self._held[shard_id] = until
                return True
            self._forget(shard_id)
        if await self.readmodel.acquire_lease(self.pk, sk, owner=self.owner, now=now, until=until):
            self._held[shard_id] = until
            # another replica may have read on meanwhile: from the checkpoint, not a kept iterator
            self._iterators.pop(shard_id, None)
            log.info("expiry_shard_taken", shard=shard_id, owner=self.owner)
            return True
        return False

    def _forget(self, shard_id: str) -> None:
        self._held.pop(shard_id, None)
        self._iterators.pop(shard_id, None)


def _record_time(value: object) -> datetime | None:
    """A record's ApproximateCreationDateTime (botocore parses it; epoch seconds otherwise)."""
    if isinstance(value, datetime):
        return ensure_utc(value)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return None
