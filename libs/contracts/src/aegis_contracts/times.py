"""Time in AEGIS: fixed-width UTC timestamps, UTC partitions, KST report dates, clock-skew policy.

Timestamps inside keys are ``YYYY-MM-DDTHH:MM:SS.mmmZ`` (24 characters, always UTC, milliseconds
truncated) so that lexical order is time order. The report day is the KST (UTC+9, no daylight
saving) calendar date: KST day D runs from D-1 15:00 UTC to D 15:00 UTC.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, PlainSerializer

from aegis_contracts.errors import ContractError

KST = timezone(timedelta(hours=9), "KST")
CLOCK_SKEW_TOLERANCE = timedelta(minutes=5)
TS_WIDTH = 24
_TS_PATTERN = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def ensure_utc(value: datetime, what: str = "timestamp") -> datetime:
    if value.tzinfo is UTC:  # the common case (every validated Timestamp): nothing to convert
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise ContractError("naive_timestamp", f"{what} {value.isoformat()} has no time zone")
    return value.astimezone(UTC)


def format_ts(value: datetime) -> str:
    """``YYYY-MM-DDTHH:MM:SS.mmmZ``; sub-millisecond digits are truncated, never rounded up."""
    # isoformat truncates to milliseconds; its "+00:00" becomes the Z
    return ensure_utc(value).isoformat(timespec="milliseconds")[:-6] + "Z"


def parse_ts(text: str) -> datetime:
    """Parse a fixed-width key timestamp back into an aware UTC datetime."""
    if not isinstance(text, str) or _TS_PATTERN.fullmatch(text) is None:
        raise ContractError("invalid_timestamp", f"{text!r} is not YYYY-MM-DDTHH:MM:SS.mmmZ")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def parse_iso(text: str, what: str = "timestamp") -> datetime:
    """Parse a device's ISO-8601 timestamp; it must carry a zone (``Z`` or an offset)."""
    if not isinstance(text, str) or not text or len(text) > 40:
        raise ContractError("invalid_timestamp", f"{what} {text!r} is not an ISO-8601 timestamp")
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ContractError(
            "invalid_timestamp", f"{what} {text!r} is not an ISO-8601 timestamp"
        ) from None
    return ensure_utc(value, what)


def truncate_ms(value: datetime) -> datetime:
    v = ensure_utc(value)
    return v.replace(microsecond=v.microsecond - v.microsecond % 1000)


@dataclass(frozen=True, slots=True)
class Partition:
    """The UTC partition tokens of one instant."""

    yyyy: str
    mm: str
    dd: str
    hh: str

    @classmethod
    def of(cls, value: datetime) -> Partition:
        v = ensure_utc(value)
        return cls(f"{v.year:04d}", f"{v.month:02d}", f"{v.day:02d}", f"{v.hour:02d}")

    @property
    def day_path(self) -> str:
        return f"yyyy={self.yyyy}/mm={self.mm}/dd={self.dd}"

    @property
    def hour_path(self) -> str:
        return f"{self.day_path}/hh={self.hh}"


def day_path(day: date) -> str:
    return f"yyyy={day.year:04d}/mm={day.month:02d}/dd={day.day:02d}"


def kst_report_date(value: datetime) -> date:
    """The KST calendar date an instant belongs to (the report date)."""
    return ensure_utc(value).astimezone(KST).date()


def kst_day_bounds(day: date) -> tuple[datetime, datetime]:
    """``[start, end)`` in UTC of KST day ``day``: (D-1 15:00 UTC, D 15:00 UTC)."""
    start = datetime(day.year, day.month, day.day, tzinfo=KST).astimezone(UTC)
    return start, start + timedelta(days=1)


def kst_day_utc_hours(day: date) -> list[datetime]:
    """The 24 UTC hour starts whose partitions make up KST day ``day``, in order."""
    start, _ = kst_day_bounds(day)
    return [start + timedelta(hours=h) for h in range(24)]


def floor_to(value: datetime, step: timedelta) -> datetime:
    """Floor an instant to a multiple of ``step`` since the epoch (5-minute buckets, ticks)."""
    v = ensure_utc(value)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return epoch + ((v - epoch) // step) * step


class TimeFlag(StrEnum):
    CLOCK_SKEW = "clock_skew"
    LATE = "late"


@dataclass(frozen=True, slots=True)
class EventTime:
    """The time a record is filed under, and why it may differ from what the device said."""

    at: datetime
    flags: frozenset[TimeFlag]
    emitted_at: datetime


def resolve_event_time(
    emitted_at: datetime,
    received_at: datetime,
    *,
    report_exists_for: Callable[[date], bool] | None = None,
    tolerance: timedelta = CLOCK_SKEW_TOLERANCE,
) -> EventTime:
    """The clock-skew policy: more than ``tolerance`` ahead of arrival is clock skew (arrival time is used);
    older event times are kept, flagged ``late`` when that day's report already exists."""
    emitted = ensure_utc(emitted_at, "emitted_at")
    received = ensure_utc(received_at, "received_at")
    if emitted - received > tolerance:
        return EventTime(received, frozenset({TimeFlag.CLOCK_SKEW}), emitted)
    flags: set[TimeFlag] = set()
    if report_exists_for is not None and report_exists_for(kst_report_date(emitted)):
        flags.add(TimeFlag.LATE)
    return EventTime(emitted, frozenset(flags), emitted)


def _as_utc(value: datetime) -> datetime:
    return ensure_utc(value)


# A datetime field of a stored record: aware UTC in Python, the fixed-width form in JSON, so that
# conditions and sort keys in DynamoDB compare it lexically.
Timestamp = Annotated[
    datetime,
    AfterValidator(_as_utc),
    PlainSerializer(format_ts, return_type=str, when_used="json"),
]


MAX_DURATION = timedelta(days=7)
_DURATION = re.compile(r"(?:(\d{1,6})d)?(?:(\d{1,6})h)?(?:(\d{1,6})m)?(?:(\d{1,6})s)?")


def parse_duration(text: object) -> timedelta:
    """``"90s"``, ``"5m"``, ``"1h30m"``, ``"2d"``: units d, h, m, s in that order, at most 7 days."""
    if not isinstance(text, str):
        raise ValueError(f"a duration is a string like '5m' or '1h30m', got {text!r}")  # noqa: TRY004
    found = _DURATION.fullmatch(text.strip())
    if not text.strip() or found is None:
        raise ValueError(f"{text!r} is not a duration like '0s', '5m' or '1h30m' (units d h m s)")
    days, hours, minutes, seconds = (int(part or 0) for part in found.groups())
    value = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    if value > MAX_DURATION:
        raise ValueError(f"{text!r} is longer than {format_duration(MAX_DURATION)}")
    return value


def format_duration(value: timedelta) -> str:
    """The shortest text :func:`parse_duration` reads back (``0s`` for zero; whole seconds)."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"
