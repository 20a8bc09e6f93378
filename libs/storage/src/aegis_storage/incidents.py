"""Incidents in the read model and their closed records in S3.

An incident item (``INCIDENT#{id}`` / ``INCIDENT``) is changed only by a conditional put on the
version read (:meth:`IncidentStore.change` reads, applies a pure transition of
:mod:`aegis_contracts.incidents` and writes, again on a conflict), so the dispatcher, the
dashboard and the CLI acting on one incident at once never overwrite each other. The open
incidents, and resolved ones whose record is not yet in S3, are listed through the fleet index.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pydantic

from aegis_contracts import incidents, keys
from aegis_contracts.items import Incident
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.items import Items, live
from aegis_storage.objects import Objects
from aegis_storage.s3 import to_json_bytes

log = logging.getLogger(__name__)

# a read-modify-write that keeps losing to other writers gives up after this many tries
CHANGE_ATTEMPTS = 20
# a resolved incident stays in the read model this long after its record is in S3
DEFAULT_KEPT = timedelta(days=30)

Transition = Callable[[Incident], Incident | None]


class IncidentStore:
    def __init__(
        self,
        readmodel: Items,
        store: Objects | None = None,
        *,
        kept: timedelta = DEFAULT_KEPT,
    ) -> None:
        self.readmodel = readmodel
        self.store = store
        self.kept = kept

    @staticmethod
    def parse(item: dict[str, Any]) -> Incident | None:
        try:
            return Incident.model_validate(item)
        except pydantic.ValidationError as err:
            log.warning("incident_item_unreadable %s: %s", item.get("pk"), err)
            return None

    async def get(self, incident_id: str) -> Incident | None:
        item = await self.readmodel.get_item(keys.incident_pk(incident_id), keys.INCIDENT_SK)
        return None if item is None else self.parse(item)

    async def listed(
        self, *, now: datetime, members: Sequence[tuple[str, str]] | None = None
    ) -> list[Incident]:
        """Every incident in the index: the open ones and the resolved ones not yet archived,
        oldest first (``members``: the index entries, when the caller read them already)."""
        if members is None:
            members = await self.readmodel.index_members(keys.FLEET_INCIDENT)
        found = await self.readmodel.batch_get(
            [(pk, sk) for pk, sk in members if pk.startswith(keys.INCIDENT_PK_PREFIX)]
        )
        parsed = [self.parse(i) for i in found if live(i, now)]
        return sorted(
            (i for i in parsed if i is not None and i.archived_key is None),
            key=lambda i: (i.triggered_at, i.incident_id),
        )

    async def open(self, *, now: datetime) -> list[Incident]:
        return [i for i in await self.listed(now=now) if i.state != "resolved"]

    async def save(self, new: Incident, old: Incident | None) -> None:
        """Write ``new`` only if the stored item is still ``old`` (absent when None);
        :class:`Conflict` otherwise."""
        if old is None:
            await self.readmodel.put_item(new, if_absent=True)
        else:
            await self.readmodel.put_item(new, expected={"version": old.version})

    async def change(self, incident_id: str, transition: Transition) -> tuple[Incident, bool]:
        """Apply ``transition`` to the stored incident until it is written on the version it
        read: (the incident as stored now, whether this call changed it). :class:`NotFound` when
        there is no such incident; the transition's :class:`ContractError` as it is."""
        for _ in range(CHANGE_ATTEMPTS):
            current = await self.get(incident_id)
            if current is None:
                raise NotFound(f"no incident {incident_id}")
            new = transition(current)
            if new is None:
                return current, False
            try:
                await self.save(new, current)
            except Conflict:
                continue
            return new, True
        raise Conflict(f"incident {incident_id} kept changing under {CHANGE_ATTEMPTS} attempts")

    async def archive(self, incident_id: str, *, now: datetime) -> Incident:
        """Write the resolved incident's record to S3 once (if-none-match), then mark the item
        archived so it leaves the index and expires :attr:`kept` later. A record already there
        stands: the same bytes are a duplicate; other bytes (the incident changed after a first
        archiving was cut short) are logged and the record is not overwritten."""
        if self.store is None:
            raise RuntimeError("archiving incidents needs the bucket")
        current = await self.get(incident_id)
        if current is None:
            raise NotFound(f"no incident {incident_id}")
        if current.archived_key is not None:
            return current
        key = incidents.record_key(current)
        try:
            await self.store.put_immutable(key, to_json_bytes(incidents.record(current)))
        except Conflict as err:
            log.warning("incident_record_kept %s %s: %s", incident_id, key, err)
        ttl = int((now + self.kept).timestamp())

        def mark(item: Incident) -> Incident | None:
            if item.archived_key is not None:
                return None
            return incidents.archived(item, key=key, at=now, ttl=ttl)

        stored, _ = await self.change(incident_id, mark)
        return stored

    async def read_record(self, key: str) -> dict[str, Any]:
        if self.store is None:
            raise RuntimeError("reading incident records needs the bucket")
        body = await self.store.get_json(key)
        if not isinstance(body, dict):
            raise NotFound(f"{key} is not an incident record")
        return body

    async def records_of_day(self, scope: str, day: Any) -> list[dict[str, Any]]:
        """The closed incidents of one scope whose UTC trigger day is ``day``."""
        if self.store is None:
            raise RuntimeError("reading incident records needs the bucket")
        prefix = keys.incident_day_prefix(scope, day)
        return [await self.read_record(k) for k in await self.store.list_keys(prefix)]
