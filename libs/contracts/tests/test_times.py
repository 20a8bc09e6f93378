"""Fixed-width timestamps, the KST report date and the clock-skew policy."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from aegis_contracts.errors import ContractError
from aegis_contracts.times import (
    TimeFlag,
    floor_to,
    format_ts,
    kst_day_bounds,
    kst_day_utc_hours,
    kst_report_date,
    parse_iso,
    parse_ts,
    resolve_event_time,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (utc(2026, 11, 30, 23, 59, 59, 999_999), "2026-11-30T23:59:59.999Z"),  # truncated
        (utc(2026, 1, 1), "2026-01-01T00:00:00.000Z"),
        (utc(999, 1, 1), "0999-01-01T00:00:00.000Z"),  # still 24 characters
        (
            datetime(2026, 12, 1, 0, 30, tzinfo=timezone(timedelta(hours=9))),
            "2026-11-30T15:30:00.000Z",
        ),
    ],
)
def test_format_ts_is_fixed_width_utc(value, text):
    assert format_ts(value) == text
    assert len(text) == 24
    assert parse_ts(text) == value.astimezone(UTC).replace(
        microsecond=value.microsecond // 1000 * 1000
    )


@pytest.mark.parametrize("bad", ["2026-11-30T10:00:00Z", "2026-11-30 10:00:00.000Z", "", "x"])
def test_parse_ts_refuses_other_shapes(bad):
    with pytest.raises(ContractError):
        parse_ts(bad)


def test_naive_datetimes_are_refused():
    with pytest.raises(ContractError) as info:
        format_ts(datetime(2026, 1, 1))
    assert info.value.code == "naive_timestamp"


@pytest.mark.parametrize(
    ("instant", "kst_date"),
    [
        (utc(2026, 11, 30, 14, 59, 59, 999_000), date(2026, 11, 30)),
        (utc(2026, 11, 30, 15, 0), date(2026, 12, 1)),  # 00:00 KST: the next report day
        (utc(2026, 12, 31, 15, 0), date(2027, 1, 1)),  # year end in KST comes 9 h early
        (utc(2026, 12, 31, 14, 59, 59), date(2026, 12, 31)),
    ],
)
def test_kst_report_date_boundary_is_15_utc(instant, kst_date):
    assert kst_report_date(instant) == kst_date


def test_kst_day_bounds_and_hours():
    start, end = kst_day_bounds(date(2026, 12, 1))
    assert start == utc(2026, 11, 30, 15)
    assert end == utc(2026, 12, 1, 15)
    hours = kst_day_utc_hours(date(2026, 12, 1))
    assert len(hours) == 24
    assert hours[0] == start
    assert hours[-1] == utc(2026, 12, 1, 14)
    assert all(kst_report_date(h) == date(2026, 12, 1) for h in hours)


def test_parse_iso_requires_a_zone():
    assert parse_iso("2026-11-30T10:00:00Z") == utc(2026, 11, 30, 10)
    assert parse_iso("2026-11-30T19:00:00+09:00") == utc(2026, 11, 30, 10)
    with pytest.raises(ContractError):
        parse_iso("2026-11-30T10:00:00")
    with pytest.raises(ContractError):
        parse_iso("yesterday")


def test_floor_to_five_minutes():
    assert floor_to(utc(2026, 11, 30, 10, 4, 59, 999), timedelta(minutes=5)) == utc(
        2026, 11, 30, 10, 0
    )
    assert floor_to(utc(2026, 11, 30, 10, 5), timedelta(minutes=5)) == utc(2026, 11, 30, 10, 5)


ARRIVAL = utc(2026, 11, 30, 10, 0)


def test_event_time_within_tolerance_is_kept():
    ahead = ARRIVAL + timedelta(minutes=5)  # exactly at the limit is not skew
    result = resolve_event_time(ahead, ARRIVAL)
    assert result.at == ahead
    assert result.flags == frozenset()


def test_event_time_far_ahead_is_clock_skew():
    ahead = ARRIVAL + timedelta(minutes=5, milliseconds=1)
    result = resolve_event_time(ahead, ARRIVAL)
    assert result.at == ARRIVAL
    assert result.flags == {TimeFlag.CLOCK_SKEW}
    assert result.emitted_at == ahead


def test_old_event_time_is_kept_and_late_only_when_the_report_exists():
    old = ARRIVAL - timedelta(days=3)
    assert resolve_event_time(old, ARRIVAL).flags == frozenset()
    reported = {kst_report_date(old)}
    result = resolve_event_time(old, ARRIVAL, report_exists_for=reported.__contains__)
    assert result.at == old
    assert result.flags == {TimeFlag.LATE}
