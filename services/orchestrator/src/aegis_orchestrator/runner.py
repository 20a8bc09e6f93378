"""Durable executions: a run slot per ``overlap_allowed``, the claim check of large values, the
interpreter, and the execution log that is also the execution's state.

- :meth:`Runner.begin` records an execution (its lease, its slot, its log item with the input)
  before the trigger's message is acknowledged; :meth:`Runner.start` then runs it in a task.
- Every step's record is written to the log item as the step completes (a WAIT's wake-up time
  as it begins), so the log is the journal the interpreter replays.
- The replica running an execution renews a lease on it (``EXEC-ACTIVE`` item) and on its run
  slot. :meth:`Runner.resume_abandoned`, run by every replica, takes over an execution whose
  lease ran out and resumes it after its last recorded step; one that already ended, or whose job
  changed meanwhile, is closed and its slot freed.
- The log item stays under the item budget: a step's input and output are kept as JSON text, in
  S3 (claim check) when over ``log_inline``, all of a step's values when the item is near its
  budget; past that the execution fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog

from aegis_contracts import keys
from aegis_contracts.times import format_ts, parse_ts
from aegis_orchestration.engine import Executor, Interpreter, StepRecord
from aegis_orchestration.limits import (
    CLAIM_CHECK,
    LimitExceeded,
    Limits,
    check_item,
    claim_check,
    json_size,
)
from aegis_orchestration.model import Job, TaskKind
from aegis_orchestration.store import JobStore
from aegis_orchestration.triggers import Trigger
from aegis_storage.errors import Conflict, StorageError, Transient
from aegis_storage.items import Table
from aegis_storage.objects import Objects

log = structlog.get_logger(__name__)


# how far back a redelivered trigger is looked for (redeliveries come within ack_wait x max_deliver)
REDELIVERY_WINDOW = timedelta(hours=1)


def trigger_digest(trigger: Trigger) -> str:
    """Names one trigger (the event it comes from): the same data, the same digest."""
    document = [trigger.type.value, trigger.object_id, trigger.sub_type, trigger.data]
    text = json.dumps(document, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def new_execution_id(now: datetime) -> str:
    return f"{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


class TaskSource(Protocol):
    """What runs a job's task steps (:class:`aegis_orchestrator.tasks.Tasks`)."""

    def executors(self, job: Job, execution_id: str) -> Mapping[TaskKind, Executor]: ...


class LeaseLost(Exception):
    """Another replica took the execution over (this one was presumed dead): stop, write nothing."""


@dataclass
class Execution:
    """One execution this replica runs: its log item (``record``) and its leases."""

    job: Job
    record: dict[str, Any]
    data: dict[str, Any]
    journal: dict[str, StepRecord] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def id(self) -> str:
        return str(self.record["execution_id"])

    @property
    def started(self) -> datetime:
        return parse_ts(str(self.record["started_at"]))

    @property
    def active_sk(self) -> str:
        return keys.exec_active_sk(self.job.id, self.started, self.id)


