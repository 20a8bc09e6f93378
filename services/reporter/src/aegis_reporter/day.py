"""The day from its hourly folds (pure): summaries, incidents, completeness, report context.

Nothing here sees a record: every figure is merged from :mod:`aegis_folds.folds`, so the
memory of a report does not depend on how many records the day had. Times are given in KST
(the report's zone) and UTC; a duration is in seconds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from aegis_contracts.state import Level
from aegis_contracts.times import kst_day_bounds
from aegis_folds.folds import (
    INTERVAL_RESOLUTION_S,
    CheckFold,
    CloudHour,
    FactoryHour,
    FoldParams,
    Gap,
    ReasonPeak,
    Run,
    Series,
    added_counts,
    append_run,
    merge_peaks,
)
from aegis_reporter.summary import (
    CameraFigures,
    CheckFigures,
    CloudCompleteness,
    CloudHeadline,
    CloudHourRow,
    CloudSummary,
    Completeness,
    DetectionFigures,
    DriftFigures,
    FactoryHeadline,
    FactoryHourRow,
    FactorySummary,
    GapRow,
    HourStatus,
    ImageFigures,
    Incident,
    InfraFigures,
    LatencyRow,
    Period,
    ReasonRow,
    SensorFigures,
    SeriesFigures,
    TierFigures,
    TierIncident,
    kst_text,
)

P95_METHOD = (
    "p95 is the nearest-rank 95th percentile from mergeable log-binned quantile sketches "
    "folded per hour (DDSketch-style), within {alpha:.1%} relative error of the exact value"
)


@dataclass(frozen=True, slots=True)
class DayWindow:
    """KST day ``day`` in UTC, and how much of it the report covers (all of it once it is over)."""

    day: date
    start: datetime
    end: datetime
    as_of: datetime

    @classmethod
    def of(cls, day: date, now: datetime | None = None) -> DayWindow:
        start, end = kst_day_bounds(day)
        as_of = end if now is None else max(start, min(end, now))
        return cls(day, start, end, as_of)

    @property
    def complete(self) -> bool:
        return self.as_of >= self.end

    def utc_hour(self, kst_hour: int) -> datetime:
        return self.start + timedelta(hours=kst_hour)

    def hour_started(self, kst_hour: int) -> bool:
        return self.utc_hour(kst_hour) < self.as_of


def _series(items: Sequence[Series]) -> dict[str, Any]:
    """count/min/avg/max (and p95 when the folds carry sketches) of hourly series."""
    count = sum(s.count for s in items)
    lo, hi = min(s.min for s in items), max(s.max for s in items)
    out: dict[str, Any] = {
        "count": count,
        "min": lo,
        "avg": math.fsum(s.sum for s in items) / count,
        "max": hi,
    }
    sketches = [s.sketch for s in items if s.sketch is not None]
    if sketches:
        merged = sketches[0].sketch()
        for other in sketches[1:]:
            merged.merge(other.sketch())
        p95 = merged.quantile(0.95)
        out["p95"] = None if p95 is None else min(hi, max(lo, p95))
    return out


def day_runs(hour_runs: Iterable[Sequence[Run]]) -> list[Run]:
    """The runs of every hour, in order, with a level that continues across hours joined."""
    runs: list[Run] = []
    for hour in hour_runs:
        for run in hour:
            runs = append_run(runs, run)
    return runs


def _period(start: datetime, end: datetime | None, report_end: datetime) -> Period:
    return Period(
        start=start,
        end=end,
        duration_s=((end or report_end) - start).total_seconds(),
        ongoing=end is None,
    )


def _incident(group: Sequence[Run], end: datetime | None, report_end: datetime) -> Incident:
    """One WARNING/CRITICAL period: ``group``, its runs, ended by the run at ``end``."""
    reasons: dict[str, ReasonPeak] = {}
    for run in group:
        reasons = merge_peaks(reasons, run.reasons)
    peak = max(
        (r for r in group if r.peak_score is not None),
        key=lambda r: (r.peak_score or 0.0, -(r.peak_at or r.first_at).timestamp()),
        default=None,
    )
    ends = [r.first_at for r in group[1:]] + [end]
    return Incident(
        level=Level.worst(*(r.level for r in group)),
        **dict(_period(group[0].first_at, end, report_end)),
        records=sum(r.records for r in group),
        peak_score=peak.peak_score if peak else None,
        peak=peak.peak_at if peak else None,
        reasons=[
            ReasonRow(
                code=code,
                severity=p.severity,
                peak_value=p.value,
                threshold=p.threshold,
                detail=p.detail,
                at=p.at,
            )
            for code, p in reasons.items()
        ],
        critical_periods=[
            _period(run.first_at, run_end, report_end)
            for run, run_end in zip(group, ends, strict=True)
            if run.level is Level.CRITICAL
        ],
    )


def incidents(runs: Sequence[Run], report_end: datetime) -> list[Incident]:
    """WARNING/CRITICAL periods: one starts at the first record at WARNING or above and ends at
    the first record below it (NORMAL); still open at the end of the report it is ``ongoing``.
    Inside it, each CRITICAL period starts at the first CRITICAL record and ends at the first
    record below CRITICAL."""
    found: list[Incident] = []
    i = 0
    while i < len(runs):
        if runs[i].level is Level.NORMAL:
            i += 1
            continue
        j = i
        while j + 1 < len(runs) and runs[j + 1].level is not Level.NORMAL:
            j += 1
        end = runs[j + 1].first_at if j + 1 < len(runs) else None
        found.append(_incident(runs[i : j + 1], end, report_end))
        i = j + 1
    return found


def _median_interval(hours: Sequence[FactoryHour]) -> float | None:
    counts: Counter[int] = Counter()
    for h in hours:
        counts.update({int(k): n for k, n in h.intervals.items()})
    total = sum(counts.values())
    if not total:
        return None
    seen, rank = 0, math.ceil(total / 2)
    for tenths in sorted(counts):
        seen += counts[tenths]
        if seen >= rank:
            return tenths * INTERVAL_RESOLUTION_S
    raise AssertionError("counts do not add up")  # pragma: no cover


def _gaps(with_state: Sequence[FactoryHour], window: DayWindow, gap_s: float) -> list[Gap]:
    """The gaps between factory_state records longer than ``gap_s``, also before the first and
    after the last record of the day (so far)."""
    gaps: list[Gap] = []
    reach = window.start
    for h in with_state:
        assert h.first_at is not None and h.last_at is not None
        if (h.first_at - reach).total_seconds() > gap_s:
            gaps.append(Gap(start=reach, end=h.first_at))
        gaps.extend(h.gaps)
        reach = h.last_at
    if (window.as_of - reach).total_seconds() > gap_s:
        gaps.append(Gap(start=reach, end=window.as_of))
    return gaps


def completeness(
    hours: Mapping[int, FactoryHour],
    window: DayWindow,
    *,
    gap_s: float,
    offline_s: float,
    cadence_s: float | None,
) -> Completeness:
    """Messages expected (from the observed median interval, or ``cadence_s``) against those
    received; gaps between factory_state records longer than ``gap_s`` (also before the first
    and after the last record of the day), each ``stale`` or, past ``offline_s``, ``offline``;
    hours without any object are missing (hours not yet begun are not)."""
    ordered = [hours[h] for h in sorted(hours)]
    with_state = [h for h in ordered if h.factory_records]
    cadence = cadence_s if cadence_s is not None else _median_interval(with_state)
    span = (window.as_of - window.start).total_seconds()
    received = sum(h.factory_records for h in ordered)
    expected = round(span / cadence) if cadence else None
    gaps = [
        GapRow(start=g.start, end=g.end, duration_s=d, kind="offline" if d > offline_s else "stale")
        for g in _gaps(with_state, window, gap_s)
        for d in [(g.end - g.start).total_seconds()]
    ]
    started = [h for h in range(24) if window.hour_started(h)]
    return Completeness(
        received=received,
        expected=expected,
        ratio=received / expected if expected else None,
        cadence_s=cadence,
        cadence_source="setting" if cadence_s is not None else "observed median interval",
        covered_s=span,
        gap_threshold_s=gap_s,
        gaps=gaps,
        stale_s=math.fsum(g.duration_s for g in gaps if g.kind == "stale"),
        offline_s=math.fsum(g.duration_s for g in gaps if g.kind == "offline"),
        missing_hours=[h for h in started if h not in hours],
        hours_without_factory_state=[
            h for h in started if h in hours and not hours[h].factory_records
        ],
        skipped_objects=sum(h.skipped for h in ordered),
    )


def _status(h: int, window: DayWindow, fold: FactoryHour | CloudHour | None) -> HourStatus:
    return "future" if not window.hour_started(h) else "missing" if fold is None else "ok"


def _factory_row(h: int, window: DayWindow, fold: FactoryHour | None) -> FactoryHourRow:
    start, status = window.utc_hour(h), _status(h, window, fold)
    if fold is None:
        return FactoryHourRow(kst_hour=h, start=start, status=status)
    return FactoryHourRow(
        kst_hour=h,
        start=start,
        status=status,
        factory_records=fold.factory_records,
        risk_records=fold.risk_records,
        worst_level=fold.worst_level,
        max_score=fold.max_score,
    )


def _sensors(ordered: Sequence[FactoryHour]) -> dict[str, SensorFigures]:
    names = sorted({n for h in ordered for n in h.sensors})
    return {
        n: SensorFigures(
            **_series([h.sensors[n] for h in ordered if n in h.sensors]),
            hours_out_of_range=[h.kst_hour for h in ordered if h.out_of_range.get(n)],
            records_out_of_range=sum(h.out_of_range.get(n, 0) for h in ordered),
        )
        for n in names
    }


def _detections(ordered: Sequence[FactoryHour]) -> dict[str, DetectionFigures]:
    labels = sorted({label for h in ordered for label in h.detections})
    out = {}
    for label in labels:
        folds = [h.detections[label] for h in ordered if label in h.detections]
        out[label] = DetectionFigures(
            count=sum(f.count for f in folds),
            max_confidence=max(f.max_confidence for f in folds),
            cameras=added_counts(f.cameras for f in folds),
            hours=[h.kst_hour for h in ordered if label in h.detections],
        )
    return out


def _infra(ordered: Sequence[FactoryHour]) -> InfraFigures:
    names = sorted({n for h in ordered for n in h.infra})
    observations = added_counts(h.camera_observations for h in ordered)
    offline = added_counts(h.camera_offline for h in ordered)
    return InfraFigures(
        records=sum(h.infra_records for h in ordered),
        series={
            n: SeriesFigures(**_series([h.infra[n] for h in ordered if n in h.infra]))
            for n in names
        },
        cameras={
            c: CameraFigures(observations=n, offline=offline.get(c, 0))
            for c, n in observations.items()
        },
        pipeline_not_ok=added_counts(h.pipeline_not_ok for h in ordered),
    )


def window_fields(window: DayWindow) -> dict[str, Any]:
    """The fields every summary of the day starts with."""
    return {
        "report_date": window.day.isoformat(),
        "timezone": "KST (UTC+09:00)",
        "window_start": window.start,
        "window_end": window.end,
        "as_of": window.as_of,
        "complete_day": window.complete,
    }


def factory_summary(
    target: str,
    window: DayWindow,
    hours: Mapping[int, FactoryHour],
    params: FoldParams,
    *,
    offline_s: float,
    cadence_s: float | None,
) -> FactorySummary:
    """``factory-daily-summary.json``."""
    ordered = [hours[h] for h in sorted(hours)]
    runs = day_runs(h.runs for h in ordered)
    found = incidents(runs, window.as_of)
    complete = completeness(
        hours, window, gap_s=params.gap_s, offline_s=offline_s, cadence_s=cadence_s
    )
    return FactorySummary(
        kind="factory",
        target=target,
        **window_fields(window),
        headline=FactoryHeadline(
            worst_level=Level.worst(*(r.level for r in runs)) if runs else None,
            incidents=len(found),
            critical_incidents=sum(1 for i in found if i.level is Level.CRITICAL),
            max_score=max((h.max_score for h in ordered if h.max_score is not None), default=None),
            completeness=complete.ratio,
            missing_hours=len(complete.missing_hours),
        ),
        timeline=[_factory_row(h, window, hours.get(h)) for h in range(24)],
        incidents=found,
        sensors=_sensors(ordered),
        p95_method=P95_METHOD.format(alpha=params.alpha),
        detections=_detections(ordered),
        completeness=complete,
        infra=_infra(ordered),
        images=ImageFigures(
            count=sum(h.images for h in ordered),
            bytes=sum(h.image_bytes for h in ordered),
            cameras=added_counts(h.image_cameras for h in ordered),
        ),
    )


def _merge_checks(folds: Sequence[CheckFold]) -> CheckFigures:
    runs = sum(f.runs for f in folds)
    ok = sum(f.ok for f in folds)
    worst = max(
        (f for f in folds if f.worst_value is not None),
        key=lambda f: (f.worst_value or 0.0, -(f.worst_at or datetime.max).timestamp()),
        default=None,
    )
    return CheckFigures(
        runs=runs,
        ok=ok,
        warning=sum(f.warning for f in folds),
        critical=sum(f.critical for f in folds),
        availability=ok / runs if runs else None,
        unit=next((f.unit for f in folds if f.unit), None),
        worst_value=worst.worst_value if worst else None,
        worst=worst.worst_at if worst else None,
        reasons=added_counts(f.reasons for f in folds),
    )


def _cloud_row(h: int, window: DayWindow, fold: CloudHour | None) -> CloudHourRow:
    start, status = window.utc_hour(h), _status(h, window, fold)
    if fold is None:
        return CloudHourRow(kst_hour=h, start=start, status=status)
    statuses = added_counts(t.status_counts for t in fold.tiers.values())
    return CloudHourRow(
        kst_hour=h,
        start=start,
        status=status,
        snapshots={t: f.snapshots for t, f in fold.tiers.items()},
        worst_level=Level.worst(*(Level(s) for s in statuses)),
    )


def _tiers(
    ordered: Sequence[CloudHour], window: DayWindow
) -> tuple[dict[str, TierFigures], list[TierIncident]]:
    """Each tier's figures of the day, and the incidents of every tier in order."""
    figures: dict[str, TierFigures] = {}
    found: list[TierIncident] = []
    for tier in sorted({t for h in ordered for t in h.tiers}):
        folds = [h.tiers[tier] for h in ordered if tier in h.tiers]
        runs = day_runs(f.runs for f in folds)
        found.extend(TierIncident(tier=tier, **dict(i)) for i in incidents(runs, window.as_of))
        figures[tier] = TierFigures(
            snapshots=sum(f.snapshots for f in folds),
            status_counts=added_counts(f.status_counts for f in folds),
            first=folds[0].first_at,
            last=folds[-1].last_at,
        )
    found.sort(key=lambda i: (i.start, i.tier))
    return figures, found


