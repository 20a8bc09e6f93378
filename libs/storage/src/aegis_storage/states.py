"""A factory's states in the table: its LATEST item and its HISTORY#STATE items, as the
processor's commit protocol reads and writes them.

:class:`FactoryStates` is the protocol; :class:`TableStates` is its one implementation, over a
table: DynamoDB's (:class:`~aegis_storage.readmodel.ReadModel`) or the in-memory one
(:class:`~aegis_storage.items.MemoryTable`, for tests that need no server; :class:`MemoryStates`
makes one). The table decides every condition, so both refuse exactly the same writes (one
contract test suite runs against both, libs/storage/tests/test_states.py):

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

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from aegis_contracts import keys
from aegis_storage.encoding import Encoded
from aegis_storage.memorytable import MemoryTable

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


class StatesTable(Protocol):
    """What :class:`TableStates` needs of a table."""

    @property
    def table(self) -> str: ...

    async def get_latest(self, factory_id: str) -> dict[str, Any] | None: ...

    async def replace_latest(
        self, factory_id: str, image: Image, *, expected: str | None
    ) -> bool: ...

    async def put_item(self, item: Encoded, *, if_absent: bool = False) -> None: ...

    async def get_item(self, pk: str, sk: str) -> dict[str, Any] | None: ...

    async def delete_item(self, pk: str, sk: str) -> None: ...

    async def history_states(
        self, factory_id: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]: ...


class TableStates:
    """:class:`FactoryStates` in a table (DynamoDB's, or the in-memory one)."""

    def __init__(self, readmodel: StatesTable) -> None:
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


class MemoryStates(TableStates):
    """:class:`TableStates` on an in-memory table (a new one, or ``table`` to share one)."""

    def __init__(self, table: MemoryTable | None = None) -> None:
        self.memory = table if table is not None else MemoryTable()
        super().__init__(self.memory)
