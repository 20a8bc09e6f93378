"""export-asl: the examples as Amazon States Language, validated by the maintained npm package
``asl-validator`` (installed into a cache folder on first use; skipped only without npm), and the
DSL -> Choice rule mapping."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from aegis_orchestration.asl import AslExportError, choice_rule, export_asl
from aegis_orchestration.dsl import parse
from aegis_orchestration.yamlio import load_jobs

EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"
CACHE = Path(os.environ.get("AEGIS_NPM_CACHE", Path.home() / ".cache" / "aegis-npm"))
VALIDATOR = CACHE / "node_modules" / ".bin" / "asl-validator"


@pytest.fixture(scope="module")
def asl_validator() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    if not VALIDATOR.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "npm",
                "install",
                "--prefix",
                str(CACHE),
                "--no-audit",
                "--no-fund",
                "asl-validator@4",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return VALIDATOR


def test_every_example_exports_to_valid_asl(asl_validator: Path, tmp_path: Path) -> None:
    for job in load_jobs(EXAMPLES.read_text()):
        path = tmp_path / f"{job.id}.json"
        path.write_text(json.dumps(export_asl(job)))
        done = subprocess.run(
            [str(asl_validator), "--json-path", str(path)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_example_maps_every_state_type() -> None:
    job = next(j for j in load_jobs(EXAMPLES.read_text()) if j.id == "gas-leak-escalation")
    states = export_asl(job)["States"]
    types = {s["Type"] for s in states.values()}
    assert types == {"Pass", "Task", "Parallel", "Choice", "Wait", "Succeed"}
    notify = states["notify"]
    assert notify["Retry"][0]["MaxAttempts"] == 2
    assert states["respond"]["Catch"][0]["Next"] == "maintenance_down"
    loop_exit = states["still_critical__choose"]["Choices"][0]
    assert loop_exit == {
        "Variable": "$.loops.still_critical.n",
        "NumericGreaterThan": 3,
        "Next": "done",
    }


def test_dsl_to_choice_rules() -> None:
    rule = choice_rule(parse('AND(StringEQ([$.a], "x"), NOT(NumberGE([$.b], 2)))').condition)
    assert rule == {
        "And": [
            {
                "And": [
                    {"Variable": "$.a", "IsPresent": True},
                    {"Variable": "$.a", "IsString": True},
                    {"Variable": "$.a", "StringEquals": "x"},
                ]
            },
            {
                "Not": {
                    "And": [
                        {"Variable": "$.b", "IsPresent": True},
                        {"Variable": "$.b", "IsNumeric": True},
                        {"Variable": "$.b", "NumericGreaterThanEquals": 2},
                    ]
                }
            },
        ]
    }
    with pytest.raises(AslExportError, match="Array"):
        choice_rule(parse('StringEQ(Array([$.a], [@.b]), "x")').condition)
    with pytest.raises(AslExportError, match="wildcards"):
        choice_rule(parse('StringEQ([$.a[*].b], "x")').condition)
