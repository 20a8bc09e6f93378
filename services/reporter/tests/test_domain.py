"""The reporter's pure parts: the sketch against exact quantiles, hourly folds, runs joined
across hours, incidents, completeness (gaps, missing hours), KST bounds and the template."""

from __future__ import annotations

import math
import random
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis_contracts.state import FactoryState, Level, Reason, RiskRecord
from aegis_devstack.testing.builders import meta
from aegis_folds.folds import (
    FactoryHour,
    FoldParams,
    Point,
    fold_factory_hour,
    listing_of,
    runs_of,
)
from aegis_folds.sketch import QuantileSketch
from aegis_reporter.day import (
    DayWindow,
    completeness,
    day_runs,
    factory_summary,
    incidents,
    report_context,
)
from aegis_reporter.markdown import duration, render, sparkline

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)
PARAMS = FoldParams(gap_s=60.0, alpha=0.005)


def exact_quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=300,
    ),
    st.integers(min_value=1, max_value=5),
    st.sampled_from([0.0, 0.5, 0.95, 1.0]),
)
def test_merged_sketches_answer_within_their_relative_error(
    values: list[float], parts: int, q: float
) -> None:
    merged = QuantileSketch()
    for i in range(parts):
        merged.merge(QuantileSketch.from_json(QuantileSketch.of(values[i::parts]).to_json()))
    exact = exact_quantile(values, q)
    got = merged.quantile(q)
    assert got is not None
    assert abs(got - exact) <= 0.005 * abs(exact) * (1 + 1e-9) + 1e-9


def test_sketch_size_does_not_grow_with_the_values() -> None:
    rng = random.Random(1)
    sketch = QuantileSketch.of(rng.uniform(10, 100) for _ in range(100_000))
    assert sketch.count == 100_000
    assert len(sketch.pos) <= math.ceil(math.log(10) / math.log(1.005 / 0.995)) + 1


def risk(i: int, at: datetime, level: Level, score: float, co: float | None = None) -> RiskRecord:
    reasons = []
    if level is not Level.NORMAL:
        reasons.append(
            Reason(
                code="CO_HIGH",
                severity=level.value,  # type: ignore[arg-type]
                detail=f"co_ppm {co:g} ppm >= threshold",
                value=co,
                threshold=35.0,
            )
        )
    return RiskRecord.model_validate(
        {
            "meta": meta(f"msg-{i:08d}", at),
            "risk": {"score": score, "level": level, "reasons": reasons},
        }
    )


def state(i: int, at: datetime, co: float) -> FactoryState:
    return FactoryState.model_validate(
        {"meta": meta(f"msg-{i:08d}", at), "sensors": {"co_ppm": co}}
    )


def hour(kst_hour: int, levels: list[tuple[int, Level, float]]) -> FactoryHour:
    """A fold of records at ``(second of the hour, level, co)``."""
    base = START + timedelta(hours=kst_hour)
    records = [(base + timedelta(seconds=s), lvl, co) for s, lvl, co in levels]
    return fold_factory_hour(
        target="f",
        report_date=DAY,
        kst_hour=kst_hour,
        utc_hour=base,
        params=PARAMS,
        listing=listing_of(("factory_state", f"k{i}", "e") for i in range(len(records))),
        factory_states=[state(i, at, co) for i, (at, _, co) in enumerate(records)],
        risks=[
            risk(
                i, at, lvl, {"NORMAL": 0, "WARNING": 40, "CRITICAL": 90}[lvl.value] + co / 1000, co
            )
            for i, (at, lvl, co) in enumerate(records)
        ],
        infras=[],
        images=[],
    )


N, W, C = Level.NORMAL, Level.WARNING, Level.CRITICAL


def test_an_incident_across_an_hour_boundary_is_one_incident() -> None:
    h0 = hour(0, [(0, N, 1), (3540, W, 50), (3570, C, 250)])
    h1 = hour(1, [(0, C, 300), (30, W, 60), (60, N, 2)])
    found = [i.facts() for i in incidents(day_runs([h0.runs, h1.runs]), START + timedelta(days=1))]
    assert len(found) == 1
    inc = found[0]
    assert inc["level"] == "CRITICAL"
    assert inc["start_kst"] == "2026-11-30T00:59:00.000+09:00"
    assert inc["end_kst"] == "2026-11-30T01:01:00.000+09:00"
    assert inc["duration_s"] == 120
    assert inc["records"] == 4
    assert inc["peak_score"] == pytest.approx(90.3)
    assert inc["reasons"][0]["peak_value"] == 300
    assert [(c["start_kst"][11:19], c["end_kst"][11:19]) for c in inc["critical_periods"]] == [
        ("00:59:30", "01:00:30")
    ]


