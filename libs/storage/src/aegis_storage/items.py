"""Keyed items of the table as services read and write them, and the leases and claims that
keep replicas apart.

:class:`Items`: a read, a conditional put, a transaction of conditional puts, a delete, one
partition or a range of it, a batch of keys, the members of a fleet index partition (the alert
dispatcher, incidents, silences, the job registry). :class:`Leases`: a lease on an item, held by
one owner until a time, and a claim of one window of periodic work. The table
(:class:`~aegis_storage.readmodel.ReadModel`) keeps both in DynamoDB,
:class:`~aegis_storage.memorytable.MemoryTable` in a dict, for tests that need no server. Both
refuse exactly the same writes (one contract suite runs against both, libs/storage/tests/test_items.py):

- ``put_item`` with ``if_absent`` writes only where no item has the key; with ``expected`` only
  where the stored item has those attribute values (a missing attribute or item never matches;
  both: absent, or present with them). A refused write raises
  :class:`~aegis_storage.errors.Conflict` and changes nothing;
- ``put_items`` checks every condition first and writes all or nothing (1 to 100 puts, at most
  one per item);
- a whole-item put replaces the item, and its fleet index entry follows the new item
  (:func:`aegis_contracts.keys.fleet_index_keys`): in, moved or out;
- reads return plain values as DynamoDB's do (integral numbers as ``int``), without the fleet
  index's bookkeeping attributes, as a copy; ``now`` hides items whose ``ttl`` has passed;
- ``partition`` returns live items by sort key, ``query_range`` those of a time range of sort
  keys, ``batch_get`` the present ones in no particular order, ``index_members`` the sorted
  (pk, sk) of the index entries of one kind;
- a lease is taken where there is none or where its ``until`` has passed, moved and given back
  only by its owner; a window is claimed once, or again after ``lease`` when never finished,
  and finished only by its owner (False, never an error, when refused).

Every call of :class:`MemoryTable` suspends once before it acts, as a request to the table
does, so that concurrent callers interleave there as they would against DynamoDB.

What the dict does not model: eventual consistency (every read is a consistent one), TTL
deletion (expired items stay until overwritten; reads with ``now`` hide them as the table's
reads do), throttling, and free-form queries (``ReadModel.query_pages``' expressions).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from pydantic import BaseModel

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_storage.encoding import Encoded

Item = BaseModel | Mapping[str, Any] | Encoded


class Items(Protocol):
    """Keyed items of one table."""

    @property
    def table(self) -> str: ...

    async def get_item(
        self, pk: str, sk: str, *, now: datetime | None = None, consistent: bool = True
    ) -> dict[str, Any] | None: ...

    async def get_latest(self, factory_id: str) -> dict[str, Any] | None: ...

    async def put_item(
        self, item: Item, *, if_absent: bool = False, expected: Mapping[str, Any] | None = None
    ) -> None: ...

    async def put_items(self, puts: Sequence[Put]) -> None: ...

    async def delete_item(self, pk: str, sk: str) -> None: ...

    async def partition(
        self, pk: str, *, now: datetime, prefix: str | None = None
    ) -> list[dict[str, Any]]: ...

    async def batch_get(
        self, item_keys: Sequence[tuple[str, str]], *, consistent: bool = False
    ) -> list[dict[str, Any]]: ...

    async def index_members(
        self, kind: str, *, shards: Sequence[int] | None = None
    ) -> list[tuple[str, str]]: ...

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
    ) -> list[dict[str, Any]]: ...


class Leases(Protocol):
    """Leases and claims that keep replicas of a service apart."""

    async def acquire_lease(
        self,
        pk: str,
        sk: str,
        *,
        owner: str,
        now: datetime,
        until: datetime,
        attributes: Mapping[str, Any] | None = None,
    ) -> bool: ...

    async def extend_lease(self, pk: str, sk: str, *, owner: str, until: datetime) -> bool: ...

    async def release_lease(self, pk: str, sk: str, *, owner: str) -> bool: ...

    async def claim_window(
        self,
        job: str,
        window_start: datetime,
        *,
        owner: str,
        now: datetime,
        ttl: int,
        lease: timedelta | None = None,
    ) -> bool: ...

    async def finish_window(
        self, job: str, window_start: datetime, *, owner: str, now: datetime
    ) -> bool: ...


class Table(Items, Leases, Protocol):
    """Both: what a service that keeps replicas apart and reads and writes items needs."""


# TransactWriteItems takes at most 100 actions
TRANSACTION_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Put:
    """One conditional put of :meth:`ReadModel.put_items` (conditions as in ``put_item``)."""

    item: BaseModel | Mapping[str, Any] | Encoded
    if_absent: bool = False
    expected: Mapping[str, Any] | None = None
    # the item this put replaces, when the writer knows it (a transaction returns no old
    # image): the old image of its change event
    before: BaseModel | Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """One write of an announced entity (:func:`aegis_contracts.keys.change_entity`), as a table
    stream would record it: INSERT, MODIFY or REMOVE with the old and new images."""

    entity: str
    pk: str
    sk: str
    event_name: str
    old_image: dict[str, Any] | None
    new_image: dict[str, Any] | None


ChangeSink = Callable[[Change], Awaitable[None]]


def late_markers(found: Sequence[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The live late-data markers among ``found`` (the items the fleet index's ``LATE``
    entries name), oldest hour first."""
    items = [i for i in found if live(i, now) and "hour_start" in i and "marks" in i]
    return sorted(items, key=lambda i: (str(i["hour_start"]), str(i["pk"])))


def lease_item(
    pk: str,
    sk: str,
    *,
    owner: str,
    now: datetime,
    until: datetime,
    attributes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A lease on ``pk``/``sk`` as the table keeps it: held by ``owner`` from ``now`` to
    ``until``, with ``attributes`` (what kind of work it is) beside."""
    fields = {"owner": owner, "since": format_ts(now), "until": format_ts(until)}
    return {**(attributes or {}), "pk": pk, "sk": sk, **fields}


def claim_item(
    job: str, window_start: datetime, *, owner: str, now: datetime, ttl: int
) -> dict[str, Any]:
    """The claim of one window of periodic work as the table keeps it."""
    return {
        "pk": keys.claim_pk(job),
        "sk": keys.claim_sk(window_start),
        "job": job,
        "window_start": format_ts(window_start),
        "owner": owner,
        "claimed_at": format_ts(now),
        "ttl": ttl,
    }


def live(item: Mapping[str, Any], now: datetime) -> bool:
    """True unless the item carries a ``ttl`` that has passed."""
    ttl = item.get("ttl")
    return ttl is None or int(ttl) > int(now.timestamp())
