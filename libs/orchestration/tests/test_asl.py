"""export-asl: the examples as Amazon States Language, validated by the maintained npm package
``asl-validator`` (installed into a cache folder on first use; skipped only without npm), the
DSL -> Choice rule mapping, the engine's bound on loops without a CHOICE, and the refusal to
decide a CHOICE on a trigger that came by reference. (The machines run on the emulator's Step
Functions in services/orchestrator/tests/test_stepfunctions.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aegis_orchestration.asl import AslExportError, choice_rule, export_asl
from aegis_orchestration.dsl import parse
from aegis_orchestration.engine import Interpreter
from aegis_orchestration.model import Job
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


LOOPS = Path(__file__).with_name("loops.yaml")


def loops() -> dict[str, Job]:
    return {job.id: job for job in load_jobs(LOOPS.read_text())}


def test_every_example_exports_to_valid_asl(asl_validator: Path, tmp_path: Path) -> None:
    for job in [*load_jobs(EXAMPLES.read_text()), *loops().values()]:
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


def test_loops_through_a_choice_get_no_run_counter() -> None:
    for job in load_jobs(EXAMPLES.read_text()):
        definition = export_asl(job)
        assert "runs" not in definition["States"]["Init"]["Parameters"], job.id
        assert not any(name.endswith("__Limit") for name in definition["States"]), job.id


async def test_a_loop_without_a_choice_fails_where_and_as_the_engine_fails() -> None:
    """The exported machine fails the (allowed + 1)th run of a step on the loop with the engine's
    error and cause, allowed = 1 + repeat_limit (no CHOICE in the job)."""
    job = loops()["spin"]
    states = export_asl(job)["States"]
    assert states["Init"]["Parameters"]["runs"] == {"tick": {"n": 0}, "tock": {"n": 0}}
    for sid in ("tick", "tock"):
        # every way into the step goes through its counter, which keeps the step's name
        assert states[sid]["Parameters"] == {"n.$": f"States.MathAdd($.runs.{sid}.n, 1)"}
        [rule] = states[f"{sid}__Count"]["Choices"]
        assert rule == {
            "Variable": f"$.runs.{sid}.n",
            "NumericGreaterThan": 4,
            "Next": f"{sid}__Limit",
        }
        assert states[f"{sid}__Count"]["Default"] == f"{sid}__Run"
    assert states["tock__Run"]["Next"] == "tick"
    engine = await Interpreter(job, {}, clock=lambda: datetime(2026, 12, 1, tzinfo=UTC)).run({})
    assert engine.status == "FAILED"
    assert engine.error == {
        "Error": states["tick__Limit"]["Error"],
        "Cause": states["tick__Limit"]["Cause"],
    }
    assert engine.error["Cause"] == (
        "step tick would run 5 times in this execution; its repeat_limit allows 4"
    )


def test_a_catch_path_back_to_its_step_is_counted() -> None:
    states = export_asl(loops()["retry-forever"])["States"]
    assert states["call__Run"]["Type"] == "Task"
    assert states["call__Run"]["Catch"][0]["Next"] == "pause"  # the counter of pause
    assert states["pause__Run"]["Next"] == "call"  # the counter of call
    assert states["call__Count"]["Choices"][0]["NumericGreaterThan"] == 5


def test_a_parallel_passes_the_repeat_limit_of_its_branches_past_its_catch() -> None:
    states = export_asl(loops()["caught-spin"])["States"]
    [branch] = states["fan"]["Branches"]
    assert {"tick__Limit", "tock__Limit"} <= set(branch["States"])
    first, last = states["fan"]["Catch"]
    assert first == {
        "ErrorEquals": ["RepeatLimitExceeded"],
        "ResultPath": "$.errors.fan",
        "Next": "fan__BranchLimit",
    }
    assert last["ErrorEquals"] == ["States.ALL"] and last["Next"] == "handled"
    assert states["fan__BranchLimit"] == {
        "Type": "Fail",
        "Error": "RepeatLimitExceeded",
        "CausePath": "$.errors.fan.Cause",
    }
    # the top level has no loop: nothing counted there
    assert "handled__Count" not in states and "fan__Count" not in states


def test_a_choice_on_the_trigger_refuses_a_trigger_by_reference() -> None:
    definition = export_asl(loops()["on-the-trigger"])
    states: dict[str, Any] = definition["States"]
    assert states["Init"]["Next"] == "TriggerInline"
    [rule] = states["TriggerInline"]["Choices"]
    assert rule == {
        "Variable": "$.trigger.claim_check",
        "IsPresent": True,
        "Next": "TriggerByReference",
    }
    assert states["TriggerInline"]["Default"] == "pick"
    assert states["TriggerByReference"]["Type"] == "Fail"
    assert "on-the-trigger" in states["TriggerByReference"]["Cause"]
    # a job whose CHOICEs read only step outputs has no such check
    for job in [*load_jobs(EXAMPLES.read_text()), *loops().values()]:
        if job.id != "on-the-trigger":
            assert "TriggerInline" not in export_asl(job)["States"], job.id
