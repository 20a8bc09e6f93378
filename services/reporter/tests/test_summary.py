"""The written form of a summary's typed facts: times as KST and UTC texts, fields with a
default only when given, and a cloud day whose every part is filled written as its contract
says."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from pydantic import ValidationError

from aegis_contracts.state import Level
from aegis_folds.folds import (
    CheckFold,
    CloudHour,
    DriftFold,
    FoldParams,
    Run,
    TierFold,
    listing_of,
)
from aegis_reporter.day import DayWindow, cloud_summary
from aegis_reporter.summary import CheckFigures, FactoryHourRow, Period, SeriesFigures

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)


def test_a_time_is_written_as_its_kst_and_utc_texts_and_null_both_without_one() -> None:
    period = Period(start=START, end=None, duration_s=60.0, ongoing=True)
    assert period.facts() == {
        "start_kst": "2026-11-30T00:00:00.000+09:00",
        "start_utc": "2026-11-29T15:00:00.000Z",
        "end_kst": None,
        "end_utc": None,
        "duration_s": 60.0,
        "ongoing": True,
    }


def test_a_field_with_a_default_is_written_only_when_given() -> None:
    bare = FactoryHourRow(kst_hour=1, start=START, status="missing")
    assert set(bare.facts()) == {"kst_hour", "start_kst", "start_utc", "status"}
    folded = FactoryHourRow(
        kst_hour=0,
        start=START,
        status="ok",
        factory_records=3,
        risk_records=3,
        worst_level=None,
        max_score=None,
    )
    assert folded.facts()["worst_level"] is None and "max_score" in folded.facts()
    assert "p95" not in SeriesFigures(count=1, min=1, avg=1, max=1).facts()
    assert SeriesFigures(count=1, min=1, avg=1, max=1, p95=None).facts()["p95"] is None


def test_a_summary_part_refuses_a_field_it_does_not_declare() -> None:
    with pytest.raises(ValidationError):
        CheckFigures.model_validate(
            {
                "runs": 1,
                "ok": 1,
                "warning": 0,
                "critical": 0,
                "availability": 1.0,
                "unit": None,
                "worst_value": None,
                "worst": None,
                "reasons": {},
                "latency": 3,
            }
        )


def test_a_cloud_day_with_every_part_is_written_as_its_contract_says() -> None:
    at = START + timedelta(minutes=5)
    runs = [
        Run(level=Level.NORMAL, first_at=START, last_at=at, records=2),
        Run(
            level=Level.CRITICAL,
            first_at=at + timedelta(minutes=1),
            last_at=at + timedelta(minutes=2),
            records=2,
        ),
    ]
    hour = CloudHour(
        target="cloud-infra",
        report_date=DAY,
        kst_hour=0,
        utc_hour=START,
        params=FoldParams(gap_s=60.0, alpha=0.005),
        input=listing_of([]),
        tiers={
            "fast": TierFold(
                snapshots=4,
                status_counts={"NORMAL": 2, "CRITICAL": 2},
                first_at=START,
                last_at=at + timedelta(minutes=2),
                runs=runs,
            )
        },
        checks={
            "storage:s3": CheckFold(
                runs=4,
                ok=3,
                warning=0,
                critical=1,
                unit="ms",
                worst_value=950.0,
                worst_at=at,
                reasons={"SLOW": 1},
            ),
        },
        drift={
            "bucket:raw": DriftFold(first_at=START, last_at=at, runs=2, detail="versioning off")
        },
    )
    facts = cloud_summary("cloud-infra", DayWindow.of(DAY), {0: hour}).facts()
    assert facts["kind"] == "cloud-infra" and facts["timezone"] == "KST (UTC+09:00)"
    assert facts["headline"] == {
        "worst_level": "CRITICAL",
        "incidents": 1,
        "critical_incidents": 1,
        "checks_below_full_availability": 1,
        "drift_found": True,
        "missing_hours": 23,
    }
    assert facts["timeline"][0] == {
        "kst_hour": 0,
        "start_kst": "2026-11-30T00:00:00.000+09:00",
        "start_utc": "2026-11-29T15:00:00.000Z",
        "status": "ok",
        "snapshots": {"fast": 4},
        "worst_level": "CRITICAL",
    }
    assert set(facts["timeline"][1]) == {"kst_hour", "start_kst", "start_utc", "status"}
    (incident,) = facts["incidents"]
    assert incident["tier"] == "fast" and incident["ongoing"] is True
    assert incident["start_utc"] == "2026-11-29T15:06:00.000Z" and incident["end_utc"] is None
    assert facts["worst_latencies"] == [
        {"check": "storage:s3", "worst_ms": 950.0, "worst_kst": "2026-11-30T00:05:00.000+09:00"}
    ]
    assert facts["availability"]["storage:s3"]["availability"] == 0.75
    assert facts["availability"]["storage:s3"]["worst_utc"] == "2026-11-29T15:05:00.000Z"
    assert facts["drift"]["bucket:raw"]["last_kst"] == "2026-11-30T00:05:00.000+09:00"
    assert facts["tiers"]["fast"]["status_counts"] == {"CRITICAL": 2, "NORMAL": 2}
