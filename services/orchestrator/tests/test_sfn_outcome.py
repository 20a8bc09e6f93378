"""How a DescribeExecution answer becomes the execution log's outcome (pure: the emulator's
answers are checked in test_stepfunctions.py), and the input every starter gives the same
recorded execution."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from aegis_orchestrator.stepfunctions import execution_input, outcome

STOPPED = datetime(2026, 12, 1, 15, 0, 1, 250000, tzinfo=timezone(timedelta(hours=9)))


@pytest.mark.parametrize("status", ["RUNNING", "PENDING_REDRIVE", None])
def test_an_execution_that_has_not_ended_has_no_outcome(status: str | None) -> None:
    assert outcome({"status": status}) is None


def test_a_success_has_no_error_and_ends_at_its_stop_date_in_utc() -> None:
    assert outcome({"status": "SUCCEEDED", "stopDate": STOPPED, "output": "{}"}) == {
        "status": "SUCCEEDED",
        "error": None,
        "finished_at": "2026-12-01T06:00:01.250Z",
    }


def test_a_failure_keeps_step_functions_error_and_cause() -> None:
    ended = outcome({"status": "FAILED", "error": "TaskFailed", "cause": '{"errorMessage": "x"}'})
    assert ended is not None
    assert ended["error"] == {"Error": "TaskFailed", "Cause": '{"errorMessage": "x"}'}
    assert ended["finished_at"] is None  # no stop date given: none made up


@pytest.mark.parametrize(
    ("status", "error"),
    [("TIMED_OUT", "States.Timeout"), ("ABORTED", "Aborted"), ("FAILED", "Failed")],
)
def test_an_ending_described_without_an_error_is_named_all_the_same(
    status: str, error: str
) -> None:
    ended = outcome({"status": status, "stopDate": datetime(2026, 12, 1, tzinfo=UTC)})
    assert ended is not None and ended["status"] == status
    assert ended["error"]["Error"] == error
    assert ended["error"]["Cause"]


def test_a_stop_with_its_own_error_keeps_it() -> None:
    ended = outcome({"status": "ABORTED", "error": "Operator", "cause": "shift over"})
    assert ended is not None
    assert ended["error"] == {"Error": "Operator", "Cause": "shift over"}


def test_the_input_is_the_same_text_whoever_starts_the_recorded_execution() -> None:
    record = {
        "execution_id": "a" * 32,
        "job_id": "j",
        "input": {"b": 1, "a": {"y": 2, "x": 1}},
    }
    reread = {**record, "input": {"a": {"x": 1, "y": 2}, "b": 1}}  # as DynamoDB gives it back
    assert execution_input(record) == execution_input(reread)
    assert json.loads(execution_input(record)) == {
        "trigger": {"a": {"x": 1, "y": 2}, "b": 1},
        "payload": {"execution_id": "a" * 32, "job_id": "j"},
    }
    by_reference = {**record, "input": {"claim_check": {"bucket": "b", "key": "k", "bytes": 9}}}
    assert json.loads(execution_input(by_reference))["trigger"] == by_reference["input"]
