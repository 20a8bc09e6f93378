"""Executions: a run slot per ``overlap_allowed``, the claim check of large inputs, the
interpreter, and the execution log (written at start and at the end, each step's input, output,
error and timing)."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import structlog

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_orchestration.engine import Interpreter, StepRecord
from aegis_orchestration.model import Job
from aegis_orchestration.triggers import Trigger
from aegis_orchestrator.store import JobStore
from aegis_orchestrator.tasks import Tasks
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)


def new_execution_id(now: datetime) -> str:
    return f"{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(4)}"


class Runner:
    def __init__(
        self,
        *,
        store: JobStore,
        readmodel: ReadModel,
        objects: ObjectStore,
        tasks: Tasks,
        clock: Callable[[], datetime],
        environment: Mapping[str, str],
        owner: str,
        lease: timedelta,
        inline_limit: int,
        log_inline: int,
        log_ttl: timedelta,
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
        self.inline_limit = inline_limit
        self.log_inline = log_inline
        self.log_ttl = log_ttl
        self.sleep = sleep
        self.running: set[asyncio.Task[dict[str, Any]]] = set()

    def start(self, job: Job, trigger: Trigger) -> asyncio.Task[dict[str, Any]]:
        """Run ``job`` in the background (the trigger's message is settled meanwhile)."""
        task = asyncio.ensure_future(self.execute(job, trigger))
        self.running.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self.running.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("execution_crashed", exc_info=exc)

    async def drain(self, wait_s: float) -> None:
        if self.running:
            await asyncio.wait(list(self.running), timeout=wait_s)
        for task in list(self.running):
            task.cancel()

    async def execute(self, job: Job, trigger: Trigger) -> dict[str, Any]:
        started = self.clock()
        execution_id = new_execution_id(started)
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
            },
            "status": "RUNNING",
            "started_at": format_ts(started),
            "steps": [],
            "ttl": int((started + self.log_ttl).timestamp()),
        }
        slot = await self._acquire(job, execution_id, started)
        if slot is None:
            record.update(status="SKIPPED_OVERLAP", finished_at=format_ts(self.clock()))
            await self.store.put_execution(record)
            log.info(
                "execution_skipped", job_id=job.id, reason="overlap", limit=job.overlap_allowed
            )
            return record
        try:
            data = trigger.data
            record["input"] = await self._offload(
                job, started, execution_id, name="input", value=data, limit=self.inline_limit
            )
            await self.store.put_execution(record)
            steps: list[dict[str, Any]] = []

            async def on_step(step: StepRecord) -> None:
                steps.append(
                    await self._step_entry(job, started, execution_id, step=step, n=len(steps))
                )

            interpreter = Interpreter(
                job,
                self.tasks.executors(job, execution_id),
                clock=self.clock,
                sleep=self.sleep,
                environment=self.environment,
                on_step=on_step,
            )
            result = await interpreter.run(data, {"execution_id": execution_id, "job_id": job.id})
            record.update(
                status=result.status,
                error=result.error,
                steps=steps,
                finished_at=format_ts(self.clock()),
            )
            await self.store.put_execution(record)
            log.info(
                "execution_finished",
                job_id=job.id,
                execution_id=execution_id,
                status=result.status,
                steps=len(steps),
            )
            return record
        finally:
            await self.readmodel.release_lease(
                keys.job_pk(job.id), keys.running_sk(slot), owner=execution_id
            )

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

    async def _offload(
        self, job: Job, started: datetime, execution_id: str, *, name: str, value: Any, limit: int
    ) -> Any:
        """``value`` inline when small, else an S3 object and ``{"claim_check": {...}}``."""
        body = json.dumps(value, default=str).encode()
        if len(body) <= limit:
            return value
        key = keys.orchestration_input_key(job.id, started, execution_id, name)
        await self.objects.put_bytes(key, body, content_type="application/json")
        return {"claim_check": {"bucket": self.objects.bucket, "key": key, "bytes": len(body)}}

    async def _step_entry(
        self, job: Job, started: datetime, execution_id: str, *, step: StepRecord, n: int
    ) -> dict[str, Any]:
        name = f"{n:03d}-{step.step_id}"
        return {
            "step_id": step.step_id,
            "kind": step.kind,
            "status": step.status,
            "attempts": step.attempts,
            "branch": step.branch,
            "started_at": format_ts(step.started_at),
            "finished_at": format_ts(step.finished_at) if step.finished_at else None,
            "duration_ms": round(
                ((step.finished_at or step.started_at) - step.started_at).total_seconds() * 1000, 3
            ),
            "input": await self._offload(
                job,
                started,
                execution_id,
                name=f"{name}.in",
                value=step.input,
                limit=self.log_inline,
            ),
            "output": await self._offload(
                job,
                started,
                execution_id,
                name=f"{name}.out",
                value=step.output,
                limit=self.log_inline,
            ),
            "error": step.error,
        }
