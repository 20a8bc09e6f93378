"""The DynamoDB read model: whole-item and conditional writes, range queries, claims and leases,
the fleet index. The aggregates services decide on are reached through repositories over it
(:mod:`aegis_storage.states`: a factory's LATEST and HISTORY; :mod:`aegis_storage.latemarks`;
:mod:`aegis_storage.cloudlatest`: the cloud's LATEST; :mod:`aegis_storage.periodic`: periodic
jobs' windows), each with an in-memory twin that refuses the same writes.

Rules this module keeps for every caller:
- a factory's LATEST is written whole, and only while it is the version its writer read
  (:meth:`ReadModel.replace_latest`), so two writers never interleave their fields; the
  processor's commit protocol (HISTORY first, then LATEST) builds on it;
- a HISTORY#STATE item is put only where none is (``put_item(..., if_absent=True)``);
- every read drops items whose ``ttl`` has passed: DynamoDB deletes them late, moto never does;
- every write of a FACTORY LATEST, of an alert state or of a late-data marker carries the fleet
  index's keys exactly when the item belongs in the index
  (:func:`aegis_contracts.keys.fleet_index_keys`), and every read strips them: callers never see
  them. The fleet, the open alerts and the late factory-hours are listed from that index, never
  by scanning the table.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from pydantic import BaseModel

from aegis_contracts import keys
from aegis_contracts.backoff import exponential_s
from aegis_contracts.times import format_ts
from aegis_storage import cloudlatest
from aegis_storage.encoding import (
    Encoded,
    condition_value,
    from_attributes,
    indexed,
    item_attributes,
    to_attributes,
)
from aegis_storage.errors import Conflict, Transient, translated
from aegis_storage.items import (
    TRANSACTION_LIMIT,
    Change,
    ChangeSink,
    Put,
    claim_item,
    late_markers,
    lease_item,
    live,
)
from aegis_storage.periodic import PeriodicWork
from aegis_storage.tasks import all_of

if TYPE_CHECKING:
    from aegis_storage.dynamo import DynamoItems

_ser = TypeSerializer()
_deser = TypeDeserializer()

log = logging.getLogger(__name__)

# BatchGetItem takes at most 100 keys; a few batches at once, retried for unprocessed keys
BATCH_GET_LIMIT = 100
BATCH_GET_CONCURRENCY = 8
BATCH_GET_ATTEMPTS = 8

# field group -> the attribute holding its event time
LATEST_GROUPS: dict[str, str] = {
    "factory_state": "last_factory_state_at",
    "infra_state": "last_infra_state_at",
    "latest_image_snapshot": "last_image_snapshot_at",
}


# dashboard window -> (span, key family it reads)
WINDOWS: dict[str, tuple[timedelta, str]] = {
    "1h": (timedelta(hours=1), keys.HISTORY_STATE_PREFIX),
    "6h": (timedelta(hours=6), keys.GRAPH_5M_PREFIX),
    "12h": (timedelta(hours=12), keys.GRAPH_5M_PREFIX),
    "24h": (timedelta(hours=24), keys.GRAPH_5M_PREFIX),
}


def window_span(window: str) -> tuple[timedelta, str]:
    try:
        return WINDOWS[window]
    except KeyError:
        raise ValueError(f"unknown window {window!r}; one of {', '.join(WINDOWS)}") from None


class ReadModel(cloudlatest.CloudLatest, PeriodicWork):
    """The table. With ``changes``, every write of an announced entity made through it (puts,
    deletes, the cloud LATEST, late-data markers; not a factory's LATEST, which the processor
    announces itself) is handed to ``changes`` once written, with its old and new images; a
    write that changes nothing is not. A failing sink is logged, never raised: the write is
    done."""

    def __init__(
        self, dynamodb: DynamoItems, table: str, *, changes: ChangeSink | None = None
    ) -> None:
        self._ddb = dynamodb
        self._table = table
        self.changes = changes

    @property
    def table(self) -> str:
        """The table's name."""
        return self._table

    def _tracked(self, pk: str | None, sk: str | None) -> str | None:
        if self.changes is None or pk is None or sk is None:
            return None
        entity = keys.change_entity(pk, sk)
        return None if entity == "factory_latest" else entity

    async def _changed(
        self,
        entity: str,
        pk: str,
        sk: str,
        old: dict[str, Any] | None,
        new: dict[str, Any] | None,
        *,
        event_name: str | None = None,
    ) -> None:
        if self.changes is None or old == new:
            return
        name = event_name or ("REMOVE" if new is None else "INSERT" if old is None else "MODIFY")
        try:
            await self.changes(Change(entity, pk, sk, name, old, new))
        except Exception:
            log.exception("change_announce_failed %s %s/%s %s", entity, pk, sk, name)

    # -- LATEST -------------------------------------------------------------------------------

    async def replace_latest(
        self,
        factory_id: str,
        image: BaseModel | Mapping[str, Any] | Encoded,
        *,
        expected: str | None,
    ) -> bool:
        """Write the whole LATEST item if it is still the version read (``updated_at`` equal to
        ``expected``; ``None``: no LATEST yet). False when another writer got there first."""
        pk = keys.factory_pk(factory_id)
        item = indexed({**item_attributes(image), "pk": {"S": pk}, "sk": {"S": keys.LATEST_SK}})
        request: dict[str, Any] = {"TableName": self.table, "Item": item}
        if expected is None:
            request["ConditionExpression"] = "attribute_not_exists(pk)"
        else:
            request["ConditionExpression"] = "updated_at = :seen"
            request["ExpressionAttributeValues"] = {":seen": {"S": expected}}
        try:
            with translated(f"replace {pk}/LATEST"):
                await self._ddb.put_item(**request)
        except Conflict:
            return False
        return True

    async def get_latest(self, factory_id: str) -> dict[str, Any] | None:
        return await self.get_item(keys.factory_pk(factory_id), keys.LATEST_SK)

    async def factory_latest_items(self, *, shard: int | None = None) -> list[dict[str, Any]]:
        """Every FACTORY LATEST item (the fleet; with ``shard``, the factories of that fleet
        index shard), by pk: the index's entries, then the items themselves. Reads what it
        returns, however much history the table holds."""
        members = await self.index_members(
            keys.FLEET_LATEST, shards=None if shard is None else [shard]
        )
        found = await self.batch_get(members)
        return sorted(found, key=lambda i: str(i["pk"]))

    async def firing_alerts(self, *, now: datetime) -> list[dict[str, Any]]:
        """Every live ALERT# state that is firing (the dashboard's open alerts), by scope then
        sort key: the index's open-alert entries, then the items (checked again: the index
        follows the table by a moment)."""
        found = await self.batch_get(await self.index_members(keys.FLEET_FIRING))
        items = [i for i in found if i.get("firing") is True and live(i, now)]
        return sorted(items, key=lambda i: (str(i["pk"]), str(i["sk"])))

    async def index_members(
        self, kind: str, *, shards: Sequence[int] | None = None
    ) -> list[tuple[str, str]]:
        """The (pk, sk) of every item in the fleet index's ``kind`` partitions
        (one of :data:`keys.FLEET_KINDS`), all shards (or those of ``shards``) queried at once."""

        async def shard(partition: str) -> list[tuple[str, str]]:
            found: list[tuple[str, str]] = []
            paginator = self._ddb.get_paginator("query")
            async for page in paginator.paginate(
                TableName=self.table,
                IndexName=keys.FLEET_INDEX,
                KeyConditionExpression="#p = :p",
                ExpressionAttributeNames={"#p": keys.FLEET_PK},
                ExpressionAttributeValues={":p": {"S": partition}},
            ):
                found.extend((i["pk"]["S"], i["sk"]["S"]) for i in page.get("Items", []))
            return found

        with translated(f"query index {keys.FLEET_INDEX} of {self.table} for {kind}"):
            partitions = (
                keys.fleet_partitions(kind)
                if shards is None
                else [keys.fleet_partition(kind, n) for n in shards]
            )
            found_per_shard = await all_of(*(shard(p) for p in partitions))
        return sorted({member for found in found_per_shard for member in found})

    async def batch_get(
        self, item_keys: Sequence[tuple[str, str]], *, consistent: bool = False
    ) -> list[dict[str, Any]]:
        """The items with these (pk, sk), in no particular order; absent ones are left out.
        BatchGetItem in batches of 100, a few at once; keys DynamoDB leaves unprocessed
        (throttling) are asked for again with backoff, and :class:`Transient` is raised when
        they never come."""
        slots = asyncio.Semaphore(BATCH_GET_CONCURRENCY)

        async def batch(chunk: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
            wanted: list[dict[str, Any]] = [{"pk": {"S": pk}, "sk": {"S": sk}} for pk, sk in chunk]
            found: list[dict[str, Any]] = []
            for attempt in range(BATCH_GET_ATTEMPTS):
                async with slots:
                    with translated(f"batch get {len(wanted)} items of {self.table}"):
                        resp = await self._ddb.batch_get_item(
                            RequestItems={
                                self.table: {"Keys": wanted, "ConsistentRead": consistent}
                            }
                        )
                found.extend(
                    from_attributes(i) for i in resp.get("Responses", {}).get(self.table, [])
                )
                unprocessed: dict[str, Any] = dict(resp.get("UnprocessedKeys") or {})
                left = (unprocessed.get(self.table) or {}).get("Keys") or []
                if not left:
                    return found
                wanted = list(left)
                await asyncio.sleep(exponential_s(attempt + 1, first=0.05, cap=1.0))
            raise Transient(f"{len(wanted)} keys of {self.table} stayed unprocessed")

        chunks = [
            item_keys[i : i + BATCH_GET_LIMIT] for i in range(0, len(item_keys), BATCH_GET_LIMIT)
        ]
        batches = await all_of(*(batch(c) for c in chunks))
        return [item for found in batches for item in found]

    # -- HISTORY and other keyed items ------------------------------------------------------------

    async def put_item(
        self,
        item: BaseModel | Mapping[str, Any] | Encoded,
        *,
        if_absent: bool = False,
        expected: Mapping[str, Any] | None = None,
    ) -> None:
        """Put ``item``; with ``if_absent`` only if no item has its key; with ``expected`` only if
        the stored item has those attribute values (optimistic concurrency, e.g. a version).
        Both: absent, or present with those values. A failed condition raises :class:`Conflict`."""
        request = self._put_request(Put(item, if_absent=if_absent, expected=expected))
        pk, sk = request["Item"].get("pk", {}).get("S"), request["Item"].get("sk", {}).get("S")
        entity = self._tracked(pk, sk)
        if entity is not None:
            request["ReturnValues"] = "ALL_OLD"
        with translated(f"put {pk}/{sk}"):
            resp = await self._ddb.put_item(TableName=self.table, **request)
        if entity is not None:
            assert pk is not None and sk is not None
            old = resp.get("Attributes")
            await self._changed(
                entity,
                pk,
                sk,
                from_attributes(old) if old else None,
                from_attributes(request["Item"]),
            )

    async def put_items(self, puts: Sequence[Put]) -> None:
        """Several conditional puts as one transaction (at most 100): all are written or none.
        Any failed condition raises :class:`Conflict` and writes nothing."""
        if not 0 < len(puts) <= TRANSACTION_LIMIT:
            raise ValueError(f"a transaction takes 1 to {TRANSACTION_LIMIT} puts, not {len(puts)}")
        items = [{"Put": {"TableName": self.table, **self._put_request(p)}} for p in puts]
        first = items[0]["Put"]["Item"]
        with translated(f"transaction of {len(puts)} from {first['pk']['S']}/{first['sk']['S']}"):
            await self._ddb.transact_write_items(TransactItems=items)
        for put, request in zip(puts, items, strict=True):
            item = request["Put"]["Item"]
            pk, sk = item.get("pk", {}).get("S"), item.get("sk", {}).get("S")
            entity = self._tracked(pk, sk)
            if entity is not None:
                assert pk is not None and sk is not None
                before = from_attributes(item_attributes(put.before)) if put.before else None
                await self._changed(
                    entity,
                    pk,
                    sk,
                    before,
                    from_attributes(item),
                    # an old image the writer did not give is unknown, not absent
                    event_name="INSERT" if before is None and put.if_absent else "MODIFY",
                )

    @staticmethod
    def _put_request(put: Put) -> dict[str, Any]:
        request: dict[str, Any] = {"Item": item_attributes(put.item)}
        conditions: list[str] = []
        if put.expected:
            names, values = {}, {}
            for i, (name, value) in enumerate(sorted(put.expected.items())):
                names[f"#e{i}"], values[f":e{i}"] = name, condition_value(value)
                conditions.append(f"#e{i} = :e{i}")
            request["ExpressionAttributeNames"] = names
            request["ExpressionAttributeValues"] = values
        if put.if_absent:
            match = " AND ".join(conditions)
            request["ConditionExpression"] = (
                f"attribute_not_exists(pk) OR ({match})" if match else "attribute_not_exists(pk)"
            )
        elif conditions:
            request["ConditionExpression"] = " AND ".join(conditions)
        return request

    async def get_item(
        self, pk: str, sk: str, *, now: datetime | None = None, consistent: bool = True
    ) -> dict[str, Any] | None:
        with translated(f"get {pk}/{sk}"):
            resp = await self._ddb.get_item(
                TableName=self.table,
                Key={"pk": {"S": pk}, "sk": {"S": sk}},
                ConsistentRead=consistent,
            )
        if "Item" not in resp:
            return None
        item = from_attributes(resp["Item"])
        return item if now is None or live(item, now) else None

    async def delete_item(self, pk: str, sk: str) -> None:
        entity = self._tracked(pk, sk)
        with translated(f"delete {pk}/{sk}"):
            resp = await self._ddb.delete_item(
                TableName=self.table,
                Key={"pk": {"S": pk}, "sk": {"S": sk}},
                ReturnValues="ALL_OLD" if entity else "NONE",
            )
        old = resp.get("Attributes")
        if entity is not None and old:
            await self._changed(entity, pk, sk, from_attributes(old), None)

    async def query_range(
        self,
        pk: str,
        sk_prefix: str,
        start: datetime,
        end: datetime,
        *,
        now: datetime,
        descending: bool = False,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Items of ``pk`` whose sort key is ``{sk_prefix}{ts}`` with ``start <= ts < end``, live
        ones only (``ttl > now`` is filtered by DynamoDB and checked again here)."""
        return [
            item
            async for item in self._query(
                pk,
                sk_prefix + format_ts(start),
                sk_prefix + format_ts(end),
                now=now,
                descending=descending,
                limit=limit,
            )
        ]

    async def _query(
        self,
        pk: str,
        low: str,
        high: str,
        *,
        now: datetime,
        descending: bool,
        limit: int | None,
    ) -> AsyncIterator[dict[str, Any]]:
        paginator = self._ddb.get_paginator("query")
        count = 0
        with translated(f"query {pk} [{low}, {high})"):
            async for page in paginator.paginate(
                TableName=self.table,
                # BETWEEN is inclusive; the exclusive end is checked below
                KeyConditionExpression="pk = :pk AND sk BETWEEN :low AND :high",
                FilterExpression="attribute_not_exists(#ttl) OR #ttl > :now",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues={
                    ":pk": {"S": pk},
                    ":low": {"S": low},
                    ":high": {"S": high},
                    ":now": {"N": str(int(now.timestamp()))},
                },
                ScanIndexForward=not descending,
                ConsistentRead=True,
                # a few items wanted: pages that small, so DynamoDB reads no more than that
                PaginationConfig={"PageSize": max(limit, 10)} if limit else {},
            ):
                for raw in page.get("Items", []):
                    item = from_attributes(raw)
                    if item["sk"] >= high or not live(item, now):
                        continue
                    yield item
                    count += 1
                    if limit is not None and count >= limit:
                        return

    async def partition(
        self, pk: str, *, now: datetime, prefix: str | None = None
    ) -> list[dict[str, Any]]:
        """Every live item of one partition (small ones: an ALERT# scope, a CLAIM# job), or with
        ``prefix`` those whose sort key begins with it (only they are read)."""
        items: list[dict[str, Any]] = []
        paginator = self._ddb.get_paginator("query")
        condition, values = "pk = :pk", {":pk": {"S": pk}}
        if prefix is not None:
            condition += " AND begins_with(sk, :prefix)"
            values[":prefix"] = {"S": prefix}
        with translated(f"query {pk}"):
            async for page in paginator.paginate(
                TableName=self.table,
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
                ConsistentRead=True,
            ):
                items.extend(
                    item
                    for item in (from_attributes(i) for i in page.get("Items", []))
                    if live(item, now)
                )
        return items

    async def query_pages(
        self,
        pk: str,
        *,
        now: datetime,
        sk_condition: str | None = None,
        filter_expression: str | None = None,
        names: Mapping[str, str] | None = None,
        values: Mapping[str, Any] | None = None,
        projection: Sequence[str] | None = None,
        forward: bool = True,
        page_size: int | None = None,
    ) -> AsyncGenerator[list[dict[str, Any]]]:
        """The live items of one partition, a page at a time, in sort key order (``forward``)
        or the reverse: ``sk_condition`` on the sort key (``sk``) narrows the range read,
        ``filter_expression`` what comes back, ``projection`` (document paths over ``names``)
        what each item holds; ``values`` are plain values; ``page_size`` the items each page
        reads (before the filter). A projection keeps ``ttl`` so expired items stay out. The
        caller stops reading by leaving the loop."""
        condition = "pk = :pk" + (f" AND {sk_condition}" if sk_condition else "")
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": {
                ":pk": {"S": pk},
                **{k: _ser.serialize(v) for k, v in (values or {}).items()},
            },
            "ScanIndexForward": forward,
            "ConsistentRead": True,
        }
        all_names = dict(names or {})
        if filter_expression:
            request["FilterExpression"] = filter_expression
        if page_size is not None:
            request["Limit"] = page_size
        if projection:
            all_names.setdefault("#ttl", "ttl")
            request["ProjectionExpression"] = ", ".join(
                [*projection, *(["#ttl"] if "#ttl" not in projection else [])]
            )
        if all_names:
            request["ExpressionAttributeNames"] = all_names
        paginator = self._ddb.get_paginator("query")
        with translated(f"query {pk}"):
            async for page in paginator.paginate(**request):
                yield [
                    item
                    for item in (from_attributes(i) for i in page.get("Items", []))
                    if live(item, now)
                ]

    async def history_states(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        return await self.query_range(
            keys.factory_pk(factory_id), keys.HISTORY_STATE_PREFIX, start, end, now=now
        )

    async def graph_buckets(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        return await self.query_range(
            keys.factory_pk(factory_id), keys.GRAPH_5M_PREFIX, start, end, now=now
        )

    # -- dashboard windows ----------------------------------------------------------------------

    async def factory_window(
        self, factory_id: str, window: str, *, now: datetime
    ) -> tuple[str, list[dict[str, Any]]]:
        """A factory's series for a dashboard window: ``1h`` from HISTORY#STATE (raw resolution),
        ``6h``/``12h``/``24h`` from GRAPH#5M. Returns the key family read and its live items,
        oldest first; an empty list when there is no data (never an error)."""
        span, family = window_span(window)
        start, end = now - span, now + timedelta(milliseconds=1)
        if family == keys.HISTORY_STATE_PREFIX:
            return family, await self.history_states(factory_id, start, end, now=now)
        return family, await self.graph_buckets(factory_id, start, end, now=now)

    async def cloud_window(
        self, tier: str, *, now: datetime, span: timedelta | None = None
    ) -> list[dict[str, Any]]:
        """Cloud history for the dashboard: fast 6 h, slow 24 h by default (their TTLs)."""
        span = span or (timedelta(hours=6) if tier == "fast" else timedelta(hours=24))
        return await self.cloud_history(tier, now - span, now + timedelta(milliseconds=1), now=now)

    # -- CLOUD#infra ------------------------------------------------------------------------------

    async def set_cloud_tier(self, write: cloudlatest.TierWrite) -> None:
        """:meth:`aegis_storage.cloudlatest.CloudLatest.set_cloud_tier`: one conditional update."""
        names = {"#own": write.tier, "#own_at": write.own_name, "#other_at": write.other_name}
        values: dict[str, Any] = {
            ":snap": _ser.serialize(write.body),
            ":at": {"S": write.at},
            ":overall": {"S": write.overall.value},
        }
        if write.other_at is None:
            condition = "attribute_not_exists(#other_at)"
        else:
            condition = "#other_at = :other_at"
            values[":other_at"] = {"S": write.other_at}
        with translated("update CLOUD#infra/LATEST"):
            resp = await self._ddb.update_item(
                TableName=self.table,
                Key={"pk": {"S": keys.CLOUD_PK}, "sk": {"S": keys.LATEST_SK}},
                UpdateExpression="SET #own = :snap, #own_at = :at, overall_status = :overall",
                ConditionExpression=(
                    f"({condition}) AND (attribute_not_exists(#own_at) OR #own_at < :at)"
                ),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="ALL_NEW",
            )
        entity = self._tracked(keys.CLOUD_PK, keys.LATEST_SK)
        if entity is not None:
            # the write was conditional on both tiers' times: what was read is its old image
            new = from_attributes(resp.get("Attributes", {}))
            await self._changed(
                entity, keys.CLOUD_PK, keys.LATEST_SK, dict(write.read) or None, new
            )

    # -- periodic work ------------------------------------------------------------------------

    async def claim_window(
        self,
        job: str,
        window_start: datetime,
        *,
        owner: str,
        now: datetime,
        ttl: int,
        lease: timedelta | None = None,
    ) -> bool:
        """Claim one window of periodic work; exactly one of N concurrent replicas gets True.

        With ``lease``, a claim that was never finished (:meth:`finish_window`) and is older than
        the lease may be taken over: a replica that died mid-window does not lose the window."""
        item = claim_item(job, window_start, owner=owner, now=now, ttl=ttl)
        request: dict[str, Any] = {"TableName": self.table, "Item": to_attributes(item)}
        if lease is None:
            request["ConditionExpression"] = "attribute_not_exists(pk)"
        else:
            request["ConditionExpression"] = (
                "attribute_not_exists(pk) OR (attribute_not_exists(done_at) AND claimed_at < :expired)"
            )
            request["ExpressionAttributeValues"] = {":expired": {"S": format_ts(now - lease)}}
        try:
            with translated(f"claim {item['pk']}/{item['sk']}"):
                await self._ddb.put_item(**request)
        except Conflict:
            return False
        return True

    async def acquire_lease(
        self,
        pk: str,
        sk: str,
        *,
        owner: str,
        now: datetime,
        until: datetime,
        attributes: Mapping[str, Any] | None = None,
    ) -> bool:
        """Hold ``pk``/``sk`` for ``owner`` until ``until`` if it is free or its lease has run out
        (a holder that died does not keep it); False when someone else holds it. ``attributes``
        are stored on the lease item too (what kind of work it is, for whoever takes it over)."""
        item = lease_item(pk, sk, owner=owner, now=now, until=until, attributes=attributes)
        try:
            with translated(f"lease {pk}/{sk}"):
                await self._ddb.put_item(
                    TableName=self.table,
                    Item=to_attributes(item),
                    ConditionExpression="attribute_not_exists(pk) OR #until < :now",
                    ExpressionAttributeNames={"#until": "until"},
                    ExpressionAttributeValues={":now": {"S": format_ts(now)}},
                )
        except Conflict:
            return False
        return True

    async def extend_lease(self, pk: str, sk: str, *, owner: str, until: datetime) -> bool:
        """Move the end of a lease ``owner`` holds to ``until`` (a heartbeat; an ``until`` in the
        past hands it over at once); False when another owner has taken it or it is gone."""
        try:
            with translated(f"extend {pk}/{sk}"):
                await self._ddb.update_item(
                    TableName=self.table,
                    Key={"pk": {"S": pk}, "sk": {"S": sk}},
                    UpdateExpression="SET #until = :until",
                    ConditionExpression="#owner = :owner",
                    ExpressionAttributeNames={"#owner": "owner", "#until": "until"},
                    ExpressionAttributeValues={
                        ":owner": {"S": owner},
                        ":until": {"S": format_ts(until)},
                    },
                )
        except Conflict:
            return False
        return True

    async def release_lease(self, pk: str, sk: str, *, owner: str) -> bool:
        """Give a lease back (only its owner can); False when it was taken over meanwhile."""
        try:
            with translated(f"release {pk}/{sk}"):
                await self._ddb.delete_item(
                    TableName=self.table,
                    Key={"pk": {"S": pk}, "sk": {"S": sk}},
                    ConditionExpression="#owner = :owner",
                    ExpressionAttributeNames={"#owner": "owner"},
                    ExpressionAttributeValues={":owner": {"S": owner}},
                )
        except Conflict:
            return False
        return True

    async def finish_window(
        self, job: str, window_start: datetime, *, owner: str, now: datetime
    ) -> bool:
        """Mark a claimed window done (only by its owner); False if another replica took it over."""
        try:
            with translated(f"finish {keys.claim_pk(job)}/{keys.claim_sk(window_start)}"):
                await self._ddb.update_item(
                    TableName=self.table,
                    Key={"pk": {"S": keys.claim_pk(job)}, "sk": {"S": keys.claim_sk(window_start)}},
                    UpdateExpression="SET done_at = :now",
                    ConditionExpression="#owner = :owner",
                    ExpressionAttributeNames={"#owner": "owner"},
                    ExpressionAttributeValues={
                        ":now": {"S": format_ts(now)},
                        ":owner": {"S": owner},
                    },
                )
        except Conflict:
            return False
        return True

    # -- late data: factory-hours whose windows must be folded again ---------------------------

    async def mark_late(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        """Record that the factory-hour starting at ``hour`` got processed/ objects after its
        windows were folded (``FACTORY#{f}`` / ``LATE#{hour}``, in the fleet index). Each call
        adds one to ``marks``: a reader that folded the hour clears the marker only if no mark
        came after the one it read (:meth:`clear_late`)."""
        pk, sk = keys.factory_pk(factory_id), keys.late_hour_sk(hour)
        index = keys.fleet_index_keys(pk, sk) or {}
        entity = self._tracked(pk, sk)
        with translated(f"mark {pk}/{sk}"):
            resp = await self._ddb.update_item(
                TableName=self.table,
                Key={"pk": {"S": pk}, "sk": {"S": sk}},
                UpdateExpression=(
                    "SET factory_id = :f, hour_start = :h, marked_at = :now, #ttl = :ttl, "
                    "#fp = :fp, #fs = :fs ADD marks :one"
                ),
                ExpressionAttributeNames={
                    "#ttl": "ttl",
                    "#fp": keys.FLEET_PK,
                    "#fs": keys.FLEET_SK,
                },
                ExpressionAttributeValues={
                    ":f": {"S": factory_id},
                    ":h": {"S": format_ts(hour)},
                    ":now": {"S": format_ts(now)},
                    ":ttl": {"N": str(ttl)},
                    ":fp": {"S": index[keys.FLEET_PK]},
                    ":fs": {"S": index[keys.FLEET_SK]},
                    ":one": {"N": "1"},
                },
                ReturnValues="ALL_NEW" if entity else "NONE",
            )
        if entity is not None:
            new = from_attributes(resp.get("Attributes", {}))
            # ``marks`` counts every mark: the first one made the item
            first = int(new.get("marks", 1)) <= 1
            old = None if first else {**new, "marks": int(new["marks"]) - 1}
            await self._changed(entity, pk, sk, old, new)

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        """Every live late-data marker (``factory_id``, ``hour_start``, ``marks``), oldest hour
        first: the fleet index's ``LATE`` entries, then the markers themselves (consistent reads,
        so ``marks`` is the count a clear is conditioned on)."""
        return late_markers(
            await self.batch_get(await self.index_members(keys.FLEET_LATE), consistent=True), now
        )

    async def clear_late(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        """Delete the factory-hour's marker if it still holds ``marks`` (no object came late
        since it was read); False when another mark arrived (the hour is folded again later)."""
        pk, sk = keys.factory_pk(factory_id), keys.late_hour_sk(hour)
        entity = self._tracked(pk, sk)
        try:
            with translated(f"clear {pk}/{sk}"):
                resp = await self._ddb.delete_item(
                    TableName=self.table,
                    Key={"pk": {"S": pk}, "sk": {"S": sk}},
                    ConditionExpression="marks = :n",
                    ExpressionAttributeValues={":n": {"N": str(marks)}},
                    ReturnValues="ALL_OLD" if entity else "NONE",
                )
        except Conflict:
            return False
        old = resp.get("Attributes")
        if entity is not None and old:
            await self._changed(entity, pk, sk, from_attributes(old), None)
        return True