class Runner:
    def __init__(
        self,
        *,
        store: JobStore,
        readmodel: Table,
        objects: Objects,
        tasks: TaskSource,
        clock: Callable[[], datetime],
        environment: Mapping[str, str],
        owner: str,
        lease: timedelta,
        inline_limit: int,
        log_inline: int,
        log_ttl: timedelta,
        execution_lease: timedelta = timedelta(seconds=30),
        limits: Limits | None = None,
        wait_poll_s: float = 1.0,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.store = store
        self.readmodel = readmodel
        self.objects = objects
        self.tasks = tasks
        self.clock = clock
        self.environment = environment
        self.owner = owner
        self.lease = lease
        self.execution_lease = execution_lease
        self.inline_limit = inline_limit
        self.log_inline = log_inline
        self.log_ttl = log_ttl
        self.limits = limits or Limits()
        self.wait_poll_s = wait_poll_s
        self.sleep = sleep
        self.running: dict[str, asyncio.Task[dict[str, Any]]] = {}

    # -- starting -------------------------------------------------------------------------------

    async def begin(
        self,
        job: Job,
        trigger: Trigger,
        *,
        execution_id: str | None = None,
        engine: str | None = None,
        inline_limit: int | None = None,
    ) -> Execution | None:
        """Record a new execution of ``job`` (None: no run slot free, logged SKIPPED_OVERLAP, or
        the same execution being recorded by another replica this very instant). Raises when it
        cannot be recorded: the trigger is then not acknowledged.

        Another ``engine`` (``stepfunctions``) runs it elsewhere: its name on the log item and on
        its lease keeps this runner from resuming it; ``execution_id`` names it (else a new id)
        and ``inline_limit`` replaces the input's claim-check limit."""
        started = self.clock()
        execution_id = execution_id or new_execution_id(started)
        record: dict[str, Any] = {
            "pk": keys.exec_pk(job.id),
            "sk": keys.exec_sk(started, execution_id),
            "job_id": job.id,
            "job_version": job.version,
            "execution_id": execution_id,
            "trigger": {
                "type": trigger.type.value,
                "object_id": trigger.object_id,
                "sub_type": trigger.sub_type,
                "digest": trigger_digest(trigger),
            },
            "status": "RUNNING",
            "started_at": format_ts(started),
            "runner": self.owner,
            "steps": [],
            "ttl": int((started + self.log_ttl).timestamp()),
        }
        if engine is not None:
            record["engine"] = engine
        execution = Execution(job, record, trigger.data)
        # the lease first: whatever is left behind by a crash from here on, a replica finds and
        # cleans up (or resumes) through it
        if not await self.readmodel.acquire_lease(
            keys.EXEC_ACTIVE_PK,
            execution.active_sk,
            owner=self.owner,
            now=started,
            until=started + self.execution_lease,
            attributes={"engine": engine} if engine is not None else None,
        ):
            log.info("execution_already_recorded", job_id=job.id, execution_id=execution_id)
            return None
        slot = await self._acquire(job, execution_id, started)
        if slot is None:
            record.update(status="SKIPPED_OVERLAP", finished_at=format_ts(self.clock()))
            await self.store.put_execution(record)
            await self.readmodel.release_lease(
                keys.EXEC_ACTIVE_PK, execution.active_sk, owner=self.owner
            )
            log.info(
                "execution_skipped", job_id=job.id, reason="overlap", limit=job.overlap_allowed
            )
            return None
        record["slot"] = slot
        record["input"] = await self._offload(
            execution,
            name="input",
            value=trigger.data,
            limit=self.inline_limit if inline_limit is None else inline_limit,
        )
        await self.store.put_execution(record, new=True)
        return execution

    async def recorded(self, job: Job, trigger: Trigger) -> bool:
        """Whether an execution of ``job`` for this very trigger started in the last hour."""
        now = self.clock()
        digest = trigger_digest(trigger)
        recent = await self.readmodel.query_range(
            keys.exec_pk(job.id), "", now - REDELIVERY_WINDOW, now + timedelta(minutes=1), now=now
        )
        return any(item.get("trigger", {}).get("digest") == digest for item in recent)

    def start(self, execution: Execution) -> asyncio.Task[dict[str, Any]]:
        """Run a recorded execution in the background; its outcome lands in its log."""
        task = asyncio.ensure_future(self.run(execution))
        self.running[execution.active_sk] = task
        task.add_done_callback(lambda t: self._done(execution.active_sk, t))
        return task

    def _done(self, active_sk: str, task: asyncio.Task[dict[str, Any]]) -> None:
        self.running.pop(active_sk, None)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("execution_crashed", exc_info=exc)

    async def drain(self, wait_s: float) -> None:
        """On shutdown: let executions finish for ``wait_s``, then stop the rest and hand their
        leases over, so another replica resumes them at once instead of after the lease."""
        tasks = dict(self.running)
        if tasks:
            await asyncio.wait(list(tasks.values()), timeout=wait_s)
        for active_sk, task in tasks.items():
            if task.done():
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            # ended just before now: free for the taking (a lease is free once `until < now`);
            # if storage does not answer, the lease runs out on its own
            try:
                await self.readmodel.extend_lease(
                    keys.EXEC_ACTIVE_PK,
                    active_sk,
                    owner=self.owner,
                    until=self.clock() - timedelta(milliseconds=1),
                )
            except StorageError as err:
                log.warning("execution_not_handed_over", execution=active_sk, error=str(err))
                continue
            log.info("execution_handed_over", execution=active_sk)

    # -- running --------------------------------------------------------------------------------

    async def run(self, execution: Execution) -> dict[str, Any]:
        job, record = execution.job, execution.record
        lost = False
        try:
            async with asyncio.TaskGroup() as group:
                heartbeat = group.create_task(self._heartbeat(execution))
                interpreter = Interpreter(
                    job,
                    self.tasks.executors(job, execution.id),
                    clock=self.clock,
                    sleep=self.sleep,
                    environment=self.environment,
                    on_step=lambda step: self._record_step(execution, step),
                    limits=self.limits,
                    wait_poll_s=self.wait_poll_s,
                )
                result = await interpreter.run(
                    execution.data,
                    {"execution_id": execution.id, "job_id": job.id},
                    journal=execution.journal,
                )
                heartbeat.cancel()
            async with execution.lock:
                record.update(status=result.status, error=result.error, finished_at=self._now())
                await self._write(execution)
        except* LeaseLost:
            lost = True
        if lost:
            log.warning("execution_taken_over", job_id=job.id, execution_id=execution.id)
            return record
        await self.free(job.id, execution.id, execution.active_sk, slot=record.get("slot"))
        log.info(
            "execution_finished",
            job_id=job.id,
            execution_id=execution.id,
            status=result.status,
            steps=len(record["steps"]),
            error=result.error,
        )
        return record

    async def _heartbeat(self, execution: Execution) -> None:
        """Renew the execution's lease (and its slot's) every third of the lease; raise
        :class:`LeaseLost` when another replica holds it. A renewal that fails for a moment is
        tried again at the next beat (two more before the lease runs out)."""
        while True:
            await self.sleep(self.execution_lease.total_seconds() / 3)
            async with execution.lock:
                try:
                    await self._renew(execution)
                except Transient as err:
                    log.warning(
                        "execution_lease_not_renewed", execution_id=execution.id, error=str(err)
                    )

    async def _renew(self, execution: Execution) -> None:
        now = self.clock()
        if not await self.readmodel.extend_lease(
            keys.EXEC_ACTIVE_PK,
            execution.active_sk,
            owner=self.owner,
            until=now + self.execution_lease,
        ):
            raise LeaseLost(execution.id)
        slot = execution.record.get("slot")
        if slot is not None:
            await self.readmodel.extend_lease(
                keys.job_pk(execution.job.id),
                keys.running_sk(int(slot)),
                owner=execution.id,
                until=now + self.lease,
            )

    async def _record_step(self, execution: Execution, step: StepRecord) -> None:
        """Write the step's record into the log before the execution moves on (a record of the
        same run of the step, a WAITING one, is replaced)."""
        entry = await self._step_entry(execution, step, limit=self.log_inline)
        async with execution.lock:
            steps: list[dict[str, Any]] = execution.record["steps"]
            at = next(
                (i for i, e in enumerate(steps) if e.get("occurrence") == step.occurrence),
                len(steps),
            )
            previous = steps[at] if at < len(steps) else None

            def place(value: dict[str, Any]) -> None:
                if at < len(steps):
                    steps[at] = value
                else:
                    steps.append(value)

            place(entry)
            if json_size(execution.record) > self.limits.max_item_bytes:
                # near the budget: this step's values by reference, whatever their size
                place(await self._step_entry(execution, step, limit=0))
                try:
                    check_item(json_size(execution.record), self.limits)
                except LimitExceeded:
                    if previous is None:
                        steps.pop()
                    else:
                        steps[at] = previous
                    raise
            await self._write(execution)

    async def _write(self, execution: Execution) -> None:
        try:
            await self.store.put_execution(execution.record, runner=self.owner)
        except Conflict:
            raise LeaseLost(execution.id) from None

    async def free(self, job_id: str, execution_id: str, active_sk: str, *, slot: Any) -> None:
        """Give back the run slot, then the execution's lease (the lease last: while it exists a
        replica can still find the slot to free)."""
        pk = keys.job_pk(job_id)
        if slot is not None:
            await self.readmodel.release_lease(pk, keys.running_sk(int(slot)), owner=execution_id)
        else:  # left behind before its log item said which slot: free any it holds
            for item in await self.readmodel.partition(pk, now=self.clock()):
                if item.get("owner") == execution_id:
                    await self.readmodel.release_lease(pk, str(item["sk"]), owner=execution_id)
        await self.readmodel.release_lease(keys.EXEC_ACTIVE_PK, active_sk, owner=self.owner)

    async def _acquire(self, job: Job, execution_id: str, now: datetime) -> int | None:
        for slot in range(job.overlap_allowed):
            if await self.readmodel.acquire_lease(
                keys.job_pk(job.id),
                keys.running_sk(slot),
                owner=execution_id,
                now=now,
                until=now + self.lease,
            ):
                return slot
        return None

    # -- resuming -------------------------------------------------------------------------------

    async def resume_abandoned(self, jobs: Callable[[str], Any]) -> list[str]:
        """Take over every execution whose lease ran out and resume it (or close it when it had
        ended, or its job is gone or changed); returns the execution ids taken over. ``jobs``
        gets a job by id (awaitable)."""
        now = self.clock()
        taken: list[str] = []
        for item in await self.readmodel.partition(keys.EXEC_ACTIVE_PK, now=now):
            sk = str(item["sk"])
            if sk in self.running or str(item.get("until", "")) >= format_ts(now):
                continue
            if item.get("engine"):
                continue  # runs elsewhere (Step Functions): its launcher watches it
            if not await self.readmodel.acquire_lease(
                keys.EXEC_ACTIVE_PK, sk, owner=self.owner, now=now, until=now + self.execution_lease
            ):
                continue  # another replica was quicker
            execution = await self._take_over(sk, await jobs(keys.parse_exec_active_sk(sk)[0]))
            if execution is not None:
                taken.append(execution.id)
                self.start(execution)
        return taken

    async def _take_over(self, active_sk: str, job: Job | None) -> Execution | None:
        job_id, exec_sk = keys.parse_exec_active_sk(active_sk)
        record = await self.readmodel.get_item(keys.exec_pk(job_id), exec_sk)
        execution_id = exec_sk.rsplit("#", 1)[-1]
        if record is None or record.get("status") != "RUNNING" or job is None:
            if record is not None and record.get("status") == "RUNNING":
                record.update(
                    runner=self.owner,
                    status="FAILED",
                    error={"Error": "Abandoned", "Cause": f"job {job_id} no longer exists"},
                    finished_at=self._now(),
                )
                await self.store.put_execution(record)
            slot = record.get("slot") if record else None
            await self.free(job_id, execution_id, active_sk, slot=slot)
            log.info("execution_closed", job_id=job_id, execution_id=execution_id)
            return None
        if int(record.get("job_version", 0)) != job.version:
            record.update(
                runner=self.owner,
                status="FAILED",
                error={
                    "Error": "Abandoned",
                    "Cause": (
                        f"job {job_id} changed (version {record.get('job_version')} -> "
                        f"{job.version}) while the execution was interrupted: not resumed"
                    ),
                },
                finished_at=self._now(),
            )
            await self.store.put_execution(record)
            await self.free(job_id, execution_id, active_sk, slot=record.get("slot"))
            return None
        previous = record.get("runner")
        record["runner"] = self.owner
        record["resumed"] = int(record.get("resumed", 0)) + 1
        try:
            await self.store.put_execution(record, runner=previous)
        except Conflict:
            return None
        data = await self._load(record.get("input"))
        execution = Execution(job, record, data if isinstance(data, dict) else {})
        execution.journal = {
            str(e["occurrence"]): await self._journal_record(e)
            for e in record.get("steps", [])
            if e.get("occurrence")
        }
        slot = record.get("slot")
        if slot is not None and not await self.readmodel.extend_lease(
            keys.job_pk(job.id),
            keys.running_sk(int(slot)),
            owner=execution.id,
            until=self.clock() + self.lease,
        ):
            log.warning("execution_slot_lost", job_id=job.id, execution_id=execution.id)
        log.info(
            "execution_resumed",
            job_id=job.id,
            execution_id=execution.id,
            after=len(execution.journal),
            previous_runner=previous,
        )
        return execution

    async def _journal_record(self, entry: Mapping[str, Any]) -> StepRecord:
        return StepRecord(
            step_id=str(entry["step_id"]),
            kind=str(entry.get("kind", "")),
            status=str(entry["status"]),
            started_at=parse_ts(str(entry["started_at"])),
            finished_at=parse_ts(str(entry["finished_at"])) if entry.get("finished_at") else None,
            attempts=int(entry.get("attempts") or 0),
            input=None,  # a replayed step needs only what it did
            output=await self._load(entry.get("output"), text=True),
            error=entry.get("error"),
            branch=entry.get("branch"),
            occurrence=str(entry["occurrence"]),
            wake_at=parse_ts(str(entry["wake_at"])) if entry.get("wake_at") else None,
        )

    # -- the log's values -----------------------------------------------------------------------

    def _now(self) -> str:
        return format_ts(self.clock())

    async def _offload(
        self, execution: Execution, *, name: str, value: Any, limit: int, text: bool = False
    ) -> Any:
        return await self.offload(
            execution.job.id,
            execution.started,
            execution.id,
            name=name,
            value=value,
            limit=limit,
            text=text,
        )

    async def offload(
        self,
        job_id: str,
        started: datetime,
        execution_id: str,
        *,
        name: str,
        value: Any,
        limit: int,
        text: bool = False,
    ) -> Any:
        """``value`` of an execution inline when small (with ``text`` as its JSON text), else an
        S3 object and ``{"claim_check": {...}}``."""
        body = json.dumps(value, default=str, separators=(",", ":")).encode()
        if value is None or len(body) <= limit:
            return body.decode() if text and value is not None else value
        key = keys.orchestration_input_key(job_id, started, execution_id, name)
        await self.objects.put_bytes(key, body, content_type="application/json")
        return {CLAIM_CHECK: {"bucket": self.objects.bucket, "key": key, "bytes": len(body)}}

    async def _load(self, value: Any, *, text: bool = False) -> Any:
        """The value a claim check, or with ``text`` a JSON text, stands for."""
        if (reference := claim_check(value)) is not None:
            return json.loads(await self.objects.get_bytes(str(reference["key"])))
        if text and isinstance(value, str):
            return json.loads(value)
        return value

    async def _step_entry(
        self, execution: Execution, step: StepRecord, *, limit: int
    ) -> dict[str, Any]:
        name = _object_name(step)
        return {
            "step_id": step.step_id,
            "occurrence": step.occurrence,
            "kind": step.kind,
            "status": step.status,
            "attempts": step.attempts,
            "branch": step.branch,
            "started_at": format_ts(step.started_at),
            "finished_at": format_ts(step.finished_at) if step.finished_at else None,
            "wake_at": format_ts(step.wake_at) if step.wake_at else None,
            "duration_ms": round(
                ((step.finished_at or step.started_at) - step.started_at).total_seconds() * 1000, 3
            ),
            # JSON text: a step's values may nest deeper than DynamoDB's 32 levels (an output
            # that holds earlier outputs), and one string is cheap to write again each step
            "input": await self._offload(
                execution, name=f"{name}.in", value=step.input, limit=limit, text=True
            ),
            "output": await self._offload(
                execution, name=f"{name}.out", value=step.output, limit=limit, text=True
            ),
            "error": step.error,
        }


def _object_name(step: StepRecord) -> str:
    """The claim-check name of a run of a step: its occurrence (loops run a step more than
    once), a digest of it when nesting makes it long."""
    name = step.occurrence.replace("/", "-").lower() or step.step_id
    if len(name) > 50:
        name = f"{step.step_id[:20]}-{hashlib.sha256(step.occurrence.encode()).hexdigest()[:24]}"
    return name
