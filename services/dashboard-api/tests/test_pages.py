"""The incident pages' server side: how long is written (as app.js writes it) and the order.
The pages themselves are tested in Chromium: tests/integration/test_dashboard_page.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts import incidents
from aegis_dashboard_api.pages import duration, worst_first

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "en", "ko"),
    [
        (0, "0 s", "0초"),
        (59.9, "59 s", "59초"),
        (60, "1 min", "1분"),
        (3599, "59 min", "59분"),
        (3600, "1 h", "1시간"),
        (2 * 3600 + 5 * 60, "2 h 5 min", "2시간 5분"),
        (48 * 3600 - 1, "47 h 59 min", "47시간 59분"),
        (48 * 3600, "2 d", "2일"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h", "3일 4시간"),
        (-5, "0 s", "0초"),
    ],
)
def test_a_duration_is_written_as_the_script_writes_it(seconds: float, en: str, ko: str) -> None:
    assert duration(seconds, "en") == en
    assert duration(seconds, "ko") == ko


def test_worst_first_is_critical_before_warning_then_the_oldest() -> None:
    def opened(scope: str, severity: incidents.Severity, minutes_ago: int) -> incidents.Incident:
        at = NOW - timedelta(minutes=minutes_ago)
        return incidents.open_incident(
            scope=scope, stream="STATE", reason="R", severity=severity, at=at
        )

    old_warning = opened("a", "WARNING", 300)
    new_critical = opened("b", "CRITICAL", 1)
    old_critical = opened("c", "CRITICAL", 60)
    new_warning = opened("d", "WARNING", 5)
    ordered = worst_first([old_warning, new_critical, new_warning, old_critical])
    assert ordered == [old_critical, new_critical, old_warning, new_warning]
