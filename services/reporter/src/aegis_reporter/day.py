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
from aegis_contracts.times import KST, format_ts, kst_day_bounds
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


def kst_text(at: datetime) -> str:
    """``2026-11-30T14:05:00.000+09:00``."""
    return at.astimezone(KST).isoformat(timespec="milliseconds")


def times(prefix: str, at: datetime | None) -> dict[str, str | None]:
    return {
        f"{prefix}_kst": kst_text(at) if at else None,
        f"{prefix}_utc": format_ts(at) if at else None,
    }


def merge_series(items: Sequence[Series]) -> dict[str, Any]:
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


def _period(start: datetime, end: datetime | None, report_end: datetime) -> dict[str, Any]:
    return {
        **times("start", start),
        **times("end", end),
        "duration_s": ((end or report_end) - start).total_seconds(),
        "ongoing": end is None,
    }


def incidents(runs: Sequence[Run], report_end: datetime) -> list[dict[str, Any]]:
    """WARNING/CRITICAL periods: one starts at the first record at WARNING or above and ends at
    the first record below it (NORMAL); still open at the end of the report it is ``ongoing``.
    Inside it, each CRITICAL period starts at the first CRITICAL record and ends at the first
    record below CRITICAL."""
    found: list[dict[str, Any]] = []
    i = 0
    while i < len(runs):
        if runs[i].level is Level.NORMAL:
            i += 1
            continue
        j = i
        while j + 1 < len(runs) and runs[j + 1].level is not Level.NORMAL:
            j += 1
        group = runs[i : j + 1]
        end = runs[j + 1].first_at if j + 1 < len(runs) else None
        reasons: dict[str, ReasonPeak] = {}
        for run in group:
            reasons = merge_peaks(reasons, run.reasons)
        peak = max(
            (r for r in group if r.peak_score is not None),
            key=lambda r: (r.peak_score or 0.0, -(r.peak_at or r.first_at).timestamp()),
            default=None,
        )
        critical = [
            _period(run.first_at, runs[k + 1].first_at if k + 1 < len(runs) else None, report_end)
            for k, run in enumerate(runs)
            if i <= k <= j and run.level is Level.CRITICAL
        ]
        found.append(
            {
                "level": Level.worst(*(r.level for r in group)).value,
                **_period(group[0].first_at, end, report_end),
                "records": sum(r.records for r in group),
                "peak_score": peak.peak_score if peak else None,
                **times("peak", peak.peak_at if peak else None),
                "reasons": [
                    {
                        "code": code,
                        "severity": p.severity,
                        "peak_value": p.value,
                        "threshold": p.threshold,
                        "detail": p.detail,
                        **times("at", p.at),
                    }
                    for code, p in reasons.items()
                ],
                "critical_periods": critical,
            }
        )
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


def completeness(
    hours: Mapping[int, FactoryHour],
    window: DayWindow,
    *,
    gap_s: float,
    offline_s: float,
    cadence_s: float | None,
) -> dict[str, Any]:
    """Messages expected (from the observed median interval, or ``cadence_s``) against those
    received; gaps between factory_state records longer than ``gap_s`` (also before the first
    and after the last record of the day), each ``stale`` or, past ``offline_s``, ``offline``;
    hours without any object are missing (hours not yet begun are not)."""
    ordered = [hours[h] for h in sorted(hours)]
    with_state = [h for h in ordered if h.factory_records]
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
    observed = _median_interval(with_state)
    cadence = cadence_s if cadence_s is not None else observed
    span = (window.as_of - window.start).total_seconds()
    received = sum(h.factory_records for h in ordered)
    expected = round(span / cadence) if cadence else None
    lengths = [(g.end - g.start).total_seconds() for g in gaps]
    kinds = ["offline" if d > offline_s else "stale" for d in lengths]
    listed = [
        {
            **times("start", g.start),
            **times("end", g.end),
            "duration_s": d,
            "kind": kind,
        }
        for g, d, kind in zip(gaps, lengths, kinds, strict=True)
    ]
    started = [h for h in range(24) if window.hour_started(h)]
    return {
        "received": received,
        "expected": expected,
        "ratio": received / expected if expected else None,
        "cadence_s": cadence,
        "cadence_source": "setting" if cadence_s is not None else "observed median interval",
        "covered_s": span,
        "gap_threshold_s": gap_s,
        "gaps": listed,
        "stale_s": math.fsum(d for d, k in zip(lengths, kinds, strict=True) if k == "stale"),
        "offline_s": math.fsum(d for d, k in zip(lengths, kinds, strict=True) if k == "offline"),
        "missing_hours": [h for h in started if h not in hours],
        "hours_without_factory_state": [
            h for h in started if h in hours and not hours[h].factory_records
        ],
        "skipped_objects": sum(h.skipped for h in ordered),
    }