def test_an_incident_still_open_at_the_end_is_ongoing() -> None:
    h = hour(23, [(0, N, 1), (60, W, 40)])
    end = START + timedelta(days=1)
    (inc,) = [i.facts() for i in incidents(h.runs, end)]
    assert inc["ongoing"] and inc["end_kst"] is None
    assert inc["duration_s"] == 3600 - 60


def test_runs_join_only_equal_levels() -> None:
    t = START
    runs = runs_of(
        Point(t + timedelta(seconds=i), lvl, 0.0, []) for i, lvl in enumerate([N, N, W, W, N])
    )
    assert [(r.level, r.records) for r in runs] == [(N, 2), (W, 2), (N, 1)]


def test_completeness_lists_gaps_and_missing_hours_never_zeros() -> None:
    h0 = hour(0, [(s, N, 1) for s in range(0, 3600, 30)])
    h2 = hour(2, [(s, N, 1) for s in range(0, 1200, 30)] + [(1800, N, 1)])
    window = DayWindow.of(DAY, START + timedelta(hours=2, minutes=59, seconds=59))
    c = completeness({0: h0, 2: h2}, window, gap_s=60, offline_s=300, cadence_s=None).facts()
    assert c["missing_hours"] == [1]
    assert c["received"] == 120 + 41
    assert c["cadence_s"] == 30
    assert c["expected"] == round(10_799 / 30)
    spans = [(g["start_kst"][11:19], g["end_kst"][11:19], g["kind"]) for g in c["gaps"]]
    assert spans == [
        ("00:59:30", "02:00:00", "offline"),
        ("02:19:30", "02:30:00", "offline"),
        ("02:30:00", "02:59:59", "offline"),
    ]
    summary = factory_summary(
        "f", window, {0: h0, 2: h2}, PARAMS, offline_s=300, cadence_s=None
    ).facts()
    statuses = [r["status"] for r in summary["timeline"]]
    assert statuses[:3] == ["ok", "missing", "ok"] and set(statuses[3:]) == {"future"}
    assert "max_score" not in summary["timeline"][1]


def test_kst_day_window_bounds() -> None:
    w = DayWindow.of(DAY)
    assert w.start == datetime(2026, 11, 29, 15, tzinfo=UTC)
    assert w.end == datetime(2026, 11, 30, 15, tzinfo=UTC)
    assert w.complete and all(w.hour_started(h) for h in range(24))
    today = DayWindow.of(DAY, datetime(2026, 11, 29, 17, 30, tzinfo=UTC))
    assert not today.complete
    assert [h for h in range(24) if today.hour_started(h)] == [0, 1, 2]


def test_the_template_is_deterministic_and_shows_missing_hours() -> None:
    h0 = hour(0, [(0, N, 1), (60, W, 50), (120, N, 1)])
    window = DayWindow.of(DAY)
    context = report_context(
        factory_summary("f", window, {0: h0}, PARAMS, offline_s=300, cadence_s=5.0).facts()
    )
    text = render(context)
    assert text == render(context)
    assert text.startswith("# Daily report f: 2026-11-30 (KST)\n\n**Status: WARNING**")
    for section in ("## Incidents", "## Sensors", "## Data completeness", "## Edge infrastructure"):
        assert section in text
    assert "| 1 | WARNING | 00:01:00 (15:01:00Z) | 00:02:00 (15:02:00Z) | 1m 00s |" in text
    assert "missing KST hours (no objects at all): 01, 02, 03" in text
    assert sparkline([0.0, 50.0, None, 100.0]) == "▁▅·█"
    assert duration(3725) == "1h 02m 05s" and duration(12.5) == "12.5s"


def test_a_threshold_reason_names_its_sensor_by_source_or_by_older_detail() -> None:
    from aegis_contracts.state import Reason  # noqa: PLC0415
    from aegis_folds.folds import _sensor_of  # noqa: PLC0415

    sensors = {"co_ppm", "temperature_c"}
    new = Reason(
        code="CO_HIGH",
        severity="WARNING",
        detail="co_ppm 60 ppm >= warning threshold 50 ppm",
        value=60,
        source="sensors.co_ppm",
    )
    old = Reason(
        code="CO_HIGH",
        severity="WARNING",
        detail="co_ppm 60 ppm >= warning threshold 50 ppm",
        value=60,
    )
    camera = Reason(
        code="FIRE_DETECTED",
        severity="CRITICAL",
        detail="fire detected by cam-1",
        value=0.9,
        source="cam-1",
    )
    assert _sensor_of(new, sensors) == "co_ppm" and _sensor_of(old, sensors) == "co_ppm"
    assert _sensor_of(camera, sensors) is None
