"""The statistics of one 5-minute window, from its state snapshots (pure, no I/O): HISTORY#STATE
items or state_snapshot objects, the same LATEST fields either way.

The definitions are those of :mod:`aegis_contracts.graph`. The result depends only on the
snapshots and the window, never on when it is computed, so a re-run writes the same bytes.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from aegis_contracts.graph import LabelStats, RiskStats, SeriesStats, WindowStats
from aegis_contracts.items import FactoryLatest
from aegis_contracts.state import FactoryState, InfraState, Level

R = TypeVar("R", FactoryState, InfraState)

# the edge host and network figures the window keeps (from infra_state)
INFRA_SERIES = ("cpu_pct", "mem_pct", "disk_pct", "temperature_c", "rtt_ms", "loss_pct")


def series(values: Sequence[float]) -> SeriesStats:
    """``values`` in record order (the last one is ``last``); at least one."""
    return SeriesStats(
        count=len(values),
        min=min(values),
        max=max(values),
        avg=math.fsum(values) / len(values),
        last=values[-1],
    )


def _distinct(records: Iterable[R | None]) -> list[R]:
    """Each device record once (it repeats in every snapshot until the next one), in event order."""
    seen: dict[str, R] = {}
    for record in records:
        if record is not None:
            seen.setdefault(record.meta.message_id, record)
    return sorted(seen.values(), key=lambda r: (r.meta.event_time, r.meta.message_id))


def coverage(
    event_times: Iterable[datetime], start: datetime, end: datetime, fresh_for: timedelta
) -> float:
    """Share of ``[start, end)`` inside the union of ``[t, t + fresh_for)``."""
    covered = timedelta(0)
    reach = start  # everything before ``reach`` is already counted
    for t in sorted(event_times):
        lo, hi = max(t, reach), min(t + fresh_for, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered / (end - start)


def _risk(snapshots: Sequence[FactoryLatest], end: datetime) -> RiskStats | None:
    rated = [s for s in snapshots if s.risk is not None and s.updated_at is not None]
    if not rated:
        return None
    seconds: dict[Level, float] = dict.fromkeys(Level, 0.0)
    weighted: list[float] = []
    for i, snap in enumerate(rated):
        assert snap.risk is not None and snap.updated_at is not None
        until = rated[i + 1].updated_at if i + 1 < len(rated) else end
        assert until is not None
        held = (until - snap.updated_at).total_seconds()
        seconds[snap.risk.level] += held
        weighted.append(held * snap.risk.score)
    total = math.fsum(seconds.values())
    return RiskStats(
        max_score=max(s.risk.score for s in rated if s.risk is not None),
        mean_score=math.fsum(weighted) / total if total > 0 else None,
        worst_level=Level.worst(*(s.risk.level for s in rated if s.risk is not None)),
        seconds_at_level=seconds,
        reasons=sorted({r.code for s in rated if s.risk is not None for r in s.risk.reasons}),
    )


def window_stats(
    snapshots: Iterable[FactoryLatest],
    start: datetime,
    end: datetime,
    *,
    fresh_for: timedelta = timedelta(seconds=60),
) -> WindowStats:
    """Statistics of ``[start, end)``; snapshots outside it (or without ``updated_at``) are
    ignored, so a caller may pass a wider read."""
    inside = sorted(
        (s for s in snapshots if s.updated_at is not None and start <= s.updated_at < end),
        key=lambda s: s.updated_at or start,
    )
    factory = _distinct(s.factory_state for s in inside)
    infra = _distinct(s.infra_state for s in inside)

    sensor_values: defaultdict[str, list[float]] = defaultdict(list)
    labels: defaultdict[str, list[float]] = defaultdict(list)
    for fs in factory:
        for name, value in fs.sensors.items():
            sensor_values[name].append(value)
        for detection in fs.detections:
            labels[detection.label].append(detection.confidence)

    infra_values: defaultdict[str, list[float]] = defaultdict(list)
    camera_seen: Counter[str] = Counter()
    camera_online: Counter[str] = Counter()
    for inf in infra:
        figures = {**inf.host.model_dump(), **inf.network.model_dump()}
        for name in INFRA_SERIES:
            if (figure := figures.get(name)) is not None:
                infra_values[name].append(float(figure))
        for camera, state in inf.cameras.items():
            camera_seen[camera] += 1
            camera_online[camera] += state == "online"
    observations = sum(camera_seen.values())

    return WindowStats(
        window_start=start,
        window_end=end,
        samples=len(inside),
        first_sample_at=inside[0].updated_at if inside else None,
        last_sample_at=inside[-1].updated_at if inside else None,
        factory_records=len(factory),
        infra_records=len(infra),
        coverage=coverage((r.meta.event_time for r in factory), start, end, fresh_for),
        sensors={name: series(v) for name, v in sorted(sensor_values.items())},
        detections={
            label: LabelStats(count=len(c), max_confidence=max(c))
            for label, c in sorted(labels.items())
        },
        risk=_risk(inside, end),
        infra={name: series(v) for name, v in sorted(infra_values.items())},
        camera_online_ratio=sum(camera_online.values()) / observations if observations else None,
        cameras={c: camera_online[c] / n for c, n in sorted(camera_seen.items())},
        pipeline_states=dict(
            sorted(
                Counter(s.pipeline_status.status.value for s in inside if s.pipeline_status).items()
            )
        ),
    )
