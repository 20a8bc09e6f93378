"""The job model: its four entities as one document, tree validation, duplicate keys,
parameter resolution with coercion/defaults/required/max_length, YAML round trip, task queries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from aegis_orchestration.model import Job
from aegis_orchestration.params import ParamError, resolve_params
from aegis_orchestration.query import build_query
from aegis_orchestration.yamlio import JobFileError, dump_jobs, load_jobs

EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"


def job(**overrides: Any) -> Job:
    doc: dict[str, Any] = {
        "id": "j1",
        "job_name": "test",
        "trigger_type": "BizObject",
        "object_id": "factory_latest",
        "trigger_sub_type": "Update",
        "steps": [
            {
                "id": "a",
                "step_type": "TASK",
                "step_sub_type": "PUBLISH_EVENT",
                "is_start_point": True,
            }
        ],
    }
    doc.update(overrides)
    return Job.model_validate(doc)


def test_the_examples_load_and_round_trip_through_yaml() -> None:
    jobs = load_jobs(EXAMPLES.read_text())
    assert {j.id for j in jobs} == {
        "gas-leak-escalation",
        "daily-report-check",
        "alert-audit",
        "sign-in-lockout",
    }
    assert sorted(load_jobs(dump_jobs(jobs)), key=lambda j: j.id) == sorted(
        jobs, key=lambda j: j.id
    )
    schedule = next(j for j in jobs if j.trigger_type == "Schedule")
    assert schedule.time_zone == "Asia/Seoul"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"steps": []}, "at least one step"),
        (
            {"steps": [{"id": "a", "step_type": "DUMMY"}, {"id": "b", "step_type": "DUMMY"}]},
            "exactly one step must be the start point",
        ),
        (
            {
                "steps": [
                    {"id": "a", "step_type": "DUMMY", "is_start_point": True, "next_step_id": "zz"}
                ]
            },
            "next_step_id zz does not exist",
        ),
        (
            {
                "steps": [
                    {"id": "a", "step_type": "DUMMY", "is_start_point": True},
                    {"id": "b", "step_type": "DUMMY", "flow_step_id": "a"},
                ]
            },
            "is not a SEQUENCE/PARALLEL/CHOICE",
        ),
        (
            {
                "steps": [
                    {
                        "id": "c",
                        "step_type": "FLOW",
                        "step_sub_type": "CHOICE",
                        "is_start_point": True,
                    },
                    {
                        "id": "b",
                        "step_type": "DUMMY",
                        "flow_step_id": "c",
                        "condition_expr": "AND(",
                    },
                ]
            },
            "condition unexpected end",
        ),
        ({"trigger_condition_expr": "StringEQ([$.a], )"}, "line 1, column"),
        ({"trigger_type": "Schedule", "trigger_cron": "not a cron"}, "not a cron expression"),
        (
            {"trigger_type": "Schedule", "trigger_cron": "* * * * *", "time_zone": "Mars/Base"},
            "unknown",
        ),
        ({"params": [{"id": "p", "step_id": "zz", "param_key": "k"}]}, "step zz does not exist"),
        ({"unscoped_events": True}, "unscoped_events is for a tenant's job"),
        ({"tenant": "a/b/c"}, "tenant\n  String should match pattern"),
        ({"tenant": "plant ops"}, "tenant\n  String should match pattern"),
        (
            {
                "params": [
                    {"id": "p", "step_id": "a", "param_key": "k", "source_type": "TRIGGER_DATA"}
                ]
            },
            "needs ref_path",
        ),
    ],
)
def test_malformed_jobs_are_refused_naming_the_problem(
    overrides: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        job(**overrides)


def test_duplicate_key_normalizes_layout_and_argument_order() -> None:
    one = job(trigger_condition_expr='AND(StringEQ([$.a], "x"), NumberGT([$.b], 1))')
    two = job(id="j2", trigger_condition_expr='AND( NumberGT([ $.b ], 1.0),\n StringEQ([$.a],"x"))')
    other = job(id="j3", trigger_condition_expr='AND(StringEQ([$.a], "y"), NumberGT([$.b], 1))')
    assert one.duplicate_key() == two.duplicate_key()
    assert one.duplicate_key() != other.duplicate_key()
    assert one.duplicate_key() != job(trigger_sub_type="Insert").duplicate_key()


def test_jobs_of_two_tenants_on_one_trigger_are_no_twins() -> None:
    plain = job()
    # a job without a tenant keeps the key it had (six parts): its stored trigger claim holds
    assert len(plain.duplicate_key()) == 6
    ops, audit = job(tenant="aegis/plant-ops"), job(tenant="aegis/audit")
    assert len({plain.duplicate_key(), ops.duplicate_key(), audit.duplicate_key()}) == 3
    assert ops.duplicate_key() == job(id="j2", tenant="aegis/plant-ops").duplicate_key()


def _param_job(*params: dict[str, Any]) -> Job:
    return job(params=list(params))


CONTEXT = {
    "trigger": {
        "afterData": {"factory_id": "factory-b", "risk": {"score": "85", "level": "CRITICAL"}}
    },
    "payload": {"source": "test"},
    "steps": {"q": {"count": 2}},
    "globals": {"channel": "#safety"},
}


def test_every_source_type_resolves_with_coercion() -> None:
    j = _param_job(
        {
            "id": "p1",
            "step_id": "a",
            "param_key": "factory",
            "source_type": "TRIGGER_DATA",
            "ref_path": "$.afterData.factory_id",
        },
        {
            "id": "p2",
            "step_id": "a",
            "param_key": "score",
            "source_type": "TRIGGER_DATA",
            "ref_path": "$.afterData.risk.score",
            "data_type": "NUMBER",
        },
        {
            "id": "p3",
            "step_id": "a",
            "param_key": "src",
            "source_type": "PAYLOAD",
            "ref_path": "$.source",
        },
        {
            "id": "p4",
            "step_id": "a",
            "param_key": "n",
            "source_type": "RETURN_DATA",
            "ref_path": "$.q.count",
            "data_type": "INTEGER",
        },
        {
            "id": "p5",
            "step_id": "a",
            "param_key": "channel",
            "source_type": "GLOBAL_TASK_PARAMETER",
            "ref_path": "channel",
        },
        {
            "id": "p6",
            "step_id": "a",
            "param_key": "flag",
            "source_type": "STATIC",
            "param_value": "Y",
            "data_type": "BOOLEAN",
        },
        {
            "id": "p7",
            "step_id": "a",
            "param_key": "url",
            "source_type": "ENVIRONMENT",
            "param_value": "http://${AEGIS_JOB_HOST}/x",
        },
        {
            "id": "p8",
            "step_id": "a",
            "param_key": "missing",
            "source_type": "TRIGGER_DATA",
            "ref_path": "$.nope",
            "default_value": "dflt",
        },
        {"id": "p9", "step_id": "a", "param_key": "body", "data_type": "OBJECT"},
        {
            "id": "p10",
            "step_id": "a",
            "parent_param_id": "p9",
            "param_key": "level",
            "source_type": "TRIGGER_DATA",
            "ref_path": "$.afterData.risk.level",
        },
        {
            "id": "p11",
            "step_id": "a",
            "param_key": "only_if",
            "source_type": "STATIC",
            "param_value": "x",
            "condition_expr": 'StringEQ([$.globals.channel], "#other")',
        },
    )
    resolved = resolve_params(j, "a", CONTEXT, {"AEGIS_JOB_HOST": "h"})
    assert resolved == {
        "factory": "factory-b",
        "score": 85.0,
        "src": "test",
        "n": 2,
        "channel": "#safety",
        "flag": True,
        "url": "http://h/x",
        "missing": "dflt",
        "body": {"level": "CRITICAL"},
    }


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ({"source_type": "TRIGGER_DATA", "ref_path": "$.nope", "is_required": True}, "required"),
        ({"source_type": "STATIC", "param_value": "toolong", "max_length": 3}, "max_length"),
        ({"source_type": "STATIC", "param_value": "abc", "data_type": "NUMBER"}, "not NUMBER"),
        (
            {"source_type": "ENVIRONMENT", "param_value": "${AEGIS_SLACK_WEBHOOK_URL}"},
            "only AEGIS_JOB_",
        ),
    ],
)
def test_param_checks_fail_the_step(param: dict[str, Any], message: str) -> None:
    j = _param_job({"id": "p", "step_id": "a", "param_key": "k", **param})
    with pytest.raises(ParamError, match=message):
        resolve_params(j, "a", CONTEXT, {"AEGIS_SLACK_WEBHOOK_URL": "secret"})


def test_task_conditions_build_search_and_sort() -> None:
    j = job(
        steps=[
            {
                "id": "a",
                "step_type": "TASK",
                "step_sub_type": "READ_MODEL_QUERY",
                "is_start_point": True,
            }
        ],
        conditions=[
            {
                "id": "c1",
                "step_id": "a",
                "field_id": "score",
                "comparison_type": "GE",
                "value_type": "PARAM_KEY",
                "value": "min",
            },
            {
                "id": "c2",
                "step_id": "a",
                "field_id": "level",
                "comparison_type": "EQ",
                "value": "CRITICAL",
                "operator_type": "OR",
            },
            {
                "id": "s1",
                "step_id": "a",
                "field_id": "score",
                "condition_type": "SORT",
                "comparison_type": "DESC",
            },
        ],
    )
    spec = build_query(j.conditions_of("a"), {"pk": "FACTORY#x", "min": 50})
    items = [
        {"sk": "A", "score": 10, "level": "CRITICAL"},
        {"sk": "B", "score": 60, "level": "NORMAL"},
        {"sk": "C", "score": 90, "level": "WARNING"},
        {"sk": "D", "score": 5, "level": "NORMAL"},
    ]
    assert [i["sk"] for i in spec.apply(items)] == ["C", "B", "A"]


def test_a_broken_jobs_file_names_each_entry() -> None:
    with pytest.raises(JobFileError, match=r"jobs\[x\]"):
        load_jobs("jobs:\n  - {id: x, job_name: n, trigger_type: Nope, steps: []}\n")
