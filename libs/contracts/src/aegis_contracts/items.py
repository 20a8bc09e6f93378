"""DynamoDB item families of the read model, one model each.

Items are dumped with ``model_dump(mode="json")``: datetimes become fixed-width UTC strings, so a
condition such as "only if newer" compares strings and sort keys sort by time. ``ttl`` is epoch
seconds; DynamoDB deletes expired items late, so every reader filters ``ttl > now`` as well.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aegis_contracts.cloud import CloudSnapshot, CloudTier
from aegis_contracts.graph import WindowStats
from aegis_contracts.keys import CLOUD_PK, LATEST_SK
from aegis_contracts.state import (
    FactoryState,
    ImageSnapshotRef,
    InfraState,
    Level,
    PipelineStatus,
    Risk,
)
from aegis_contracts.times import Timestamp


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pk: str
    sk: str


class FactoryLatest(_Item):
    """``FACTORY#{f}`` / ``LATEST``: the current state, updated partially per field group."""

    sk: str = LATEST_SK
    factory_id: str
    factory_state: FactoryState | None = None
    infra_state: InfraState | None = None
    risk: Risk | None = None
    pipeline_status: PipelineStatus | None = None
    latest_image_snapshot: ImageSnapshotRef | None = None
    last_factory_state_at: Timestamp | None = None
    last_infra_state_at: Timestamp | None = None
    last_image_snapshot_at: Timestamp | None = None
    updated_at: Timestamp | None = None
    # the updated_at of the state this one replaced: HISTORY items form a chain, which is how a
    # writer that crashed mid-way finds out whether its snapshot was committed
    prev_updated_at: Timestamp | None = None


class HistoryState(FactoryLatest):
    """``FACTORY#{f}`` / ``HISTORY#STATE#{updated_at}``: a LATEST snapshot plus ``ttl``."""

    ttl: int


class Graph5m(_Item):
    """``FACTORY#{f}`` / ``GRAPH#5M#{bucket_start}``: one 5-minute window's statistics."""

    factory_id: str
    bucket_start: Timestamp
    bucket_end: Timestamp
    stats: WindowStats
    ttl: int


class CloudLatest(_Item):
    """``CLOUD#infra`` / ``LATEST``: each collector owns its own fields."""

    pk: str = CLOUD_PK
    sk: str = LATEST_SK
    fast: CloudSnapshot | None = None
    fast_updated_at: Timestamp | None = None
    slow: CloudSnapshot | None = None
    slow_updated_at: Timestamp | None = None
    overall_status: Level = Level.NORMAL


class CloudHistory(_Item):
    """``CLOUD#infra`` / ``HISTORY#FAST#…`` or ``HISTORY#SLOW#…``."""

    pk: str = CLOUD_PK
    tier: CloudTier
    updated_at: Timestamp
    snapshot: CloudSnapshot
    status: Level
    ttl: int


class AlertState(_Item):
    """``ALERT#{scope}`` / ``{severity}#{reason}#{status}``: cooldown and dedupe state.

    ``status`` is the alert stream the reason comes from: ``STATE`` (a factory's state snapshots),
    ``FAST`` or ``SLOW`` (the cloud collectors). ``version`` grows with every change; a replica
    changes the item only if the version is still the one it read, which is how N replicas send
    one message, not two. ``pending``: the sk of the :class:`AlertIntent` that is sending this
    alert's message (None once Slack confirmed it or it was dead-lettered); ``last_sent_at`` and
    ``sent_count`` count confirmed sends only."""

    scope: str
    severity: Literal["WARNING", "CRITICAL"]
    reason: str
    status: str
    firing: bool
    version: int = Field(default=0, ge=0)
    fired_at: Timestamp | None = None
    last_sent_at: Timestamp | None = None
    last_snapshot_at: Timestamp | None = None
    resolved_at: Timestamp | None = None
    sent_count: int = 0
    pending: str | None = None
    # the incident this alert speaks for (one per scope, stream and reason while it fires)
    incident_id: str | None = None
    ttl: int


class IntentAlert(BaseModel):
    """One alert an :class:`AlertIntent` speaks for: its item, the version the claim wrote, what
    the message says of it, and the item as it was before the claim (None: it did not exist), so
    whoever settles the intent can confirm or undo it without the snapshot."""

    model_config = ConfigDict(extra="forbid")

    sk: str
    action: Literal["fire", "escalate", "resolve"]
    claimed_version: int
    before: dict[str, Any] | None = None
    incident_id: str | None = None


