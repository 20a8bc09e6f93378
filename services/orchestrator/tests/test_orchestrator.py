"""The orchestrator on real servers (NATS JetStream, the S3/DynamoDB emulator, a local HTTP
server for Slack and the maintenance webhook): BizObject triggers with conditions, disabled and
soft-deleted jobs, duplicate registration, the issue's example workflow end to end, schedules
with overlap_allowed and two replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest

from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import change_subject
from aegis_orchestration.model import Job, Retry
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.store import DuplicateJob
from aegis_runtime.testing.clock import FakeClock
from aegis_runtime.testing.storage import Foundation
from aegis_runtime.testing.waiting import eventually
from aegis_runtime.testing.webhook import FakeWebhook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"


def settings(
    nats_url: str, aws_endpoint: str, f: Foundation, uid: str, **extra: Any
) -> OrchestratorSettings:
    return OrchestratorSettings(
        nats_url=nats_url,
        aws_endpoint_url=aws_endpoint,
        bucket=f.bucket,
        table=f.table,
        orchestrator_durable=f"orch-{uid}",
        orchestrator_jobs_file="",
        orchestrator_schedule_tick_s=3600,
        heartbeat_interval_s=60,
        **extra,
    )


@pytest.fixture
async def make_app(
    nats_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> AsyncIterator[Callable[..., Any]]:
    apps: list[OrchestratorApp] = []

    async def make(
        clock: Any = None, env: dict[str, str] | None = None, **extra: Any
    ) -> OrchestratorApp:
        app = OrchestratorApp(
            settings(nats_url, aws_endpoint, foundation, unique_id, **extra),
            clock=clock or (lambda: datetime.now(UTC)),
            environment=env or {},
        )
        await app.start()
        apps.append(app)
        return app

    yield make
    for app in apps:
        await app.stop()


async def publish_change(nats_url: str, factory: str, before: str | None, after: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        event = ChangeEvent(
            table="t",
            pk=f"FACTORY#{factory}",
            sk="LATEST",
            event_name="MODIFY" if before else "INSERT",
            old_image={"factory_id": factory, "risk": {"level": before}} if before else None,
            new_image={
                "factory_id": factory,
                "risk": {"level": after, "score": 90, "reasons": [{"code": "CO_HIGH"}]},
            },
            producer="test",
            at=datetime.now(UTC),
        )
        await nc.jetstream().publish(
            change_subject("factory_latest"), event.model_dump_json().encode()
        )
    finally:
        await nc.close()


def biz_job(job_id: str, factory: str, **overrides: Any) -> Job:
    doc: dict[str, Any] = {
        "id": job_id,
        "job_name": job_id,
        "trigger_type": "BizObject",
        "object_id": "factory_latest",
        "trigger_sub_type": "Update",
        "trigger_condition_expr": (
            f'AND(StringEQ([$.afterData.factory_id], "{factory}"), '
            'StringEQ([$.afterData.risk.level], "CRITICAL"), '
            'NOT(StringEQ([$.beforeData.risk.level], "CRITICAL")))'
        ),
        "steps": [{"id": "mark", "step_type": "DUMMY", "is_start_point": True}],
    }
    doc.update(overrides)
    return Job.model_validate(doc)


async def runs_of(app: OrchestratorApp, job_id: str) -> list[dict[str, Any]]:
    assert app.store is not None
    return await app.store.executions(job_id, limit=100)


async def test_bizobject_update_fires_only_when_condition_holds_never_when_disabled_or_deleted(
    make_app: Callable[..., Any], nats_url: str, unique_id: str
) -> None:
    app = await make_app()
    assert app.store is not None
    for job in (
        biz_job("on", unique_id),
        biz_job("off", unique_id, is_enabled=False, trigger_sub_type="*"),
        biz_job("gone", unique_id, is_active=False, object_id="*"),
    ):
        await app.store.register(job)
    await app.refresh()
    await publish_change(nats_url, unique_id, "WARNING", "WARNING")  # condition false
    await publish_change(nats_url, unique_id, "CRITICAL", "CRITICAL")  # condition false
    await publish_change(nats_url, unique_id, None, "CRITICAL")  # Insert: another sub type
    await publish_change(nats_url, unique_id, "WARNING", "CRITICAL")  # fires
    await eventually(lambda: _count(app, "on", 1), within=20, what="one execution of 'on'")
    await asyncio.sleep(1.0)  # the other events were handled before the last one or alongside
    assert len(await runs_of(app, "on")) == 1
    assert await runs_of(app, "off") == [] and await runs_of(app, "gone") == []
    run = (await runs_of(app, "on"))[0]
    assert run["trigger"] == {
        "type": "BizObject",
        "object_id": "factory_latest",
        "sub_type": "Update",
    }
    assert run["input"]["beforeData"]["risk"]["level"] == "WARNING"


async def _count(app: OrchestratorApp, job_id: str, n: int) -> bool:
    return len([r for r in await runs_of(app, job_id) if r["status"] != "RUNNING"]) >= n


async def test_a_duplicate_registration_is_refused(
    make_app: Callable[..., Any], unique_id: str
) -> None:
    app = await make_app()
    assert app.store is not None
    await app.store.register(biz_job("first", unique_id))
    twin = biz_job("second", unique_id)
    twin = twin.model_copy(
        update={"trigger_condition_expr": "  " + (twin.trigger_condition_expr or "")}
    )
    with pytest.raises(DuplicateJob, match="duplicates first"):
        await app.store.register(twin)
    await app.store.update("first", is_active=False)  # soft-deleted: the twin may take its place
    await app.store.register(twin)
    with pytest.raises(DuplicateJob):
        await app.store.update("first", is_active=True)


def example_job(factory: str) -> Job:
    text = EXAMPLES.read_text().replace('"factory-b"', f'"{factory}"')
    job = next(j for j in load_jobs(text) if j.id == "gas-leak-escalation")
    steps = []
    for s in job.steps:
        fast = s
        if s.id == "wait_2m":
            fast = s.model_copy(update={"wait_seconds": 0.3})
        if s.id in ("call_maintenance", "notify"):
            fast = s.model_copy(update={"retry": Retry(max_attempts=2, interval_s=0.1)})
        steps.append(fast)
    return job.model_copy(update={"steps": steps})


async def test_the_example_workflow_end_to_end(
    make_app: Callable[..., Any],
    nats_url: str,
    unique_id: str,
    foundation: Foundation,
    webhook: FakeWebhook,
) -> None:
    app = await make_app(
        env={"AEGIS_JOB_MAINTENANCE_URL": webhook.url + "/maintenance"},
        slack_webhook_url=webhook.url + "/slack",
    )
    assert app.store is not None
    await app.store.register(example_job(unique_id))
    await app.refresh()
    await foundation.readmodel.set_latest(unique_id, {"risk": {"level": "CRITICAL"}})
    webhook.script(200, 500, 500, 500)  # notify ok; the maintenance webhook fails 3 times
    await publish_change(nats_url, unique_id, "WARNING", "CRITICAL")
    await eventually(lambda: _count(app, "gas-leak-escalation", 1), within=40, what="the run")
    run = (await runs_of(app, "gas-leak-escalation"))[0]
    assert run["status"] == "SUCCEEDED", run
    steps = run["steps"]
    names = [s["step_id"] for s in steps]
    # every step in the log, with timing
    assert {
        "notify",
        "call_maintenance",
        "evacuate",
        "respond",
        "maintenance_down",
        "wait_2m",
        "check",
        "still_critical",
        "escalate",
        "done",
    } <= set(names)
    assert all(s["started_at"] and s["finished_at"] for s in steps)
    by = {s["step_id"]: s for s in steps}
    # parallel branches ran concurrently
    assert by["evacuate"]["started_at"] <= by["call_maintenance"]["finished_at"]
    assert by["call_maintenance"]["started_at"] <= by["evacuate"]["finished_at"]
    # the failing task retried, then the catch path ran
    assert by["call_maintenance"]["status"] == "FAILED" and by["call_maintenance"]["attempts"] == 3
    assert by["respond"]["status"] == "CAUGHT"
    assert [r.path for r in webhook.requests].count("/hook/maintenance") == 3
    # the CHOICE loop stopped at repeat_limit (3)
    assert names.count("escalate") == 3
    assert [s["status"] for s in steps if s["step_id"] == "still_critical"][-1] == "REPEAT_LIMIT"
    assert by["notify"]["input"]["text"] == unique_id
    slack = [r.body["text"] for r in webhook.requests if r.path == "/hook/slack"]
    assert slack[0] == unique_id and slack.count("ESCALATION: factory-b is still CRITICAL") == 3


def schedule_job(job_id: str, overlap: int, wait: float) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "job_name": job_id,
            "trigger_type": "Schedule",
            "trigger_cron": "* * * * *",
            "misfire_policy": "SKIP",
            "overlap_allowed": overlap,
            "steps": [
                {
                    "id": "hold",
                    "step_type": "FLOW",
                    "step_sub_type": "WAIT",
                    "wait_seconds": wait,
                    "is_start_point": True,
                }
            ],
        }
    )


START = datetime(2026, 11, 30, 3, 0, 30, tzinfo=UTC)


async def test_schedule_overlap_allowed_n_does_not_start_while_previous_runs_go(
    make_app: Callable[..., Any],
) -> None:
    clock = FakeClock(START)
    app = await make_app(clock=clock)
    assert app.store is not None
    await app.store.register(schedule_job("every-minute", overlap=2, wait=3.0))
    await app.refresh()
    await app.tick_schedules()  # first tick: nothing due (SKIP)
    started = []
    for _ in range(3):
        clock.advance(timedelta(minutes=1))
        started += await app.tick_schedules()
        await asyncio.sleep(0.3)
    assert len(started) == 3  # three fires claimed
    await eventually(lambda: _count(app, "every-minute", 3), within=20, what="three outcomes")
    statuses = sorted(r["status"] for r in await runs_of(app, "every-minute"))
    assert statuses == ["SKIPPED_OVERLAP", "SUCCEEDED", "SUCCEEDED"]  # the third found 2 running


async def test_two_replicas_fire_each_schedule_once(make_app: Callable[..., Any]) -> None:
    clock = FakeClock(START)
    one = await make_app(clock=clock)
    two = await make_app(clock=clock)
    assert one.store is not None
    await one.store.register(schedule_job("once", overlap=5, wait=0))
    await one.refresh()
    await two.refresh()
    await asyncio.gather(one.tick_schedules(), two.tick_schedules())
    fired: list[Any] = []
    for _ in range(3):
        clock.advance(timedelta(minutes=1))
        a, b = await asyncio.gather(one.tick_schedules(), two.tick_schedules())
        fired += a + b
    assert sorted(f for _, f in fired) == [
        START.replace(second=0) + timedelta(minutes=m) for m in (1, 2, 3)
    ]
    await eventually(lambda: _count(one, "once", 3), within=20, what="three runs")
    assert len(await runs_of(one, "once")) == 3
