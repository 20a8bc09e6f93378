"""What a state snapshot's ObjectCreated tells the dispatcher of the state before it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from aegis_processor.handlers import Commit, alert_basis

AT = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FIRE = {"code": "FIRE_DETECTED", "severity": "CRITICAL", "detail": "fire on cam-1"}


def image(reasons: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    level = "CRITICAL" if reasons else "NORMAL"
    return {"risk": {"score": 90 if reasons else 0, "level": level, "reasons": reasons}} | extra


def test_a_calm_state_after_a_calm_one_is_routine() -> None:
    basis = alert_basis(Commit(old=image([]), new=image([], prev_updated_at="x"), at=AT))
    assert basis.routine and basis.at == AT


def test_a_calm_state_after_a_fire_names_the_fire_and_is_not_routine() -> None:
    basis = alert_basis(Commit(old=image([FIRE]), new=image([], prev_updated_at="x"), at=AT))
    assert [r.code for r in basis.previous_reasons or []] == ["FIRE_DETECTED"]
    assert basis.reasons == [] and not basis.routine


def test_a_factory_s_first_state_had_nothing_before_it() -> None:
    basis = alert_basis(Commit(old=None, new=image([FIRE]), at=AT))
    assert basis.previous_reasons == [] and [r.code for r in basis.reasons] == ["FIRE_DETECTED"]


def test_a_redelivery_that_lost_its_predecessor_says_it_does_not_know() -> None:
    basis = alert_basis(Commit(old=None, new=image([], prev_updated_at="x"), at=AT))
    assert basis.previous_reasons is None and not basis.routine
