"""Late-data marks: a factory-hour that got processed/ objects after its windows were folded
(``FACTORY#{f}`` / ``LATE#{hour}``, in the fleet index), marked by the processor and cleared by
the aggregator once it folded the hour again.

:class:`LateMarks` is the protocol; :class:`TableLateMarks` keeps the marks in DynamoDB (through
:class:`~aegis_storage.readmodel.ReadModel`, which also announces them), :class:`MemoryLateMarks`
in a dict. Both follow one contract (libs/storage/tests/test_latemarks.py): every ``mark`` adds
one to the hour's ``marks``; ``clear`` deletes the marker only while it still holds the count
the clearer read (else False, and the marker stays); ``late_hours`` lists the live markers,
oldest hour first.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any, Protocol

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_storage.readmodel import ReadModel, live


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


class TableLateMarks:
    """:class:`LateMarks` in DynamoDB."""

    def __init__(self, readmodel: ReadModel) -> None:
        self._readmodel = readmodel

    async def mark(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        await self._readmodel.mark_late(factory_id, hour, now=now, ttl=ttl)

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        return await self._readmodel.late_hours(now=now)

    async def clear(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        return await self._readmodel.clear_late(factory_id, hour, marks=marks)


class MemoryLateMarks:
    """:class:`LateMarks` in a dict, items as a DynamoDB read returns them."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    async def mark(self, factory_id: str, hour: datetime, *, now: datetime, ttl: int) -> None:
        pk, sk = keys.factory_pk(factory_id), keys.late_hour_sk(hour)
        marks = int(self.items.get((pk, sk), {}).get("marks", 0)) + 1
        self.items[(pk, sk)] = {
            "pk": pk,
            "sk": sk,
            "factory_id": factory_id,
            "hour_start": format_ts(hour),
            "marked_at": format_ts(now),
            "ttl": ttl,
            "marks": marks,
        }

    async def late_hours(self, *, now: datetime) -> list[dict[str, Any]]:
        found = [copy.deepcopy(i) for i in self.items.values() if live(i, now)]
        return sorted(found, key=lambda i: (str(i["hour_start"]), str(i["pk"])))

    async def clear(self, factory_id: str, hour: datetime, *, marks: int) -> bool:
        key = (keys.factory_pk(factory_id), keys.late_hour_sk(hour))
        found = self.items.get(key)
        if found is None or found["marks"] != marks:
            return False
        del self.items[key]
        return True
