"""The orchestrator on real servers (NATS JetStream, the S3/DynamoDB emulator, a local HTTP
server for Slack and the maintenance webhook): BizObject triggers with conditions, disabled and
soft-deleted jobs, duplicate registration, the issue's example workflow end to end, schedules
with overlap_allowed and two replicas."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
import structlog

from aegis_contracts import keys
from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import change_subject, object_created_subject
from aegis_contracts.times import format_ts, parse_ts
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook
from aegis_orchestration.limits import json_size
from aegis_orchestration.model import Job, Retry
from aegis_orchestration.store import DuplicateJob, JobStore
from aegis_orchestration.triggers import Trigger, biz_object_trigger, due_fires, schedule_trigger
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator.app import SCHEDULE_CLAIM_LEASE, FileClock, OrchestratorApp
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_storage.readmodel import ReadModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"


@pytest.fixture
async def make_app(
    make_settings: Callable[..., OrchestratorSettings],
) -> AsyncIterator[Callable[..., Any]]:
    apps: list[OrchestratorApp] = []

    async def make(
        clock: Any = None, env: dict[str, str] | None = None, **extra: Any
    ) -> OrchestratorApp:
        app = OrchestratorApp(
            make_settings(**extra),
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
        "digest": run["trigger"]["digest"],  # names the event (a redelivery is recognised)
    }
    assert run["input"]["beforeData"]["risk"]["level"] == "WARNING"


async def _count(app: OrchestratorApp, job_id: str, n: int) -> bool:
    return len([r for r in await runs_of(app, job_id) if r["status"] != "RUNNING"]) >= n


async def test_a_jobs_file_that_is_not_there_is_said_and_registers_nothing(
    make_app: Callable[..., Any], tmp_path: Path
) -> None:
    missing = tmp_path / "no-jobs.yaml"
    with structlog.testing.capture_logs() as logs:
        app = await make_app(orchestrator_jobs_file=str(missing))
    [said] = [e for e in logs if e["event"] == "jobs_file_missing"]
    assert (said["log_level"], said["file"]) == ("warning", str(missing))
    assert app.store is not None and await app.store.all() == []


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


def example_job(factory: str, wait_s: float = 0.3) -> Job:
    text = EXAMPLES.read_text().replace('"factory-b"', f'"{factory}"')
    job = next(j for j in load_jobs(text) if j.id == "gas-leak-escalation")
    steps = []
    for s in job.steps:
        fast = s
        if s.id == "wait_2m":
            fast = s.model_copy(update={"wait_seconds": wait_s})
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
    await seed_latest(foundation.readmodel, unique_id, {"risk": {"level": "CRITICAL"}})
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
    assert json.loads(by["notify"]["input"])["text"] == unique_id  # values as JSON text
    slack = [r.body["text"] for r in webhook.requests if r.path == "/hook/slack"]
    assert slack[0] == unique_id and slack.count("ESCALATION: factory-b is still CRITICAL") == 3


def wait_step(seconds: float) -> dict[str, Any]:
    return {"id": "hold", "step_type": "FLOW", "step_sub_type": "WAIT", "wait_seconds": seconds}


START = datetime(2026, 11, 30, 3, 0, 30, tzinfo=UTC)


async def test_schedule_overlap_allowed_n_does_not_start_while_previous_runs_go(
    every_minute_job: Callable[..., Job],
    make_app: Callable[..., Any],
) -> None:
    clock = FakeClock(START)
    app = await make_app(clock=clock)
    assert app.store is not None
    await app.store.register(every_minute_job("every-minute", overlap=2, steps=[wait_step(3.0)]))
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


async def test_two_replicas_fire_each_schedule_once(
    make_app: Callable[..., Any], every_minute_job: Callable[..., Job]
) -> None:
    clock = FakeClock(START)
    one = await make_app(clock=clock)
    two = await make_app(clock=clock)
    assert one.store is not None
    await one.store.register(every_minute_job("once", overlap=5, steps=[wait_step(0)]))
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


@pytest.mark.parametrize("recorded", [False, True], ids=["died-claiming", "died-recording"])
async def test_a_schedule_fire_whose_replica_died_runs_once(
    every_minute_job: Callable[..., Job], make_app: Callable[..., Any], recorded: bool
) -> None:
    """A replica claimed a fire and died before marking it done: before recording its execution
    (nobody ran it), or after (it ran). The surviving replica watches the unfinished claim, takes
    it over once its lease is over, and the fire has run exactly once."""
    clock = FakeClock(START)
    one = await make_app(clock=clock)
    assert one.store is not None and one.clients is not None
    job_id = f"died-{'recorded' if recorded else 'claimed'}"
    await one.store.register(every_minute_job(job_id, overlap=5, steps=[wait_step(0)]))
    await one.refresh()
    await one.tick_schedules()  # first tick: nothing due (SKIP)
    clock.advance(timedelta(minutes=1))
    (job,) = [j for j in one.index.schedules() if j.id == job_id]
    (fire,) = due_fires(job, START, clock())  # as every replica names it (in the job's zone)
    readmodel = ReadModel(one.clients.items, one.settings.table)
    assert await readmodel.claim_window(
        f"orch-{job_id}",
        fire,
        owner="replica-that-died",
        now=clock(),
        ttl=int((clock() + timedelta(days=1)).timestamp()),
        lease=SCHEDULE_CLAIM_LEASE,
    )
    if recorded:  # it recorded (and started) the execution, then died before marking it done
        await one.launch(job, schedule_trigger(job, fire))
        await eventually(lambda: _count(one, job_id, 1), within=20, what="the dead one's run")
    assert await one.tick_schedules() == []  # held by the dead replica: watched, not run
    clock.advance(SCHEDULE_CLAIM_LEASE + timedelta(seconds=1))
    started = await one.tick_schedules()
    assert (job_id, fire) in started  # taken over
    runs = len(started)  # this fire (run once, by whichever replica) and the later ones
    await eventually(lambda: _count(one, job_id, runs), within=20, what=f"{runs} runs")
    fires = [r["trigger"]["digest"] for r in await runs_of(one, job_id)]  # one per fire
    assert len(fires) == len(set(fires)) == runs


# -- durable executions ---------------------------------------------------------------------------
# A real orchestrator process is SIGKILLed with work outstanding; a second replica (in this
# process, on the same clock file) finishes the run. Time is a file both read: nothing waits for it.

T0 = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
LEASE_S = 30.0


class ClockFile(FileClock):
    def set(self, at: datetime) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(at.isoformat())
        os.replace(tmp, self.path)  # a reader never sees half a timestamp


@dataclass
class Victim:
    """An orchestrator process to kill: the replica that takes the trigger."""

    env: dict[str, str]
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).parent / "aegis-orchestrator")],
                env=self.env | {"AEGIS_HEALTH_PORT": str(self.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    async def start(self) -> None:
        self.launch()

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1):
                    return True
            except OSError:
                return False

        await eventually(ready, within=30, what="the orchestrator process ready")

    def kill(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "it died before the fault"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def durable_settings(clock_file: Path) -> dict[str, Any]:
    """What the victim and its successor share (besides the servers)."""
    return {
        "orchestrator_resume_scan_s": 0.1,
        "orchestrator_wait_poll_s": 0.05,
        "orchestrator_execution_lease_s": LEASE_S,
        "orchestrator_clock_file": clock_file,
    }


@dataclass
class Drill:
    """A replica process that takes the trigger and is killed, the one that takes over, the
    clock file both read, and what they leave in the stores and at the webhook stand-in."""

    victim: Victim
    clock: ClockFile
    foundation: Foundation
    webhook: FakeWebhook
    nats_url: str
    factory: str
    make_app: Callable[..., Any]

    async def start(self, job: Job) -> None:
        """Register ``job``, start the victim and fire the job (with the victim alone to take it)."""
        await JobStore(self.foundation.readmodel, lambda: T0).register(job)
        await self.victim.start()
        await publish_change(self.nats_url, self.factory, "WARNING", "CRITICAL")

    async def run(self, job_id: str) -> dict[str, Any] | None:
        return await log_of(self.foundation, job_id)

    async def successor(self) -> OrchestratorApp:
        app: OrchestratorApp = await self.make_app(
            clock=self.clock,
            env={
                "AEGIS_JOB_MAINTENANCE_URL": self.webhook.url + "/maintenance",
                "AEGIS_JOB_HOOK_URL": self.webhook.url,
            },
            slack_webhook_url=self.webhook.url + "/slack",
            **durable_settings(self.clock.path),
        )
        return app

    async def finished(self, job_id: str, *, waits: bool = False) -> dict[str, Any]:
        """The run once it has ended; with ``waits`` the clock is moved past each WAIT begun."""

        async def ended() -> bool:
            found = await self.run(job_id)
            assert found is not None
            for entry in found["steps"] if waits else []:
                if entry["status"] == "WAITING":
                    self.clock.set(parse_ts(entry["wake_at"]) + timedelta(seconds=1))
            return bool(found["status"] != "RUNNING")

        await eventually(ended, within=20, what=f"the run of {job_id} finished")
        run = await self.run(job_id)
        assert run is not None
        return run


@pytest.fixture
async def drill(
    make_app: Callable[..., Any],
    nats_url: str,
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    webhook: FakeWebhook,
    tmp_path: Path,
) -> AsyncIterator[Drill]:
    clock = ClockFile(tmp_path / "clock")
    clock.set(T0)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
        "AEGIS_NATS_URL": nats_url,
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
        "AEGIS_LOG_FORMAT": "json",
        "AEGIS_HEARTBEAT_INTERVAL_S": "60",
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url + "/slack",
        "AEGIS_JOB_MAINTENANCE_URL": webhook.url + "/maintenance",
        "AEGIS_JOB_HOOK_URL": webhook.url,
        "AEGIS_JOB_EGRESS_ALLOW": "127.0.0.1",
    }
    shared = durable_settings(clock.path) | {
        "orchestrator_durable": f"orch-{unique_id}",  # what settings() gives the successor
        "orchestrator_jobs_file": "",
        "orchestrator_schedule_tick_s": 3600,
    }
    for name, value in shared.items():
        env[f"AEGIS_{name.upper()}"] = str(value)
    victim = Victim(env, tmp_path / "victim.log")
    yield Drill(victim, clock, foundation, webhook, nats_url, unique_id, make_app)
    if victim.proc is not None and victim.proc.poll() is None:
        victim.proc.kill()
        victim.proc.wait(10)


async def log_of(f: Foundation, job_id: str) -> dict[str, Any] | None:
    runs = await JobStore(f.readmodel, lambda: T0).executions(job_id)
    assert len(runs) <= 1, runs  # one trigger, one execution, whoever ran it
    return runs[0] if runs else None


def recorded(run: dict[str, Any] | None, occurrence: str, status: str) -> bool:
    return run is not None and any(
        e["occurrence"] == occurrence and e["status"] == status for e in run["steps"]
    )


def keys_by_path(webhook: FakeWebhook) -> dict[str, set[str]]:
    """The idempotency keys each endpoint saw: one per step run means one effect per step run for
    a receiver that honours the key, however often a call was repeated."""
    seen: dict[str, set[str]] = {}
    for r in [*webhook.requests, *webhook.waiting]:
        seen.setdefault(r.path, set()).add(r.headers["Idempotency-Key"])
    return seen


async def assert_freed(f: Foundation, job_id: str) -> None:
    """No run slot taken and no execution lease left for the job, soon after its outcome: a
    replica writes the outcome first, then gives the slot back, then the lease."""
    held: list[dict[str, Any]] = []

    async def freed() -> bool:
        held[:] = await f.readmodel.partition(keys.job_pk(job_id), now=T0)
        active = await f.readmodel.partition(keys.EXEC_ACTIVE_PK, now=T0)
        held.extend(a for a in active if str(a["sk"]).startswith(f"{job_id}#"))
        return not held

    try:
        await eventually(freed, within=10, interval=0.1, what=f"{job_id}'s slot and lease freed")
    except AssertionError:
        raise AssertionError(f"still held: {held}") from None


def parallel_job(job_id: str, factory: str) -> Job:
    hook = "${AEGIS_JOB_HOOK_URL}"
    return biz_job(
        job_id,
        factory,
        steps=[
            {"id": "notify", "step_type": "TASK", "step_sub_type": "SLACK_NOTIFY",
             "is_start_point": True, "seq": 1},
            {"id": "respond", "step_type": "FLOW", "step_sub_type": "PARALLEL", "seq": 2},
            {"id": "first", "flow_step_id": "respond", "step_type": "TASK",
             "step_sub_type": "HTTP_WEBHOOK", "seq": 1},
            {"id": "second", "flow_step_id": "respond", "step_type": "TASK",
             "step_sub_type": "HTTP_WEBHOOK", "seq": 2},
            {"id": "after", "step_type": "TASK", "step_sub_type": "HTTP_WEBHOOK", "seq": 3},
        ],
        params=[
            {"id": "notify_text", "step_id": "notify", "param_key": "text",
             "param_value": "on it"},
            *[
                {"id": f"{s}_url", "step_id": s, "param_key": "url",
                 "source_type": "ENVIRONMENT", "param_value": f"{hook}/{s}"}
                for s in ("first", "second", "after")
            ],
        ],
    )  # fmt: skip


@pytest.mark.timeout(60)
async def test_a_replica_killed_during_a_parallel_is_finished_by_another_each_call_once(
    drill: Drill, webhook: FakeWebhook
) -> None:
    webhook.hold("/hook/second")  # the second branch stays in flight
    await drill.start(parallel_job("fan-out", drill.factory))

    async def in_flight() -> bool:
        run = await drill.run("fan-out")
        # the second branch's call reached the stand-in; the first branch's result is recorded
        return bool(webhook.waiting) and recorded(run, "respond.1/first.1", "SUCCEEDED")

    await eventually(in_flight, within=20, what="both branches under way, the first recorded")
    drill.victim.kill()
    run = await drill.run("fan-out")
    assert run is not None and run["status"] == "RUNNING"
    assert not recorded(run, "respond.1/second.1", "SUCCEEDED")
    assert "/hook/after" not in keys_by_path(webhook)
    webhook.release()

    drill.clock.set(T0 + timedelta(seconds=LEASE_S + 1))  # the dead replica's lease runs out
    app = await drill.successor()
    run = await drill.finished("fan-out")
    assert run["status"] == "SUCCEEDED", run
    assert run["runner"] == app.owner and run["resumed"] == 1
    eid = run["execution_id"]
    assert keys_by_path(webhook) == {
        "/hook/slack": {f"{eid}:notify.1"},
        "/hook/first": {f"{eid}:respond.1/first.1"},
        "/hook/second": {f"{eid}:respond.1/second.1"},  # sent again after the kill, same key
        "/hook/after": {f"{eid}:after.1"},
    }
    calls = [r.path for r in webhook.requests]
    assert calls.count("/hook/slack") == calls.count("/hook/first") == 1  # recorded: not redone
    assert calls.count("/hook/after") == 1
    await assert_freed(drill.foundation, "fan-out")


@pytest.mark.timeout(60)
async def test_a_replica_killed_during_a_2_minute_wait_leaves_it_to_another_that_wakes_on_time(
    drill: Drill, webhook: FakeWebhook
) -> None:
    job = example_job(drill.factory, wait_s=120)
    await seed_latest(drill.foundation.readmodel, drill.factory, {"risk": {"level": "CRITICAL"}})
    await drill.start(job)

    async def waiting() -> bool:
        return recorded(await drill.run(job.id), "wait_2m.1", "WAITING")

    await eventually(waiting, within=20, what="the escalation waiting its 2 minutes")
    drill.victim.kill()
    run = await drill.run(job.id)
    assert run is not None and run["status"] == "RUNNING"
    wait = next(e for e in run["steps"] if e["occurrence"] == "wait_2m.1")
    assert wait["wake_at"] == format_ts(T0 + timedelta(minutes=2))
    assert not any(e["step_id"] == "check" for e in run["steps"])

    # a minute later (the dead replica's lease is over, the WAIT is not) the other one takes over
    drill.clock.set(T0 + timedelta(minutes=1))
    app = await drill.successor()

    async def taken_over() -> bool:
        found = await drill.run(job.id)
        return found is not None and found["runner"] == app.owner

    await eventually(taken_over, within=20, what="the second replica running the execution")
    # past the recorded wake-up time (a WAIT begun again at the take-over would end at 3 min)
    drill.clock.set(T0 + timedelta(minutes=2, seconds=1))

    def escalated() -> bool:
        return len(keys_by_path(webhook).get("/hook/slack", set())) == 2

    await eventually(escalated, within=20, what="the first escalation after the 2 minutes")
    run = await drill.finished(job.id, waits=True)
    assert run["status"] == "SUCCEEDED", run
    assert run["resumed"] == 1
    eid = run["execution_id"]
    assert keys_by_path(webhook) == {
        "/hook/slack": {
            f"{eid}:notify.1",
            *(f"{eid}:still_critical.{n}/escalate.1" for n in (1, 2, 3)),
        },
        "/hook/maintenance": {f"{eid}:respond.1/call_maintenance.1"},
    }
    calls = [r.path for r in webhook.requests]
    assert calls.count("/hook/slack") == 4 and calls.count("/hook/maintenance") == 1
    first_wait = next(e for e in run["steps"] if e["occurrence"] == "wait_2m.1")
    assert first_wait["status"] == "SUCCEEDED"
    assert first_wait["wake_at"] == format_ts(T0 + timedelta(minutes=2))
    await assert_freed(drill.foundation, job.id)


def looped(
    job_id: str, factory: str, body: list[dict[str, Any]], back_to: str, **extra: Any
) -> Job:
    """``body`` (top-level steps first, with the start point) then a CHOICE whose default branch
    goes back to ``back_to``: a loop that only repeat_limit (100) or a bound ends."""
    loop = [
        {"id": "again", "step_type": "FLOW", "step_sub_type": "CHOICE", "seq": 90},
        {"id": "loop", "flow_step_id": "again", "step_type": "DUMMY", "next_step_id": back_to},
    ]
    return biz_job(job_id, factory, repeat_limit=100, steps=[*body, *loop], **extra)


async def run_once(app: OrchestratorApp, nats_url: str, job: Job, factory: str) -> None:
    """Register ``job`` (a :func:`biz_job` of ``factory``), fire it once, wait for its outcome."""
    assert app.store is not None
    await app.store.register(job)
    await app.refresh()
    await publish_change(nats_url, factory, "WARNING", "CRITICAL")
    await eventually(lambda: _count(app, job.id, 1), within=20, what=f"the outcome of {job.id}")


async def test_a_parallel_in_a_loop_fails_with_a_clear_error_instead_of_growing_without_end(
    make_app: Callable[..., Any], nats_url: str, unique_id: str, foundation: Foundation
) -> None:
    """Each round copies the whole context into each of 3 branches: 3**rounds without a bound."""
    app = await make_app(orchestrator_max_context_bytes=16 * 1024)
    body = [
        {"id": "fan", "step_type": "FLOW", "step_sub_type": "PARALLEL", "is_start_point": True},
        *[{"id": f"b{i}", "flow_step_id": "fan", "step_type": "DUMMY", "seq": i} for i in range(3)],
    ]
    await run_once(app, nats_url, looped("fan-loop", unique_id, body, back_to="fan"), unique_id)
    run = (await runs_of(app, "fan-loop"))[0]
    assert run["status"] == "FAILED"
    assert run["error"]["Error"] == "ContextTooLarge"
    assert "over the limit of 16384 bytes" in run["error"]["Cause"]
    fans = [e for e in run["steps"] if e["step_id"] == "fan"]
    assert fans[-1]["status"] == "FAILED" and len(fans) < 15
    await assert_freed(foundation, "fan-loop")


@pytest.mark.parametrize("job_changed", [False, True], ids=["same-job", "job-changed"])
async def test_a_stopped_replica_hands_its_wait_over_at_once_and_the_wake_up_time_holds(
    make_app: Callable[..., Any],
    nats_url: str,
    unique_id: str,
    foundation: Foundation,
    job_changed: bool,
) -> None:
    """A deploy: SIGTERM's path (stop) during a WAIT. The next replica resumes it without waiting
    for the lease to run out (the clock does not move), and it still wakes at T0 + 2 min; unless
    the job was changed meanwhile: then the run is closed as Abandoned and its slot freed."""
    clock = FakeClock(T0)
    fast = {"orchestrator_resume_scan_s": 0.1, "orchestrator_wait_poll_s": 0.05}
    first = await make_app(clock=clock, orchestrator_drain_s=0.1, **fast)
    job = biz_job(
        "deploy-wait",
        unique_id,
        steps=[
            {"id": "hold", "step_type": "FLOW", "step_sub_type": "WAIT", "wait_seconds": 120,
             "is_start_point": True, "seq": 1},
            {"id": "done", "step_type": "DUMMY", "seq": 2},
        ],
    )  # fmt: skip
    await first.store.register(job)
    await first.refresh()
    await publish_change(nats_url, unique_id, "WARNING", "CRITICAL")

    async def waiting() -> bool:
        return recorded(await log_of(foundation, job.id), "hold.1", "WAITING")

    await eventually(waiting, within=20, what="the WAIT begun")
    await first.stop()
    if job_changed:
        await JobStore(foundation.readmodel, clock).update(job.id, job_name="deploy-wait v2")
    second = await make_app(clock=clock, **fast)

    async def taken_over() -> bool:
        run = await log_of(foundation, job.id)
        return run is not None and run["runner"] == second.owner

    await eventually(taken_over, within=20, what="the next replica running it, same clock")
    clock.advance(timedelta(minutes=2, seconds=1))
    await eventually(lambda: _count(second, job.id, 1), within=20, what="the run finished")
    run = await log_of(foundation, job.id)
    assert run is not None
    if job_changed:
        assert run["status"] == "FAILED" and run["error"]["Error"] == "Abandoned"
        assert "changed (version 1 -> 2)" in run["error"]["Cause"]
        assert [(e["occurrence"], e["status"]) for e in run["steps"]] == [("hold.1", "WAITING")]
    else:
        assert run["status"] == "SUCCEEDED" and run["resumed"] == 1
        assert [(e["occurrence"], e["status"]) for e in run["steps"]] == [
            ("hold.1", "SUCCEEDED"),
            ("done.1", "SUCCEEDED"),
        ]
        assert run["steps"][0]["wake_at"] == format_ts(T0 + timedelta(minutes=2))
    await assert_freed(foundation, job.id)


async def test_a_log_item_near_its_budget_keeps_values_in_s3_then_the_run_fails_cleanly(
    make_app: Callable[..., Any], nats_url: str, unique_id: str, foundation: Foundation
) -> None:
    app = await make_app(orchestrator_max_item_bytes=8192, orchestrator_log_inline_bytes=256)
    await seed_latest(
        foundation.readmodel, unique_id, {"risk": {"level": "CRITICAL"}, "note": "n" * 600}
    )
    body = [
        {"id": "check", "step_type": "TASK", "step_sub_type": "READ_MODEL_QUERY",
         "is_start_point": True},
    ]  # fmt: skip
    job = looped(
        "big-log",
        unique_id,
        body,
        back_to="check",
        params=[
            {"id": "check_pk", "step_id": "check", "param_key": "pk",
             "source_type": "TRIGGER_DATA", "ref_path": "$.pk", "is_required": True},
            {"id": "check_sk", "step_id": "check", "param_key": "sk_prefix",
             "param_value": "LATEST"},
        ],
        conditions=[
            {"id": "check_level", "step_id": "check", "field_id": "risk.level",
             "comparison_type": "EXISTS"},
        ],
    )  # fmt: skip
    await run_once(app, nats_url, job, unique_id)
    run = (await runs_of(app, job.id))[0]
    assert run["status"] == "FAILED"
    assert run["error"]["Error"] == "ExecutionLogTooLarge"
    assert "over the limit of 8192 bytes" in run["error"]["Cause"]
    assert json_size(run) < 8192 + 1024  # the last step that fit, plus the error
    checks = [e for e in run["steps"] if e["step_id"] == "check"]
    assert len(checks) >= 3
    for entry in checks:  # every query result by reference, read back whole
        ref = entry["output"]["claim_check"]
        stored = await foundation.store.get_json(ref["key"])
        assert stored["items"][0]["note"] == "n" * 600 and ref["bytes"] > 600
    await assert_freed(foundation, job.id)


async def test_a_redelivered_trigger_that_was_recorded_starts_nothing_new(
    make_app: Callable[..., Any], unique_id: str, foundation: Foundation
) -> None:
    """The replica recorded the execution, then died before NATS had the acknowledgement."""
    app = await make_app()
    await app.store.register(biz_job("once-per-event", unique_id, overlap_allowed=2))
    await app.refresh()

    def change(before: str) -> Trigger:
        return biz_object_trigger(
            {
                "event_name": "MODIFY",
                "pk": f"FACTORY#{unique_id}",
                "old_image": {"risk": {"level": before}},
                "new_image": {"factory_id": unique_id, "risk": {"level": "CRITICAL"}},
                "at": "2026-12-01T06:00:00.000Z",
            },
            "factory_latest",
        )

    assert [j.id for j in await app.handle(change("WARNING"))] == ["once-per-event"]
    await app.handle(change("WARNING"), redelivered=True)  # the same event again
    await app.handle(change("NORMAL"), redelivered=True)  # another event, redelivered
    await eventually(lambda: _count(app, "once-per-event", 2), within=20, what="two outcomes")
    runs = await runs_of(app, "once-per-event")
    assert len(runs) == 2
    assert sorted(r["input"]["beforeData"]["risk"]["level"] for r in runs) == ["NORMAL", "WARNING"]
    await assert_freed(foundation, "once-per-event")


async def test_a_job_calling_the_metadata_endpoint_fails_with_the_refusal_in_its_log(
    make_app: Callable[..., Any], nats_url: str, unique_id: str, webhook: FakeWebhook
) -> None:
    # a registered job tries to read instance credentials, then to post them to its own hook
    steps = [
        {
            "id": "steal",
            "step_type": "TASK",
            "step_sub_type": "HTTP_WEBHOOK",
            "is_start_point": True,
            "seq": 1,
            "retry": {"max_attempts": 0},
        },
        {"id": "post", "step_type": "TASK", "step_sub_type": "HTTP_WEBHOOK", "seq": 2},
    ]
    params = [
        {"id": "p1", "step_id": "steal", "param_key": "url",
         "param_value": "http://169.254.169.254/latest/meta-data/iam/security-credentials/"},
        {"id": "p2", "step_id": "steal", "param_key": "method", "param_value": "GET"},
        {"id": "p3", "step_id": "post", "param_key": "url", "param_value": webhook.url + "/out"},
    ]  # fmt: skip
    app = await make_app()
    assert app.store is not None
    await app.store.register(biz_job("steal", unique_id, steps=steps, params=params))
    await app.refresh()
    await publish_change(nats_url, unique_id, "WARNING", "CRITICAL")
    await eventually(lambda: _count(app, "steal", 1), within=20, what="the run")
    run = (await runs_of(app, "steal"))[0]
    assert run["status"] == "FAILED", run
    steal = next(s for s in run["steps"] if s["step_id"] == "steal")
    assert steal["status"] == "FAILED"
    assert "egress refused: http://169.254.169.254 is plain http" in json.dumps(steal["error"])
    assert webhook.requests == []  # the next step never ran


# -- every trigger type fires ---------------------------------------------------------------------


def _skipped(app: OrchestratorApp, job_id: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "aegis_orchestrator_jobs_skipped_total", {"job": job_id}
    )
    return value or 0.0


async def test_a_component_job_fires_on_a_real_object_created_and_a_skip_is_counted(
    make_app: Callable[..., Any], nats_url: str, foundation: Foundation, unique_id: str
) -> None:
    app = await make_app()
    assert app.store is not None
    prefix = f"reports/daily/2025-01-02/{unique_id}/"
    for job in (
        Job.model_validate(
            {
                "id": f"md-{unique_id}"[:48],
                "job_name": "report written",
                "trigger_type": "Component",
                "object_id": "reports",
                "trigger_sub_type": "Insert",
                "trigger_condition_expr": f'StringMatches([$.key], "{prefix}*.md")',
                "steps": [{"id": "mark", "step_type": "DUMMY", "is_start_point": True}],
            }
        ),
    ):
        await app.store.register(job)
    await app.refresh()
    job_id = f"md-{unique_id}"[:48]
    nc = await nats.connect(nats_url)
    try:
        for name in ("hourly.csv", "report.md"):  # the csv is skipped, the report fires
            put = await foundation.store.put_bytes(prefix + name, b"# report", content_type="text")
            event = foundation.store.created(put, producer="reporter", at=datetime.now(UTC))
            await nc.jetstream().publish(
                object_created_subject("reports"), event.model_dump_json().encode()
            )
    finally:
        await nc.close()
    await eventually(lambda: _count(app, job_id, 1), within=20, what="the report's execution")
    await eventually(lambda: _skipped(app, job_id) == 1, within=10, what="one skip counted")
    run = (await runs_of(app, job_id))[0]
    assert run["trigger"]["type"] == "Component" and run["trigger"]["object_id"] == "reports"
    assert run["input"]["key"] == prefix + "report.md"
    assert run["input"]["family"] == "reports" and run["input"]["bucket"] == foundation.bucket


async def test_a_bizobject_job_fires_on_the_delete_of_a_late_data_marker(
    make_app: Callable[..., Any], unique_id: str
) -> None:
    app = await make_app()
    assert app.store is not None and app.clients is not None
    await app.store.register(
        biz_job(
            "late-cleared",
            unique_id,
            object_id="factory_late",
            trigger_sub_type="Delete",
            trigger_condition_expr=f'StringEQ([$.beforeData.factory_id], "{unique_id}")',
        )
    )
    await app.refresh()
    # the writer: a read model announcing its changes (as the processor and aggregator do)
    writer = ReadModel(app.clients.items, app.settings.table, changes=app.publish_change)
    hour = datetime(2025, 1, 2, 3, tzinfo=UTC)
    now = datetime.now(UTC)
    ttl = int((now + timedelta(days=1)).timestamp())
    await writer.mark_late(unique_id, hour, now=now, ttl=ttl)
    await writer.mark_late(unique_id, hour, now=now, ttl=ttl)
    assert await writer.clear_late(unique_id, hour, marks=2)
    await eventually(lambda: _count(app, "late-cleared", 1), within=20, what="the delete's run")
    await asyncio.sleep(0.5)
    (run,) = await runs_of(app, "late-cleared")  # the INSERT and the MODIFY fired nothing
    assert run["trigger"]["sub_type"] == "Delete"
    assert run["input"]["beforeData"]["marks"] == 2 and run["input"]["afterData"] is None
    assert run["input"]["sk"] == keys.late_hour_sk(hour)


async def test_a_registration_naming_what_never_fires_is_refused(
    make_app: Callable[..., Any], unique_id: str
) -> None:
    app = await make_app()
    assert app.store is not None
    text = (
        f"jobs:\n- id: never-{unique_id[:20]}\n  job_name: never\n  trigger_type: BizObject\n"
        "  object_id: cloud_infra\n  trigger_sub_type: Delete\n"
        "  steps: [{id: a, step_type: DUMMY, is_start_point: true}]\n"
    )
    with pytest.raises(ValueError, match="cloud_infra never announces a Delete"):
        load_jobs(text)
    with pytest.raises(ValueError, match="no entity whose changes are announced"):
        biz_job("nowhere", unique_id, object_id="factory_history")
    assert all(j.id != f"never-{unique_id[:20]}" for j in await app.store.all())


async def test_a_tenants_job_starts_only_for_events_of_its_tenants_factories(
    make_app: Callable[..., Any], nats_url: str, unique_id: str, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f'tenants:\n  aegis/plant-ops: ["{unique_id}-a*"]\n')
    app = await make_app(orchestrator_tenants_file=tenants)
    assert app.store is not None
    # this test's factories only (the stream holds other tests' events too)
    mine = f'StringMatches([$.afterData.factory_id], "{unique_id}-*")'
    await app.store.register(
        biz_job(
            "tenant-job",
            unique_id,
            trigger_condition_expr=mine,
            tenant="aegis/plant-ops",
            overlap_allowed=2,
        )
    )
    await app.store.register(
        biz_job("fleet-job", unique_id, trigger_condition_expr=mine, overlap_allowed=2)
    )
    await app.refresh()
    await publish_change(nats_url, f"{unique_id}-b", "WARNING", "CRITICAL")  # another's factory
    await publish_change(nats_url, f"{unique_id}-a1", "WARNING", "CRITICAL")  # the tenant's
    # the job without a tenant runs for both; the tenant's job was skipped for the other
    # factory's event and ran for its own (an event's jobs are launched one after the other, so
    # the fleet job's runs alone do not say the tenant's job has been launched yet)
    await eventually(lambda: _count(app, "fleet-job", 2), within=20, what="two fleet runs")
    await eventually(lambda: _skipped(app, "tenant-job") >= 1, within=20, what="a skip")
    await eventually(lambda: _count(app, "tenant-job", 1), within=20, what="the tenant's run")
    (run,) = await runs_of(app, "tenant-job")
    assert run["input"]["afterData"]["factory_id"] == f"{unique_id}-a1"
