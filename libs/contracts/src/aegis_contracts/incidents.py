"""The incident lifecycle (pure): ids, the transitions every writer applies, the closed record.

An incident is one firing alert of a scope (a factory id or ``cloud-infra``), alert stream and
reason, from its first message until it is resolved. States: ``triggered`` -> ``acknowledged``
(a person is on it) -> ``resolved`` (the data no longer reports it, or a person closed it with a
note). Every transition returns a new item with ``version`` + 1 and one more timeline line; the
writer stores it only if the stored version is still the one it read, so the dispatcher, the
dashboard and the CLI can act on one incident at the same time and none overwrites another.

Acknowledging twice is not an error (the first one stands and the second changes nothing); a
resolved incident can no longer be acknowledged (``incident_resolved``).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.items import Incident, IncidentEvent
from aegis_contracts.times import ensure_utc, format_ts

Severity = Literal["WARNING", "CRITICAL"]
# who acts when no person does
AEGIS = "aegis"
# where a person may act from
VIAS = ("slack", "dashboard", "cli", "api")
MAX_NOTE = 2000
MAX_ACTOR = 200
MAX_TIMELINE = 500


def new_incident_id(scope: str, stream: str, reason: str, triggered_at: datetime) -> str:
    """``{yyyymmdd}-{8 hex}``: the same on every replica for the same first message."""
    at = ensure_utc(triggered_at)
    digest = hashlib.sha256(f"{scope}|{stream}|{reason}|{format_ts(at)}".encode()).hexdigest()
    return keys.incident_id(f"{at:%Y%m%d}-{digest[:8]}")


def open_incident(
    *, scope: str, stream: str, reason: str, severity: Severity, at: datetime, detail: str = ""
) -> Incident:
    incident = new_incident_id(scope, stream, reason, at)
    return Incident(
        pk=keys.incident_pk(incident),
        sk=keys.INCIDENT_SK,
        incident_id=incident,
        scope=keys.alert_scope(scope),
        stream=stream,
        reason=reason,
        severity=severity,
        triggered_at=at,
        detail=detail[:MAX_NOTE],
        timeline=[IncidentEvent(at=at, kind="triggered", detail=f"{severity} {reason}")],
    )


def _next(incident: Incident, event: IncidentEvent, **changes: Any) -> Incident:
    timeline = [*incident.timeline, event]
    if len(timeline) > MAX_TIMELINE:  # a flapping receiver must not grow the item past 400 KB
        dropped = len(timeline) - MAX_TIMELINE + 1
        note = IncidentEvent(at=event.at, kind="note", detail=f"{dropped} older lines dropped")
        timeline = [timeline[0], note, *timeline[dropped + 1 :]]
    return incident.model_copy(
        update={"version": incident.version + 1, "timeline": timeline, **changes}
    )


def _actor(by: str) -> str:
    by = by.strip()
    if not by:
        raise ContractError("invalid_actor", "who acts must be named")
    return by[:MAX_ACTOR]


def _via(via: str) -> str:
    if via not in VIAS:
        raise ContractError("invalid_via", f"{via!r:.40} is not one of {', '.join(VIAS)}")
    return via


def raise_severity(incident: Incident, severity: Severity, at: datetime) -> Incident:
    """A WARNING incident whose reason became CRITICAL (no change for the same or lower)."""
    if incident.severity == "CRITICAL" or severity == "WARNING":
        return incident
    event = IncidentEvent(at=at, kind="severity_raised", detail="WARNING -> CRITICAL")
    return _next(incident, event, severity=severity)


def acknowledge(
    incident: Incident, *, by: str, via: str, at: datetime, note: str | None = None
) -> Incident | None:
    """A person is on it. None: it was acknowledged already (the first acknowledgement stands)."""
    if incident.state == "resolved":
        raise ContractError(
            "incident_resolved",
            f"incident {incident.incident_id} was resolved at {format_ts(incident.resolved_at)}"
            if incident.resolved_at
            else f"incident {incident.incident_id} is resolved",
        )
    if incident.state == "acknowledged":
        return None
    who = _actor(by)
    event = IncidentEvent(
        at=at, kind="acknowledged", by=who, via=_via(via), detail=(note or "")[:MAX_NOTE]
    )
    return _next(
        incident,
        event,
        state="acknowledged",
        acknowledged_at=at,
        acknowledged_by=who,
        acknowledged_via=via,
    )


def resolve(
    incident: Incident,
    *,
    at: datetime,
    by: str = AEGIS,
    via: str = "data",
    note: str | None = None,
) -> Incident | None:
    """Closed: by the data (``by`` aegis, ``via`` data) or by a person with a note. None: it was
    resolved already."""
    if incident.state == "resolved":
        return None
    person = via != "data"
    if person and not (note or "").strip():
        raise ContractError("note_required", "a person resolving an incident says why (a note)")
    who = _actor(by) if person else AEGIS
    detail = (note or "no longer reported").strip()[:MAX_NOTE]
    event = IncidentEvent(
        at=at, kind="resolved", by=who, via=_via(via) if person else "data", detail=detail
    )
    return _next(
        incident,
        event,
        state="resolved",
        resolved_at=at,
        resolved_by=who,
        resolved_via=event.via,
        resolution_note=detail if person else None,
    )


def notified(
    incident: Incident,
    *,
    at: datetime,
    receiver: str,
    outcome: str,
    kind: str = "notified",
    detail: str = "",
) -> Incident:
    """A receiver was sent a message of this incident (``outcome``: sent, undeliverable,
    logged_only, ...). Only a delivered message counts as a notification."""
    event = IncidentEvent(
        at=at,
        kind=kind,
        receiver=receiver,
        outcome=outcome,
        level=incident.level,
        detail=detail[:MAX_NOTE],
    )
    delivered = outcome in ("sent", "logged_only")
    return _next(
        incident,
        event,
        last_notified_at=at if delivered else incident.last_notified_at,
        notifications=incident.notifications + int(delivered),
        silenced_since=None if delivered else incident.silenced_since,
    )


def silenced(incident: Incident, *, at: datetime, by: list[str]) -> Incident:
    """A silence held back a notification of it (the first time since it was last notified)."""
    if incident.silenced_since is not None:
        return incident
    event = IncidentEvent(at=at, kind="silenced", detail=f"held back by {', '.join(by)}")
    return _next(incident, event, silenced_since=at)


def escalated(incident: Incident, *, level: int, at: datetime, detail: str = "") -> Incident:
    """Unacknowledged for long enough: the policy's next ``level`` is notified."""
    event = IncidentEvent(at=at, kind="escalated", level=level, detail=detail[:MAX_NOTE])
    return _next(incident, event, level=level, escalated_at=at)


