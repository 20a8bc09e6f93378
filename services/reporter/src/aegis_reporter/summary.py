"""What a daily summary holds: the typed facts of ``factory-daily-summary.json`` and
``cloud-infra-daily-summary.json`` (what a generator reads under ``facts``).

A model holds its times as datetimes (:data:`Stamp`); written out, each becomes two fields,
``<name>_kst`` (the report's zone) and ``<name>_utc``, ``null`` both when there is no time. A
duration is in seconds. A field with a default is written only when it was given: an hour's
fold figures appear only for the hours that have a fold, ``p95`` only for series whose folds
carry sketches. :meth:`Facts.facts` is what the artifact and the report context are made of.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from aegis_contracts.state import Level
from aegis_contracts.times import KST, format_ts


@dataclass(frozen=True, slots=True)
class _Stamp:
    """The marker of a time written as a ``<name>_kst``/``<name>_utc`` pair (``name``: the
    field's own name unless given)."""

    name: str | None = None


Stamp = Annotated[datetime, _Stamp()]
MaybeStamp = Annotated[datetime | None, _Stamp()]  # null both when there is no time


def stamp_named(name: str) -> _Stamp:
    """The marker of a time written under another name than its field's (``acknowledged_at``
    as ``acknowledged_kst``/``_utc`` beside a field ``acknowledged``)."""
    return _Stamp(name)


def kst_text(at: datetime) -> str:
    """``2026-11-30T14:05:00.000+09:00``."""
    return at.astimezone(KST).isoformat(timespec="milliseconds")


class Facts(BaseModel):
    """A part of a summary. Times (:data:`Stamp`) are written as their KST and UTC texts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _stamps: ClassVar[tuple[tuple[str, str], ...] | None] = None

    @classmethod
    def _stamp_fields(cls) -> tuple[tuple[str, str], ...]:
        """(field, written name) of each time of the model."""
        if cls.__dict__.get("_stamps") is None:
            cls._stamps = tuple(
                (name, marker.name or name)
                for name, f in cls.model_fields.items()
                for marker in f.metadata
                if isinstance(marker, _Stamp)
            )
        return cls.__dict__["_stamps"]  # type: ignore[no-any-return]

    @model_serializer(mode="wrap")
    def _with_stamp_pairs(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for field, name in self._stamp_fields():
            if field in out:
                del out[field]
                at: datetime | None = getattr(self, field)
                out[f"{name}_kst"] = None if at is None else kst_text(at)
                out[f"{name}_utc"] = None if at is None else format_ts(at)
        return out

    def facts(self) -> dict[str, Any]:
        """The JSON form: what the artifact holds (fields with a default only when given)."""
        return self.model_dump(mode="json", exclude_unset=True)


class Period(Facts):
    start: Stamp
    end: MaybeStamp
    duration_s: float
    ongoing: bool


class ReasonRow(Facts):
    code: str
    severity: str
    peak_value: float | None
    threshold: float | None
    detail: str
    at: Stamp


class Incident(Period):
    """A WARNING/CRITICAL period of records, with the CRITICAL periods inside it."""

    level: Level
    records: int
    peak_score: float | None
    peak: MaybeStamp
    reasons: list[ReasonRow]
    critical_periods: list[Period]


class TierIncident(Incident):
    tier: str


class GapRow(Facts):
    start: Stamp
    end: Stamp
    duration_s: float
    kind: Literal["stale", "offline"]


class Completeness(Facts):
    received: int
    expected: int | None
    ratio: float | None
    cadence_s: float | None
    cadence_source: Literal["setting", "observed median interval"]
    covered_s: float
    gap_threshold_s: float
    gaps: list[GapRow]
    stale_s: float
    offline_s: float
    missing_hours: list[int]
    hours_without_factory_state: list[int]
    skipped_objects: int


class SeriesFigures(Facts):
    count: int
    min: float
    avg: float
    max: float
    p95: float | None = None  # only when the folds carry sketches


class SensorFigures(SeriesFigures):
    hours_out_of_range: list[int]
    records_out_of_range: int


class DetectionFigures(Facts):
    count: int
    max_confidence: float
    cameras: dict[str, int]
    hours: list[int]


class CameraFigures(Facts):
    observations: int
    offline: int


class InfraFigures(Facts):
    records: int
    series: dict[str, SeriesFigures]
    cameras: dict[str, CameraFigures]
    pipeline_not_ok: dict[str, int]


class ImageFigures(Facts):
    count: int
    bytes: int
    cameras: dict[str, int]


HourStatus = Literal["future", "missing", "ok"]


class FactoryHourRow(Facts):
    kst_hour: int
    start: Stamp
    status: HourStatus
    # only for an hour that has a fold
    factory_records: int | None = None
    risk_records: int | None = None
    worst_level: Level | None = None
    max_score: float | None = None


class CloudHourRow(Facts):
    kst_hour: int
    start: Stamp
    status: HourStatus
    # only for an hour that has a fold
    snapshots: dict[str, int] | None = None
    worst_level: Level | None = None


class _Window(Facts):
    """What every summary of a day starts with: the KST day and how much of it is covered."""

    report_date: str
    timezone: Literal["KST (UTC+09:00)"]
    window_start: Stamp
    window_end: Stamp
    as_of: Stamp
    complete_day: bool


class _Day(_Window):
    target: str


class AlertIncidentRow(Facts):
    """One alert incident of the day: when, why, who answered through what, how fast, and who
    was told (delivered notifications per receiver; failed attempts counted apart)."""

    incident_id: str
    stream: str
    reason: str
    severity: str
    state: str
    open: bool
    triggered: Stamp
    acknowledged: bool
    acknowledged_at: Annotated[datetime | None, stamp_named("acknowledged")]
    acknowledged_by: str | None
    acknowledged_via: str | None
    time_to_acknowledge_s: float | None
    resolved: MaybeStamp
    resolved_by: str | None
    resolved_via: str | None
    resolution_note: str | None
    time_to_resolve_s: float | None
    escalation_level: int
    notifications: int
    receivers: dict[str, int]
    failed_notifications: int


class AlertCounts(Facts):
    total: int
    critical: int
    warning: int
    open: int
    resolved: int
    acknowledged: int
    unacknowledged: int
    escalated: int
    resolved_by_data: int
    resolved_by_person: int


class AlertFigures(Facts):
    """Counts, MTTA and MTTR of alert incidents (of one target, or of the whole fleet)."""

    counts: AlertCounts
    mtta_s: float | None
    mtta_over: int
    mttr_s: float | None
    mttr_over: int


class TargetAlertFigures(AlertFigures):
    unreadable_records: int


class AlertSection(TargetAlertFigures):
    """``alert_incidents`` of a target's summary."""

    items: list[AlertIncidentRow]
    method: str


class _AlertHeadline(Facts):
    """The headline's figures of the day's alert incidents (once the section is added)."""

    alert_incidents: int | None = None
    open_alert_incidents: int | None = None
    mtta_s: float | None = None
    mttr_s: float | None = None


class FactoryHeadline(_AlertHeadline):
    worst_level: Level | None
    incidents: int
    critical_incidents: int
    max_score: float | None
    completeness: float | None
    missing_hours: int


class FactorySummary(_Day):
    """``factory-daily-summary.json``."""

    kind: Literal["factory"]
    headline: FactoryHeadline
    timeline: list[FactoryHourRow]
    incidents: list[Incident]
    sensors: dict[str, SensorFigures]
    p95_method: str
    detections: dict[str, DetectionFigures]
    completeness: Completeness
    infra: InfraFigures
    images: ImageFigures
    alert_incidents: AlertSection | None = None


class CheckFigures(Facts):
    runs: int
    ok: int
    warning: int
    critical: int
    availability: float | None
    unit: str | None
    worst_value: float | None
    worst: MaybeStamp
    reasons: dict[str, int]


class LatencyRow(Facts):
    check: str
    worst_ms: float
    worst_kst: str | None


class TierFigures(Facts):
    snapshots: int
    status_counts: dict[str, int]
    first: Stamp
    last: Stamp


class DriftFigures(Facts):
    first: Stamp
    last: Stamp
    runs: int
    detail: str


class CloudCompleteness(Facts):
    missing_hours: list[int]
    skipped_objects: int


class CloudHeadline(_AlertHeadline):
    worst_level: Level | None
    incidents: int
    critical_incidents: int
    checks_below_full_availability: int
    drift_found: bool
    missing_hours: int


class CloudSummary(_Day):
    """``cloud-infra-daily-summary.json``."""

    kind: Literal["cloud-infra"]
    headline: CloudHeadline
    timeline: list[CloudHourRow]
    tiers: dict[str, TierFigures]
    incidents: list[TierIncident]
    availability: dict[str, CheckFigures]
    worst_latencies: list[LatencyRow]
    drift: dict[str, DriftFigures]
    completeness: CloudCompleteness
    alert_incidents: AlertSection | None = None


class FleetIncidents(_Window):
    """``fleet-incidents-summary.json``: the day's alert incidents of every target, with the
    fleet's totals."""

    kind: Literal["fleet-incidents"]
    targets: dict[str, TargetAlertFigures]
    totals: TargetAlertFigures
    method: str
