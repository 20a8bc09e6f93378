"""Jobs from the four relational tables (orch_job, orch_job_step, orch_step_param,
orch_task_condition) as CSV or JSON files: assembly into job documents, the tenant and audit
columns kept, every refusal named by table, row and line, and what registering them would do."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from aegis_orchestration.model import Job
from aegis_orchestration.tables import (
    CONDITION,
    JOB,
    OVERLAP_WHEN_ALLOWED,
    PARAM,
    STEP,
    TABLES,
    Action,
    TableProblem,
    TablesResult,
    load_tables,
    plan_registration,
)
from aegis_orchestration.tables import (
    TENANT as TENANT_COLUMNS,
)
from aegis_orchestration.tenants import Tenants

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples" / "jobs-tables"
AUTOMATION = {
    "trigger_type": "Automation",
    "object_id": "alert-dispatcher",
    "trigger_sub_type": "alert_sent",
}
AUDIT = {
    "tenant_app_id": "aegis",
    "tenant_account_id": "plant-ops",
    "created_by": "kim",
    "modified_by": "park",
    "created_at": "2025-11-03 09:14:22",
    "updated_at": "2025-11-20 17:02:05",
}


def tables() -> dict[str, list[dict[str, Any]]]:
    """A small valid set: one BizObject job, a start TASK, a READ_MODEL_QUERY with a param and
    a condition."""
    return {
        JOB: [
            {
                "id": "j1",
                "job_name": "CO high",
                "trigger_type": "BizObject",
                "object_id": "factory_latest",
                "trigger_sub_type": "Update",
                "is_enabled": "Y",
                "overlap_allowed": "N",
                "is_active": "Y",
                **AUDIT,
            }
        ],
        STEP: [
            {
                "id": "notify",
                "job_id": "j1",
                "step_type": "TASK",
                "step_sub_type": "SLACK_NOTIFY",
                "is_start_point": "Y",
                "tenant_app_id": "aegis",
            },
            {
                "id": "check",
                "job_id": "j1",
                "step_type": "TASK",
                "step_sub_type": "READ_MODEL_QUERY",
            },
        ],
        PARAM: [
            {
                "id": "text",
                "job_id": "j1",
                "step_id": "notify",
                "param_key": "text",
                "param_value": "CO high",
            },
        ],
        CONDITION: [
            {
                "id": "level",
                "step_id": "check",
                "field_id": "risk.level",
                "comparison_type": "EXISTS",
            }
        ],
    }


def write_csv(folder: Path, data: dict[str, list[dict[str, Any]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for table, rows in data.items():
        columns = list(dict.fromkeys(c for r in rows for c in r)) or ["id"]
        with (folder / f"{table}.csv").open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, columns)
            writer.writeheader()
            writer.writerows(rows)
    return folder


def write_json(folder: Path, data: dict[str, list[dict[str, Any]]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for table, rows in data.items():
        (folder / f"{table}.json").write_text(json.dumps(rows))
    return folder


def load(
    tmp_path: Path, data: dict[str, list[dict[str, Any]]], as_json: bool = False
) -> TablesResult:
    return load_tables((write_json if as_json else write_csv)(tmp_path / "t", data))


def only(result: TablesResult) -> TableProblem:
    assert len(result.problems) == 1, [str(p) for p in result.problems]
    return result.problems[0]


# -- assembly -------------------------------------------------------------------------------------


def test_the_example_tables_assemble_into_valid_jobs() -> None:
    result = load_tables(EXAMPLES)
    assert result.problems == []
    assert result.files == {t: f"{t}.csv" for t in TABLES}
    co, note = result.jobs
    assert (co.id, note.id) == ("co-high-factory-a", "nightly-shift-note")
    # steps in the order of their rows, per container; the deleted step is left out
    assert [(s.id, s.flow_step_id, s.seq) for s in co.steps] == [
        ("notify", None, 1),
        ("respond", None, 2),
        ("call_maintenance", "respond", 1),
        ("evacuate", "respond", 2),
        ("check", None, 3),
    ]
    assert co.start_step.id == "notify"
    assert [p.id for p in co.params_of("call_maintenance")] == [
        "maint_url",
        "maint_body",
        "maint_factory",
        "maint_score",
    ]
    assert co.params[0].is_required is True and co.params[0].max_length == 64
    assert [(c.id, c.condition_type) for c in co.conditions] == [
        ("check_level", "SEARCH"),
        ("check_newest", "SORT"),
    ]
    assert co.overlap_allowed == 1 and co.repeat_limit == 3
    assert co.designer_offset == {"x": 120, "y": 40}
    assert co.origin == {
        "tenant_app_id": "aegis",
        "tenant_account_id": "plant-ops",
        "created_by": "kim.jiwoo",
        "modified_by": "park.minseo",
        "created_at": "2025-11-03 09:14:22",
        "updated_at": "2025-11-20 17:02:05",
    }
    assert note.trigger_cron == "30 0 * * *" and note.trigger_cron_desc == "every day at 00:30"
    assert result.deleted == {STEP: 1, PARAM: 1}
    assert result.rows == {JOB: 2, STEP: 7, PARAM: 11, CONDITION: 2}


def test_json_files_give_the_same_jobs_as_csv(tmp_path: Path) -> None:
    folder = tmp_path / "json"
    folder.mkdir()
    for table in TABLES:
        with (EXAMPLES / f"{table}.csv").open(newline="", encoding="utf-8") as f:
            rows = [{k: (v or None) for k, v in r.items()} for r in csv.DictReader(f)]
        (folder / f"{table}.json").write_text(json.dumps(rows))
    from_json = load_tables(folder)
    assert from_json.problems == []
    assert from_json.files[JOB] == "orch_job.json"
    assert from_json.jobs == load_tables(EXAMPLES).jobs


def test_json_values_keep_their_types(tmp_path: Path) -> None:
    data = tables()
    data[JOB][0] |= {"is_enabled": False, "overlap_allowed": 3, "global_params": {"a": 1}}
    data[PARAM][0] |= {"param_value": {"nested": [1, 2]}, "is_required": True, "max_length": 9}
    (job,) = load(tmp_path, data, as_json=True).jobs
    assert job.is_enabled is False and job.overlap_allowed == 3 and job.global_params == {"a": 1}
    assert job.params[0].param_value == {"nested": [1, 2]} and job.params[0].max_length == 9


def test_seq_orders_steps_and_rows_order_the_rest(tmp_path: Path) -> None:
    data = tables()
    data[STEP][0]["seq"] = "5"
    data[STEP][1]["seq"] = "2"
    (job,) = load(tmp_path, data).jobs
    assert [s.id for s in job.children(None)] == ["check", "notify"]


def test_flags_and_overlap(tmp_path: Path) -> None:
    data = tables()
    data[JOB][0] |= {"is_enabled": "n", "overlap_allowed": "Y"}
    (job,) = load(tmp_path, data).jobs
    assert job.is_enabled is False and job.overlap_allowed == OVERLAP_WHEN_ALLOWED
    data[JOB][0]["overlap_allowed"] = "4"
    assert load(tmp_path, data).jobs[0].overlap_allowed == 4


def test_deleted_rows_are_left_out(tmp_path: Path) -> None:
    data = tables()
    data[JOB].append(dict(data[JOB][0], id="gone", is_active="N"))
    data[STEP].append({"id": "old", "job_id": "gone", "step_type": "DUMMY"})
    data[STEP].append({"id": "old2", "job_id": "j1", "step_type": "DUMMY", "is_active": "N"})
    data[PARAM].append({"id": "p2", "step_id": "old2", "param_key": "k", "is_active": "N"})
    result = load(tmp_path, data)
    assert result.problems == []
    assert [j.id for j in result.jobs] == ["j1"]
    assert [s.id for s in result.jobs[0].steps] == ["notify", "check"]
    assert result.deleted == {JOB: 1, STEP: 2, PARAM: 1}


def test_a_cell_over_several_lines_keeps_the_line_numbers(tmp_path: Path) -> None:
    data = tables()
    data[STEP][0]["step_description"] = "first line\nsecond line"
    data[STEP][1]["step_type"] = "LOOP"
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row, problem.line, problem.job) == (STEP, 2, 4, "j1")
    assert problem.reason.startswith("step_type: Input should be")


# -- refusals -------------------------------------------------------------------------------------


def test_a_missing_column_refuses_the_file(tmp_path: Path) -> None:
    data = tables()
    for row in data[STEP]:
        del row["step_type"]
    result = load(tmp_path, data)
    problem = only(result)
    assert (problem.table, problem.row, problem.line) == (STEP, None, 1)
    assert problem.reason == "missing column 'step_type'"
    assert result.fatal and result.jobs == []


def test_a_missing_column_in_a_json_row(tmp_path: Path) -> None:
    data = tables()
    del data[STEP][1]["step_type"]
    result = load(tmp_path, data, as_json=True)
    assert str(result.problems[0]) == "orch_job_step row 2 [job j1]: missing column 'step_type'"


def test_an_unknown_column_is_refused(tmp_path: Path) -> None:
    data = tables()
    data[JOB][0]["trigger_typ"] = "x"
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.line, problem.reason) == (JOB, 1, "unknown column 'trigger_typ'")


def test_a_step_of_an_unknown_job(tmp_path: Path) -> None:
    data = tables()
    data[STEP].append({"id": "stray", "job_id": "nope", "step_type": "DUMMY"})
    result = load(tmp_path, data)
    problem = only(result)
    assert str(problem) == "orch_job_step row 3 (line 4): a step of an unknown job 'nope'"
    assert problem.job is None and not result.fatal
    assert [j.id for j in result.good_jobs] == ["j1"]  # the row belongs to no job read


def test_a_duplicate_step_order(tmp_path: Path) -> None:
    data = tables()
    data[STEP][0]["seq"] = "1"
    data[STEP][1]["seq"] = "1"
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row, problem.line, problem.job) == (STEP, 2, 3, "j1")
    assert problem.reason == (
        "duplicate step order: seq 1 in the job's top level is also step 'notify''s (row 1)"
    )


def test_a_parameter_of_an_unknown_step(tmp_path: Path) -> None:
    data = tables()
    data[PARAM].append({"id": "p9", "job_id": "j1", "step_id": "ghost", "param_key": "k"})
    result = load(tmp_path, data)
    problem = only(result)
    assert str(problem) == (
        "orch_step_param row 2 (line 3) [job j1]: a parameter of an unknown step 'ghost'"
    )
    assert result.good_jobs == []  # its job misses a parameter: not registered


def test_a_condition_of_an_unknown_step(tmp_path: Path) -> None:
    data = tables()
    data[CONDITION][0]["step_id"] = "ghost"
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row, problem.job) == (CONDITION, 1, None)
    assert problem.reason == "a condition of an unknown step 'ghost'"


def test_a_parameter_of_a_deleted_step(tmp_path: Path) -> None:
    data = tables()
    data[STEP].append({"id": "old", "job_id": "j1", "step_type": "DUMMY", "is_active": "N"})
    data[PARAM].append({"id": "p9", "job_id": "j1", "step_id": "old", "param_key": "k"})
    problem = only(load(tmp_path, data))
    assert problem.job == "j1"
    assert problem.reason == "a parameter of step 'old', which is deleted (is_active N)"


def test_a_parameter_naming_another_job(tmp_path: Path) -> None:
    data = tables()
    data[JOB].append(dict(data[JOB][0], id="j2", **AUTOMATION))
    data[STEP].append({"id": "s2", "job_id": "j2", "step_type": "DUMMY", "is_start_point": "Y"})
    data[PARAM][0]["job_id"] = "j2"
    problem = only(load(tmp_path, data))
    assert problem.job == "j1" and problem.reason == "job_id 'j2', but step 'notify' is of job 'j1'"


@pytest.mark.parametrize(
    ("table", "column", "value", "reason"),
    [
        (STEP, "step_type", "LOOP", "step_type: Input should be"),
        (STEP, "is_start_point", "maybe", "is_start_point: 'maybe' is not Y or N"),
        (STEP, "wait_seconds", "soon", "wait_seconds: 'soon' is not a number"),
        (STEP, "retry_max_attempts", "50", "retry_max_attempts: Input should be less than"),
        (JOB, "repeat_limit", "2.5", "repeat_limit: '2.5' is not an integer"),
        (JOB, "overlap_allowed", "often", "overlap_allowed: 'often' is not Y or N"),
        (JOB, "designer_offset", "{x", "designer_offset: not JSON"),
        (JOB, "trigger_condition_expr", "AND(", "trigger_condition_expr: Value error"),
        (JOB, "created_by", "x" * 300, "created_by: String should have at most 255"),
        (PARAM, "source_type", "EVENT", "source_type: Input should be"),
        (CONDITION, "comparison_type", "LIKE", "comparison_type: String should match"),
    ],
)
def test_a_value_the_model_refuses_names_its_row_and_column(
    tmp_path: Path, table: str, column: str, value: str, reason: str
) -> None:
    data = tables()
    data[table][0][column] = value
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row, problem.line, problem.job) == (table, 1, 2, "j1")
    assert problem.reason.startswith(reason), problem.reason


def test_a_tree_check_lands_on_the_row_it_names(tmp_path: Path) -> None:
    data = tables()
    data[CONDITION][0]["step_id"] = "notify"  # conditions are for READ_MODEL_QUERY steps
    data[STEP][1]["is_start_point"] = "Y"  # two start points: the job's row
    reasons = {(p.table, p.row): p.reason for p in load(tmp_path, data).problems}
    assert reasons == {
        (CONDITION, 1): "condition level: step notify is not a READ_MODEL_QUERY",
        (JOB, 1): "exactly one step must be the start point (found 2)",
    }


def test_duplicate_ids(tmp_path: Path) -> None:
    data = tables()
    data[JOB].append(dict(data[JOB][0]))
    data[PARAM].append(dict(data[PARAM][0]))
    found = [str(p) for p in load(tmp_path, data).problems]
    assert found == [
        "orch_job row 2 (line 3) [job j1]: duplicate id 'j1' (also row 1)",
        "orch_step_param row 2 (line 3) [job j1]: duplicate id 'text' (also row 1)",
    ]


def test_a_row_of_another_tenant(tmp_path: Path) -> None:
    data = tables()
    data[STEP][0]["tenant_app_id"] = "other-app"
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row) == (STEP, 1)
    assert problem.reason == "tenant_app_id 'other-app' differs from its job's 'aegis'"


def test_files_that_cannot_be_read(tmp_path: Path) -> None:
    folder = write_csv(tmp_path / "t", tables())
    (folder / "orch_job.json").write_text("[]")
    (folder / "orch_step_param.csv").write_text('id,step_id,param_key\n"p1,notify\n')
    (folder / "orch_task_condition.csv").unlink()  # optional: no conditions
    result = load_tables(folder)
    assert result.fatal and result.jobs == []
    found = {(p.table, p.reason.split(":")[0]) for p in result.problems}
    assert found == {
        (JOB, "both orch_job.csv and orch_job.json"),
        (PARAM, "not CSV"),
    }
    (folder / "orch_job.csv").unlink()
    (folder / "orch_job.json").unlink()
    assert "no orch_job.csv or orch_job.json" in [p.reason for p in load_tables(folder).problems]


def test_a_row_with_too_many_fields(tmp_path: Path) -> None:
    folder = write_csv(tmp_path / "t", tables())
    path = folder / "orch_job_step.csv"
    path.write_text(path.read_text() + "extra,j1,TASK,SLACK_NOTIFY,N,aegis,too,many\n")
    result = load_tables(folder)
    problem = only(result)
    assert (problem.row, problem.line, problem.job) == (3, 4, None)
    assert problem.reason == "8 fields where the header has 6"
    assert result.fatal  # which job it belongs to cannot be told


def test_not_a_list_of_rows(tmp_path: Path) -> None:
    folder = write_json(tmp_path / "t", tables())
    (folder / "orch_job.json").write_text('{"id": "j1"}')
    (folder / "orch_task_condition.json").write_text("[1]")
    reasons = {(p.table, p.row, p.reason) for p in load_tables(folder).problems}
    assert (JOB, None, "expected a JSON list of rows (objects)") in reasons
    assert (CONDITION, 1, "not an object") in reasons


def test_skip_bad_keeps_the_good_jobs(tmp_path: Path) -> None:
    data = tables()
    data[JOB].append(dict(data[JOB][0], id="j2", **AUTOMATION))
    data[STEP].append({"id": "s2", "job_id": "j2", "step_type": "TASK", "is_start_point": "Y"})
    result = load(tmp_path, data)
    assert result.bad_jobs == ["j2"] and not result.fatal
    assert [j.id for j in result.good_jobs] == ["j1"]


# -- registering ----------------------------------------------------------------------------------


def test_the_plan_new_unchanged_replaced_and_refused(tmp_path: Path) -> None:
    result = load_tables(EXAMPLES)
    co, note = result.jobs
    plan, refused = plan_registration([], result.jobs, rows=result.job_rows)
    assert [(p.job.id, p.action) for p in plan] == [
        (co.id, Action.REGISTER),
        (note.id, Action.REGISTER),
    ]
    assert refused == []

    stored = [
        j.model_copy(update={"version": 1, "created_at": "t", "updated_at": "t"})
        for j in (co, note)
    ]
    again, refused = plan_registration(stored, result.jobs)
    assert [(p.action, p.version) for p in again] == [(Action.UNCHANGED, 1)] * 2 and not refused

    changed = [stored[0].model_copy(update={"job_name": "renamed"}), stored[1]]
    plan, refused = plan_registration(changed, result.jobs, rows=result.job_rows)
    assert [p.job.id for p in plan] == [note.id]
    assert [(p.table, p.row, p.line, p.job) for p in refused] == [(JOB, 1, 2, co.id)]
    assert "is registered and differs" in refused[0].reason
    plan, refused = plan_registration(changed, result.jobs, replace=True)
    assert [p.action for p in plan] == [Action.REPLACE, Action.UNCHANGED] and not refused


def test_the_plan_refuses_a_twin_trigger() -> None:
    (co, _) = load_tables(EXAMPLES).jobs
    twin = Job.model_validate(co.model_dump() | {"id": "registered-twin"})
    plan, refused = plan_registration([twin], [co])
    assert plan == []
    assert "duplicates registered-twin" in refused[0].reason


# -- the ids of real databases --------------------------------------------------------------------

JOB_UUID = "3F2504E0-4F89-11D3-9A0C-0305E82C3301"
CHOICE_HEX = "C91D2E3F4A5B6C7D8E9F0A1B2C3D4E5F"  # a VARCHAR(32) key


def real_tables() -> dict[str, list[dict[str, Any]]]:
    """A job keyed as a real database keys it: a UUID job, numeric and hexadecimal steps, params
    and conditions, every reference between the tables made with those ids."""
    return {
        JOB: [
            {
                "id": JOB_UUID,
                "job_name": "CO high",
                "trigger_type": "BizObject",
                "object_id": "factory_latest",
                "trigger_sub_type": "Update",
                "designer_offset": json.dumps({"1001": {"x": 10, "y": 20}, "x": 120, "y": 40}),
                "tenant_app_id": "aegis",
                "tenant_account_id": "plant-ops",
            }
        ],
        STEP: [
            {
                "id": "1001",
                "job_id": JOB_UUID,
                "step_type": "TASK",
                "step_sub_type": "READ_MODEL_QUERY",
                "is_start_point": "Y",
            },
            {"id": CHOICE_HEX, "job_id": JOB_UUID, "step_type": "FLOW", "step_sub_type": "CHOICE"},
            {
                "id": "1002",
                "job_id": JOB_UUID,
                "flow_step_id": CHOICE_HEX,
                "step_type": "DUMMY",
                "condition_expr": "NumberGT([$.steps['1001'].count], 0)",
            },
            {
                "id": "1003",
                "job_id": JOB_UUID,
                "flow_step_id": CHOICE_HEX,
                "step_type": "DUMMY",
                "next_step_id": "1001",
            },
            {
                "id": "1004",
                "job_id": JOB_UUID,
                "step_type": "TASK",
                "step_sub_type": "PUBLISH_EVENT",
                "catch_step_id": "1005",
            },
            {"id": "1005", "job_id": JOB_UUID, "step_type": "DUMMY"},
        ],
        PARAM: [
            {
                "id": "501",
                "job_id": JOB_UUID,
                "step_id": "1004",
                "param_key": "detail",
                "data_type": "OBJECT",
            },
            {
                "id": "502",
                "step_id": "1004",
                "parent_param_id": "501",
                "param_key": "count",
                "source_type": "RETURN_DATA",
                "ref_path": "1001.count",
            },
        ],
        CONDITION: [
            {"id": "77", "step_id": "1001", "field_id": "risk.level", "comparison_type": "EXISTS"}
        ],
    }


def test_real_database_ids_become_valid_ids_in_every_reference(tmp_path: Path) -> None:
    result = load(tmp_path, real_tables())
    assert result.problems == []
    (job,) = result.jobs
    assert (job.id, job.source_id) == (f"job-{JOB_UUID.lower()}", JOB_UUID)
    choice = "c91d2e3f4a5b6c7d8e9f0a1b2c3d4e5f"  # valid once lower-cased: no prefix
    assert [(s.id, s.source_id, s.flow_step_id) for s in job.steps] == [
        ("step_1001", "1001", None),
        (choice, CHOICE_HEX, None),
        ("step_1002", "1002", choice),
        ("step_1003", "1003", choice),
        ("step_1004", "1004", None),
        ("step_1005", "1005", None),
    ]
    assert job.step("step_1003").next_step_id == "step_1001"
    assert job.step("step_1004").catch_step_id == "step_1005"
    assert job.step("step_1002").condition_expr == "NumberGT([$.steps.step_1001.count], 0)"
    detail, count = job.params
    assert (detail.id, detail.source_id, detail.step_id) == ("param_501", "501", "step_1004")
    assert (count.parent_param_id, count.ref_path) == ("param_501", "step_1001.count")
    (condition,) = job.conditions
    assert (condition.id, condition.source_id, condition.step_id) == (
        "condition_77",
        "77",
        "step_1001",
    )
    assert job.designer_offset == {"step_1001": {"x": 10, "y": 20}, "x": 120, "y": 40}
    assert job.tenant == "aegis/plant-ops"


def test_real_database_ids_import_again_unchanged(tmp_path: Path) -> None:
    first = load(tmp_path, real_tables()).jobs
    again = load_tables(write_json(tmp_path / "again", real_tables())).jobs  # JSON this time
    assert again == first
    stored = [
        j.model_copy(update={"version": 1, "created_at": "t", "updated_at": "t"}) for j in first
    ]
    plan, refused = plan_registration(stored, again)
    assert [(p.action, p.version) for p in plan] == [(Action.UNCHANGED, 1)] and refused == []


def test_numeric_ids_in_a_json_file_are_read_as_their_text(tmp_path: Path) -> None:
    data = real_tables()
    for table in (STEP, PARAM, CONDITION):
        for row in data[table]:
            for column in ("id", "step_id", "parent_param_id", "next_step_id", "catch_step_id"):
                if isinstance(row.get(column), str) and row[column].isdigit():
                    row[column] = int(row[column])
    assert load(tmp_path, data, as_json=True).jobs == load(tmp_path / "csv", real_tables()).jobs


def test_ids_differing_only_in_case_are_refused_naming_both_rows(tmp_path: Path) -> None:
    data = real_tables()
    data[STEP].append(
        {"id": CHOICE_HEX.lower(), "job_id": JOB_UUID, "step_type": "DUMMY", "seq": "9"}
    )
    data[JOB].append(dict(data[JOB][0], id=JOB_UUID.lower()))
    data[STEP].append(
        {"id": "x1", "job_id": JOB_UUID.lower(), "step_type": "DUMMY", "is_start_point": "Y"}
    )
    result = load(tmp_path, data)
    found = [str(p) for p in result.problems]
    job_id = f"job-{JOB_UUID.lower()}"
    assert found == [
        f"orch_job row 2 (line 3) [job {job_id}]: id {JOB_UUID.lower()!r} and row 1's id "
        f"{JOB_UUID!r} both become the job id {job_id!r}: rename one of them (ids that differ "
        "only in case or punctuation are one id here)",
        f"orch_job_step row 7 (line 8) [job {job_id}]: id {CHOICE_HEX.lower()!r} and row 2's id "
        f"{CHOICE_HEX!r} both become the step id {CHOICE_HEX.lower()!r}: rename one of them (ids "
        "that differ only in case or punctuation are one id here)",
    ]
    assert result.good_jobs == []  # neither job is registered: never merged


def test_one_new_id_in_two_jobs_is_no_collision(tmp_path: Path) -> None:
    data = tables()
    data[STEP][1]["id"] = "1024"  # j1's query step: step_1024
    data[CONDITION][0]["step_id"] = "1024"
    data[JOB].append(dict(data[JOB][0], id="j2", **AUTOMATION))
    data[STEP].append(
        {"id": "step_1024", "job_id": "j2", "step_type": "DUMMY", "is_start_point": "Y"}
    )
    result = load(tmp_path, data)
    assert result.problems == []
    assert [[s.id for s in j.steps] for j in result.jobs] == [
        ["notify", "step_1024"],
        ["step_1024"],
    ]


def test_the_plan_refuses_a_registered_job_of_another_original_id(tmp_path: Path) -> None:
    (job,) = load(tmp_path, real_tables()).jobs
    other = job.model_copy(update={"source_id": JOB_UUID.lower(), "version": 1})
    for replace in (False, True):
        plan, refused = plan_registration([other], [job], replace=replace)
        assert plan == []
        assert refused[0].reason == (
            f"job {job.id} is registered from the id {JOB_UUID.lower()!r}, and this row's id "
            f"{JOB_UUID!r} becomes the same id: rename one of them"
        )


# -- tenants --------------------------------------------------------------------------------------


def test_a_job_belongs_to_the_tenant_of_its_row(tmp_path: Path) -> None:
    (job,) = load(tmp_path, tables()).jobs
    assert job.tenant == "aegis/plant-ops"
    data = tables()
    for column in TENANT_COLUMNS:
        del data[JOB][0][column]
    del data[STEP][0]["tenant_app_id"]
    (plain,) = load(tmp_path, data).jobs
    assert plain.tenant is None


@pytest.mark.parametrize(
    ("app", "account", "reason"),
    [
        ("aegis", None, "tenant_app_id without tenant_account_id: a job's tenant is both"),
        (None, "plant-ops", "tenant_account_id without tenant_app_id: a job's tenant is both"),
        ("aegis", "plant ops", "tenant_account_id 'plant ops' cannot name a tenant"),
    ],
)
def test_a_tenant_that_cannot_be_told_is_refused(
    tmp_path: Path, app: str | None, account: str | None, reason: str
) -> None:
    data = tables()
    data[JOB][0] |= {"tenant_app_id": app, "tenant_account_id": account}
    data[STEP][0].pop("tenant_app_id")
    problem = only(load(tmp_path, data))
    assert (problem.table, problem.row, problem.job) == (JOB, 1, "j1")
    assert problem.reason.startswith(reason), problem.reason


def test_the_plan_refuses_a_job_of_an_undeclared_tenant(tmp_path: Path) -> None:
    result = load(tmp_path, tables())
    declared = Tenants({"aegis/plant-ops": ("factory-a",)}, "tenants.yaml")
    plan, refused = plan_registration([], result.jobs, rows=result.job_rows, tenants=declared)
    assert [p.job.id for p in plan] == ["j1"] and refused == []
    other = Tenants({"aegis/other": ()}, "tenants.yaml")
    plan, refused = plan_registration([], result.jobs, rows=result.job_rows, tenants=other)
    assert plan == []
    assert [str(p) for p in refused] == [
        "orch_job row 1 (line 2) [job j1]: job j1 belongs to tenant 'aegis/plant-ops', which the "
        "tenants file tenants.yaml does not declare"
    ]
