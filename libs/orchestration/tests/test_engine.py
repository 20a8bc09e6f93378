"""The built-in interpreter: parallel branches run concurrently, a CHOICE loop stops at
repeat_limit, a failing task retries with backoff then takes its catch path, every step is
recorded. Executors are in-memory stand-ins; the service tests run the same job on real servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aegis_orchestration.asl import AslExportError, export_asl
from aegis_orchestration.engine import Interpreter, StepRecord
from aegis_orchestration.limits import Limits, json_size
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
        self.keys: list[str] = []
        self.now = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)

    def clock(self) -> datetime:
        return self.now

    async def __call__(
        self, step: JobStep, params: dict[str, Any], ctx: Mapping[str, Any], *, key: str
    ) -> Any:
        start = time.monotonic()
        self.calls.append((step.id, params, start))
        self.keys.append(key)
        if step.id in ("call_maintenance", "evacuate"):  # evacuate ends last
            await asyncio.sleep(0.1 if step.id == "call_maintenance" else 0.2)
        if step.id in self.fail:
            raise RuntimeError(f"{step.id} answered 500")
        if step.id == "check":
            return {"items": [{"risk": {"level": "CRITICAL" if self.critical else "NORMAL"}}]}
        return {"ok": True}

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += timedelta(seconds=seconds)


def interpreter(job: Job, fake: Fake) -> Interpreter:
    return Interpreter(
        job,
        dict.fromkeys(TaskKind, fake),
        clock=fake.clock,
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


class Crash(Exception):
    """The replica died: raised by the record hook, it ends the run without an outcome."""


async def interrupted(job: Job, fake: Fake, at: str) -> dict[str, StepRecord]:
    """Run ``job`` until the record of the step ``at`` (a WAIT: its WAITING record) is written,
    then crash; returns what had been written, by occurrence, as a store would hold it."""
    journal: dict[str, StepRecord] = {}

    async def on_step(record: StepRecord) -> None:
        journal[record.occurrence] = record
        if record.step_id == at:
            raise Crash

    run = interpreter(job, fake)
    run.on_step = on_step
    with pytest.raises((Crash, ExceptionGroup)):
        await run.run(TRIGGER)
    return journal


async def test_a_run_interrupted_in_a_parallel_resumes_the_branch_that_was_not_recorded() -> None:
    first = Fake(critical=False)
    journal = await interrupted(example(), first, at="call_maintenance")
    assert set(journal) == {"notify.1", "respond.1/call_maintenance.1"}
    assert [n for n, _, _ in first.calls] == ["notify", "call_maintenance", "evacuate"]

    second = Fake(critical=False)
    result = await interpreter(example(), second).run(TRIGGER, journal=journal)
    assert result.status == "SUCCEEDED"
    # the recorded steps are not called again; the branch in flight is, with the same key
    assert [n for n, _, _ in second.calls] == ["evacuate", "check"]
    assert second.keys[0] == first.keys[2] == "respond.1/evacuate.1"
    assert result.context["steps"]["respond"][0]["call_maintenance"] == {"ok": True}
    assert result.context["steps"]["notify"] == {"ok": True}


async def test_a_run_interrupted_in_a_wait_wakes_at_the_recorded_time() -> None:
    first = Fake(critical=False)
    journal = await interrupted(example(), first, at="wait_2m")
    waiting = journal["wait_2m.1"]
    assert waiting.status == "WAITING" and waiting.wake_at is not None

    second = Fake(critical=False)
    second.now = first.now + timedelta(seconds=0.004)  # restarted 4 ms into the 10 ms wait
    result = await interpreter(example(), second).run(TRIGGER, journal=journal)
    assert result.status == "SUCCEEDED"
    assert [n for n, _, _ in second.calls] == ["check"]
    assert sum(second.sleeps) == pytest.approx(
        (waiting.wake_at - first.now).total_seconds() - 0.004
    )
    wait = next(r for r in result.records if r.step_id == "wait_2m" and r.status == "SUCCEEDED")
    assert wait.wake_at == waiting.wake_at and wait.started_at == waiting.started_at


def fanout(branches: int, repeat_limit: int) -> Job:
    """A PARALLEL inside a loop: each branch's output is its copy of every earlier output, so the
    context multiplies by ``branches`` each round."""
    return Job.model_validate(
        {
            "id": "fanout",
            "job_name": "fanout",
            "trigger_type": "Automation",
            "repeat_limit": repeat_limit,
            "steps": [
                {"id": "fan", "step_type": "FLOW", "step_sub_type": "PARALLEL",
                 "is_start_point": True, "seq": 1},
                *[
                    {"id": f"b{i}", "flow_step_id": "fan", "step_type": "TASK",
                     "step_sub_type": "HTTP_WEBHOOK", "seq": i}
                    for i in range(branches)
                ],
                {"id": "again", "step_type": "FLOW", "step_sub_type": "CHOICE", "seq": 2},
                {"id": "loop", "flow_step_id": "again", "step_type": "DUMMY",
                 "next_step_id": "fan"},
            ],
        }
    )  # fmt: skip


async def test_a_parallel_in_a_loop_fails_cleanly_when_the_context_passes_its_limit() -> None:
    fake = Fake()
    limits = Limits(max_context_bytes=64 * 1024)
    run = Interpreter(
        fanout(3, repeat_limit=1000),
        dict.fromkeys(TaskKind, fake),
        clock=fake.clock,
        sleep=fake.sleep,
        limits=limits,
    )
    result = await run.run(TRIGGER)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["Error"] == "ContextTooLarge"
    assert "over the limit of 65536 bytes" in result.error["Cause"]
    rounds = [r for r in result.records if r.step_id == "fan"]
    assert 5 <= len(rounds) <= 12  # it grew round after round until the bound stopped it
    # at most one round past the limit was ever held: branches x limit, not 3**rounds
    assert json_size(result.context) < 4 * limits.max_context_bytes
    assert rounds[-1].status == "FAILED"


async def test_the_steps_per_execution_bound_ends_a_long_loop() -> None:
    fake = Fake()
    run = Interpreter(
        fanout(1, repeat_limit=1000),
        dict.fromkeys(TaskKind, fake),
        clock=fake.clock,
        sleep=fake.sleep,
        limits=Limits(max_steps=30),
    )
    result = await run.run(TRIGGER)
    assert result.error is not None and result.error["Error"] == "StepLimitExceeded"
    assert len(result.records) <= 30


async def test_a_loop_through_a_catch_path_is_bounded_and_never_caught() -> None:
    job = Job.model_validate(
        {
            "id": "retry-forever",
            "job_name": "retry-forever",
            "trigger_type": "Automation",
            "repeat_limit": 4,
            "steps": [
                {"id": "call", "step_type": "TASK", "step_sub_type": "HTTP_WEBHOOK",
                 "is_start_point": True, "seq": 1, "catch_step_id": "pause"},
                {"id": "pause", "step_type": "DUMMY", "seq": 2, "next_step_id": "call"},
            ],
        }
    )  # fmt: skip
    fake = Fake(fail={"call"})
    result = await interpreter(job, fake).run(TRIGGER)
    assert result.error is not None and result.error["Error"] == "RepeatLimitExceeded"
    assert [n for n, _, _ in fake.calls].count("call") == 5  # the first run + repeat_limit


async def test_nested_loops_share_one_choice_counter_each() -> None:
    """An inner loop inside a PARALLEL inside an outer loop: the inner CHOICE's counter is the
    execution's, not the branch copy's, so it stops after repeat_limit in total."""
    job = Job.model_validate(
        {
            "id": "nested",
            "job_name": "nested",
            "trigger_type": "Automation",
            "repeat_limit": 3,
            "steps": [
                {"id": "outer", "step_type": "FLOW", "step_sub_type": "PARALLEL",
                 "is_start_point": True, "seq": 1},
                {"id": "body", "flow_step_id": "outer", "step_type": "FLOW",
                 "step_sub_type": "SEQUENCE", "seq": 1},
                {"id": "work", "flow_step_id": "body", "step_type": "TASK",
                 "step_sub_type": "HTTP_WEBHOOK", "seq": 1},
                {"id": "inner", "flow_step_id": "body", "step_type": "FLOW",
                 "step_sub_type": "CHOICE", "seq": 2},
                {"id": "inner_back", "flow_step_id": "inner", "step_type": "DUMMY",
                 "next_step_id": "work"},
                {"id": "again", "step_type": "FLOW", "step_sub_type": "CHOICE", "seq": 2},
                {"id": "outer_back", "flow_step_id": "again", "step_type": "DUMMY",
                 "next_step_id": "outer"},
            ],
        }
    )  # fmt: skip
    fake = Fake()
    result = await interpreter(job, fake).run(TRIGGER)
    assert result.status == "SUCCEEDED", result.error
    # 4 outer passes, each runs `work` once, plus 3 inner loop-backs in all: 7, not 4 * 4 = 16
    assert [n for n, _, _ in fake.calls].count("work") == 7
    assert len(set(fake.keys)) == len(fake.keys)  # every run of a step has its own key


def two_calls() -> Job:
    """A Slack message from device data and the author's own text, then a webhook whose URL
    (with its token) comes from the environment."""
    return Job.model_validate(
        {
            "id": "leaky",
            "job_name": "leaky",
            "trigger_type": "Automation",
            "steps": [
                {"id": "tell", "step_type": "TASK", "step_sub_type": "SLACK_NOTIFY",
                 "is_start_point": True, "seq": 1},
                {"id": "hook", "step_type": "TASK", "step_sub_type": "HTTP_WEBHOOK", "seq": 2,
                 "retry": {"max_attempts": 1, "interval_s": 0}},
            ],
            "params": [
                {"id": "t1", "step_id": "tell", "param_key": "text", "source_type": "TRIGGER_DATA",
                 "ref_path": "afterData.note"},
                {"id": "t2", "step_id": "tell", "param_key": "channel", "param_value": "<#C1|ops>"},
                {"id": "h1", "step_id": "hook", "param_key": "url", "source_type": "ENVIRONMENT",
                 "param_value": "${AEGIS_JOB_HOOK_URL}?x=1"},
            ],
        }
    )  # fmt: skip


class Echo(Fake):
    """A webhook that fails once naming its URL, then answers with the URL it was called at."""

    async def __call__(
        self, step: JobStep, params: dict[str, Any], ctx: Mapping[str, Any], *, key: str
    ) -> Any:
        self.calls.append((step.id, params, time.monotonic()))
        if step.id == "hook" and (len(self.calls) == 2 or "hook" in self.fail):
            raise RuntimeError(f"connection to {params['url']} reset")
        return {"echo": params}


SECRET_URL = "https://hooks.example.com/services/T0KEN-abc123"


def leaky(echo: Echo) -> Interpreter:
    return Interpreter(
        two_calls(),
        dict.fromkeys(TaskKind, echo),
        clock=echo.clock,
        sleep=echo.sleep,
        environment={"AEGIS_JOB_HOOK_URL": SECRET_URL},
    )


async def test_environment_values_reach_the_call_but_never_the_log_or_the_context() -> None:
    echo = Echo()
    interp = leaky(echo)
    trigger = {"afterData": {"note": "<!channel> gas & smoke <https://evil.example|open me>"}}
    result = await interp.run(trigger)
    assert result.status == "SUCCEEDED"
    calls = {step: params for step, params, _ in echo.calls}
    assert calls["hook"]["url"] == f"{SECRET_URL}?x=1"  # the call itself has the real URL
    hook = next(r for r in result.records if r.step_id == "hook")
    assert hook.attempts == 2
    assert hook.input == {"url": "**********?x=1"}
    assert hook.output == {"echo": {"url": "**********?x=1"}}  # echoed back: scrubbed
    assert "T0KEN" not in repr(result.records) and "T0KEN" not in repr(result.context)


async def test_device_text_in_a_slack_step_is_escaped_and_the_authors_is_not() -> None:
    echo = Echo()
    interp = leaky(echo)
    trigger = {"afterData": {"note": "<!channel> gas & smoke <https://evil.example|open me>"}}
    await interp.run(trigger)
    tell = next(params for step, params, _ in echo.calls if step == "tell")
    assert tell["text"] == ("&lt;!channel&gt; gas &amp; smoke &lt;https://evil.example|open me&gt;")
    assert tell["channel"] == "<#C1|ops>"  # the job's author wrote it: a link stays a link


async def test_a_failure_naming_an_environment_value_is_logged_scrubbed() -> None:
    echo = Echo(fail={"hook"})
    interp = leaky(echo)
    result = await interp.run({"afterData": {"note": "x"}})
    assert result.status == "FAILED"
    hook = next(r for r in result.records if r.step_id == "hook")
    assert hook.error == {"Error": "RuntimeError", "Cause": "connection to **********?x=1 reset"}
    assert "T0KEN" not in repr(result.records) and "T0KEN" not in repr(result.context)


# -- OUT and INOUT params: a step's output written back for the steps after it ---------------


def counting() -> Job:
    """``count`` reads the read model (its answer has ``count``), ``bump`` takes a counter in
    and gives it back changed, ``tell`` reads both back: from the globals and the payload."""
    return Job.model_validate(
        {
            "id": "counting",
            "job_name": "counting",
            "trigger_type": "Automation",
            "global_params": {"attempts": 1},
            "steps": [
                {"id": "count", "step_type": "TASK", "step_sub_type": "READ_MODEL_QUERY",
                 "is_start_point": True, "seq": 1},
                {"id": "bump", "step_type": "TASK", "step_sub_type": "RUN_COMMAND", "seq": 2},
                {"id": "tell", "step_type": "TASK", "step_sub_type": "SLACK_NOTIFY", "seq": 3},
            ],
            "params": [
                {"id": "c1", "step_id": "count", "param_key": "pk", "param_value": "FACTORY#x"},
                {"id": "c2", "step_id": "count", "param_key": "found", "param_type": "OUT",
                 "ref_path": "$.count", "data_type": "INTEGER"},
                {"id": "c3", "step_id": "count", "param_key": "first", "param_type": "OUT",
                 "ref_path": "$.items[0].level", "target_type": "PAYLOAD"},
                {"id": "b1", "step_id": "bump", "param_key": "attempts", "param_type": "INOUT",
                 "source_type": "GLOBAL_TASK_PARAMETER", "ref_path": "attempts",
                 "data_type": "INTEGER"},
                {"id": "t1", "step_id": "tell", "param_key": "found", "data_type": "INTEGER",
                 "source_type": "GLOBAL_TASK_PARAMETER", "ref_path": "found"},
                {"id": "t2", "step_id": "tell", "param_key": "attempts", "data_type": "INTEGER",
                 "source_type": "GLOBAL_TASK_PARAMETER", "ref_path": "attempts"},
                {"id": "t3", "step_id": "tell", "param_key": "first", "source_type": "PAYLOAD",
                 "ref_path": "$.first"},
            ],
        }
    )  # fmt: skip


class Counter(Fake):
    async def __call__(
        self, step: JobStep, params: dict[str, Any], ctx: Mapping[str, Any], *, key: str
    ) -> Any:
        self.calls.append((step.id, params, time.monotonic()))
        if step.id == "count":
            return {"items": [{"level": "CRITICAL"}, {"level": "NORMAL"}], "count": "2"}
        if step.id == "bump":
            return {"attempts": params["attempts"] + 1}
        return {"ok": True}


async def test_out_and_inout_params_write_the_outputs_that_later_steps_read() -> None:
    fake = Counter()
    result = await interpreter(counting(), fake).run(TRIGGER)
    assert result.status == "SUCCEEDED", result.error
    calls = {name: params for name, params, _ in fake.calls}
    assert "found" not in calls["count"]  # an OUT param is not an input
    assert calls["bump"] == {"attempts": 1}  # an INOUT param goes in from its source...
    assert calls["tell"] == {"found": 2, "attempts": 2, "first": "CRITICAL"}  # ...and back
    assert result.context["globals"] == {"attempts": 2, "found": 2}
    assert result.context["payload"]["first"] == "CRITICAL"


async def test_a_resumed_run_writes_the_recorded_outputs_again() -> None:
    fake = Counter()
    journal = await interrupted(counting(), fake, at="bump")  # recorded, then the crash
    again = Counter()
    result = await interpreter(counting(), again).run(TRIGGER, journal=journal)
    assert [name for name, _, _ in again.calls] == ["tell"]
    assert again.calls[0][1] == {"found": 2, "attempts": 2, "first": "CRITICAL"}
    assert result.status == "SUCCEEDED"


async def test_a_required_out_param_the_output_lacks_fails_the_step() -> None:
    job = counting()
    params = [
        p.model_copy(update={"ref_path": "$.missing", "is_required": True}) if p.id == "c2" else p
        for p in job.params
    ]
    fake = Counter()
    result = await interpreter(job.model_copy(update={"params": params}), fake).run(TRIGGER)
    assert result.status == "FAILED"
    assert result.error is not None and result.error["Error"] == "ParamError"
    assert "found" in result.error["Cause"]
    assert [name for name, _, _ in fake.calls] == ["count"]


def test_out_params_are_checked_where_they_are_and_where_they_write() -> None:
    base = counting().model_dump()
    params = [
        *base["params"],
        {"id": "x1", "step_id": "tell", "param_key": "k", "target_type": "PAYLOAD"},
        {"id": "x2", "step_id": "tell", "param_key": "k2", "param_type": "OUT",
         "target_type": "FACTORY"},
    ]  # fmt: skip
    with pytest.raises(ValueError, match="target_type") as caught:
        Job.model_validate({**base, "params": params})
    text = str(caught.value)
    assert "param x1: target_type is for OUT and INOUT params" in text
    assert "param x2: target_type FACTORY is not one of GLOBAL_TASK_PARAMETER, PAYLOAD" in text


def test_a_job_with_out_params_is_refused_by_the_step_functions_export() -> None:
    with pytest.raises(AslExportError, match=r"OUT and INOUT params \(steps bump, count\)"):
        export_asl(counting())
