"""Late-data marks: a factory-hour that got processed/ objects after its windows were folded
(``FACTORY#{f}`` / ``LATE#{hour}``, in the fleet index), marked by the processor and cleared by
the aggregator once it folded the hour again.

:class:`LateMarks` is the protocol; :class:`TableLateMarks` its one implementation, over a table:
DynamoDB's (:class:`~aegis_storage.readmodel.ReadModel`, which also announces the marks) or the
in-memory one (:class:`~aegis_storage.items.MemoryTable`; :class:`MemoryLateMarks` makes one).
Both follow one contract (libs/storage/tests/test_latemarks.py): every ``mark`` adds one to the
hour's ``marks``; ``clear`` deletes the marker only while it still holds the count the clearer
read (else False, and the marker stays); ``late_hours`` lists the live markers, oldest hour
first.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from aegis_storage.memorytable import MemoryTable


class LateMarks(Protocol):
    async def mark(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        """Add a mark to the factory-hour starting at ``hour`` (made with the first)."""
        ...

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        """Every live marker (``factory_id``, ``hour_start``, ``marks``), oldest hour first."""
        ...

    async def clear(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        """Delete the marker if it still holds ``marks``; False when another mark came since."""
        ...


class LateTable(Protocol):
    """What :class:`TableLateMarks` needs of a table."""

    async def mark_late(
        self, factory_id: str, hour: datetime, *, now: datetime, ttl: int
    ) -> None: ...

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]: ...

    async def clear_late(self, factory_id: str, hour: datetime, *, marks: int) -> bool: ...


class TableLateMarks:
    """:class:`LateMarks` in a table (DynamoDB's, or the in-memory one)."""

    def __init__(self, readmodel: LateTable) -> None:
        self._readmodel = readmodel

    async def mark(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        await self._readmodel.mark_late(factory_id, hour, now=now, ttl=ttl)

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        return await self._readmodel.late_hours(now=now)

    async def clear(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        return await self._readmodel.clear_late(factory_id, hour, marks=marks)


class MemoryLateMarks(TableLateMarks):
    """:class:`TableLateMarks` on an in-memory table (a new one, or ``table`` to share one)."""

    def __init__(self, table: MemoryTable | None = None) -> None:
        self.memory = table if table is not None else MemoryTable()
        super().__init__(self.memory)
