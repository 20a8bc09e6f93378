"""The ``stepfunctions`` engine: a fired job starts an execution of its exported state machine
(``{AEGIS_ORCHESTRATOR_STATE_MACHINE_ARN_PREFIX}{job_id}``) instead of running here.

- The execution's input is what the built-in engine starts from: ``{"trigger": <the trigger's
  data>, "payload": {"execution_id", "job_id"}}`` (the machine's first state builds the same
  context from it).
- Its name is the trigger's digest (:func:`aegis_orchestrator.runner.trigger_digest`): Step
  Functions keeps one execution per name and machine (90 days), so a redelivered trigger (looked
  up before anything else), or a replica starting what another started, finds its execution
  and starts nothing.
- ``overlap_allowed`` holds as far as Step Functions lets it be seen: with that many executions
  RUNNING (ListExecutions), the trigger is skipped (logged ``SKIPPED_OVERLAP``). Two replicas
  starting at the same instant can both pass the check; the built-in engine's run slots cannot.
- Every start is written to the execution log (``aegis jobs runs``) with its execution ARN and
  status ``STARTED``; Step Functions keeps the rest (its console, DescribeExecution).
- A failure to start (no such machine, throttling, an input over 256 KB) raises: the trigger is
  not acknowledged and comes again, then is dead-lettered.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import structlog
from botocore.exceptions import ClientError

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_orchestration.triggers import Trigger
from aegis_orchestrator.runner import trigger_digest
from aegis_storage.errors import Conflict

log = structlog.get_logger(__name__)

STARTED = "STARTED"
SKIPPED_OVERLAP = "SKIPPED_OVERLAP"


class Launcher:
    """Starts state machine executions for fired jobs (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        *,
        arn_prefix: str,
        store: JobStore,
        clock: Callable[[], datetime],
        log_ttl: timedelta,
    ) -> None:
        self.client = client
        self.arn_prefix = arn_prefix
        self.store = store
        self.clock = clock
        self.log_ttl = log_ttl

    def machine_arn(self, job: Job) -> str:
        return f"{self.arn_prefix}{job.id}"

    async def start(self, job: Job, trigger: Trigger, *, redelivered: bool = False) -> str | None:
        """Start an execution of ``job`` for ``trigger``; its ARN, or None when it was started
        before (the same trigger) or the job's overlap limit is reached. A ``redelivered``
        trigger is looked up first: its execution may be the one running."""
        machine = self.machine_arn(job)
        name = trigger_digest(trigger)
        if redelivered and await self._exists(machine, name):
            log.info("trigger_already_started", job_id=job.id, execution=name)
            return None
        if await self._running(machine, job.overlap_allowed) >= job.overlap_allowed:
            log.info(
                "execution_skipped", job_id=job.id, reason="overlap", limit=job.overlap_allowed
            )
            await self._log(job, trigger, name, SKIPPED_OVERLAP, None)
            return None
        document = {"trigger": trigger.data, "payload": {"execution_id": name, "job_id": job.id}}
        try:
            answer = await self.client.start_execution(
                stateMachineArn=machine,
                name=name,
                input=json.dumps(document, default=str, separators=(",", ":")),
            )
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
                log.info("trigger_already_started", job_id=job.id, execution=name)
                return None
            raise
        arn = str(answer["executionArn"])
        await self._log(job, trigger, name, STARTED, arn)
        return arn

    async def _exists(self, machine: str, name: str) -> bool:
        arn = f"{machine.replace(':stateMachine:', ':execution:', 1)}:{name}"
        try:
            await self.client.describe_execution(executionArn=arn)
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
                return False
            raise
        return True

    async def _running(self, machine: str, enough: int) -> int:
        """Executions of ``machine`` running (counted up to ``enough``)."""
        answer = await self.client.list_executions(
            stateMachineArn=machine, statusFilter="RUNNING", maxResults=enough
        )
        return len(answer.get("executions", []))

    async def _log(
        self, job: Job, trigger: Trigger, name: str, status: str, arn: str | None
    ) -> None:
        now = self.clock()
        record: dict[str, Any] = {
            "pk": keys.exec_pk(job.id),
            "sk": keys.exec_sk(now, name),
            "job_id": job.id,
            "job_version": job.version,
            "execution_id": name,
            "engine": "stepfunctions",
            "trigger": {
                "type": trigger.type.value,
                "object_id": trigger.object_id,
                "sub_type": trigger.sub_type,
                "digest": name,
            },
            "status": status,
            "started_at": format_ts(now),
            "steps": [],
            "ttl": int((now + self.log_ttl).timestamp()),
        }
        if arn is not None:
            record["execution_arn"] = arn
        # the same start logged in the same instant: once is enough
        with contextlib.suppress(Conflict):
            await self.store.put_execution(record, new=True)
