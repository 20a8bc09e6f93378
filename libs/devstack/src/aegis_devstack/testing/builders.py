"""What tests build again and again, built one way: a clock the test moves by hand, and the
``meta`` block every processed object carries.

Services take ``clock=`` (a callable returning an aware UTC ``datetime``), so a test passes a
:class:`FakeClock` and moves it instead of sleeping; nothing here reads the calendar.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from aegis_contracts.times import format_ts


class FakeClock:
    """``clock()`` is ``clock.now``; ``advance(timedelta(minutes=5))`` or ``advance(300)``
    (seconds) moves it and returns the new now."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta | float) -> datetime:
        self.now += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        return self.now


def meta(
    message_id: str,
    at: datetime,
    *,
    factory_id: str = "f",
    source_type: str = "factory_state",
    device_id: str = "edge-01",
) -> dict[str, Any]:
    """The ``meta`` of a processed object (a state or a risk record) of one message emitted,
    received and timed at ``at``, its raw key in that day's partition."""
    ts = format_ts(at)
    return {
        "message_id": message_id,
        "device_id": device_id,
        "emitted_at": ts,
        "event_time": ts,
        "received_at": ts,
        "raw_key": f"raw/{factory_id}/{source_type}/{at:yyyy=%Y/mm=%m/dd=%d}/{message_id}.json",
        "schema_version": "1.0",
    }
