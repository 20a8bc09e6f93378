"""``aegis jobs validate``: a jobs file checked as ``register`` would, with nothing registered and
no storage read; every problem named by job, field and reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_orchestration.asl import DEFAULT_FUNCTION_ARN
from aegis_orchestrator import cli

EXAMPLES = Path(__file__).resolve().parents[3] / "deploy" / "jobs" / "examples.yaml"
runner = CliRunner()

BROKEN = """\
jobs:
  - id: no-steps
    job_name: a schedule without steps
    trigger_type: Schedule
  - id: bad-type
    job_name: n
    trigger_type: Nope
    steps: []
  - just a string
"""


@pytest.fixture(autouse=True)
def no_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    # validate reads nothing: an endpoint where nothing listens would fail any read
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", "http://127.0.0.1:9")


def test_the_examples_are_valid() -> None:
    result = runner.invoke(app, ["jobs", "validate", str(EXAMPLES)])
    assert result.exit_code == 0, result.output
    assert "job(s) valid" in result.stdout

    as_json = runner.invoke(app, ["jobs", "validate", str(EXAMPLES), "--json"])
    doc = json.loads(as_json.stdout)
    assert doc["valid"] is True and doc["problems"] == []
    assert "gas-leak-escalation" in doc["jobs"]


def test_every_problem_is_named_by_job_field_and_reason(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(BROKEN)
    result = runner.invoke(app, ["jobs", "validate", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "jobs[no-steps]: a job needs at least one step" in result.stderr
    assert "jobs[no-steps]: a Schedule job needs trigger_cron" in result.stderr
    assert "jobs[bad-type] trigger_type: Input should be" in result.stderr
    assert "jobs[2]: not a mapping" in result.stderr

    doc = json.loads(runner.invoke(app, ["jobs", "validate", str(path), "--json"]).stdout)
    assert doc["valid"] is False and doc["jobs"] == []
    problems = {(p["job"], p["field"]) for p in doc["problems"]}
    assert {("no-steps", None), ("bad-type", "trigger_type"), ("2", None)} <= problems
    assert all(p["reason"] for p in doc["problems"])


def test_a_json_file_and_the_tree_checks(tmp_path: Path) -> None:
    step = {"id": "a", "step_type": "TASK", "step_sub_type": "SLACK_NOTIFY", "seq": 1}
    jobs = {
        "jobs": [
            {
                "id": "loop",
                "job_name": "n",
                "trigger_type": "Platform",
                "steps": [step | {"is_start_point": True, "next_step_id": "missing"}],
            }
        ]
    }
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    doc = json.loads(runner.invoke(app, ["jobs", "validate", str(path), "--json"]).stdout)
    assert doc["valid"] is False
    assert any(p["job"] == "loop" and p["field"] == "step a" for p in doc["problems"]), doc


def test_not_a_jobs_file(tmp_path: Path) -> None:
    for name, text, reason in (
        ("a.json", "{not json", "not JSON"),
        ("a.yaml", "jobs: [unclosed", "not YAML"),
        ("b.yaml", "- 1\n", "expected a mapping with a 'jobs' list"),
    ):
        path = tmp_path / name
        path.write_text(text)
        result = runner.invoke(app, ["jobs", "validate", str(path), "--json"])
        assert result.exit_code == 1
        (problem,) = json.loads(result.stdout)["problems"]
        assert problem["job"] is None and problem["reason"].startswith(reason)
    missing = runner.invoke(app, ["jobs", "validate", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2


def test_the_help_default_arn_is_the_exporters() -> None:
    assert cli.DEFAULT_FUNCTION_ARN == DEFAULT_FUNCTION_ARN
