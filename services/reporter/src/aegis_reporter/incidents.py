"""The alert incidents of a report: what was paged that day, who answered it and how fast.

An alert incident (:mod:`aegis_contracts.incidents`) belongs to the KST day it was triggered on.
Its closed record is in S3 under the UTC day it was triggered on, so a KST day reads the records
of the two UTC days it overlaps and keeps those triggered inside it. An incident not yet closed
at report time comes from the read model (:meth:`IncidentStore.listed`: the open ones, and the
resolved ones whose record is not written yet) and is marked open.

MTTA is the mean time from trigger to acknowledgement over the day's incidents that were
acknowledged by report time; one never acknowledged (resolved by the data before anyone did, or
still open) is listed as unacknowledged and left out of it. MTTR is the mean time from trigger
to resolution over the day's resolved incidents; open ones are left out. Both in seconds,
``None`` when no incident counts.

Everything but the reading is pure, and a row holds no figure that depends on when the report
ran (an open incident has no age), so the same records give the same bytes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, timedelta
from typing import Any

import pydantic
import structlog

from aegis_contracts import incidents, keys
from aegis_contracts.items import Incident
from aegis_reporter.day import DayWindow, window_fields
from aegis_reporter.summary import (
    AlertCounts,
    AlertFigures,
    AlertIncidentRow,
    AlertSection,
    CloudSummary,
    FactorySummary,
    FleetIncidents,
    TargetAlertFigures,
)
from aegis_storage.incidents import IncidentStore

log = structlog.get_logger(__name__)

# the fields a record adds to the incident it was made from
RECORD_ONLY = ("time_to_acknowledge_s", "time_to_resolve_s", "record_key")
DELIVERED = ("sent", "logged_only")
MEAN_METHOD = (
    "MTTA: mean seconds from trigger to acknowledgement over the day's incidents acknowledged "
    "by report time (an incident never acknowledged is listed as unacknowledged and left out); "
    "MTTR: mean seconds from trigger to resolution over the day's resolved incidents (open ones "
    "are left out)"
)


def utc_days(window: DayWindow) -> list[date]:
    """The UTC days the KST day overlaps (two): where its incidents' records are."""
    first, last = window.start.date(), (window.end - timedelta(microseconds=1)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def from_record(body: Mapping[str, Any]) -> Incident | None:
    """The incident a closed record was made from (None: the record does not parse)."""
    fields = {k: v for k, v in body.items() if k not in RECORD_ONLY}
    try:
        fields["pk"] = keys.incident_pk(str(fields.get("incident_id")))
        return Incident.model_validate({**fields, "sk": keys.INCIDENT_SK})
    except (pydantic.ValidationError, ValueError) as err:
        log.warning("incident_record_unreadable", key=body.get("record_key"), error=str(err))
        return None


def in_window(incident: Incident, window: DayWindow) -> bool:
    return window.start <= incident.triggered_at < window.end


async def day_incidents(
    store: IncidentStore, target: str, window: DayWindow, live: Iterable[Incident]
) -> tuple[list[Incident], int]:
    """The incidents of ``target`` triggered in the KST day: the closed records, then those of
    ``live`` (the read model's) that have no record yet; and how many records did not parse."""
    found: dict[str, Incident] = {}
    unreadable = 0
    for day in utc_days(window):
        for body in await store.records_of_day(target, day):
            incident = from_record(body)
            if incident is None:
                unreadable += 1
            elif in_window(incident, window):
                found[incident.incident_id] = incident
    for incident in live:
        if incident.scope == target and in_window(incident, window):
            found.setdefault(incident.incident_id, incident)
    ordered = sorted(found.values(), key=lambda i: (i.triggered_at, i.incident_id))
    return ordered, unreadable


def row(incident: Incident) -> AlertIncidentRow:
    """One incident of the report: when, why, who answered through what, how fast, and who was
    told (delivered notifications per receiver; failed attempts counted apart)."""
    delivered: Counter[str] = Counter()
    failed = 0
    for event in incident.timeline:
        if event.kind != "notified" or event.receiver is None:
            continue
        if event.outcome in DELIVERED:
            delivered[event.receiver] += 1
        else:
            failed += 1
    return AlertIncidentRow(
        incident_id=incident.incident_id,
        stream=incident.stream,
        reason=incident.reason,
        severity=incident.severity,
        state=incident.state,
        open=incident.state != "resolved",
        triggered=incident.triggered_at,
        acknowledged=incident.acknowledged_at is not None,
        acknowledged_at=incident.acknowledged_at,
        acknowledged_by=incident.acknowledged_by,
        acknowledged_via=incident.acknowledged_via,
        time_to_acknowledge_s=incidents.seconds_between(
            incident.triggered_at, incident.acknowledged_at
        ),
        resolved=incident.resolved_at,
        resolved_by=incident.resolved_by,
        resolved_via=incident.resolved_via,
        resolution_note=incident.resolution_note,
        time_to_resolve_s=incidents.seconds_between(incident.triggered_at, incident.resolved_at),
        escalation_level=incident.level,
        notifications=incident.notifications,
        receivers=dict(sorted(delivered.items())),
        failed_notifications=failed,
    )


def _mean(values: Sequence[float]) -> float | None:
    return round(math.fsum(values) / len(values), 3) if values else None


def figures(rows: Sequence[AlertIncidentRow]) -> AlertFigures:
    """Counts, MTTA and MTTR of incident rows (of one target, or of the whole fleet)."""
    acked = [r.time_to_acknowledge_s for r in rows if r.time_to_acknowledge_s is not None]
    resolved = [r.time_to_resolve_s for r in rows if r.time_to_resolve_s is not None]
    return AlertFigures(
        counts=AlertCounts(
            total=len(rows),
            critical=sum(1 for r in rows if r.severity == "CRITICAL"),
            warning=sum(1 for r in rows if r.severity == "WARNING"),
            open=sum(1 for r in rows if r.open),
            resolved=len(resolved),
            acknowledged=len(acked),
            unacknowledged=len(rows) - len(acked),
            escalated=sum(1 for r in rows if r.escalation_level > 0),
            resolved_by_data=sum(1 for r in rows if r.resolved_via == "data"),
            resolved_by_person=sum(1 for r in rows if r.resolved_via not in (None, "data")),
        ),
        mtta_s=_mean(acked),
        mtta_over=len(acked),
        mttr_s=_mean(resolved),
        mttr_over=len(resolved),
    )


def section(found: Sequence[Incident], unreadable: int = 0) -> AlertSection:
    """``alert_incidents`` of a target's summary."""
    rows = [row(i) for i in found]
    return AlertSection(
        **dict(figures(rows)), items=rows, unreadable_records=unreadable, method=MEAN_METHOD
    )


def with_section(
    summary: FactorySummary | CloudSummary, alerts: AlertSection
) -> FactorySummary | CloudSummary:
    """The summary with its ``alert_incidents`` and the headline's figures of them."""
    headline = summary.headline.model_copy(
        update={
            "alert_incidents": alerts.counts.total,
            "open_alert_incidents": alerts.counts.open,
            "mtta_s": alerts.mtta_s,
            "mttr_s": alerts.mttr_s,
        }
    )
    return summary.model_copy(update={"headline": headline, "alert_incidents": alerts})


def _target_figures(rows: Sequence[AlertIncidentRow], unreadable: int) -> TargetAlertFigures:
    return TargetAlertFigures(**dict(figures(rows)), unreadable_records=unreadable)


def fleet_summary(window: DayWindow, sections: Mapping[str, AlertSection]) -> FleetIncidents:
    """``fleet-incidents-summary.json``: the day's alert incidents of every target, with the
    fleet's totals (MTTA and MTTR over all the fleet's incidents, not a mean of the targets')."""
    rows = [r for s in sections.values() for r in s.items]
    return FleetIncidents(
        kind="fleet-incidents",
        **window_fields(window),
        targets={
            t: _target_figures(s.items, s.unreadable_records) for t, s in sorted(sections.items())
        },
        totals=_target_figures(rows, sum(s.unreadable_records for s in sections.values())),
        method=MEAN_METHOD,
    )
