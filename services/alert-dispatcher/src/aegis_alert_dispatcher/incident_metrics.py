"""Incidents on /metrics: how many are open now, and how fast they were answered.

``aegis_incidents_open{severity,state}`` counts the open incidents (``triggered`` or
``acknowledged``) from :meth:`IncidentStore.open`, read by a background task at most every
``refresh_s`` seconds and kept between reads: a scrape never reads DynamoDB.
``aegis_incidents_open_age_seconds`` says how old that count is (NaN before the first read);
every replica reports the same count, so a dashboard takes ``max`` over replicas, not ``sum``.

``aegis_incident_time_to_acknowledge_seconds{severity}`` and
``aegis_incident_time_to_resolve_seconds{severity}`` are observed once per incident in the
whole deployment, when it is closed: by the replica whose write marked its record archived (a
conditional write on the incident's version, which exactly one writer wins, whether the
dispatcher archives it after its RESOLVED message or the sweep does). So ``sum`` over replicas
counts each incident once, and a restarted process observes nothing twice. The time to
acknowledge of an incident is therefore observed when it is closed, not when it is
acknowledged; one resolved without being acknowledged has no time to acknowledge (it is left
out, as in the daily report's MTTA). Acknowledged incidents still open are in
``aegis_incidents_open{state="acknowledged"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta

import structlog

from aegis_contracts import incidents
from aegis_contracts.items import Incident
from aegis_contracts.times import Clock
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsClients
from aegis_storage.errors import StorageError
from aegis_storage.incidents import DEFAULT_KEPT, IncidentStore, Transition
from aegis_storage.items import ChangeSink
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

SEVERITIES = ("WARNING", "CRITICAL")
OPEN_STATES = ("triggered", "acknowledged")
# from a quick answer to a day-long incident
RESPONSE_BUCKETS = (
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    900.0,
    1800.0,
    3600.0,
    7200.0,
    14_400.0,
    43_200.0,
    86_400.0,
)


class ObservedIncidentStore(IncidentStore):
    """An :class:`IncidentStore` that tells ``on_archived`` of every incident whose archiving
    this store wrote (not those another replica archived first)."""

    def __init__(
        self,
        readmodel: ReadModel,
        store: ObjectStore | None,
        *,
        on_archived: Callable[[Incident], None],
        kept: timedelta = DEFAULT_KEPT,
    ) -> None:
        super().__init__(readmodel, store, kept=kept)
        self.on_archived = on_archived

    async def change(self, incident_id: str, transition: Transition) -> tuple[Incident, bool]:
        archiving: list[Incident] = []

        def watched(item: Incident) -> Incident | None:
            new = transition(item)
            if new is not None and item.archived_key is None and new.archived_key is not None:
                archiving.append(new)
            return new

        stored, changed = await super().change(incident_id, watched)
        if changed and any(new is stored for new in archiving):
            self.on_archived(stored)
        return stored, changed


class IncidentMetrics:
    def __init__(self, metrics: Metrics, *, clock: Clock, refresh_s: float = 30.0) -> None:
        self.metrics = metrics
        self.clock = clock
        self.refresh_s = refresh_s
        self.store: IncidentStore | None = None
        self.read_at: datetime | None = None
        self.open = metrics.gauge(
            "incidents_open",
            "Open incidents by severity and state (triggered, acknowledged), as of the last "
            "read of the read model (aegis_incidents_open_age_seconds).",
            ("severity", "state"),
        )
        self.age = metrics.gauge(
            "incidents_open_age_seconds",
            "Seconds since aegis_incidents_open was read from the read model (NaN: not yet).",
        )
        self.age.set_function(self._age)
        self.to_acknowledge = metrics.histogram(
            "incident_time_to_acknowledge_seconds",
            "Seconds from trigger to acknowledgement of closed incidents, observed once per "
            "incident when its record is archived (unacknowledged ones are left out).",
            ("severity",),
            buckets=RESPONSE_BUCKETS,
        )
        self.to_resolve = metrics.histogram(
            "incident_time_to_resolve_seconds",
            "Seconds from trigger to resolution of closed incidents, observed once per incident "
            "when its record is archived.",
            ("severity",),
            buckets=RESPONSE_BUCKETS,
        )
        for severity in SEVERITIES:
            self.to_acknowledge.labels(severity=severity)
            self.to_resolve.labels(severity=severity)
        self.count([])

    def _age(self) -> float:
        if self.read_at is None:
            return math.nan
        return (self.clock() - self.read_at).total_seconds()

    def watch(
        self, clients: AwsClients, *, table: str, bucket: str, changes: ChangeSink | None
    ) -> IncidentStore:
        """The dispatcher's incident store: archiving through it is observed here, and the open
        count is read from it."""
        self.store = ObservedIncidentStore(
            ReadModel(clients.items, table, changes=changes),
            ObjectStore(clients, bucket),
            on_archived=self.closed,
        )
        return self.store

    def closed(self, incident: Incident) -> None:
        """An incident this process archived: its times to acknowledge and to resolve."""
        acknowledge = incidents.seconds_between(incident.triggered_at, incident.acknowledged_at)
        resolve = incidents.seconds_between(incident.triggered_at, incident.resolved_at)
        if acknowledge is not None:
            self.to_acknowledge.labels(severity=incident.severity).observe(acknowledge)
        if resolve is not None:
            self.to_resolve.labels(severity=incident.severity).observe(resolve)

    def count(self, open_incidents: list[Incident]) -> None:
        """Set the open gauge from the open incidents (every label pair, zeros included)."""
        counts: Counter[tuple[str, str]] = Counter((i.severity, i.state) for i in open_incidents)
        for severity in SEVERITIES:
            for state in OPEN_STATES:
                self.open.labels(severity=severity, state=state).set(counts[(severity, state)])

    async def refresh(self) -> bool:
        """Read the open incidents if the last read is ``refresh_s`` old; whether it read."""
        now = self.clock()
        if self.store is None:
            return False
        if self.read_at is not None and (now - self.read_at).total_seconds() < self.refresh_s:
            return False
        self.count(await self.store.open(now=now))
        self.read_at = now
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``refresh_s`` until ``stop``; a failed read keeps the last count (its
        age grows) and is tried again at the next."""
        while not stop.is_set():
            try:
                await self.refresh()
            except StorageError as err:
                log.warning("incident_metrics_read_failed", error=str(err))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.refresh_s)