def archived(incident: Incident, *, key: str, at: datetime, ttl: int) -> Incident:
    """Its record is in S3 at ``key``: the item leaves the open-incident index and expires."""
    return incident.model_copy(
        update={"version": incident.version + 1, "archived_key": key, "ttl": ttl}
    )


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 3)


def record(incident: Incident) -> dict[str, Any]:
    """The closed incident's S3 record: everything that happened, who was told and who
    answered, with the time to acknowledge and to resolve in seconds."""
    if incident.state != "resolved":
        raise ContractError(
            "incident_open", f"incident {incident.incident_id} is {incident.state}, not resolved"
        )
    body = incident.model_dump(
        mode="json", exclude={"pk", "sk", "version", "ttl", "archived_key", "outbox"}
    )
    body["time_to_acknowledge_s"] = seconds_between(incident.triggered_at, incident.acknowledged_at)
    body["time_to_resolve_s"] = seconds_between(incident.triggered_at, incident.resolved_at)
    body["record_key"] = record_key(incident)
    return body


def record_key(incident: Incident) -> str:
    return keys.incident_record_key(incident.scope, incident.triggered_at, incident.incident_id)


def labels(incident: Incident) -> dict[str, str]:
    """What a silence matches an incident on."""
    return {
        "factory": incident.scope,
        "reason": incident.reason,
        "severity": incident.severity,
        "source": incident.stream,
    }
