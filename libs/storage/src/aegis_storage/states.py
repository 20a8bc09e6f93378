"""A factory's states in the table: its LATEST item and its HISTORY#STATE items, as the
processor's commit protocol reads and writes them.

:class:`FactoryStates` is the protocol; :class:`TableStates` keeps them in DynamoDB (through
:class:`~aegis_storage.readmodel.ReadModel`), :class:`MemoryStates` in a dict, for tests that
need no server. Both refuse exactly the same writes (one contract test suite runs against both,
libs/storage/tests/test_states.py):

- ``add_history`` puts a HISTORY item only where none is: a taken key raises
  :class:`~aegis_storage.errors.Conflict` and leaves the stored item as it was;
- ``replace_latest`` writes the whole LATEST only while its ``updated_at`` is the one read
  (``expected``; None: only while there is no LATEST), else returns False and writes nothing;
- reads return items as a DynamoDB read does: plain values (integral numbers as ``int``),
  without the fleet index's bookkeeping attributes, a copy the caller may change;
- ``history`` returns the live items (no ``ttl`` at or before ``now``) whose updated_at lies in
  ``[start, end)``, oldest first.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_storage.errors import Conflict
from aegis_storage.readmodel import Encoded, ReadModel, encode, live

Image = Encoded | Mapping[str, Any]


class FactoryStates(Protocol):
    """LATEST and HISTORY#STATE of the factories in one table."""

    @property
    def table(self) -> str: ...

    async def latest(self, factory_id: str) -> dict[str, Any] | None:
        """The factory's LATEST (a consistent read), None when it has none."""
        ...

    async def replace_latest(self, factory_id: str, image: Image, *, expected: str | None) -> bool:
        """Write the whole LATEST if its ``updated_at`` is still ``expected`` (None: if there is
        no LATEST); False, writing nothing, when another writer got there first."""
        ...

    async def add_history(self, item: Encoded) -> None:
        """Put a HISTORY#STATE item (its ``pk`` and ``sk`` inside) where none is; raises
        :class:`Conflict` when the key is taken."""
        ...

    async def history_item(self, factory_id: str, sk: str) -> dict[str, Any] | None:
        """The HISTORY item at ``sk`` (a consistent read), None when there is none."""
        ...

    async def remove_history(self, factory_id: str, sk: str) -> None:
        """Delete the HISTORY item at ``sk``; nothing happens when there is none."""
        ...

    async def history(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        """The live HISTORY#STATE items with ``start <= updated_at < end``, oldest first."""
        ...


class TableStates:
    """:class:`FactoryStates` in DynamoDB."""

    def __init__(self, readmodel: ReadModel) -> None:
        self._readmodel = readmodel

    @property
    def table(self) -> str:
        return self._readmodel.table

    async def latest(self, factory_id: str) -> dict[str, Any] | None:
        return await self._readmodel.get_latest(factory_id)

    async def replace_latest(self, factory_id: str, image: Image, *, expected: str | None) -> bool:
        return await self._readmodel.replace_latest(factory_id, image, expected=expected)

    async def add_history(self, item: Encoded) -> None:
        await self._readmodel.put_item(item, if_absent=True)

    async def history_item(self, factory_id: str, sk: str) -> dict[str, Any] | None:
        return await self._readmodel.get_item(keys.factory_pk(factory_id), sk)

    async def remove_history(self, factory_id: str, sk: str) -> None:
        await self._readmodel.delete_item(keys.factory_pk(factory_id), sk)

    async def history(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        return await self._readmodel.history_states(factory_id, start, end, now=now)


class MemoryStates:
    """:class:`FactoryStates` in a dict: items kept in the plain form a DynamoDB read returns."""

    def __init__(self, table: str = "memory") -> None:
        self._table = table
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def table(self) -> str:
        return self._table

    def _get(self, pk: str, sk: str) -> dict[str, Any] | None:
        found = self.items.get((pk, sk))
        return None if found is None else copy.deepcopy(found)

    async def latest(self, factory_id: str) -> dict[str, Any] | None:
        return self._get(keys.factory_pk(factory_id), keys.LATEST_SK)

    async def replace_latest(self, factory_id: str, image: Image, *, expected: str | None) -> bool:
        pk = keys.factory_pk(factory_id)
        stored = self.items.get((pk, keys.LATEST_SK))
        if expected is None and stored is not None:
            return False
        if expected is not None and (stored is None or stored.get("updated_at") != expected):
            return False
        plain = _plain(image)
        self.items[(pk, keys.LATEST_SK)] = {**plain, "pk": pk, "sk": keys.LATEST_SK}
        return True

    async def add_history(self, item: Encoded) -> None:
        plain = _plain(item)
        key = (str(plain["pk"]), str(plain["sk"]))
        if key in self.items:
            raise Conflict(f"put {key[0]}/{key[1]}: the item exists")
        self.items[key] = plain

    async def history_item(self, factory_id: str, sk: str) -> dict[str, Any] | None:
        return self._get(keys.factory_pk(factory_id), sk)

    async def remove_history(self, factory_id: str, sk: str) -> None:
        self.items.pop((keys.factory_pk(factory_id), sk), None)

    async def history(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        pk = keys.factory_pk(factory_id)
        low = keys.HISTORY_STATE_PREFIX + format_ts(start)
        high = keys.HISTORY_STATE_PREFIX + format_ts(end)
        found = sorted(
            (sk, item)
            for (p, sk), item in self.items.items()
            if p == pk and low <= sk < high and live(item, now)
        )
        return [copy.deepcopy(item) for _, item in found]


def _plain(image: Image) -> dict[str, Any]:
    """What a read of ``image`` once written returns (the conversion a write makes)."""
    encoded = image if isinstance(image, Encoded) else encode(image)
    return copy.deepcopy(encoded.plain)
