"""The bounds of one execution, as pure checks: context size, step runs, runs of one step across
nested loops, and the execution log item."""

from __future__ import annotations

import pytest

from aegis_orchestration.limits import (
    DYNAMODB_ITEM_BYTES,
    LimitExceeded,
    Limits,
    allowed_runs,
    check_context,
    check_item,
    check_runs,
    check_steps,
    json_size,
)

LIMITS = Limits(max_context_bytes=100, max_steps=5, max_item_bytes=1000)


def test_json_size_counts_compact_utf8_bytes() -> None:
    assert json_size({"a": [1, 2]}) == len('{"a":[1,2]}')
    assert json_size("가") == len('"\\uac00"')  # json escapes non-ASCII: 8 bytes, as stored


@pytest.mark.parametrize(("size", "fails"), [(100, False), (101, True)])
def test_the_context_may_reach_its_limit_but_not_pass_it(size: int, fails: bool) -> None:
    context = {"x": "a" * (size - len('{"x":""}'))}
    assert json_size(context) == size
    if fails:
        with pytest.raises(LimitExceeded) as err:
            check_context("fanout", context, LIMITS)
        assert err.value.error == "ContextTooLarge"
        assert "101 bytes after step fanout" in err.value.cause and "100" in err.value.cause
    else:
        assert check_context("fanout", context, LIMITS) == size


@pytest.mark.parametrize(("count", "fails"), [(5, False), (6, True)])
def test_steps_per_execution(count: int, fails: bool) -> None:
    if fails:
        with pytest.raises(LimitExceeded, match="StepLimitExceeded: step s would be step run 6"):
            check_steps("s", count, LIMITS)
    else:
        check_steps("s", count, LIMITS)


@pytest.mark.parametrize(
    ("repeat_limit", "choices", "allowed"),
    [(3, 0, 4), (3, 1, 4), (3, 2, 7), (0, 1, 1), (10, 3, 31)],
)
def test_nested_loops_add_up_instead_of_multiplying(
    repeat_limit: int, choices: int, allowed: int
) -> None:
    assert allowed_runs(repeat_limit, choices) == allowed
    check_runs("s", allowed, allowed)
    with pytest.raises(LimitExceeded) as err:
        check_runs("s", allowed + 1, allowed)
    assert err.value.error == "RepeatLimitExceeded"


def test_an_item_over_its_budget_is_refused_with_the_reason() -> None:
    check_item(1000, LIMITS)
    with pytest.raises(LimitExceeded) as err:
        check_item(1001, LIMITS)
    assert err.value.error == "ExecutionLogTooLarge"
    assert "1001 bytes" in err.value.cause and "by reference" in err.value.cause


def test_the_default_item_budget_stays_under_dynamodbs_item_limit() -> None:
    assert Limits().max_item_bytes < DYNAMODB_ITEM_BYTES
