"""Hourly folds (pure): one KST hour of processed/ records reduced to a small, mergeable summary.

A fold is what ``intermediate/hourly/hh=HH.json`` holds: counts, sums, min/max, quantile sketches,
the level runs that incidents are made of, gaps, and the listing it was made from (object count
and a digest of keys and ETags), so a re-run reuses it only while its input is unchanged. Its
size depends on how many sensors, labels, checks and level changes an hour has, never on how
many records it had. The day is made from folds alone (:mod:`aegis_reporter.day`).
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from aegis_contracts.cloud import CloudSnapshot
from aegis_contracts.state import (
    FactoryState,
    ImageSnapshotRef,
    InfraState,
    Level,
    Reason,
    RiskRecord,
)
from aegis_contracts.times import Timestamp
from aegis_folds.sketch import QuantileSketch

# bump when a fold's definition changes: older intermediates are then recomputed, not reused
FOLD_VERSION = 1
INFRA_SERIES = ("cpu_pct", "mem_pct", "disk_pct", "temperature_c", "rtt_ms", "loss_pct")
INTERVAL_RESOLUTION_S = 0.1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FoldParams(_Model):
    """What a fold depends on besides its input; a change invalidates stored folds."""

    fold_version: int = FOLD_VERSION
    gap_s: float
    alpha: float


class InputListing(_Model):
    count: int
    digest: str
    per_dataset: dict[str, int]


class SketchData(_Model):
    alpha: float
    count: int
    zero: int
    pos: list[tuple[int, int]]
    neg: list[tuple[int, int]]

    @classmethod
    def of(cls, sketch: QuantileSketch) -> SketchData:
        return cls.model_validate(sketch.to_json())

    def sketch(self) -> QuantileSketch:
        return QuantileSketch.from_json(self.model_dump())


class Series(_Model):
    count: int
    min: float
    max: float
    sum: float
    sketch: SketchData | None = None


class ReasonPeak(_Model):
    """A reason at its highest value within a run (or an incident)."""

    severity: Literal["WARNING", "CRITICAL"]
    value: float | None = None
    threshold: float | None = None
    detail: str = ""
    at: Timestamp


class Run(_Model):
    """Consecutive records (in event time) at one level."""

    level: Level
    first_at: Timestamp
    last_at: Timestamp
    records: int
    peak_score: float | None = None
    peak_at: Timestamp | None = None
    reasons: dict[str, ReasonPeak] = {}


class Gap(_Model):
    start: Timestamp
    end: Timestamp


class LabelFold(_Model):
    count: int
    max_confidence: float
    cameras: dict[str, int]


class _HourFold(_Model):
    """What every hourly fold records: whose hour it is and what it was made from."""

    target: str
    report_date: date
    kst_hour: int
    utc_hour: Timestamp
    params: FoldParams
    input: InputListing
    skipped: int = 0


class FactoryRecords(_Model):
    """What a fold of one factory's records holds, whatever span of event time it covers (an
    hour, a 5-minute window); ``out_of_range`` counts, per sensor, the risk records whose reasons
    name it (an hour keeps the sensors it has; a window keeps every name, see
    :func:`hour_from_windows`)."""

    factory_records: int = 0
    first_at: Timestamp | None = None
    last_at: Timestamp | None = None
    # intervals between consecutive factory_state records up to gap_s, in tenths of a second
    intervals: dict[str, int] = {}
    gaps: list[Gap] = []
    sensors: dict[str, Series] = {}
    out_of_range: dict[str, int] = {}
    detections: dict[str, LabelFold] = {}
    risk_records: int = 0
    max_score: float | None = None
    worst_level: Level | None = None
    runs: list[Run] = []
    infra_records: int = 0
    infra: dict[str, Series] = {}
    camera_observations: dict[str, int] = {}
    camera_offline: dict[str, int] = {}
    pipeline_not_ok: dict[str, int] = {}
    images: int = 0
    image_bytes: int = 0
    image_cameras: dict[str, int] = {}


class FactoryHour(_HourFold, FactoryRecords):
    kind: Literal["factory"] = "factory"


class CheckFold(_Model):
    runs: int
    ok: int
    warning: int
    critical: int
    unit: str | None = None
    worst_value: float | None = None
    worst_at: Timestamp | None = None
    reasons: dict[str, int] = {}


class TierFold(_Model):
    snapshots: int
    status_counts: dict[str, int]
    first_at: Timestamp
    last_at: Timestamp
    runs: list[Run]


class DriftFold(_Model):
    first_at: Timestamp
    last_at: Timestamp
    runs: int
    detail: str


class CloudHour(_HourFold):
    kind: Literal["cloud"] = "cloud"
    tiers: dict[str, TierFold] = {}
    checks: dict[str, CheckFold] = {}
    drift: dict[str, DriftFold] = {}


Hour = FactoryHour | CloudHour


def listing_of(entries: Iterable[tuple[str, str, str]]) -> InputListing:
    """``(dataset, key, etag)`` of an hour's objects: their count per dataset and a digest that
    changes when any object is added, removed or rewritten."""
    ordered = sorted(entries, key=lambda e: e[1])
    digest = hashlib.sha256()
    per: Counter[str] = Counter()
    for dataset, key, etag in ordered:
        digest.update(f"{key}\t{etag}\n".encode())
        per[dataset] += 1
    return InputListing(
        count=len(ordered), digest=digest.hexdigest(), per_dataset=dict(sorted(per.items()))
    )


def series(values: Sequence[float], alpha: float | None) -> Series:
    """count/min/max/sum (and a sketch when ``alpha``) of at least one value."""
    return Series(
        count=len(values),
        min=min(values),
        max=max(values),
        sum=math.fsum(values),
        sketch=None if alpha is None else SketchData.of(QuantileSketch.of(values, alpha)),
    )


@dataclass(frozen=True, slots=True)
class Point:
    """One rated observation in event time: a risk record, or a cloud collector run."""

    at: datetime
    level: Level
    score: float | None
    reasons: Sequence[Reason]


def _peaks(reasons: Iterable[Reason], at: datetime) -> dict[str, ReasonPeak]:
    peaks: dict[str, ReasonPeak] = {}
    for r in reasons:
        peaks[r.code] = better_peak(
            peaks.get(r.code),
            ReasonPeak(
                severity=r.severity, value=r.value, threshold=r.threshold, detail=r.detail, at=at
            ),
        )
    return peaks


def better_peak(old: ReasonPeak | None, new: ReasonPeak) -> ReasonPeak:
    """The worse of two observations of one reason: higher severity, then higher value, then
    the earlier one (so merging is order-independent)."""
    if old is None:
        return new

    def rank(p: ReasonPeak) -> tuple[int, float, float]:
        sev = 1 if p.severity == "CRITICAL" else 0
        value = p.value if p.value is not None else -math.inf
        return (sev, value, -p.at.timestamp())

    return new if rank(new) > rank(old) else old


def merge_peaks(a: dict[str, ReasonPeak], b: dict[str, ReasonPeak]) -> dict[str, ReasonPeak]:
    merged = dict(a)
    for code, peak in b.items():
        merged[code] = better_peak(merged.get(code), peak)
    return dict(sorted(merged.items()))


def _higher_score(a: Run, b: Run) -> tuple[float | None, datetime | None]:
    if b.peak_score is not None and (a.peak_score is None or b.peak_score > a.peak_score):
        return b.peak_score, b.peak_at
    return a.peak_score, a.peak_at


def join_runs(a: Run, b: Run) -> Run:
    """Two runs at one level, ``b`` after ``a``."""
    score, at = _higher_score(a, b)
    return Run(
        level=a.level,
        first_at=a.first_at,
        last_at=b.last_at,
        records=a.records + b.records,
        peak_score=score,
        peak_at=at,
        reasons=merge_peaks(a.reasons, b.reasons),
    )


def runs_of(points: Iterable[Point]) -> list[Run]:
    """Level runs of points already in event-time order."""
    runs: list[Run] = []
    for p in points:
        run = Run(
            level=p.level,
            first_at=p.at,
            last_at=p.at,
            records=1,
            peak_score=p.score,
            peak_at=p.at if p.score is not None else None,
            reasons=dict(sorted(_peaks(p.reasons, p.at).items())),
        )
        runs = append_run(runs, run)
    return runs


def append_run(runs: list[Run], run: Run) -> list[Run]:
    if runs and runs[-1].level is run.level:
        runs[-1] = join_runs(runs[-1], run)
    else:
        runs.append(run)
    return runs


def _sensor_of(reason: Reason, sensors: Iterable[str]) -> str | None:
    """The sensor a threshold reason is about: its source ``sensors.{name}`` (records written
    before the processor set it: the detail, which starts with the sensor's name)."""
    if reason.value is None:
        return None
    if reason.source is not None:
        name = (
            reason.source.removeprefix("sensors.") if reason.source.startswith("sensors.") else ""
        )
    else:
        name = reason.detail.split(" ", 1)[0]
    return name if name in sensors else None


def _infra_values(infra: Sequence[InfraState]) -> dict[str, list[float]]:
    values: defaultdict[str, list[float]] = defaultdict(list)
    for inf in infra:
        figures = {**inf.host.model_dump(), **inf.network.model_dump()}
        for name in INFRA_SERIES:
            if (figure := figures.get(name)) is not None:
                values[name].append(float(figure))
    return dict(values)


def _fold_infra(infra: Sequence[InfraState], values: dict[str, list[float]]) -> dict[str, Any]:
    seen: Counter[str] = Counter()
    off: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    for inf in infra:
        for cam, online in inf.cameras.items():
            seen[cam] += 1
            off[cam] += online == "offline"
        for stage, health in inf.pipeline.items():
            if health != "ok":
                stages[f"{stage}:{health}"] += 1
    return {
        "infra": {n: series(v, None) for n, v in sorted(values.items())},
        "camera_observations": dict(sorted(seen.items())),
        "camera_offline": {c: n for c, n in sorted(off.items()) if n},
        "pipeline_not_ok": dict(sorted(stages.items())),
    }


class _Everything:
    """Every sensor name: a window counts out-of-range readings of any sensor a reason names,
    and the hour keeps those of the sensors it has (see :func:`hour_from_windows`)."""

    def __contains__(self, name: object) -> bool:
        return True


def _order(r: FactoryState | RiskRecord | InfraState | ImageSnapshotRef) -> tuple[datetime, str]:
    return (r.meta.event_time, r.meta.message_id)


def _exact(values: Iterable[float]) -> str:
    """The exact sum of ``values`` as ``numerator/denominator``: sums of windows add up to the
    hour's exactly (``math.fsum`` of all values is this sum, correctly rounded)."""
    total = sum((Fraction(v) for v in values), Fraction(0))
    return f"{total.numerator}/{total.denominator}"


def _factory_body(
    factory_states: Iterable[FactoryState],
    risks: Iterable[RiskRecord],
    infras: Iterable[InfraState],
    images: Iterable[ImageSnapshotRef],
    params: FoldParams,
    *,
    all_sensors: bool = False,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields a fold of factory records has, whatever span it covers, and the exact sums of
    its series (``sensors.{name}``, ``infra.{name}``). Records are ordered by (event time,
    message id) first, so the fold does not depend on the order they were read in."""
    states = sorted(factory_states, key=_order)
    rated = sorted(risks, key=_order)
    infra = sorted(infras, key=_order)
    shots = sorted(images, key=_order)

    intervals: Counter[str] = Counter()
    gaps: list[Gap] = []
    for prev, cur in itertools.pairwise(states):
        dt = (cur.meta.event_time - prev.meta.event_time).total_seconds()
        if dt > params.gap_s:
            gaps.append(Gap(start=prev.meta.event_time, end=cur.meta.event_time))
        else:
            intervals[str(round(dt / INTERVAL_RESOLUTION_S))] += 1

    sensor_values: defaultdict[str, list[float]] = defaultdict(list)
    labels: defaultdict[str, list[tuple[float, str]]] = defaultdict(list)
    for fs in states:
        for name, value in fs.sensors.items():
            sensor_values[name].append(value)
        for d in fs.detections:
            labels[d.label].append((d.confidence, d.camera_id))

    names: Any = _Everything() if all_sensors else sensor_values
    out_of_range: Counter[str] = Counter()
    for rr in rated:
        hit = {s for r in rr.risk.reasons if (s := _sensor_of(r, names)) is not None}
        out_of_range.update(hit)

    infra_values = _infra_values(infra)
    infra_fold = _fold_infra(infra, infra_values)
    exact = {f"sensors.{n}": _exact(v) for n, v in sorted(sensor_values.items())} | {
        f"infra.{n}": _exact(v) for n, v in sorted(infra_values.items())
    }
    body = {
        "factory_records": len(states),
        "first_at": states[0].meta.event_time if states else None,
        "last_at": states[-1].meta.event_time if states else None,
        "intervals": dict(sorted(intervals.items())),
        "gaps": gaps,
        "sensors": {n: series(v, params.alpha) for n, v in sorted(sensor_values.items())},
        "out_of_range": dict(sorted(out_of_range.items())),
        "detections": {
            label: LabelFold(
                count=len(found),
                max_confidence=max(c for c, _ in found),
                cameras=dict(sorted(Counter(cam for _, cam in found).items())),
            )
            for label, found in sorted(labels.items())
        },
        "risk_records": len(rated),
        "max_score": max((r.risk.score for r in rated), default=None),
        "worst_level": Level.worst(*(r.risk.level for r in rated)) if rated else None,
        "runs": runs_of(
            Point(r.meta.event_time, r.risk.level, r.risk.score, r.risk.reasons) for r in rated
        ),
        "infra_records": len(infra),
        **infra_fold,
        "images": len(shots),
        "image_bytes": sum(s.size_bytes for s in shots),
        "image_cameras": dict(sorted(Counter(s.camera_id for s in shots).items())),
    }
    return body, exact


def fold_factory_hour(
    *,
    target: str,
    report_date: date,
    kst_hour: int,
    utc_hour: datetime,
    params: FoldParams,
    listing: InputListing,
    factory_states: Iterable[FactoryState],
    risks: Iterable[RiskRecord],
    infras: Iterable[InfraState],
    images: Iterable[ImageSnapshotRef],
    skipped: int = 0,
) -> FactoryHour:
    """One hour of one factory, from its records."""
    body, _ = _factory_body(factory_states, risks, infras, images, params)
    return FactoryHour(
        target=target,
        report_date=report_date,
        kst_hour=kst_hour,
        utc_hour=utc_hour,
        params=params,
        input=listing,
        skipped=skipped,
        **body,
    )


# -- 5-minute windows ---------------------------------------------------------------------------


class InputEntry(_Model):
    """One processed/ object a window was folded from."""

    dataset: str
    key: str
    etag: str


class FactoryWindow(FactoryRecords):
    """One factory's records of one 5-minute window of event time ``[start, end)``: what an
    hourly fold needs, kept by the aggregator in the window's processed_agg/ object. Its series
    carry exact sums (``exact``) so that twelve windows merge into exactly the hour's fold
    (:func:`hour_from_windows`); ``inputs`` are the objects it was made from, so a reader can tell
    whether the window is current against a listing of its hour."""

    kind: Literal["factory-window"] = "factory-window"
    factory_id: str
    window_start: Timestamp
    window_end: Timestamp
    params: FoldParams
    inputs: list[InputEntry] = []
    skipped: int = 0
    exact: dict[str, str] = {}


def fold_factory_window(
    *,
    factory_id: str,
    start: datetime,
    end: datetime,
    params: FoldParams,
    inputs: Iterable[InputEntry],
    factory_states: Iterable[FactoryState],
    risks: Iterable[RiskRecord],
    infras: Iterable[InfraState],
    images: Iterable[ImageSnapshotRef],
    skipped: int = 0,
) -> FactoryWindow:
    """One window of one factory, from its records (the same definitions as an hour)."""
    body, exact = _factory_body(factory_states, risks, infras, images, params, all_sensors=True)
    return FactoryWindow(
        factory_id=factory_id,
        window_start=start,
        window_end=end,
        params=params,
        inputs=sorted(inputs, key=lambda e: (e.key, e.etag)),
        skipped=skipped,
        exact=exact,
        **body,
    )


def _merge_series(items: Sequence[tuple[Series, str]]) -> Series:
    """Series of consecutive spans with their exact sums, as one span's series."""
    sketches = [s.sketch for s, _ in items if s.sketch is not None]
    merged = None
    if sketches:
        merged = sketches[0].sketch()
        for other in sketches[1:]:
            merged.merge(other.sketch())
    total = sum((Fraction(exact) for _, exact in items), Fraction(0))
    return Series(
        count=sum(s.count for s, _ in items),
        min=min(s.min for s, _ in items),
        max=max(s.max for s, _ in items),
        sum=float(total),
        sketch=None if merged is None else SketchData.of(merged),
    )


def added_counts(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counts by name summed over ``counts``, names in order (the merge of any counted field
    of windows, hours or days)."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update(c)
    return dict(sorted(total.items()))


def hour_from_windows(
    windows: Iterable[FactoryWindow],
    *,
    target: str,
    report_date: date,
    kst_hour: int,
    utc_hour: datetime,
    params: FoldParams,
    listing: InputListing,
) -> FactoryHour:
    """The hour's fold from the folds of its windows: equal to :func:`fold_factory_hour` over
    the same records (intervals and gaps across window boundaries are rebuilt from each
    window's first and last record; sums are exact; sketches merge bin by bin)."""
    ordered = sorted(windows, key=lambda w: w.window_start)
    if any(w.params != params for w in ordered):
        raise ValueError("windows folded with other parameters do not merge into this hour")
    intervals, gaps = _joined_timeline(ordered, params)
    sensors = _merged_series(ordered, "sensors")
    runs: list[Run] = []
    for run in (run for w in ordered for run in w.runs):
        runs = append_run(runs, run)
    with_states = [w for w in ordered if w.factory_records]
    scores = [w.max_score for w in ordered if w.max_score is not None]
    levels = [w.worst_level for w in ordered if w.worst_level is not None]
    out_of_range = added_counts(w.out_of_range for w in ordered)
    return FactoryHour(
        target=target,
        report_date=report_date,
        kst_hour=kst_hour,
        utc_hour=utc_hour,
        params=params,
        input=listing,
        skipped=sum(w.skipped for w in ordered),
        factory_records=sum(w.factory_records for w in ordered),
        first_at=with_states[0].first_at if with_states else None,
        last_at=with_states[-1].last_at if with_states else None,
        intervals=intervals,
        gaps=gaps,
        sensors=sensors,
        out_of_range={n: c for n, c in out_of_range.items() if n in sensors},
        detections=_merged_detections(ordered),
        risk_records=sum(w.risk_records for w in ordered),
        max_score=max(scores) if scores else None,
        worst_level=Level.worst(*levels) if levels else None,
        runs=runs,
        infra_records=sum(w.infra_records for w in ordered),
        infra=_merged_series(ordered, "infra"),
        camera_observations=added_counts(w.camera_observations for w in ordered),
        camera_offline=added_counts(w.camera_offline for w in ordered),
        pipeline_not_ok=added_counts(w.pipeline_not_ok for w in ordered),
        images=sum(w.images for w in ordered),
        image_bytes=sum(w.image_bytes for w in ordered),
        image_cameras=added_counts(w.image_cameras for w in ordered),
    )


def _joined_timeline(
    ordered: Sequence[FactoryWindow], params: FoldParams
) -> tuple[dict[str, int], list[Gap]]:
    """The hour's intervals and gaps: each window's own, and the step from one window's last
    record to the next one's first (a gap when longer than ``gap_s``)."""
    intervals: Counter[str] = Counter()
    gaps: list[Gap] = []
    last: datetime | None = None
    for w in ordered:
        if not w.factory_records:
            continue
        assert w.first_at is not None and w.last_at is not None
        if last is not None:
            dt = (w.first_at - last).total_seconds()
            if dt > params.gap_s:
                gaps.append(Gap(start=last, end=w.first_at))
            else:
                intervals[str(round(dt / INTERVAL_RESOLUTION_S))] += 1
        intervals.update(w.intervals)
        gaps.extend(w.gaps)
        last = w.last_at
    return dict(sorted(intervals.items())), gaps


def _merged_series(ordered: Sequence[FactoryWindow], field: str) -> dict[str, Series]:
    """The windows' series of ``field`` (``sensors`` or ``infra``) merged name by name."""
    names = sorted({n for w in ordered for n in getattr(w, field)})
    return {
        n: _merge_series(
            [
                (getattr(w, field)[n], w.exact[f"{field}.{n}"])
                for w in ordered
                if n in getattr(w, field)
            ]
        )
        for n in names
    }


def _merged_detections(ordered: Sequence[FactoryWindow]) -> dict[str, LabelFold]:
    """The windows' detections merged label by label: counts added, the highest confidence."""
    merged: dict[str, LabelFold] = {}
    for label in sorted({label for w in ordered for label in w.detections}):
        folds = [w.detections[label] for w in ordered if label in w.detections]
        merged[label] = LabelFold(
            count=sum(f.count for f in folds),
            max_confidence=max(f.max_confidence for f in folds),
            cameras=added_counts(f.cameras for f in folds),
        )
    return merged


def _worse_value(check: CheckFold, value: float | None, at: datetime) -> CheckFold:
    if value is None or (check.worst_value is not None and value <= check.worst_value):
        return check
    return check.model_copy(update={"worst_value": value, "worst_at": at})


def fold_cloud_hour(
    *,
    target: str,
    report_date: date,
    kst_hour: int,
    utc_hour: datetime,
    params: FoldParams,
    listing: InputListing,
    snapshots: Iterable[CloudSnapshot],
    skipped: int = 0,
) -> CloudHour:
    """One hour of the cloud collectors' runs (both tiers)."""
    ordered = sorted(snapshots, key=lambda s: (s.tier, s.updated_at))
    tiers: dict[str, TierFold] = {}
    checks: dict[str, CheckFold] = {}
    drift: dict[str, DriftFold] = {}
    for tier in sorted({s.tier for s in ordered}):
        runs = [s for s in ordered if s.tier == tier]
        tiers[tier] = TierFold(
            snapshots=len(runs),
            status_counts=dict(sorted(Counter(s.status.value for s in runs).items())),
            first_at=runs[0].updated_at,
            last_at=runs[-1].updated_at,
            runs=runs_of(Point(s.updated_at, s.status, None, s.reasons) for s in runs),
        )
    for snap in sorted(ordered, key=lambda s: (s.updated_at, s.tier)):
        for c in snap.checks:
            fold = checks.get(c.name) or CheckFold(runs=0, ok=0, warning=0, critical=0, unit=c.unit)
            fold = fold.model_copy(
                update={
                    "runs": fold.runs + 1,
                    "ok": fold.ok + (c.status is Level.NORMAL),
                    "warning": fold.warning + (c.status is Level.WARNING),
                    "critical": fold.critical + (c.status is Level.CRITICAL),
                    "unit": fold.unit or c.unit,
                    "reasons": fold.reasons
                    if c.status is Level.NORMAL
                    else dict(
                        sorted(
                            {**fold.reasons, c.reason: fold.reasons.get(c.reason, 0) + 1}.items()
                        )
                    ),
                }
            )
            checks[c.name] = _worse_value(fold, c.value, snap.updated_at)
            if c.name.startswith("foundation") and c.status is not Level.NORMAL:
                old = drift.get(c.name)
                drift[c.name] = DriftFold(
                    first_at=old.first_at if old else snap.updated_at,
                    last_at=snap.updated_at,
                    runs=(old.runs if old else 0) + 1,
                    detail=c.detail or c.reason,
                )
    return CloudHour(
        target=target,
        report_date=report_date,
        kst_hour=kst_hour,
        utc_hour=utc_hour,
        params=params,
        input=listing,
        skipped=skipped,
        tiers=tiers,
        checks=dict(sorted(checks.items())),
        drift=dict(sorted(drift.items())),
    )
