"""``aegis jobs import --tables DIR`` against the S3/DynamoDB emulator: the example tables (CSV,
and the same rows as JSON) are registered, ``aegis jobs show`` shows each job with the tenant and
audit columns it kept, a second import changes nothing, and a bad row registers nothing; the
same tables keyed as a real database keys them (UUID, hexadecimal and numeric ids) import with
valid ids and their originals kept; a job of a tenant the tenants file does not declare is
refused."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aegis_devstack.testing.cli import invoke, invoke_in_thread
from aegis_devstack.testing.storage import Foundation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples" / "jobs-tables"
TENANTS_FILE = EXAMPLES.parent / "tenants.yaml"
TABLES = ("orch_job", "orch_job_step", "orch_step_param", "orch_task_condition")
ORIGIN = {
    "tenant_app_id": "aegis",
    "tenant_account_id": "plant-ops",
    "created_by": "kim.jiwoo",
    "modified_by": "park.minseo",
    "created_at": "2025-11-03 09:14:22",
    "updated_at": "2025-11-20 17:02:05",
}


aegis, cli = invoke, invoke_in_thread


def as_json(result: Any) -> Any:
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}: {result.output}") from None


@pytest.fixture
def environment(
    monkeypatch: pytest.MonkeyPatch, foundation: Foundation, aws_endpoint: str, nats_url: str
) -> Foundation:
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", aws_endpoint)
    monkeypatch.setenv("AEGIS_TABLE", foundation.table)
    monkeypatch.setenv("AEGIS_BUCKET", foundation.bucket)
    monkeypatch.setenv("AEGIS_NATS_URL", nats_url)
    monkeypatch.setenv("AEGIS_ORCHESTRATOR_TENANTS_FILE", str(TENANTS_FILE))
    return foundation


def json_copy(folder: Path) -> Path:
    """The example tables as JSON files (empty cells as null)."""
    folder.mkdir()
    for table in TABLES:
        with (EXAMPLES / f"{table}.csv").open(newline="", encoding="utf-8") as f:
            rows = [{k: (v or None) for k, v in row.items()} for row in csv.DictReader(f)]
        (folder / f"{table}.json").write_text(json.dumps(rows, indent=1))
    return folder


async def test_the_example_tables_import_once_and_show_their_origin(
    environment: Foundation, tmp_path: Path
) -> None:
    dry = await cli("jobs", "import", "--tables", str(EXAMPLES), "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert [(j["id"], j["action"]) for j in as_json(dry)["jobs"]] == [
        ("co-high-factory-a", "register"),
        ("nightly-shift-note", "register"),
    ]
    assert as_json(await cli("jobs", "list", "--json")) == []  # a dry run writes nothing

    first = await cli("jobs", "import", "--tables", str(EXAMPLES), "--json")
    assert first.exit_code == 0, first.output
    doc = as_json(first)
    assert doc["changed"] is True and doc["problems"] == []
    assert [(j["id"], j["action"], j["version"]) for j in doc["jobs"]] == [
        ("co-high-factory-a", "register", 1),
        ("nightly-shift-note", "register", 1),
    ]
    assert doc["deleted_rows"] == {"orch_job_step": 1, "orch_step_param": 1}

    shown = as_json(await cli("jobs", "show", "co-high-factory-a", "--json"))
    assert shown["origin"] == ORIGIN and shown["version"] == 1
    assert [s["id"] for s in shown["steps"]] == [
        "notify",
        "respond",
        "call_maintenance",
        "evacuate",
        "check",
    ]
    assert len(shown["params"]) == 8 and len(shown["conditions"]) == 2
    as_yaml = await cli("jobs", "show", "co-high-factory-a")
    assert "tenant_account_id: plant-ops" in as_yaml.stdout
    assert "modified_by: park.minseo" in as_yaml.stdout

    # the same tables again, as CSV and as JSON: nothing changes, and the command says so
    again = await cli("jobs", "import", "--tables", str(EXAMPLES))
    assert again.exit_code == 0, again.output
    assert "unchanged co-high-factory-a v1" in again.stdout
    assert "nothing changed: 2 job(s) already registered" in again.stdout
    from_json = await cli("jobs", "import", "--tables", str(json_copy(tmp_path / "j")), "--json")
    assert from_json.exit_code == 0, from_json.output
    doc = as_json(from_json)
    assert doc["changed"] is False
    assert {(j["action"], j["version"]) for j in doc["jobs"]} == {("unchanged", 1)}
    assert {j["version"] for j in as_json(await cli("jobs", "list", "--json"))} == {1}


async def test_a_bad_row_registers_nothing_unless_skip_bad(
    environment: Foundation, tmp_path: Path
) -> None:
    folder = tmp_path / "bad"
    shutil.copytree(EXAMPLES, folder)
    steps = folder / "orch_job_step.csv"
    # the schedule job's only step gets a type the model does not know
    steps.write_text(
        steps.read_text().replace(
            "note,nightly-shift-note,,Publish the note,,TASK",
            "note,nightly-shift-note,,Publish the note,,JOB",
        )
    )

    refused = await cli("jobs", "import", "--tables", str(folder), "--json")
    assert refused.exit_code == 1, refused.output
    doc = as_json(refused)
    assert doc["jobs"] == [] and doc["changed"] is False
    (problem,) = doc["problems"]
    assert (problem["table"], problem["row"], problem["line"], problem["job"]) == (
        "orch_job_step",
        7,
        8,
        "nightly-shift-note",
    )
    assert problem["reason"].startswith("step_type: ")
    assert as_json(await cli("jobs", "list", "--json")) == []

    text = await cli("jobs", "import", "--tables", str(folder))
    assert text.exit_code == 1
    assert "orch_job_step row 7 (line 8) [job nightly-shift-note]: step_type:" in text.stderr
    assert "refused: 1 problem(s); nothing registered" in text.stderr

    partial = await cli("jobs", "import", "--tables", str(folder), "--skip-bad", "--json")
    assert partial.exit_code == 3, partial.output
    doc = as_json(partial)
    assert [j["id"] for j in doc["jobs"]] == ["co-high-factory-a"]
    assert doc["skipped"] == ["nightly-shift-note"]
    listed = as_json(await cli("jobs", "list", "--json"))
    assert [j["id"] for j in listed] == ["co-high-factory-a"]


async def test_a_changed_row_is_refused_until_replace(
    environment: Foundation, tmp_path: Path
) -> None:
    assert (await cli("jobs", "import", "--tables", str(EXAMPLES))).exit_code == 0
    folder = tmp_path / "changed"
    shutil.copytree(EXAMPLES, folder)
    jobs = folder / "orch_job.csv"
    jobs.write_text(jobs.read_text().replace("Night shift hand-over note", "Night shift note"))

    refused = await cli("jobs", "import", "--tables", str(folder))
    assert refused.exit_code == 1
    assert "nightly-shift-note is registered and differs" in refused.stderr
    replaced = as_json(await cli("jobs", "import", "--tables", str(folder), "--replace", "--json"))
    assert {j["id"]: (j["action"], j["version"]) for j in replaced["jobs"]} == {
        "co-high-factory-a": ("unchanged", 1),
        "nightly-shift-note": ("replace", 2),
    }
    shown = as_json(await cli("jobs", "show", "nightly-shift-note", "--json"))
    assert shown["job_name"] == "Night shift note" and shown["version"] == 2


def test_a_file_or_tables_not_both() -> None:
    both = aegis("jobs", "import", str(EXAMPLES / "orch_job.csv"), "--tables", str(EXAMPLES))
    assert both.exit_code == 2
    assert aegis("jobs", "import").exit_code == 2
    assert aegis("jobs", "import", str(EXAMPLES / "orch_job.csv"), "--dry-run").exit_code == 2


# the example's ids as a real database has them: UUIDs, VARCHAR(32) hexadecimal and numeric keys
REAL_IDS = {
    "co-high-factory-a": "3F2504E0-4F89-11D3-9A0C-0305E82C3301",
    "nightly-shift-note": "1024",
    "notify": "A1B2C3D4E5F60718293A4B5C6D7E8F90",
    "respond": "2001",
    "call_maintenance": "2002",
    "evacuate": "2003",
    "check": "2004",
    "note": "2005",
    "old_notify": "2006",
    "maint_body": "0F1E2D3C4B5A69788796A5B4C3D2E1F0",
    "maint_factory": "3001",
    "check_level": "4001",
}
ID_COLUMNS = ("id", "job_id", "step_id", "flow_step_id", "parent_param_id")


def with_real_ids(folder: Path) -> Path:
    """The example tables with the ids of :data:`REAL_IDS` in every column that holds one."""
    folder.mkdir()
    for table in TABLES:
        with (EXAMPLES / f"{table}.csv").open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            columns = list(reader.fieldnames or ())
            rows = [
                {k: REAL_IDS.get(v, v) if k in ID_COLUMNS else v for k, v in row.items()}
                for row in reader
            ]
        with (folder / f"{table}.csv").open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, columns)
            writer.writeheader()
            writer.writerows(rows)
    return folder


async def test_tables_with_real_database_ids_import_once_with_their_originals_kept(
    environment: Foundation, tmp_path: Path
) -> None:
    folder = with_real_ids(tmp_path / "real")
    first = await cli("jobs", "import", "--tables", str(folder), "--json")
    assert first.exit_code == 0, first.output
    co = "job-3f2504e0-4f89-11d3-9a0c-0305e82c3301"
    assert [(j["id"], j["source_id"], j["tenant"]) for j in as_json(first)["jobs"]] == [
        (co, REAL_IDS["co-high-factory-a"], "aegis/plant-ops"),
        ("job-1024", "1024", "aegis/plant-ops"),
    ]

    shown = as_json(await cli("jobs", "show", co, "--json"))
    assert shown["source_id"] == REAL_IDS["co-high-factory-a"]
    notify = "a1b2c3d4e5f60718293a4b5c6d7e8f90"  # valid once lower-cased
    assert [(s["id"], s["source_id"], s["flow_step_id"]) for s in shown["steps"]] == [
        (notify, REAL_IDS["notify"], None),
        ("step_2001", "2001", None),
        ("step_2002", "2002", "step_2001"),
        ("step_2003", "2003", "step_2001"),
        ("step_2004", "2004", None),
    ]
    params = {p["param_key"]: p for p in shown["params"]}
    body = "param_0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    assert (params["body"]["id"], params["body"]["source_id"]) == (body, REAL_IDS["maint_body"])
    assert (params["factory_id"]["id"], params["factory_id"]["parent_param_id"]) == (
        "param_3001",
        body,
    )
    assert params["text"]["step_id"] == notify and "source_id" not in params["text"]
    assert [(c["id"], c.get("source_id"), c["step_id"]) for c in shown["conditions"]] == [
        ("condition_4001", "4001", "step_2004"),
        ("check_newest", None, "step_2004"),  # valid: kept, no source_id
    ]
    assert shown["tenant"] == "aegis/plant-ops"

    again = await cli("jobs", "import", "--tables", str(folder))
    assert again.exit_code == 0, again.output
    assert f"unchanged {co} v1" in again.stdout
    assert "nothing changed: 2 job(s) already registered" in again.stdout


async def test_two_ids_that_become_one_are_refused_naming_both_rows(
    environment: Foundation, tmp_path: Path
) -> None:
    folder = with_real_ids(tmp_path / "real")
    steps = folder / "orch_job_step.csv"
    twin = REAL_IDS["notify"].lower()  # differs from the notify step's id only in case
    steps.write_text(
        steps.read_text()
        + f"{twin},{REAL_IDS['co-high-factory-a']},,Twin,,DUMMY,,N,aegis,plant-ops,Y,,,,\n"
    )
    refused = await cli("jobs", "import", "--tables", str(folder))
    assert refused.exit_code == 1, refused.output
    assert (
        f"orch_job_step row 8 (line 9) [job job-3f2504e0-4f89-11d3-9a0c-0305e82c3301]: id "
        f"{twin!r} and row 1's id {REAL_IDS['notify']!r} both become the step id {twin!r}"
    ) in refused.stderr
    assert as_json(await cli("jobs", "list", "--json")) == []


async def test_a_job_of_an_undeclared_tenant_is_refused_naming_the_tenant(
    environment: Foundation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AEGIS_ORCHESTRATOR_TENANTS_FILE")
    unset = await cli("jobs", "import", "--tables", str(EXAMPLES))
    assert unset.exit_code == 1, unset.output
    assert (
        "[job co-high-factory-a]: job co-high-factory-a belongs to tenant 'aegis/plant-ops', "
        "and no tenants file declares it (AEGIS_ORCHESTRATOR_TENANTS_FILE is not set)"
    ) in unset.stderr

    other = tmp_path / "tenants.yaml"
    other.write_text("tenants:\n  aegis/audit: [factory-a]\n")
    monkeypatch.setenv("AEGIS_ORCHESTRATOR_TENANTS_FILE", str(other))
    refused = await cli("jobs", "import", "--tables", str(EXAMPLES), "--json")
    assert refused.exit_code == 1, refused.output
    assert {p["job"]: p["reason"] for p in as_json(refused)["problems"]} == {
        job: f"job {job} belongs to tenant 'aegis/plant-ops', which the tenants file {other} "
        "does not declare"
        for job in ("co-high-factory-a", "nightly-shift-note")
    }
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(
        "jobs:\n- {id: t1, job_name: t1, trigger_type: Automation, tenant: aegis/plant-ops,\n"
        "   steps: [{id: a, step_type: DUMMY, is_start_point: true}]}\n"
    )
    registered = await cli("jobs", "register", str(jobs_file))
    assert registered.exit_code == 1, registered.output
    assert "job t1 belongs to tenant 'aegis/plant-ops', which the tenants file" in registered.stderr
    assert as_json(await cli("jobs", "list", "--json")) == []
