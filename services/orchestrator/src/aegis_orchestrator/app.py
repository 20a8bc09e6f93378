"""Composition root of the orchestrator: trigger sources (read-model change events, objects
created, device messages, system events, cron schedules), the in-memory trigger index refreshed by
job change events and scoped by the tenants file, the runner (executions are recorded before their
trigger is acknowledged), the search for abandoned executions to resume, heartbeats and health."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
from faststream.nats.subscriber.usecases import PullStreamSubscriber

from aegis_contracts import bus, keys
from aegis_contracts.events import ChangeEvent, ObjectCreated, RawArchived, SystemEvent
from aegis_contracts.subjects import (
    STREAMS,
    change_subject,
)
from aegis_contracts.times import Clock, ensure_utc, utc_now
from aegis_orchestration.limits import Limits
from aegis_orchestration.model import Job
from aegis_orchestration.params import ENV_PREFIX
from aegis_orchestration.store import DuplicateJob, JobStore
from aegis_orchestration.tenants import Tenants, TenantsFileError, load_tenants
from aegis_orchestration.triggers import (
    Trigger,
    TriggerIndex,
    automation_trigger,
    biz_object_trigger,
    component_trigger,
    due_fires,
    platform_trigger,
    schedule_trigger,
)
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator.egress import EGRESS_ALLOW_VAR, EgressPolicy, guarded_session
from aegis_orchestrator.expiry import ExpiryAnnouncer
from aegis_orchestrator.runner import Runner
from aegis_orchestrator.s3events import INVALID, Bridge
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.stepfunctions import Launcher
from aegis_orchestrator.tasks import Tasks
from aegis_runtime import logging as aegis_logging
from aegis_runtime.bus import current_subject, dead_letter, delivery, durable_pull
from aegis_runtime.heartbeat import instance_id
from aegis_runtime.lifecycle import run_service, start_background
from aegis_runtime.service import ServiceApp
from aegis_storage.clients import AwsClients, open_client
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)

JOB_ENTITY = "orch_job"
CLAIM_TTL = timedelta(days=7)
# a schedule fire claimed but not recorded within this is taken over by another replica
SCHEDULE_CLAIM_LEASE = timedelta(minutes=2)


class FileClock:
    """The time written in a file (an ISO-8601 instant), read at each call: a test or a drill
    moves the clock of a running process by rewriting it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self) -> datetime:
        return ensure_utc(datetime.fromisoformat(self.path.read_text().strip()))


def job_environment(env: Mapping[str, str]) -> dict[str, str]:
    """What ENVIRONMENT params may read: ``AEGIS_JOB_*`` only (never the service's secrets),
    less the egress allow-list, which is the orchestrator's own setting."""
    return {k: v for k, v in env.items() if k.startswith(ENV_PREFIX) and k != EGRESS_ALLOW_VAR}