def _drift(ordered: Sequence[CloudHour]) -> dict[str, DriftFigures]:
    drift = {}
    for n in sorted({n for h in ordered for n in h.drift}):
        seen = [h.drift[n] for h in ordered if n in h.drift]
        drift[n] = DriftFigures(
            first=seen[0].first_at,
            last=seen[-1].last_at,
            runs=sum(f.runs for f in seen),
            detail=seen[-1].detail,
        )
    return drift


def cloud_summary(target: str, window: DayWindow, hours: Mapping[int, CloudHour]) -> CloudSummary:
    """``cloud-infra-daily-summary.json``."""
    ordered = [hours[h] for h in sorted(hours)]
    timeline = [_cloud_row(h, window, hours.get(h)) for h in range(24)]
    tiers, found = _tiers(ordered, window)
    names = sorted({n for h in ordered for n in h.checks})
    checks = {n: _merge_checks([h.checks[n] for h in ordered if n in h.checks]) for n in names}
    latencies = sorted(
        (
            LatencyRow(
                check=n,
                worst_ms=c.worst_value,
                worst_kst=None if c.worst is None else kst_text(c.worst),
            )
            for n, c in checks.items()
            if c.unit == "ms" and c.worst_value is not None
        ),
        key=lambda row: (-row.worst_ms, row.check),
    )
    drift = _drift(ordered)
    started = [h for h in range(24) if window.hour_started(h)]
    missing = [h for h in started if h not in hours]
    worst_all = [r.worst_level for r in timeline if r.worst_level is not None]
    return CloudSummary(
        kind="cloud-infra",
        target=target,
        **window_fields(window),
        headline=CloudHeadline(
            worst_level=Level.worst(*worst_all) if worst_all else None,
            incidents=len(found),
            critical_incidents=sum(1 for i in found if i.level is Level.CRITICAL),
            checks_below_full_availability=sum(
                1 for c in checks.values() if c.availability is not None and c.availability < 1
            ),
            drift_found=bool(drift),
            missing_hours=len(missing),
        ),
        timeline=timeline,
        tiers=tiers,
        incidents=found,
        availability=checks,
        worst_latencies=latencies[:10],
        drift=drift,
        completeness=CloudCompleteness(
            missing_hours=missing, skipped_objects=sum(h.skipped for h in ordered)
        ),
    )


def report_context(summary: Mapping[str, Any]) -> dict[str, Any]:
    """``report-context.json``: what a generator may use, and nothing else: the summary plus the
    conventions a reader of it needs."""
    return {
        "schema": "aegis.report-context/1",
        "conventions": {
            "times": "*_kst fields are KST (UTC+09:00), *_utc fields UTC; durations in seconds",
            "levels": "NORMAL < WARNING < CRITICAL",
            "missing": "an hour with status 'missing' had no objects at all: no data, not zero",
            "incident": (
                "starts at the first record at WARNING or above, ends at the first record below "
                "it; 'ongoing' when still open at the end of the report"
            ),
            "alert_incident": (
                "alert_incidents lists what was paged: one firing alert from its trigger until "
                "it was resolved, who acknowledged it and through what, and who was notified; "
                "'open' when not yet resolved at report time. mtta_s is the mean time to "
                "acknowledge over the acknowledged ones (unacknowledged ones are left out and "
                "counted as unacknowledged); mttr_s the mean time to resolve over the resolved ones"
            ),
        },
        "facts": dict(summary),
    }
