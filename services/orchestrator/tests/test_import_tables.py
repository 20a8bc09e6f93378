"""``aegis jobs import --tables DIR`` against the S3/DynamoDB emulator: the example tables (CSV,
and the same rows as JSON) are registered, ``aegis jobs show`` shows each job with the tenant and
audit columns it kept, a second import changes nothing, and a bad row registers nothing."""

from __future__ import annotations

import asyncio
import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_devstack.testing.storage import Foundation

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples" / "jobs-tables"
TABLES = ("orch_job", "orch_job_step", "orch_step_param", "orch_task_condition")
ORIGIN = {
    "tenant_app_id": "aegis",
    "tenant_account_id": "plant-ops",
    "created_by": "kim.jiwoo",
    "modified_by": "park.minseo",
    "created_at": "2025-11-03 09:14:22",
    "updated_at": "2025-11-20 17:02:05",
}


def aegis(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


async def cli(*args: str) -> Any:
    """An ``aegis`` command in a thread (it runs its own event loop)."""
    return await asyncio.to_thread(aegis, *args)


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