def _hour_row(h: int, window: DayWindow, fold: FactoryHour | CloudHour | None) -> dict[str, Any]:
    status = "future" if not window.hour_started(h) else "missing" if fold is None else "ok"
    return {"kst_hour": h, **times("start", window.utc_hour(h)), "status": status}


def factory_summary(
    target: str,
    window: DayWindow,
    hours: Mapping[int, FactoryHour],
    params: FoldParams,
    *,
    offline_s: float,
    cadence_s: float | None,
) -> dict[str, Any]:
    """``factory-daily-summary.json``."""
    ordered = [hours[h] for h in sorted(hours)]
    runs = day_runs(h.runs for h in ordered)
    found = incidents(runs, window.as_of)
    timeline = []
    for h in range(24):
        row = _hour_row(h, window, hours.get(h))
        fold = hours.get(h)
        if fold is not None:
            row |= {
                "factory_records": fold.factory_records,
                "risk_records": fold.risk_records,
                "worst_level": fold.worst_level.value if fold.worst_level else None,
                "max_score": fold.max_score,
            }
        timeline.append(row)
    names = sorted({n for h in ordered for n in h.sensors})
    sensors = {
        n: merge_series([h.sensors[n] for h in ordered if n in h.sensors])
        | {
            "hours_out_of_range": [h.kst_hour for h in ordered if h.out_of_range.get(n)],
            "records_out_of_range": sum(h.out_of_range.get(n, 0) for h in ordered),
        }
        for n in names
    }
    labels = sorted({label for h in ordered for label in h.detections})
    detections = {
        label: {
            "count": sum(h.detections[label].count for h in ordered if label in h.detections),
            "max_confidence": max(
                h.detections[label].max_confidence for h in ordered if label in h.detections
            ),
            "cameras": added_counts(
                h.detections[label].cameras for h in ordered if label in h.detections
            ),
            "hours": [h.kst_hour for h in ordered if label in h.detections],
        }
        for label in labels
    }
    infra_names = sorted({n for h in ordered for n in h.infra})
    observations = added_counts(h.camera_observations for h in ordered)
    offline = added_counts(h.camera_offline for h in ordered)
    complete = completeness(
        hours, window, gap_s=params.gap_s, offline_s=offline_s, cadence_s=cadence_s
    )
    worst = Level.worst(*(r.level for r in runs)) if runs else None
    return {
        "kind": "factory",
        "target": target,
        "report_date": window.day.isoformat(),
        "timezone": "KST (UTC+09:00)",
        **times("window_start", window.start),
        **times("window_end", window.end),
        **times("as_of", window.as_of),
        "complete_day": window.complete,
        "headline": {
            "worst_level": worst.value if worst else None,
            "incidents": len(found),
            "critical_incidents": sum(1 for i in found if i["level"] == Level.CRITICAL.value),
            "max_score": max(
                (h.max_score for h in ordered if h.max_score is not None), default=None
            ),
            "completeness": complete["ratio"],
            "missing_hours": len(complete["missing_hours"]),
        },
        "timeline": timeline,
        "incidents": found,
        "sensors": sensors,
        "p95_method": P95_METHOD.format(alpha=params.alpha),
        "detections": detections,
        "completeness": complete,
        "infra": {
            "records": sum(h.infra_records for h in ordered),
            "series": {
                n: merge_series([h.infra[n] for h in ordered if n in h.infra]) for n in infra_names
            },
            "cameras": {
                c: {"observations": n, "offline": offline.get(c, 0)}
                for c, n in observations.items()
            },
            "pipeline_not_ok": added_counts(h.pipeline_not_ok for h in ordered),
        },
        "images": {
            "count": sum(h.images for h in ordered),
            "bytes": sum(h.image_bytes for h in ordered),
            "cameras": added_counts(h.image_cameras for h in ordered),
        },
    }


