"""The cloud's state in the table, as the two collector tiers (``fast``, ``slow``) file their
runs: ``CLOUD#infra`` / ``HISTORY#{TIER}#{updated_at}`` (one item a run, with a ttl) and
``CLOUD#infra`` / ``LATEST`` (each tier's last run and the ``overall_status`` of both).

:class:`CloudLatest` is the protocol; its two implementations are the tables themselves,
DynamoDB's (:class:`~aegis_storage.readmodel.ReadModel`) and the in-memory one
(:class:`~aegis_storage.memorytable.MemoryTable`). Both subclass it and inherit the reads and
the filing of a run (:func:`apply_cloud`); they differ only in the one conditional write of a
tier's fields (:meth:`CloudLatest.set_cloud_tier`), which they refuse on the same conditions.
One contract runs against both (libs/storage/tests/test_cloudlatest.py):

- a run writes its tier's own fields (``{tier}``, ``{tier}_updated_at``) and never the other
  tier's;
- ``overall_status`` is the worse of this run's status and the other tier's, and the write is
  conditioned on the other tier's time being the one read, so two tiers writing at once never
  leave a stale ``overall_status``: the loser reads again;
- a tier never moves backwards: a run older than (or as old as) the one in LATEST leaves it
  alone (:func:`apply_cloud` returns None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from aegis_contracts import keys
from aegis_contracts.cloud import CloudSnapshot
from aegis_contracts.items import CloudHistory
from aegis_contracts.state import Level
from aegis_contracts.times import format_ts
from aegis_storage.encoding import to_plain
from aegis_storage.errors import Conflict
from aegis_storage.items import Items


@dataclass(frozen=True, slots=True)
class TierWrite:
    """One tier's run as :func:`apply_cloud` writes it into LATEST: ``body`` (the snapshot) at
    ``at``, with ``overall``, conditioned on the other tier's time still being ``other_at``
    (None: absent) and ``tier``'s own being absent or older than ``at``. ``read``: the LATEST
    the write was computed from (the old image of an announced change)."""

    tier: str
    body: Mapping[str, Any]
    at: str
    overall: Level
    other_at: str | None
    read: Mapping[str, Any]

    @property
    def own_name(self) -> str:
        return f"{self.tier}_updated_at"

    @property
    def other_name(self) -> str:
        return f"{other_tier(self.tier)}_updated_at"


class CloudLatest(Items, Protocol):
    """The cloud's LATEST and HISTORY on a table's keyed items: a table that subclasses it
    inherits the reads and the filing of a run, and makes :meth:`set_cloud_tier` its own way."""

    async def set_cloud_tier(self, write: TierWrite) -> None:
        """Make ``write`` while its conditions hold; else raise :class:`Conflict`, writing
        nothing."""
        ...

    async def get_cloud_latest(self) -> dict[str, Any] | None:
        """``CLOUD#infra`` / ``LATEST`` (a consistent read), None before the first run."""
        return await self.get_item(keys.CLOUD_PK, keys.LATEST_SK)

    async def cloud_history(
        self, tier: str, start: datetime, end: datetime, *, now: datetime
    ) -> list[dict[str, Any]]:
        """The tier's live HISTORY items with ``start <= updated_at < end``, oldest first."""
        prefix = keys.HISTORY_FAST_PREFIX if tier == "fast" else keys.HISTORY_SLOW_PREFIX
        return await self.query_range(keys.CLOUD_PK, prefix, start, end, now=now)

    async def apply_cloud(
        self, snapshot: CloudSnapshot, *, ttl: int, max_attempts: int = 20
    ) -> Level | None:
        """File one collector run (:func:`apply_cloud`)."""
        return await apply_cloud(self, snapshot, ttl=ttl, max_attempts=max_attempts)


def other_tier(tier: str) -> str:
    return "slow" if tier == "fast" else "fast"


async def apply_cloud(
    table: CloudLatest, snapshot: CloudSnapshot, *, ttl: int, max_attempts: int = 20
) -> Level | None:
    """File one collector run in ``table``: its HISTORY item (``ttl``), then its tier's fields
    of LATEST with the ``overall_status`` of both tiers, read again and written again while
    another writer gets there first (at most ``max_attempts`` times, then :class:`Conflict`).
    Returns the overall status written, or None when LATEST already holds this run or a newer
    one of the tier."""
    tier, other = snapshot.tier, other_tier(snapshot.tier)
    at = format_ts(snapshot.updated_at)
    history = CloudHistory(
        sk=keys.cloud_history_sk(tier, snapshot.updated_at),
        tier=tier,
        updated_at=snapshot.updated_at,
        snapshot=snapshot,
        status=snapshot.status,
        ttl=ttl,
    )
    await table.put_item(history)  # same run, same item: a re-run rewrites it identically
    body = to_plain(snapshot)
    for _ in range(max_attempts):
        current = await table.get_item(keys.CLOUD_PK, keys.LATEST_SK) or {}
        own_at = current.get(f"{tier}_updated_at")
        if own_at is not None and str(own_at) >= at:
            return None
        other_at = current.get(f"{other}_updated_at")
        other_snapshot = current.get(other) or {}
        overall = Level.worst(snapshot.status, Level(other_snapshot.get("status", "NORMAL")))
        try:
            await table.set_cloud_tier(
                TierWrite(
                    tier,
                    body,
                    at,
                    overall,
                    other_at=None if other_at is None else str(other_at),
                    read=current,
                )
            )
        except Conflict:
            continue  # the other tier (or a newer run of this one) wrote in between: read again
        return overall
    raise Conflict(f"CLOUD#infra LATEST kept changing: {tier} run {at} not applied")
