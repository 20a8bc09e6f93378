"""The one back-off formula of every retry loop."""

from __future__ import annotations

import pytest

from aegis_contracts.backoff import exponential_s, jittered_s, spread_s


def test_the_wait_doubles_from_the_first_up_to_the_cap() -> None:
    waits = [exponential_s(n, first=0.25, cap=10.0) for n in range(1, 9)]
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


@pytest.mark.parametrize("attempt", [0, -3])
def test_an_attempt_before_the_first_retry_waits_the_first_delay(attempt: int) -> None:
    assert exponential_s(attempt, first=1.0, cap=60.0) == 1.0


def test_a_very_late_attempt_stays_at_the_cap_without_overflowing() -> None:
    assert exponential_s(10_000, first=1.0, cap=60.0) == 60.0


@pytest.mark.parametrize("attempt", range(1, 12))
def test_jittered_waits_stay_within_their_bounds(attempt: int) -> None:
    ceiling = exponential_s(attempt, first=0.05, cap=20.0)
    full = [jittered_s(attempt, first=0.05, cap=20.0) for _ in range(200)]
    spread = [spread_s(attempt, first=0.05, cap=20.0) for _ in range(200)]
    assert all(0 <= w <= ceiling for w in full)
    assert all(ceiling / 2 <= w <= ceiling for w in spread)
    # drawn, not fixed: 200 draws are not all the same
    assert len(set(full)) > 1 and len(set(spread)) > 1
