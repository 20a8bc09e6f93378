"""The table in a dict: :class:`MemoryTable` keeps :class:`~aegis_storage.items.Items`,
:class:`~aegis_storage.items.Leases` and the cloud's LATEST
(:class:`~aegis_storage.cloudlatest.CloudLatest`) as :class:`~aegis_storage.readmodel.ReadModel`
does in DynamoDB, refusing exactly the same writes (the contracts in :mod:`aegis_storage.items`
and :mod:`aegis_storage.cloudlatest`), for tests that need no server."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from aegis_contracts import keys
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
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.items import (
    TRANSACTION_LIMIT,
    Change,
    ChangeSink,
    Item,
    Put,
    claim_item,
    late_markers,
    lease_item,
    live,
)
from aegis_storage.periodic import PeriodicWork


class MemoryTable(cloudlatest.CloudLatest, PeriodicWork):
    """:class:`Items`, :class:`Leases` and the cloud's LATEST
    (:class:`~aegis_storage.cloudlatest.CloudLatest`) in a dict of DynamoDB attribute values (the
    fleet index's keys included, as the table stores them). With ``changes``, announced entities'
    writes are handed to it as :class:`~aegis_storage.readmodel.ReadModel` hands them (not a
    factory's LATEST, nor leases and claims)."""

    def __init__(self, table: str = "memory", *, changes: ChangeSink | None = None) -> None:
        self._table = table
        self.changes = changes
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def table(self) -> str:
        return self._table

    def _read(self, pk: str, sk: str) -> dict[str, Any] | None:
        stored = self.items.get((pk, sk))
        return None if stored is None else from_attributes(copy.deepcopy(stored))

    async def get_item(
        self, pk: str, sk: str, *, now: datetime | None = None, consistent: bool = True
    ) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # a request's suspension point
        del consistent  # every read of the dict is consistent
        item = self._read(pk, sk)
        return item if item is None or now is None or live(item, now) else None

    async def get_latest(self, factory_id: str) -> dict[str, Any] | None:
        await asyncio.sleep(0)  # a request's suspension point
        return self._read(keys.factory_pk(factory_id), keys.LATEST_SK)

    async def replace_latest(self, factory_id: str, image: Item, *, expected: str | None) -> bool:
        """:meth:`ReadModel.replace_latest <aegis_storage.readmodel.ReadModel.replace_latest>`:
        the whole LATEST, only over the version read (``expected``; None: only where none is)."""
        await asyncio.sleep(0)  # a request's suspension point
        pk = keys.factory_pk(factory_id)
        attributes = {**item_attributes(image), "pk": {"S": pk}, "sk": {"S": keys.LATEST_SK}}
        put = Put(
            Encoded(from_attributes(attributes), attributes),
            if_absent=expected is None,
            expected=None if expected is None else {"updated_at": expected},
        )
        try:
            await self._write([put], transaction=False)
        except Conflict:
            return False
        return True

    async def history_states(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        return await self.query_range(
            keys.factory_pk(factory_id), keys.HISTORY_STATE_PREFIX, start, end, now=now
        )

    async def put_item(
        self, item: Item, *, if_absent: bool = False, expected: Mapping[str, Any] | None = None
    ) -> None:
        await asyncio.sleep(0)  # a request's suspension point
        await self._write([Put(item, if_absent=if_absent, expected=expected)], transaction=False)

    async def put_items(self, puts: Sequence[Put]) -> None:
        await asyncio.sleep(0)  # a request's suspension point
        if not 0 < len(puts) <= TRANSACTION_LIMIT:
            raise ValueError(f"a transaction takes 1 to {TRANSACTION_LIMIT} puts, not {len(puts)}")
        await self._write(puts, transaction=True)

    async def _write(self, puts: Sequence[Put], *, transaction: bool) -> None:
        writes = [(put, item_attributes(put.item)) for put in puts]
        item_keys = [_key_of(attributes) for _, attributes in writes]
        if len(set(item_keys)) < len(item_keys):
            raise StorageError("a transaction cannot include multiple operations on one item")
        for (put, _), key in zip(writes, item_keys, strict=True):
            if not _meets(put, self.items.get(key)):
                raise Conflict(f"put {key[0]}/{key[1]}: the condition failed")
        olds = [self._read(*key) for key in item_keys]
        for (_, attributes), key in zip(writes, item_keys, strict=True):
            self.items[key] = copy.deepcopy(attributes)
        for (put, attributes), key, old in zip(writes, item_keys, olds, strict=True):
            if not transaction:
                await self._changed(key, old, from_attributes(attributes), None)
                continue
            # a transaction returns no old image: the writer's ``before`` stands for it, and
            # one it did not give is unknown, not absent
            before = None if put.before is None else from_attributes(item_attributes(put.before))
            event = "INSERT" if before is None and put.if_absent else "MODIFY"
            await self._changed(key, before, from_attributes(attributes), event)

    async def delete_item(self, pk: str, sk: str) -> None:
        await asyncio.sleep(0)  # a request's suspension point
        old = self._read(pk, sk)
        self.items.pop((pk, sk), None)
        if old is not None:
            await self._changed((pk, sk), old, None, None)

    async def partition(
        self, pk: str, *, now: datetime, prefix: str | None = None
    ) -> list[dict[str, Any]]:
        await asyncio.sleep(0)  # a request's suspension point
        found = sorted(
            sk for p, sk in self.items if p == pk and (prefix is None or sk.startswith(prefix))
        )
        return [item for sk in found if (item := self._read(pk, sk)) and live(item, now)]

    async def batch_get(
        self, item_keys: Sequence[tuple[str, str]], *, consistent: bool = False
    ) -> list[dict[str, Any]]:
        await asyncio.sleep(0)  # a request's suspension point
        del consistent
        return [item for pk, sk in dict.fromkeys(item_keys) if (item := self._read(pk, sk))]

    async def index_members(
        self, kind: str, *, shards: Sequence[int] | None = None
    ) -> list[tuple[str, str]]:
        await asyncio.sleep(0)  # a request's suspension point
        wanted = set(
            keys.fleet_partitions(kind)
            if shards is None
            else [keys.fleet_partition(kind, n) for n in shards]
        )
        return sorted(
            key
            for key, attributes in self.items.items()
            if attributes.get(keys.FLEET_PK, {}).get("S") in wanted
        )

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
        await asyncio.sleep(0)  # a request's suspension point
        low, high = sk_prefix + format_ts(start), sk_prefix + format_ts(end)
        found = sorted(
            (sk for p, sk in self.items if p == pk and low <= sk < high), reverse=descending
        )
        live_items = [item for sk in found if (item := self._read(pk, sk)) and live(item, now)]
        return live_items if limit is None else live_items[:limit]

    # -- the cloud's LATEST ---------------------------------------------------------------------

    async def set_cloud_tier(self, write: cloudlatest.TierWrite) -> None:
        """The update :class:`~aegis_storage.readmodel.ReadModel` makes, on its condition."""
        await asyncio.sleep(0)  # a request's suspension point
        key = (keys.CLOUD_PK, keys.LATEST_SK)
        stored = self.items.get(key) or {}
        other_holds = (
            write.other_name not in stored
            if write.other_at is None
            else write.other_name in stored
            and _same(stored[write.other_name], {"S": write.other_at})
        )
        own_holds = write.own_name not in stored or _less_than(stored, write.own_name, write.at)
        if not (other_holds and own_holds):
            raise Conflict("update CLOUD#infra/LATEST: the condition failed")
        old = self._read(*key)  # what ``write.read`` was: the condition held both tiers' times
        self.items[key] = {
            **stored,
            "pk": {"S": key[0]},
            "sk": {"S": key[1]},
            **to_attributes(
                {
                    write.tier: write.body,
                    write.own_name: write.at,
                    "overall_status": write.overall.value,
                }
            ),
        }
        await self._changed(key, old, self._read(*key), None)

    # -- late-data marks ------------------------------------------------------------------------

    async def mark_late(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        """:meth:`ReadModel.mark_late <aegis_storage.readmodel.ReadModel.mark_late>`: one more
        mark on the factory-hour's marker (made by the first), in the fleet index."""
        await asyncio.sleep(0)  # a request's suspension point
        pk, sk = keys.factory_pk(factory_id), keys.late_hour_sk(hour)
        stored = self.items.get((pk, sk), {})
        marks = int(stored.get("marks", {}).get("N", "0")) + 1
        fields = {
            "factory_id": factory_id,
            "hour_start": format_ts(hour),
            "marked_at": format_ts(now),
        }
        updated = {**stored, **to_attributes(fields | {"ttl": ttl, "marks": marks})}
        self.items[(pk, sk)] = indexed({**updated, "pk": {"S": pk}, "sk": {"S": sk}})
        new = from_attributes(self.items[(pk, sk)])
        # as the table announces it: the old image is the new one a mark before
        await self._changed(
            (pk, sk), None if marks <= 1 else {**new, "marks": marks - 1}, new, None
        )

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        found = await self.batch_get(await self.index_members(keys.FLEET_LATE), consistent=True)
        return late_markers(found, now)

    async def clear_late(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        """Delete the marker only while it holds ``marks`` (False, and it stays, otherwise)."""
        await asyncio.sleep(0)  # a request's suspension point
        key = (keys.factory_pk(factory_id), keys.late_hour_sk(hour))
        stored = self.items.get(key)
        if (
            stored is None
            or stored.get("marks") is None
            or not _same(stored["marks"], {"N": str(marks)})
        ):
            return False
        old = self._read(*key)
        del self.items[key]
        await self._changed(key, old, None, None)
        return True

    # -- leases and claims --------------------------------------------------------------------

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
        await asyncio.sleep(0)  # a request's suspension point
        stored = self.items.get((pk, sk))
        if stored is not None and not _less_than(stored, "until", format_ts(now)):
            return False
        item = lease_item(pk, sk, owner=owner, now=now, until=until, attributes=attributes)
        self.items[(pk, sk)] = to_attributes(item)
        return True

    async def extend_lease(self, pk: str, sk: str, *, owner: str, until: datetime) -> bool:
        await asyncio.sleep(0)  # a request's suspension point
        return self._set_if_owned((pk, sk), owner, "until", format_ts(until))

    async def release_lease(self, pk: str, sk: str, *, owner: str) -> bool:
        await asyncio.sleep(0)  # a request's suspension point
        stored = self.items.get((pk, sk))
        if stored is None or stored.get("owner") != {"S": owner}:
            return False
        del self.items[(pk, sk)]
        return True

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
        await asyncio.sleep(0)  # a request's suspension point
        key = (keys.claim_pk(job), keys.claim_sk(window_start))
        stored = self.items.get(key)
        if stored is not None and (
            lease is None
            or "done_at" in stored
            or not _less_than(stored, "claimed_at", format_ts(now - lease))
        ):
            return False
        item = claim_item(job, window_start, owner=owner, now=now, ttl=ttl)
        self.items[key] = to_attributes(item)
        return True

    async def finish_window(
        self, job: str, window_start: datetime, *, owner: str, now: datetime
    ) -> bool:
        await asyncio.sleep(0)  # a request's suspension point
        key = (keys.claim_pk(job), keys.claim_sk(window_start))
        return self._set_if_owned(key, owner, "done_at", format_ts(now))

    def _set_if_owned(self, key: tuple[str, str], owner: str, name: str, value: str) -> bool:
        """An update conditioned on ``#owner = :owner``: a missing item fails it too."""
        stored = self.items.get(key)
        if stored is None or stored.get("owner") != {"S": owner}:
            return False
        stored[name] = {"S": value}
        return True

    async def _changed(
        self,
        key: tuple[str, str],
        old: dict[str, Any] | None,
        new: dict[str, Any] | None,
        event_name: str | None,
    ) -> None:
        if self.changes is None or old == new:
            return
        entity = keys.change_entity(*key)
        if entity is None or entity == "factory_latest":
            return
        name = event_name or ("REMOVE" if new is None else "INSERT" if old is None else "MODIFY")
        await self.changes(Change(entity, key[0], key[1], name, old, new))


def _less_than(stored: Mapping[str, Any], name: str, bound: str) -> bool:
    """DynamoDB's ``#name < :bound`` on a string attribute: False where it is missing."""
    value = stored.get(name, {}).get("S")
    return isinstance(value, str) and value < bound


def _key_of(attributes: Mapping[str, Any]) -> tuple[str, str]:
    try:
        return attributes["pk"]["S"], attributes["sk"]["S"]
    except (KeyError, TypeError):
        raise StorageError("an item needs the string keys pk and sk") from None


def _meets(put: Put, stored: Mapping[str, Any] | None) -> bool:
    """Whether ``put``'s condition holds for the ``stored`` attribute values (None: no item),
    as DynamoDB evaluates ``attribute_not_exists(pk) OR (#e0 = :e0 AND ...)``."""
    expected = put.expected or {}
    matches = (
        bool(expected)
        and stored is not None
        and all(
            name in stored and _same(stored[name], condition_value(value))
            for name, value in expected.items()
        )
    )
    if put.if_absent:
        return stored is None or matches
    return matches if expected else True


def _same(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """DynamoDB's ``=``: the same type, and numbers equal as numbers (1 = 1.0)."""
    same_type = set(stored) == set(wanted)
    return same_type and from_attributes({"v": stored}) == from_attributes({"v": wanted})