class AlertIntent(_Item):
    """``ALERT#{scope}`` / ``INTENT#{status}#{snapshot_at}``: a decided Slack message, recorded
    before it is posted. ``state`` goes ``sending`` -> ``sent`` (Slack confirmed it) or
    ``undeliverable`` (dead-lettered). ``attempt_id`` is stable for the decision (every replica and
    redelivery computes the same); ``owner`` is who is posting it, until ``lease_until``: after that
    (or on a redelivery of the owner's own message) another handler completes it. ``version``
    grows with every change (takeover, settle)."""

    scope: str
    status: str
    snapshot_at: Timestamp
    attempt_id: str
    state: Literal["sending", "sent", "undeliverable"]
    owner: str
    lease_until: Timestamp
    version: int = Field(default=1, ge=1)
    alerts: list[IntentAlert]
    # the Slack webhook body, as JSON text (kept byte for byte: a completion posts the same)
    payload: str
    posts: int = Field(default=0, ge=0)
    settled_at: Timestamp | None = None
    ttl: int


IncidentStateName = Literal["triggered", "acknowledged", "resolved"]


class IncidentEvent(BaseModel):
    """One line of an incident's timeline: what happened, when, who did it and through what.

    ``kind``: ``triggered``, ``severity_raised``, ``notified`` (a receiver was sent a message:
    ``receiver`` and ``outcome`` say which and how it went), ``escalated``, ``acknowledged``,
    ``resolved``, ``silenced``, ``unsilenced``, ``archived``, ``note``. ``by`` is a person
    (Slack user, dashboard identity, CLI user) or ``aegis``; ``via`` is where it came from
    (``slack``, ``dashboard``, ``cli``, ``data``)."""

    model_config = ConfigDict(extra="forbid")

    at: Timestamp
    kind: str
    by: str = "aegis"
    via: str = "data"
    receiver: str | None = None
    outcome: str | None = None
    level: int | None = None
    detail: str = ""


class IncidentOutbox(BaseModel):
    """A notification of an incident that a dispatcher replica claimed and is sending: to whom,
    for which level, by whom until when. A replica that finds it past ``lease_until`` (its owner
    died) takes it over and sends it; the one that sends it clears it with the outcomes."""

    model_config = ConfigDict(extra="forbid")

    attempt_id: str
    kind: Literal["escalate", "renotify", "failover", "unsilenced", "acknowledge"]
    level: int = Field(ge=0)
    receivers: list[str]
    owner: str
    lease_until: Timestamp


class Incident(_Item):
    """``INCIDENT#{incident_id}`` / ``INCIDENT``: one firing alert of a scope (a factory or
    ``cloud-infra``) and reason, from the first message until it is resolved: triggered,
    acknowledged (by whom, when, from where), escalated (``level``), resolved (by the data, or by
    a person with a note), and the timeline of everything that happened to it. ``version`` grows
    with every change; every writer changes it only if the version is still the one it read.
    Open, it has no ``ttl``; once resolved its record is written to S3
    (``archived_key``) and the item expires ``ttl`` later."""

    incident_id: str
    scope: str
    stream: str
    reason: str
    severity: Literal["WARNING", "CRITICAL"]
    state: IncidentStateName = "triggered"
    version: int = Field(default=1, ge=1)
    triggered_at: Timestamp
    acknowledged_at: Timestamp | None = None
    acknowledged_by: str | None = None
    acknowledged_via: str | None = None
    resolved_at: Timestamp | None = None
    resolved_by: str | None = None
    resolved_via: str | None = None
    resolution_note: str | None = None
    level: int = Field(default=0, ge=0)
    escalated_at: Timestamp | None = None
    last_notified_at: Timestamp | None = None
    notifications: int = Field(default=0, ge=0)
    detail: str = ""
    timeline: list[IncidentEvent] = Field(default_factory=list)
    outbox: IncidentOutbox | None = None
    # a silence held back a notification of it since then (None: nothing held back)
    silenced_since: Timestamp | None = None
    # the receivers reached were told of the acknowledgement (the policy's ack_notify)
    ack_notified_at: Timestamp | None = None
    archived_key: str | None = None
    ttl: int | None = None


class AlertObservation(_Item):
    """``ALERT#{scope}`` / ``OBSERVATION#…``: consecutive observations of a cloud warning."""

    scope: str
    count: int = Field(ge=0)
    first_observed_at: Timestamp
    last_observed_at: Timestamp
    ttl: int


class AlertCursor(_Item):
    """``ALERT#{scope}`` / ``CURSOR#{status}``: the newest snapshot handled for that stream."""

    scope: str
    status: str
    last_snapshot_at: Timestamp
    ttl: int


class WindowClaim(_Item):
    """``CLAIM#{job}`` / ``{window_start}``: the replica that runs one window of periodic work."""

    job: str
    window_start: Timestamp
    owner: str
    claimed_at: Timestamp
    ttl: int
