"""Periodic work in the table: the windows a job runs (the aggregator's 5-minute graphs, the
reporter's days), claimed one replica a window (``CLAIM#{job}`` / ``{window_start}``, see
:class:`~aegis_storage.items.Leases`), the first window a job may ever run (``CLAIM#{job}`` /
``FIRST``), and the fleet such a job goes over.

:class:`PeriodicWork` is the protocol. Its reads and its claims of pending windows are made of
the table's keyed items and leases alone, so both tables subclass it and inherit them:
DynamoDB's (:class:`~aegis_storage.readmodel.ReadModel`) and the
in-memory one (:class:`~aegis_storage.memorytable.MemoryTable`). They run in the contract of the
items (libs/storage/tests/test_items.py)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from aegis_contracts import keys
from aegis_contracts.times import format_ts, parse_ts
from aegis_storage.errors import Conflict
from aegis_storage.items import Table


class PeriodicWork(Table, Protocol):
    """Periodic work on a table's keyed items and leases: a table that subclasses it inherits
    these."""

    async def fleet_ids(self) -> list[str]:
        """The id of every factory with a LATEST, sorted: the fleet index's entries alone, for
        callers that need no state (the aggregator, the reporter)."""
        members = await self.index_members(keys.FLEET_LATEST)
        return sorted(pk.removeprefix("FACTORY#") for pk, _ in members)

    async def first_window(self, job: str, window_start: datetime, *, now: datetime) -> datetime:
        """The oldest window ``job`` may ever run on this table (``CLAIM#{job}`` / ``FIRST``, no
        ttl). The first caller records ``window_start`` with a conditional put; every later caller,
        on any replica, gets that record back (``window_start`` is then ignored)."""
        pk, sk = keys.claim_pk(job), keys.CLAIM_FIRST_SK
        found = await self.get_item(pk, sk)
        if found is None:
            item = {
                "pk": pk,
                "sk": sk,
                "job": job,
                "window_start": format_ts(window_start),
                "recorded_at": format_ts(now),
            }
            try:
                await self.put_item(item, if_absent=True)
            except Conflict:  # another replica recorded it first: its record holds
                found = await self.get_item(pk, sk)
            else:
                return window_start
        if found is None:  # pragma: no cover - a record that vanished after a conflict
            raise Conflict(f"{pk}/{sk} disappeared after a conditional put failed on it")
        return parse_ts(str(found["window_start"]))

    async def window_claims(
        self, job: str, start: datetime, end: datetime, *, now: datetime
    ) -> dict[str, dict[str, Any]]:
        """The claims of ``job`` for windows in ``[start, end)``, by window start (as stored)."""
        items = await self.query_range(keys.claim_pk(job), "", start, end, now=now)
        return {str(item["window_start"]): item for item in items}

    async def claim_pending(
        self,
        job: str,
        window_start: datetime,
        *,
        claims: Mapping[str, Mapping[str, Any]],
        owner: str,
        now: datetime,
        ttl: int,
        lease: timedelta,
    ) -> bool:
        """Claim a window that :meth:`window_claims` (``claims``) does not show as done: the
        periodic jobs that look back over their windows and mark each one finished."""
        seen = claims.get(format_ts(window_start))
        if seen is not None and seen.get("done_at"):
            return False
        return await self.claim_window(
            job, window_start, owner=owner, now=now, ttl=ttl, lease=lease
        )
