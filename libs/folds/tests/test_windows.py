"""Twelve 5-minute window folds merge into exactly the hourly fold of the same records, whatever
the records: times on and across window boundaries, ties, gaps, level runs crossing windows,
sums whose rounding depends on the order they are added in, sensors a reason names that a
window does not have."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aegis_contracts.state import FactoryState, ImageSnapshotRef, InfraState, Level, RiskRecord
from aegis_contracts.times import floor_to, format_ts
from aegis_devstack.testing.builders import meta
from aegis_folds.folds import (
    FactoryWindow,
    FoldParams,
    InputEntry,
    fold_factory_hour,
    fold_factory_window,
    hour_from_windows,
    listing_of,
)

HOUR = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=5)
PARAMS = FoldParams(gap_s=60.0, alpha=0.005)
SENSORS = ("co_ppm", "temperature_c", "noise_db")


def storable(floats: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    """Numbers the read model can hold (0, or 1e-130 and more in magnitude; the contracts refuse
    the rest), as device values are."""
    return floats.map(lambda v: v if v == 0 or abs(v) >= 1e-130 else 0.0)


values = storable(st.floats(min_value=-1e3, max_value=1e5, allow_nan=False, allow_infinity=False))
ms = st.integers(min_value=0, max_value=3_599_999).map(lambda n: HOUR + timedelta(milliseconds=n))
# on a window boundary exactly, or a millisecond either side of one
edge = st.integers(min_value=0, max_value=11).flatmap(
    lambda w: st.sampled_from([-1, 0, 1]).map(
        lambda d: max(HOUR, HOUR + w * WINDOW + timedelta(milliseconds=d))
    )
)
moment = st.one_of(ms, edge)


@st.composite
def factory_records(draw: st.DrawFn) -> tuple[list[FactoryState], list[RiskRecord]]:
    n = draw(st.integers(min_value=0, max_value=60))
    states, risks = [], []
    for i in range(n):
        at = draw(moment)
        mid = f"msg-{i:08d}"
        sensors = draw(st.dictionaries(st.sampled_from(SENSORS), values, max_size=3))
        detections = [
            {"label": label, "confidence": conf, "camera_id": cam}
            for label, conf, cam in draw(
                st.lists(
                    st.tuples(
                        st.sampled_from(["fire", "smoke", "no_helmet"]),
                        st.floats(min_value=0, max_value=1),
                        st.sampled_from(["cam-1", "cam-2"]),
                    ),
                    max_size=2,
                )
            )
        ]
        states.append(
            FactoryState.model_validate(
                {"meta": meta(mid, at), "sensors": sensors, "detections": detections}
            )
        )
        level = draw(st.sampled_from(list(Level)))
        reasons = []
        if level is not Level.NORMAL:
            # a reason may name a sensor this record does not carry (its window may not have it)
            name = draw(st.sampled_from(SENSORS))
            reasons.append(
                {
                    "code": f"{name.upper()}_HIGH",
                    "severity": level.value,
                    "detail": f"{name} high",
                    "value": draw(values),
                    "threshold": 35.0,
                    "source": f"sensors.{name}",
                }
            )
        risks.append(
            RiskRecord.model_validate(
                {
                    "meta": meta(mid, at),
                    "risk": {"score": draw(st.floats(0, 100)), "level": level, "reasons": reasons},
                }
            )
        )
    return states, risks


@st.composite
def infra_records(draw: st.DrawFn) -> list[InfraState]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=20))):
        at = draw(moment)
        out.append(
            InfraState.model_validate(
                {
                    "meta": meta(f"inf-{i:08d}", at),
                    "host": {"cpu_pct": draw(st.floats(0, 100)), "temperature_c": draw(values)},
                    "network": {"rtt_ms": draw(storable(st.floats(0, 1e4)))},
                    "cameras": {"cam-1": draw(st.sampled_from(["online", "offline"]))},
                    "pipeline": {"detector": draw(st.sampled_from(["ok", "degraded", "down"]))},
                }
            )
        )
    return out


@st.composite
def image_records(draw: st.DrawFn) -> list[ImageSnapshotRef]:
    out = []
    for i in range(draw(st.integers(min_value=0, max_value=5))):
        at = draw(moment)
        out.append(
            ImageSnapshotRef.model_validate(
                {
                    "meta": meta(f"img-{i:08d}", at),
                    "camera_id": "cam-1",
                    "filename": f"{i}.jpg",
                    "content_type": "image/jpeg",
                    "size_bytes": draw(st.integers(1, 10**6)),
                    "captured_at": format_ts(at),
                    "s3_key": f"image_snapshot/factory_id=f/{i}.jpg",
                }
            )
        )
    return out


def windows_of(
    states: list[FactoryState],
    risks: list[RiskRecord],
    infras: list[InfraState],
    images: list[ImageSnapshotRef],
    skipped: int,
) -> list[FactoryWindow]:
    by_window: defaultdict[datetime, dict[str, list[Any]]] = defaultdict(
        lambda: {"s": [], "r": [], "i": [], "m": []}
    )
    for kind, records in (("s", states), ("r", risks), ("i", infras), ("m", images)):
        for r in records:
            by_window[floor_to(r.meta.event_time, WINDOW)][kind].append(r)
    starts = sorted(by_window) or [HOUR]
    return [
        fold_factory_window(
            factory_id="f",
            start=start,
            end=start + WINDOW,
            params=PARAMS,
            inputs=[InputEntry(dataset="factory_state", key=f"k{start}", etag="e")],
            factory_states=by_window[start]["s"],
            risks=by_window[start]["r"],
            infras=by_window[start]["i"],
            images=by_window[start]["m"],
            skipped=skipped if start == starts[-1] else 0,
        )
        for start in starts
    ]


@settings(max_examples=60, deadline=None)
@given(
    factory=factory_records(),
    infras=infra_records(),
    images=image_records(),
    skipped=st.integers(min_value=0, max_value=3),
)
def test_windows_merge_into_exactly_the_hour_of_the_same_records(
    factory: tuple[list[FactoryState], list[RiskRecord]],
    infras: list[InfraState],
    images: list[ImageSnapshotRef],
    skipped: int,
) -> None:
    states, risks = factory
    listing = listing_of(("factory_state", f"k{i}", "e") for i in range(len(states)))
    identity: dict[str, Any] = {
        "target": "f",
        "report_date": date(2026, 11, 30),
        "kst_hour": 14,
        "utc_hour": HOUR,
        "params": PARAMS,
        "listing": listing,
    }
    expected = fold_factory_hour(
        **identity,
        factory_states=states,
        risks=risks,
        infras=infras,
        images=images,
        skipped=skipped,
    )
    windows = windows_of(states, risks, infras, images, skipped)
    # stored and read back, as the aggregator and the reporter exchange them
    stored = [FactoryWindow.model_validate_json(w.model_dump_json()) for w in windows]
    merged = hour_from_windows(stored, **identity)
    assert merged.model_dump(mode="json") == expected.model_dump(mode="json")


def test_sums_are_exact_where_adding_window_by_window_would_round_differently() -> None:
    # 1e16 + 1 + 1 ... : float sums of partial sums lose the ones; the exact sums do not
    big, small = 1e16, 1.0
    at = [HOUR + timedelta(minutes=m) for m in (0, 1, 6, 7)]
    vals = [big, small, small, -big]
    states = [
        FactoryState.model_validate({"meta": meta(f"m{i}", t), "sensors": {"co_ppm": v}})
        for i, (t, v) in enumerate(zip(at, vals, strict=True))
    ]
    identity: dict[str, Any] = {
        "target": "f",
        "report_date": date(2026, 11, 30),
        "kst_hour": 14,
        "utc_hour": HOUR,
        "params": PARAMS,
        "listing": listing_of([]),
    }
    hour = fold_factory_hour(**identity, factory_states=states, risks=[], infras=[], images=[])
    merged = hour_from_windows(windows_of(states, [], [], [], 0), **identity)
    assert merged.sensors["co_ppm"].sum == hour.sensors["co_ppm"].sum == 2.0


def test_windows_of_other_parameters_are_refused() -> None:
    window = fold_factory_window(
        factory_id="f",
        start=HOUR,
        end=HOUR + WINDOW,
        params=FoldParams(gap_s=30.0, alpha=0.005),
        inputs=[],
        factory_states=[],
        risks=[],
        infras=[],
        images=[],
    )
    with pytest.raises(ValueError, match="other parameters"):
        hour_from_windows(
            [window],
            target="f",
            report_date=date(2026, 11, 30),
            kst_hour=14,
            utc_hour=HOUR,
            params=PARAMS,
            listing=listing_of([]),
        )
