"""The built-in interpreter: parallel branches run concurrently, a CHOICE loop stops at
repeat_limit, a failing task retries with backoff then takes its catch path, every step is
recorded. Executors are in-memory stand-ins; the service tests run the same job on real servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aegis_orchestration.engine import Interpreter
from aegis_orchestration.model import Job, JobStep, TaskKind
from aegis_orchestration.yamlio import load_jobs

EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"
TRIGGER = {
    "pk": "FACTORY#factory-b",
    "afterData": {"factory_id": "factory-b", "risk": {"level": "CRITICAL", "score": 90}},
}


def example(fast: bool = True) -> Job:
    job = next(j for j in load_jobs(EXAMPLES.read_text()) if j.id == "gas-leak-escalation")
    steps = [
        s.model_copy(update={"wait_seconds": 0.01}) if s.id == "wait_2m" else s for s in job.steps
    ]
    return job.model_copy(update={"steps": steps})


class Fake:
    def __init__(self, fail: set[str] | None = None, critical: bool = True) -> None:
        self.calls: list[tuple[str, dict[str, Any], float]] = []
        self.fail = fail or set()
        self.critical = critical
        self.sleeps: list[float] = []

    async def __call__(self, step: JobStep, params: dict[str, Any], ctx: Mapping[str, Any]) -> Any:
        start = time.monotonic()
        self.calls.append((step.id, params, start))
        if step.id in ("call_maintenance", "evacuate"):
            await asyncio.sleep(0.2)
        if step.id in self.fail:
            raise RuntimeError(f"{step.id} answered 500")
        if step.id == "check":
            return {"items": [{"risk": {"level": "CRITICAL" if self.critical else "NORMAL"}}]}
        return {"ok": True}

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def interpreter(job: Job, fake: Fake) -> Interpreter:
    return Interpreter(
        job,
        dict.fromkeys(TaskKind, fake),
        clock=lambda: datetime.now(UTC),
        sleep=fake.sleep,
        environment={"AEGIS_JOB_MAINTENANCE_URL": "http://127.0.0.1:9/hook"},
    )


async def test_parallel_branches_run_concurrently() -> None:
    fake = Fake(critical=False)
    result = await interpreter(example(), fake).run(TRIGGER)
    assert result.status == "SUCCEEDED"
    starts = {name: at for name, _, at in fake.calls}
    assert abs(starts["call_maintenance"] - starts["evacuate"]) < 0.1  # both began together
    assert result.context["steps"]["respond"][0]["call_maintenance"] == {"ok": True}
    assert fake.calls[1][1]["body"] == {
        "factory_id": "factory-b",
        "score": 90,
        "reason": "gas_leak",
    }


async def test_choice_loop_stops_at_repeat_limit() -> None:
    fake = Fake(critical=True)
    result = await interpreter(example(), fake).run(TRIGGER)
    assert result.status == "SUCCEEDED"
    assert [n for n, _, _ in fake.calls].count("escalate") == 3  # repeat_limit
    choices = [r for r in result.records if r.step_id == "still_critical"]
    assert [c.status for c in choices] == ["SUCCEEDED"] * 3 + ["REPEAT_LIMIT"]
    assert result.records[-1].step_id == "done"


async def test_a_failing_task_retries_then_takes_its_catch_path() -> None:
    fake = Fake(fail={"call_maintenance"}, critical=False)
    result = await interpreter(example(), fake).run(TRIGGER)
    assert result.status == "SUCCEEDED"
    assert [n for n, _, _ in fake.calls].count("call_maintenance") == 3  # 1 + max_attempts 2
    assert fake.sleeps[:2] == [1.0, 2.0]  # interval_s, then backoff_rate 2
    by_step = {r.step_id: r for r in result.records}
    assert (
        by_step["call_maintenance"].status == "FAILED" and by_step["call_maintenance"].attempts == 3
    )
    assert by_step["respond"].status == "CAUGHT"
    assert result.context["errors"]["respond"]["Error"] == "RuntimeError"
    assert "maintenance_down" in by_step


async def test_every_step_is_recorded_and_an_uncaught_failure_fails_the_run() -> None:
    fake = Fake(fail={"notify"})
    result = await interpreter(example(), fake).run(TRIGGER)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["Error"] == "RuntimeError"
    assert [r.step_id for r in result.records] == ["notify"]
    assert result.records[0].attempts == 3
