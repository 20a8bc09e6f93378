"""The audit record in S3: one object per event, written once, read a day at a time."""

from __future__ import annotations

from datetime import date

from aegis_contracts import keys
from aegis_contracts.audit import AuditEvent
from aegis_storage.s3 import ObjectStore
from aegis_storage.tasks import map_bounded

DAY_LIMIT = 1000  # the events of a day an admin page reads at most (the newest)
READS_AT_ONCE = 16


class AuditLog:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def record(self, event: AuditEvent) -> None:
        """Write ``event`` once (if-none-match: nothing overwrites a record)."""
        await self.store.put_immutable(event.key, event.model_dump_json().encode())

    async def day(self, day: date, *, limit: int = DAY_LIMIT) -> tuple[list[AuditEvent], int]:
        """The newest ``limit`` events of a UTC day, newest first, and how many the day has."""
        listed = [info.key async for info in self.store.list_objects(keys.audit_day_prefix(day))]
        chosen = listed[-limit:][::-1]
        bodies = await map_bounded(self.store.get_bytes, chosen, READS_AT_ONCE)
        return [AuditEvent.model_validate_json(b) for b in bodies], len(listed)