def _merge_checks(folds: Sequence[CheckFold]) -> dict[str, Any]:
    runs = sum(f.runs for f in folds)
    ok = sum(f.ok for f in folds)
    worst = max(
        (f for f in folds if f.worst_value is not None),
        key=lambda f: (f.worst_value or 0.0, -(f.worst_at or datetime.max).timestamp()),
        default=None,
    )
    return {
        "runs": runs,
        "ok": ok,
        "warning": sum(f.warning for f in folds),
        "critical": sum(f.critical for f in folds),
        "availability": ok / runs if runs else None,
        "unit": next((f.unit for f in folds if f.unit), None),
        "worst_value": worst.worst_value if worst else None,
        **times("worst", worst.worst_at if worst else None),
        "reasons": added_counts(f.reasons for f in folds),
    }


def cloud_summary(target: str, window: DayWindow, hours: Mapping[int, CloudHour]) -> dict[str, Any]:
    """``cloud-infra-daily-summary.json``."""
    ordered = [hours[h] for h in sorted(hours)]
    timeline = []
    for h in range(24):
        row = _hour_row(h, window, hours.get(h))
        fold = hours.get(h)
        if fold is not None:
            statuses = added_counts(t.status_counts for t in fold.tiers.values())
            row |= {
                "snapshots": {t: f.snapshots for t, f in fold.tiers.items()},
                "worst_level": Level.worst(*(Level(s) for s in statuses)).value,
            }
        timeline.append(row)
    tiers = sorted({t for h in ordered for t in h.tiers})
    found: list[dict[str, Any]] = []
    tier_rows: dict[str, Any] = {}
    for tier in tiers:
        folds = [h.tiers[tier] for h in ordered if tier in h.tiers]
        runs = day_runs(f.runs for f in folds)
        found.extend({"tier": tier, **i} for i in incidents(runs, window.as_of))
        tier_rows[tier] = {
            "snapshots": sum(f.snapshots for f in folds),
            "status_counts": added_counts(f.status_counts for f in folds),
            **times("first", folds[0].first_at),
            **times("last", folds[-1].last_at),
        }
    found.sort(key=lambda i: (i["start_utc"], i["tier"]))
    names = sorted({n for h in ordered for n in h.checks})
    checks = {n: _merge_checks([h.checks[n] for h in ordered if n in h.checks]) for n in names}
    latencies = sorted(
        (
            {"check": n, "worst_ms": c["worst_value"], "worst_kst": c["worst_kst"]}
            for n, c in checks.items()
            if c["unit"] == "ms" and c["worst_value"] is not None
        ),
        key=lambda row: (-row["worst_ms"], row["check"]),
    )
    drift_names = sorted({n for h in ordered for n in h.drift})
    drift = {}
    for n in drift_names:
        seen = [h.drift[n] for h in ordered if n in h.drift]
        drift[n] = {
            **times("first", seen[0].first_at),
            **times("last", seen[-1].last_at),
            "runs": sum(f.runs for f in seen),
            "detail": seen[-1].detail,
        }
    started = [h for h in range(24) if window.hour_started(h)]
    worst_all = [Level(r["worst_level"]) for r in timeline if "worst_level" in r]
    return {
        "kind": "cloud-infra",
        "target": target,
        "report_date": window.day.isoformat(),
        "timezone": "KST (UTC+09:00)",
        **times("window_start", window.start),
        **times("window_end", window.end),
        **times("as_of", window.as_of),
        "complete_day": window.complete,
        "headline": {
            "worst_level": Level.worst(*worst_all).value if worst_all else None,
            "incidents": len(found),
            "critical_incidents": sum(1 for i in found if i["level"] == Level.CRITICAL.value),
            "checks_below_full_availability": sum(
                1
                for c in checks.values()
                if c["availability"] is not None and c["availability"] < 1
            ),
            "drift_found": bool(drift),
            "missing_hours": len([h for h in started if h not in hours]),
        },
        "timeline": timeline,
        "tiers": tier_rows,
        "incidents": found,
        "availability": checks,
        "worst_latencies": latencies[:10],
        "drift": drift,
        "completeness": {
            "missing_hours": [h for h in started if h not in hours],
            "skipped_objects": sum(h.skipped for h in ordered),
        },
    }


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
