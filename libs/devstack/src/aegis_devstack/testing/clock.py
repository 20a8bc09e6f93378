"""A clock a test moves by hand: services take ``clock=`` so windows pass without sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta


class FakeClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> datetime:
        self.now += delta
        return self.now