def every(
    interval_s: float, work: Callable[[], Awaitable[Any]], failed: str
) -> Callable[[asyncio.Event], Awaitable[None]]:
    """A background loop: ``work`` now and every ``interval_s`` until stopped; a failure is
    logged as ``failed`` and the next round tries again."""

    async def loop(stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await work()
            except Exception:
                log.exception(failed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)

    return loop


class OrchestratorApp(ServiceApp):
    def __init__(
        self,
        settings: OrchestratorSettings,
        *,
        clock: Clock = utc_now,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(settings, clock=clock)
        self.settings: OrchestratorSettings = settings
        self.environment = job_environment(os.environ if environment is None else environment)
        self.fired = self.metrics.counter(
            "orchestrator_executions_started_total",
            "Executions started by trigger type.",
            ("trigger",),
        )
        # one series per job that a trigger reached but did not start (its condition was false,
        # or the event was replayed): job ids are bounded by registration
        self.skipped = self.metrics.counter(
            "orchestrator_jobs_skipped_total",
            "Jobs a trigger of their key reached but did not start (condition false, replayed, "
            "another tenant's factory, no factory, tenant not declared).",
            ("job",),
        )
        self.s3_events = self.metrics.counter(
            "orchestrator_s3_events_total",
            "S3 event notification records by outcome (announced, announced_by_writer, invalid).",
            ("outcome",),
        )
        self.owner = instance_id()
        # AEGIS_ORCHESTRATOR_TENANTS_FILE, read at start and at every refresh
        self.tenants = Tenants()
        self.index = TriggerIndex()
        self.store: JobStore | None = None
        self.runner: Runner | None = None
        # the stepfunctions engine: executions start on Step Functions instead of the runner
        self.launcher: Launcher | None = None
        # the TTL-expiry announcer (orchestrator_expiry_stream)
        self.expiry: ExpiryAnnouncer | None = None
        self._checked: dict[str, datetime] = {}
        # per schedule job, fires claimed but not recorded yet (here or elsewhere)
        self._unfinished: dict[str, set[datetime]] = {}
        durable = settings.orchestrator_durable

        def consumer(source: str) -> PullStreamSubscriber:
            """The trigger consumer of ``source`` on the stream and subjects the bus declares
            for it (named after the ``orchestrator_durable`` prefix)."""
            declared = bus.consumer(f"orchestrator-{source}")
            return durable_pull(
                self.broker,
                next(s for s in STREAMS if s.name == declared.stream),
                f"{durable}-{source}",
                subject=declared.subject,
                batch_size=settings.orchestrator_batch_size,
                fetch_timeout=settings.orchestrator_fetch_timeout_s,
                ack_wait=settings.orchestrator_ack_wait_s,
                max_deliver=settings.orchestrator_max_deliver,
                user=settings.nats_user,
            )

        @consumer("changes")
        async def on_change(event: ChangeEvent) -> None:
            entity = current_subject().rsplit(".", 1)[-1]
            await self.handle(
                biz_object_trigger(event.model_dump(mode="json"), entity),
                redelivered=delivery() > 1,
            )

        @consumer("objects")
        async def on_object(event: ObjectCreated) -> None:
            family = current_subject().rsplit(".", 1)[-1]
            await self.handle(
                component_trigger(event.model_dump(mode="json"), family),
                redelivered=delivery() > 1,
            )

        @consumer("events")
        async def on_system(event: SystemEvent) -> None:
            await self.handle(
                automation_trigger(event.model_dump(mode="json")), redelivered=delivery() > 1
            )

        @consumer("raw")
        async def on_raw(event: RawArchived) -> None:
            await self.handle(
                platform_trigger(event.model_dump(mode="json")), redelivered=delivery() > 1
            )

        # every replica hears every job change (core NATS, no queue group): no per-event DB read.
        # Never answered: a change published through JetStream (a dashboard's) carries its
        # publisher's inbox for the stream's acknowledgement, which no replica may write to
        @self.broker.subscriber(change_subject(JOB_ENTITY), no_reply=True)
        async def on_job_change(event: ChangeEvent) -> None:
            await self.reload(event.sk.removeprefix("JOB#"))

    # -- jobs -----------------------------------------------------------------------------------

    async def refresh(self) -> int:
        """Read every job, and the tenants file again, into a new trigger index."""
        assert self.store is not None
        await self.read_tenants()
        jobs = await self.store.all()
        self.index = TriggerIndex(jobs, self.tenants)
        for job in self.index.undeclared():
            log.warning("job_tenant_undeclared", job_id=job.id, reason=self.tenants.refusal(job))
        return len(jobs)

    async def read_tenants(self) -> Tenants:
        """The tenants file's tenants; when it cannot be read any more, those read before stay
        (logged), so a bad edit does not stop every tenant's jobs."""
        path = self.settings.orchestrator_tenants_file
        try:
            self.tenants = await asyncio.to_thread(load_tenants, path)
        except TenantsFileError as err:
            log.error(  # noqa: TRY400 - the reason is the message; a traceback would add nothing
                "tenants_file_invalid", error=str(err), kept=sorted(self.tenants.scopes)
            )
        return self.tenants

    async def reload(self, job_id: str) -> Job | None:
        assert self.store is not None
        job = await self.store.get(job_id)
        if job is None:
            self.index.remove(job_id)
        else:
            self.index.put(job)
            if job.fires and (undeclared := self.index.tenants.refusal(job)):
                log.warning("job_tenant_undeclared", job_id=job.id, reason=undeclared)
        log.info("job_reloaded", job_id=job_id, found=job is not None)
        return job

    async def handle(self, trigger: Trigger, *, redelivered: bool = False) -> list[Job]:
        """Record an execution of each job ``trigger`` fires and start it (in the background);
        returns the jobs. Returns once every execution is recorded, so the trigger's message is
        acknowledged only then (a failure to record nacks it). A ``redelivered`` message may
        have been recorded before its acknowledgement was lost: jobs that have it are skipped."""
        evaluation = self.index.evaluate(trigger)
        for job, why in evaluation.skipped:
            self.skipped.labels(job=job.id).inc()
            log.debug(
                "job_skipped",
                job_id=job.id,
                reason=why,
                trigger=trigger.type.value,
                object_id=trigger.object_id,
                sub_type=trigger.sub_type,
                factory_id=trigger.factory,
                tenant=job.tenant,
            )
        jobs = evaluation.fired
        for job in jobs:
            await self.launch(job, trigger, redelivered=redelivered)
        return jobs

    async def launch(
        self, job: Job, trigger: Trigger, *, redelivered: bool = False
    ) -> asyncio.Task[dict[str, Any]] | None:
        """Record and start an execution; None when no run slot was free (SKIPPED_OVERLAP) or
        the redelivered trigger was recorded already. With the stepfunctions engine, start its
        state machine's execution instead (None: the execution runs on Step Functions)."""
        if self.launcher is not None:
            arn = await self.launcher.start(job, trigger, redelivered=redelivered)
            if arn is not None:
                self.fired.labels(trigger=trigger.type.value).inc()
                log.info(
                    "execution_started",
                    job_id=job.id,
                    execution_arn=arn,
                    trigger=trigger.type.value,
                )
            return None
        if self.runner is None:
            raise RuntimeError("the orchestrator is not started")  # nacked: retried later
        if redelivered and await self.runner.recorded(job, trigger):
            log.info("trigger_already_recorded", job_id=job.id, trigger=trigger.type.value)
            return None
        execution = await self.runner.begin(job, trigger)
        if execution is None:
            return None
        self.fired.labels(trigger=trigger.type.value).inc()
        log.info(
            "execution_started",
            job_id=job.id,
            execution_id=execution.id,
            trigger=trigger.type.value,
        )
        return self.runner.start(execution)

    async def tick_schedules(self) -> list[tuple[str, datetime]]:
        """Claim and start the due fires of every schedule job; returns what this replica ran.

        A fire is claimed with a lease and marked done once its execution is recorded. A fire
        whose claim is held but not done (its replica died between claiming and recording, or
        could not record) is watched, and taken over once the lease is over; the execution is
        then started only if the trigger was not recorded yet, so a fire runs once however its
        replica died."""
        assert self.clients is not None
        readmodel = ReadModel(self.clients.items, self.settings.table)
        now = self.clock()
        started: list[tuple[str, datetime]] = []
        for job in self.index.schedules():
            watched = self._unfinished.pop(job.id, set())
            fires = sorted(set(due_fires(job, self._checked.get(job.id), now)) | watched)
            self._checked[job.id] = now
            for fire in fires:
                if now - fire > CLAIM_TTL:
                    continue  # its claim has expired: too old to run
                # a claim won for a fire seen held, or older than a claim's lease, may be taken
                # over from a replica that recorded it before dying
                maybe_run = fire in watched or now - fire >= SCHEDULE_CLAIM_LEASE
                try:
                    ran = await self._fire(readmodel, job, fire, now, maybe_run=maybe_run)
                except StorageError as err:
                    log.warning(
                        "schedule_fire_failed", job_id=job.id, fire=str(fire), error=str(err)
                    )
                    ran = None
                if ran is None:
                    self._unfinished.setdefault(job.id, set()).add(fire)
                elif ran:
                    started.append((job.id, fire))
        return started

    async def _fire(
        self, readmodel: ReadModel, job: Job, fire: datetime, now: datetime, *, maybe_run: bool
    ) -> bool | None:
        """Claim ``fire`` of ``job`` and start it. True: this replica had it (started, skipped for
        overlap, or found recorded by a replica that died before marking it done); False: done
        by another replica; None: not done yet, to look at again. ``maybe_run``: a claim won may
        be a takeover, so the execution starts only if its trigger is not recorded yet."""
        claim = f"orch-{job.id}"
        claimed = await readmodel.claim_window(
            claim,
            fire,
            owner=self.owner,
            now=now,
            ttl=int((now + CLAIM_TTL).timestamp()),
            lease=SCHEDULE_CLAIM_LEASE,
        )
        if not claimed:
            held = await readmodel.get_item(keys.claim_pk(claim), keys.claim_sk(fire))
            return False if held is None or held.get("done_at") else None
        await self.launch(job, schedule_trigger(job, fire), redelivered=maybe_run)
        await readmodel.finish_window(claim, fire, owner=self.owner, now=now)
        return True

    async def _s3_event_dead_letter(self, body: bytes, detail: str, message_id: str) -> None:
        await dead_letter(
            self.broker,
            service=self.settings.service,
            reason=INVALID,
            payload=body,
            detail=detail,
            subject=self.settings.orchestrator_s3_events_queue_url,
            message_id=message_id or None,
        )

    async def resume_abandoned(self) -> list[str]:
        """Resume the executions whose replica stopped renewing their lease; returns their ids."""
        if self.runner is None or self.store is None:
            return []
        return await self.runner.resume_abandoned(self.store.get)

    async def watch_executions(self) -> list[str]:
        """With the stepfunctions engine: record the outcome of the executions that ended (one
        round of :meth:`aegis_orchestrator.stepfunctions.Launcher.poll`); returns their ids."""
        if self.launcher is None:
            return []
        return await self.launcher.poll()

    async def _refresh_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.orchestrator_refresh_s)
            if not stop.is_set():
                try:
                    await self.refresh()
                except Exception:
                    log.exception("job_refresh_failed")

    async def register_file(self, path: Path) -> list[str]:
        """Register the jobs of a YAML file that are not registered yet (``make run``)."""
        assert self.store is not None
        added: list[str] = []
        for job in load_jobs(await asyncio.to_thread(path.read_text)):
            if undeclared := self.tenants.refusal(job):
                log.warning("example_job_refused", job_id=job.id, reason=undeclared)
                continue
            try:
                await self.store.register(job, by="orchestrator:jobs-file")
            except (Conflict, DuplicateJob) as err:
                log.info("example_job_kept", job_id=job.id, reason=str(err))
                continue
            added.append(job.id)
        return added

    # -- lifecycle ------------------------------------------------------------------------------

    async def storage_ready(self) -> bool:
        """Ready when the table answers: jobs, claims and runs live in the read model."""
        if self.clients is None:
            return False
        await self.clients.dynamodb.describe_table(TableName=self.settings.table)
        return True

    async def setup(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        s = self.settings
        egress = EgressPolicy.parse(
            s.job_egress_allow, max_response_bytes=s.orchestrator_response_max_bytes
        )
        session = await stack.enter_async_context(guarded_session(egress))
        # the jobs it registers itself (the jobs file) are announced like those of `aegis jobs`
        readmodel = ReadModel(clients.items, s.table, changes=self.publish_change)
        self.store = JobStore(readmodel, self.clock)
        tasks = Tasks(
            session=session,
            readmodel=readmodel,
            publish=self.publish,
            clock=self.clock,
            slack_webhook_url=(
                s.slack_webhook_url.get_secret_value() if s.slack_webhook_url else None
            ),
            commands=s.orchestrator_commands,
            command_timeout=s.orchestrator_command_timeout_s,
            egress=egress,
        )
        if tasks.absent:
            log.warning(
                "run_command_not_installed",
                commands=sorted(tasks.absent),
                detail="allowed by AEGIS_ORCHESTRATOR_COMMANDS but absent from this image: "
                "RUN_COMMAND steps naming them fail",
            )
        self.runner = Runner(
            store=self.store,
            readmodel=readmodel,
            objects=ObjectStore(clients, s.bucket),
            tasks=tasks,
            clock=self.clock,
            environment=self.environment,
            owner=self.owner,
            lease=timedelta(seconds=s.orchestrator_run_lease_s),
            execution_lease=timedelta(seconds=s.orchestrator_execution_lease_s),
            inline_limit=s.orchestrator_inline_limit_bytes,
            log_inline=s.orchestrator_log_inline_bytes,
            log_ttl=timedelta(days=s.orchestrator_log_ttl_days),
            limits=Limits(
                max_context_bytes=s.orchestrator_max_context_bytes,
                max_steps=s.orchestrator_max_steps,
                max_item_bytes=s.orchestrator_max_item_bytes,
            ),
            wait_poll_s=s.orchestrator_wait_poll_s,
        )
        if s.orchestrator_engine == "stepfunctions":
            client = await stack.enter_async_context(open_client("stepfunctions", s.aws()))
            self.launcher = Launcher(
                client,
                arn_prefix=s.orchestrator_state_machine_arn_prefix,
                runner=self.runner,
                batch=s.orchestrator_sfn_poll_batch,
            )
            # on stop: the executions it watches are handed over to the other replicas at once
            stack.push_async_callback(self.launcher.hand_over)
            stack.callback(setattr, self, "launcher", None)
        if s.orchestrator_s3_events_queue_url:
            sqs = await stack.enter_async_context(open_client("sqs", s.aws()))
            bridge = Bridge(
                sqs,
                s.orchestrator_s3_events_queue_url,
                publish=self.publish,
                dead_letter=self._s3_event_dead_letter,
                counter=self.s3_events,
                wait_s=s.orchestrator_s3_events_wait_s,
            )
            start_background(stack, bridge.run, "orchestrator-s3-events")
        # on stop, executions still going are handed over (their leases expired at once) to the
        # other replicas: a deploy does not wait out a WAIT, nor lose it
        stack.push_async_callback(self.runner.drain, s.orchestrator_drain_s)
        # on stop: no new execution (a trigger meanwhile is nacked and redelivered), then the drain
        stack.callback(setattr, self, "runner", None)
        # a tenants file that cannot be read stops the start, naming it (later: the last one read)
        self.tenants = await asyncio.to_thread(load_tenants, s.orchestrator_tenants_file)
        jobs_file = Path(s.orchestrator_jobs_file) if s.orchestrator_jobs_file else None
        if jobs_file is not None and await asyncio.to_thread(jobs_file.is_file):
            added = await self.register_file(jobs_file)
            log.info("example_jobs_registered", file=s.orchestrator_jobs_file, added=added)
        elif jobs_file is not None:
            log.warning(
                "jobs_file_missing",
                file=s.orchestrator_jobs_file,
                cwd=str(Path.cwd()),
                hint="no jobs registered from it: set AEGIS_ORCHESTRATOR_JOBS_FILE to a file "
                "that exists (a relative path is read from the working directory), or to '' "
                "for none",
            )
        count = await self.refresh()
        start_background(
            stack,
            every(s.orchestrator_schedule_tick_s, self.tick_schedules, "schedule_tick_failed"),
            "orchestrator-schedules",
        )
        start_background(stack, self._refresh_loop, "orchestrator-refresh")
        start_background(
            stack,
            every(s.orchestrator_resume_scan_s, self.resume_abandoned, "resume_scan_failed"),
            "orchestrator-resume",
        )
        if self.launcher is not None:
            start_background(
                stack,
                every(s.orchestrator_resume_scan_s, self.watch_executions, "execution_poll_failed"),
                "orchestrator-stepfunctions",
            )
        if s.orchestrator_expiry_stream:
            await self._start_expiry(stack, clients)
        log.info("orchestrator_started", jobs=count, owner=self.owner)

    async def _start_expiry(self, stack: AsyncExitStack, clients: AwsClients) -> None:
        """Announce the items DynamoDB expires, read from the table's stream (a background loop;
        on stop, the shards this replica reads are handed back at once)."""
        s = self.settings
        streams = await stack.enter_async_context(open_client("dynamodbstreams", s.aws()))
        self.expiry = ExpiryAnnouncer(
            clients=clients,
            streams=streams,
            table=s.table,
            publish=self.publish,
            producer=s.service,
            owner=self.owner,
            clock=self.clock,
            metrics=self.metrics,
            lease=timedelta(seconds=s.orchestrator_expiry_lease_s),
        )
        stack.push_async_callback(self.expiry.close)
        start_background(
            stack,
            every(s.orchestrator_expiry_poll_s, self.expiry.poll, "expiry_poll_failed"),
            "orchestrator-expiry",
        )


def main() -> None:
    settings = OrchestratorSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    path = settings.orchestrator_clock_file
    clock: Clock = FileClock(path) if path is not None else utc_now
    run_service(OrchestratorApp(settings, clock=clock).run)
