"""The rest of the services on the internal bus with identities (``aegis_contracts.bus``), on
a real nats-server: each does its work under its own identity (the orchestrator runs a job from a
change event, the cloud collector reads the queue's state and files a snapshot, the aggregator
and the reporter announce their objects, the dashboard's live feed hears them all), and what
each may not do is refused: another service's events, raw events, stream management."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from faststream.nats import NatsBroker
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from aegis_aggregator.app import AggregatorApp
from aegis_aggregator.settings import AggregatorSettings
from aegis_cloud_collector.app import create_app as create_collector
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts import incidents, keys
from aegis_contracts.bus import IDENTITIES
from aegis_contracts.events import ChangeEvent, ObjectCreated, SystemEvent
from aegis_contracts.people import Identity, Role
from aegis_contracts.state import Level
from aegis_contracts.subjects import (
    STREAMS,
    change_subject,
    object_created_subject,
    raw_subject,
    system_subject,
)
from aegis_contracts.times import utc_now
from aegis_dashboard_api import audit
from aegis_dashboard_api.access import token_digest
from aegis_dashboard_api.app import create_app as create_dashboard
from aegis_dashboard_api.feed import SUBJECTS, LiveFeed
from aegis_dashboard_api.live import Hub, Listener, LiveEvent
from aegis_dashboard_api.routes import Reader
from aegis_dashboard_api.settings import DashboardSettings
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.natsbus import Bus, Connect, refused, refused_publish
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_orchestration.model import Job
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.cli import announce
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_reporter.app import ReporterApp
from aegis_reporter.settings import ReporterSettings
from aegis_runtime import natsio
from aegis_runtime.bus import StreamSetupFailed, ensure_streams, publish
from aegis_runtime.service import ServiceApp
from aegis_storage.audit import AuditLog
from aegis_storage.incidents import IncidentStore
from aegis_storage.readmodel import ReadModel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def latest_change(table: str, factory: str, level: str) -> ChangeEvent:
    """The processor's change event of a factory's LATEST."""
    return ChangeEvent(
        table=table,
        pk=keys.factory_pk(factory),
        sk="LATEST",
        event_name="MODIFY",
        old_image={"factory_id": factory, "risk": {"level": "NORMAL"}},
        new_image={"factory_id": factory, "risk": {"level": level, "score": 90, "reasons": []}},
        producer="processor",
        at=utc_now(),
    )


async def stored(admin: NatsBroker, stream: str) -> int:
    js = admin.config.connection_state.stream
    return int((await js.stream_info(stream)).state.messages)


@pytest.fixture
async def started() -> AsyncIterator[list[ServiceApp]]:
    """Services a test appends after starting them; stopped at its end."""
    apps: list[ServiceApp] = []
    yield apps
    for app in reversed(apps):
        await app.stop()


def orchestrator_settings(
    bus: Bus, foundation: Foundation, aws_endpoint: str, unique_id: str
) -> OrchestratorSettings:
    return OrchestratorSettings(
        **bus.identity("orchestrator"),
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        orchestrator_durable=f"orch-{unique_id}",
        orchestrator_jobs_file="",
        orchestrator_schedule_tick_s=3600,
        orchestrator_fetch_timeout_s=0.2,  # its stop waits out a fetch: a short one
        heartbeat_interval_s=60,
    )


async def test_the_orchestrator_runs_a_job_from_a_change_under_its_identity(
    bus: Bus,
    connect: Connect,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
    started: list[ServiceApp],
) -> None:
    factory = f"f-{unique_id}"
    settings = orchestrator_settings(bus, foundation, aws_endpoint, unique_id)
    app = OrchestratorApp(settings, environment={})
    await app.start()
    started.append(app)
    job = Job.model_validate(
        {
            "id": f"job-{unique_id}",
            "job_name": "critical",
            "trigger_type": "BizObject",
            "object_id": "factory_latest",
            "trigger_sub_type": "Update",
            "trigger_condition_expr": f'StringEQ([$.afterData.factory_id], "{factory}")',
            "steps": [{"id": "mark", "step_type": "DUMMY", "is_start_point": True}],
        }
    )
    assert app.store is not None
    await app.store.register(job)
    # `aegis jobs` announces the new job under the orchestrator's identity; the running
    # orchestrator hears it on its plain subscription (its periodic refresh is a minute away)
    assert await asyncio.to_thread(announce, [job.id], settings)
    await eventually(
        lambda: any(j.id == job.id for j in app.index.jobs()), within=10, what="the job heard"
    )
    processor = await connect("processor")
    change = latest_change(foundation.table, factory, "CRITICAL")
    await publish(processor, change_subject("factory_latest"), change, msg_id=f"c-{unique_id}")

    async def recorded() -> bool:
        assert app.store is not None
        return len(await app.store.executions(job.id, limit=10)) == 1

    await eventually(recorded, within=20, what="the execution of the job, from the change")

    # its jobs may announce system events of their own (a PUBLISH_EVENT step)...
    done = SystemEvent(kind="job_done", producer="orchestrator", at=utc_now())
    assert await publish(app.broker, system_subject("job_done"), done, msg_id=unique_id) is False
    # ...but not a change of a factory, an alert sent, a report, or a device message
    await asyncio.gather(
        refused_publish(app.broker, change_subject("factory_latest")),
        refused_publish(app.broker, system_subject("alert_sent")),
        refused_publish(app.broker, system_subject("report_generated")),
        refused_publish(app.broker, raw_subject(factory, "factory_state")),
    )


@dataclass
class Desk:
    """A dashboard and an orchestrator, each under its own NATS identity, on one bus."""

    client: httpx.AsyncClient
    app: Any
    orchestrator: OrchestratorApp
    admin: str
    viewer: str

    async def register(self, job_id: str, sub_type: str, condition: str) -> None:
        made = await self.client.post(
            "/api/jobs",
            headers={"Authorization": f"Bearer {self.admin}"},
            json={
                "id": job_id,
                "job_name": job_id,
                "trigger_type": "Automation",
                "object_id": "dashboard-api",
                "trigger_sub_type": sub_type,
                "trigger_condition_expr": condition,
                "steps": [{"id": "warn", "step_type": "DUMMY", "is_start_point": True}],
            },
        )
        assert made.status_code == 201, made.text

    async def heard(self, jobs: Iterable[str]) -> None:
        await eventually(
            lambda: set(jobs) <= {j.id for j in self.orchestrator.index.jobs()},
            within=10,
            what="the jobs heard by the orchestrator",
        )

    async def runs(self, jobs: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
        assert self.orchestrator.store is not None
        return {j: await self.orchestrator.store.executions(j, limit=10) for j in jobs}


@asynccontextmanager
async def desk(
    bus: Bus,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
    started: list[ServiceApp],
    clock: Callable[[], datetime] = utc_now,
) -> AsyncIterator[Desk]:
    orchestrator = OrchestratorApp(
        orchestrator_settings(bus, foundation, aws_endpoint, unique_id), environment={}
    )
    await orchestrator.start()
    started.append(orchestrator)
    admin_token, viewer_token = f"admin-{unique_id}", f"viewer-{unique_id}"
    settings = DashboardSettings(
        **bus.identity("dashboard-api"),
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        dashboard_tokens=f"admin:{token_digest(admin_token)},viewer:{token_digest(viewer_token)}",
    )
    app = create_dashboard(settings, clients=foundation.clients, clock=clock)
    app.state.reader.readmodel.changes = app.state.feed.announce  # as its lifespan does
    stop = asyncio.Event()
    running = asyncio.create_task(app.state.feed.run(stop))
    try:
        await eventually(lambda: app.state.feed.connected, within=10, what="the dashboard's NATS")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dash"
        ) as client:
            yield Desk(client, app, orchestrator, admin_token, viewer_token)
            await audit.settled(app)
    finally:
        stop.set()
        await running


async def test_jobs_an_admin_registers_on_the_dashboard_start_from_its_sign_ins(
    bus: Bus,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
    started: list[ServiceApp],
) -> None:
    """The dashboard announces, under its own identity, the jobs an admin registers through
    its API (the orchestrator takes them at once) and each sign-in; each Login job starts once,
    for the sign-in its condition names: one that succeeded, one with a wrong token."""
    jobs = {
        f"signed-in-{unique_id}": 'StringEQ([$.detail.outcome], "ok")',
        f"wrong-token-{unique_id}": 'StringEQ([$.detail.exception], "wrong_token")',
    }
    async with desk(bus, foundation, aws_endpoint, unique_id, started) as d:
        for job_id, condition in jobs.items():
            await d.register(job_id, "Login", condition)
        await d.heard(jobs)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        ok = await d.client.post("/login", content=f"token={d.viewer}", headers=form)
        wrong = await d.client.post("/login", content="token=guessed", headers=form)
        assert (ok.status_code, wrong.status_code) == (303, 401)

        async def both_ran() -> bool:
            return all((await d.runs(jobs)).values())

        await eventually(both_ran, within=20, what="each Login job's execution")
    ran = await d.runs(jobs)
    assert {j: len(r) for j, r in ran.items()} == dict.fromkeys(jobs, 1)
    assert {r[0]["trigger"]["sub_type"] for r in ran.values()} == {"Login"}
    (refused,) = [
        e for e in (await AuditLog(foundation.store).day(utc_now().date()))[0]
        if e.action == "sign_in" and e.outcome == "refused"
    ]  # fmt: skip
    assert refused.failure == "wrong_token"


async def test_reads_of_one_entity_through_the_api_start_select_jobs_once_a_minute_per_person(
    bus: Bus,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
    started: list[ServiceApp],
) -> None:
    """A viewer reads one job three times within a minute and an unknown one: the Select job
    whose condition names that job starts once (the repeats are one read), the one naming
    another job never; a read in the next minute starts it again."""
    clock = FakeClock(datetime(2026, 11, 30, 9, 0, 5, tzinfo=UTC))
    read, other = f"read-{unique_id}", f"other-{unique_id}"
    jobs = {
        read: (
            f'AND(StringEQ([$.detail.entity], "job"), StringEQ([$.detail.id], "{read}"), '
            'StringEQ([$.detail.via], "token"))'
        ),
        other: f'StringEQ([$.detail.id], "nobody-reads-{unique_id}")',
    }
    async with desk(bus, foundation, aws_endpoint, unique_id, started, clock) as d:
        for job_id, condition in jobs.items():
            await d.register(job_id, "Select", condition)
        await d.heard(jobs)
        viewer = {"Authorization": f"Bearer {d.viewer}"}
        for _ in range(3):
            assert (await d.client.get(f"/api/jobs/{read}", headers=viewer)).status_code == 200
        assert (await d.client.get("/api/jobs/no-such-job", headers=viewer)).status_code == 404

        async def ran(n: int) -> bool:
            return len((await d.runs([read]))[read]) >= n

        await eventually(lambda: ran(1), within=20, what="the Select job's execution")
        clock.now += timedelta(minutes=1)
        assert (await d.client.get(f"/api/jobs/{read}", headers=viewer)).status_code == 200
        await eventually(lambda: ran(2), within=20, what="its execution for the next minute")
    runs = await d.runs(jobs)
    assert (len(runs[read]), len(runs[other])) == (2, 0)
    assert runs[read][0]["trigger"]["sub_type"] == "Select"


def heard(listener: Listener) -> list[LiveEvent]:
    """The page events queued for one browser so far (taken off its queue)."""
    events = []
    while not listener.queue.empty():
        item = listener.queue.get_nowait()
        if item is not None:
            events.append(item[0])
    return events


async def test_the_live_feed_hears_every_publisher_each_under_its_identity(
    bus: Bus,
    connect: Connect,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
    started: list[ServiceApp],
) -> None:
    storage = {
        "aws_endpoint_url": aws_endpoint,
        "bucket": foundation.bucket,
        "table": foundation.table,
    }
    hub = Hub()
    listener = hub.listen(
        Identity(subject="t", name="wall", via="token", role=Role.VIEWER, scope="*")
    )
    dashboard = DashboardSettings(**bus.identity("dashboard-api"), **storage)
    feed = LiveFeed(Reader(foundation.clients, dashboard, utc_now), hub)
    stop = asyncio.Event()
    running = asyncio.create_task(feed.run(stop))
    events: list[LiveEvent] = []
    try:
        await eventually(lambda: feed.connected, within=10, what="the feed's connection")
        aggregator = AggregatorApp(AggregatorSettings(**bus.identity("aggregator"), **storage))
        reporter = ReporterApp(ReporterSettings(**bus.identity("reporter"), **storage))
        for app in (aggregator, reporter):
            await app.start()  # checks the streams, says it is alive (a heartbeat)
            started.append(app)
        collector = create_collector(
            CollectorSettings(
                **bus.identity("cloud-collector"),
                **storage,
                collector_tiers=["fast"],
                expected_services=["aggregator", "reporter"],
                expected_consumers=[],
            ),
            background=False,
        )
        await collector.start()
        started.append(collector)
        processor = await connect("processor")
        factory = f"f-{unique_id}"
        window = datetime(2025, 1, 2, 3, 5, tzinfo=UTC)
        graph_key = keys.processed_agg_key(factory, window)
        report_key = keys.report_key(date(2025, 1, 2), factory, keys.ReportArtifact.REPORT)

        def created(key: str, producer: str) -> ObjectCreated:
            return ObjectCreated(
                bucket=foundation.bucket,
                key=key,
                size_bytes=1,
                producer=producer,
                created_at=utc_now(),
            )

        # the collector reads the queue (streams, consumers, every replica's last heartbeat)
        # and announces its snapshot
        snapshot = await collector.collectors["fast"].tick()
        assert snapshot is not None
        checks = {c.name: c for c in snapshot.checks}
        # a refused listing of the consumers would fail the probe that checks the streams
        assert checks["stream:AEGIS_RAW"].status is Level.NORMAL, checks
        assert checks["service:aggregator"].status is Level.NORMAL, checks
        assert checks["service:reporter"].status is Level.NORMAL, checks
        # each announces what it made through its own publishing (the domain's Publish)
        await aggregator.publish(
            object_created_subject("metrics_5m"),
            created(graph_key, "aggregator"),
            msg_id=f"oc:{graph_key}",
        )
        await reporter.publish(
            object_created_subject("reports"),
            created(report_key, "reporter"),
            msg_id=f"oc:{report_key}",
        )
        await reporter.publish(
            system_subject("report_generated"),
            SystemEvent(kind="report_generated", producer="reporter", at=utc_now()),
            msg_id=f"rg:{report_key}",
        )
        change = latest_change(foundation.table, factory, "WARNING")
        await publish(processor, change_subject("factory_latest"), change, msg_id=unique_id)

        # an incident acknowledged on a dashboard: its own write, announced under its identity
        # (the read model's change sink), heard back like the dispatcher's changes
        dashboard_writes = IncidentStore(
            ReadModel(foundation.clients.items, foundation.table, changes=feed.announce)
        )
        opened = incidents.open_incident(
            scope=factory, stream="STATE", reason="GAS_LEAK", severity="CRITICAL", at=utc_now()
        )
        await dashboard_writes.save(opened, None)

        def all_heard() -> bool:
            events.extend(heard(listener))
            wanted = {"cloud", "graph", "reports", "factory", "incident"}
            return wanted <= {e.name for e in events}

        await eventually(all_heard, within=20, what="every publisher's event on the page")
    finally:
        stop.set()
        await running
    by_name = {e.name: e.data for e in events}
    assert by_name["incident"]["incident_id"] == opened.incident_id
    assert by_name["incident"]["state"] == "triggered"
    assert by_name["graph"] == {"target": factory, "key": graph_key}
    assert by_name["reports"] == {"target": factory, "key": report_key}
    assert by_name["factory"]["entry"]["level"] == "WARNING"


async def test_what_each_service_may_not_do_is_refused(
    bus: Bus,
    connect: Connect,
    foundation: Foundation,
    aws_endpoint: str,
    unique_id: str,
) -> None:
    admin = await connect("admin")
    before = {s: await stored(admin, s) for s in ("AEGIS_RAW", "AEGIS_EVENTS", "AEGIS_DLQ")}
    aggregator, reporter, collector = (
        await connect("aggregator"),
        await connect("reporter"),
        await connect("cloud-collector"),
    )
    factory = f"f-{unique_id}"
    # another service's announcements, a change of LATEST, a device message; nobody's dead
    # letters but its own; and the collector, which looks at the queue, cannot purge it, drop a
    # service's consumer, or re-configure a stream (each refusal waits out its answer: all at
    # once)
    # (a JetStream API request the server refuses is dropped: its caller's wait runs out)
    js = natsio.client(collector).jsm(timeout=1)
    (dlq,) = [spec for spec in STREAMS if spec.name == "AEGIS_DLQ"]
    await asyncio.gather(
        refused_publish(aggregator, object_created_subject("reports")),
        refused_publish(aggregator, change_subject("factory_latest")),
        refused_publish(reporter, object_created_subject("metrics_5m")),
        refused_publish(reporter, system_subject("alert_sent")),
        # (a snapshot's announcement would page the on-call)
        refused_publish(collector, object_created_subject("state_snapshot")),
        refused_publish(collector, raw_subject(factory, "factory_state")),
        refused_publish(reporter, "aegis.dlq.processor.forged"),
        refused(js.purge_stream("AEGIS_RAW"), nats.errors.TimeoutError),
        refused(js.delete_consumer("AEGIS_EVENTS", "alerts"), nats.errors.TimeoutError),
        refused(
            ensure_streams(reporter, [replace(dlq, max_age_seconds=dlq.max_age_seconds * 2)]),
            StreamSetupFailed,
        ),
    )
    # the dashboard announces no change but an incident's, and hears only its own subjects:
    # not raw device data
    errors: list[Exception] = []

    async def on_error(err: Exception) -> None:
        errors.append(err)

    dashboard = await nats.connect(
        servers=[bus.url],
        user="dashboard-api",
        password="dashboard-api-pw",
        inbox_prefix="_INBOX_dashboard-api",
        error_cb=on_error,
    )
    try:
        raw: list[Msg] = []

        async def on_raw(msg: Msg) -> None:
            raw.append(msg)

        await dashboard.subscribe(f"aegis.raw.{factory}.>", cb=on_raw)
        await dashboard.publish(change_subject("factory_latest"), b"{}")
        await dashboard.flush()
        ingest = await connect("ingest")
        await publish(ingest, raw_subject(factory, "factory_state"), b"{}", msg_id=unique_id)
        await eventually(lambda: len(errors) >= 2, within=5, what="both permission errors")
        await asyncio.sleep(0.2)  # the raw event would have arrived by now
        assert raw == []
        assert all("permissions violation" in str(e).lower() for e in errors), errors
    finally:
        await dashboard.close()
    after = {s: await stored(admin, s) for s in before}
    assert after == {**before, "AEGIS_RAW": before["AEGIS_RAW"] + 1}  # ingest's, only


def test_the_dashboard_identity_hears_every_subject_of_its_live_feed() -> None:
    """The feed subscribes to exactly what its identity allows: a subject added to the feed and
    not to the identity would be refused on a deployment, and the page would miss it."""
    allowed = IDENTITIES["dashboard-api"].permissions()["subscribe"]["allow"]
    assert set(SUBJECTS) == set(allowed) - {"_INBOX_dashboard-api.>"}


async def test_an_unknown_user_or_a_wrong_password_cannot_connect(bus: Bus) -> None:
    for user, password in (("intruder", "x"), ("processor", "ingest-pw"), ("admin", "")):
        client = NATS()
        try:
            with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
                await client.connect(
                    servers=[bus.url],
                    user=user,
                    password=password,
                    allow_reconnect=False,
                    connect_timeout=2,
                )
        finally:
            await client.close()  # nats-py leaves a refused connection's socket open
