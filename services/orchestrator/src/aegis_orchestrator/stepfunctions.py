"""The ``stepfunctions`` engine: a fired job starts an execution of its exported state machine
(``{AEGIS_ORCHESTRATOR_STATE_MACHINE_ARN_PREFIX}{job_id}``) instead of running here, and its
outcome comes back to the execution log.

- **Recorded, then started.** An execution is recorded as the built-in engine records one
  (:meth:`aegis_orchestrator.runner.Runner.begin`): its lease (``EXEC-ACTIVE``, marked
  ``engine: stepfunctions``), a run slot (``JOB#{id}`` / ``RUNNING#{n}``, taken with a
  conditional write: of two replicas starting at once only ``overlap_allowed`` get one; the
  others log ``SKIPPED_OVERLAP``) and its log item (``RUNNING``, the input, the slot), then
  StartExecution, then the log gets the execution's ARN. A start that fails (no such machine,
  throttling) withdraws the record and raises: the trigger is not acknowledged and comes again.
- **Named by its trigger.** The execution's name is the trigger's digest
  (:func:`aegis_orchestrator.runner.trigger_digest`): a redelivered trigger recorded in the last
  hour is skipped, and Step Functions starts one execution per name and machine (90 days).
- **Input.** ``{"trigger": <the trigger's data>, "payload": {"execution_id", "job_id"}}``; trigger
  data over the claim-check limit (``AEGIS_ORCHESTRATOR_INLINE_LIMIT_BYTES``, at most 128 KB here:
  a state holds 256 KB in all) is written to S3 under ``orchestration/`` and the machine gets
  ``{"trigger": {"claim_check": {"bucket", "key", "bytes"}}, ...}``, which the task function reads
  back (:mod:`aegis_orchestrator.sfn_task`).
- **Watched until it ends.** :meth:`Launcher.poll`, on every replica's periodic loop, calls
  DescribeExecution for the executions whose lease it holds, and for those whose lease ran out
  (their replica died: it takes the lease over), at most ``batch`` per round, the least recently
  seen first. While one runs its leases are renewed (the run slot's ahead by the run lease); once
  it ended (SUCCEEDED, FAILED, TIMED_OUT, ABORTED) its status, error and cause, end time and output
  are written to its log item as the built-in engine writes an outcome, and its slot and lease are
  freed. One recorded but never started (its replica died in between) is started by the replica
  that takes it over. With every replica gone, the slot is free again after the run lease.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from botocore.exceptions import ClientError

from aegis_contracts import keys
from aegis_contracts.times import ensure_utc, format_ts, parse_ts
from aegis_orchestration.model import Job
from aegis_orchestration.triggers import Trigger
from aegis_orchestrator.runner import Runner, trigger_digest
from aegis_storage.errors import Conflict

log = structlog.get_logger(__name__)

ENGINE = "stepfunctions"
# Step Functions holds at most 256 KB in an execution's input and in each state's data: the
# trigger stays inline up to half of it, the other half is left to the steps' outputs
SFN_PAYLOAD_BYTES = 256 * 1024
SFN_INLINE_MAX = SFN_PAYLOAD_BYTES // 2
ENDED = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
# the error of an ending that Step Functions may describe without one
_ENDING_ERROR = {
    "FAILED": ("Failed", "Step Functions gave no error for this execution"),
    "TIMED_OUT": ("States.Timeout", "the execution ran past its state machine's TimeoutSeconds"),
    "ABORTED": ("Aborted", "the execution was stopped (StopExecution)"),
}
# StartExecution refusals that trying again cannot change
_REFUSED = frozenset(
    {
        "StateMachineDoesNotExist",
        "StateMachineDeleting",
        "InvalidArn",
        "InvalidName",
        "InvalidExecutionInput",
        "ValidationException",
    }
)
# DescribeExecution answers that end a round of polling (another round comes)
_SLOW_DOWN = frozenset({"ThrottlingException", "TooManyRequestsException"})
_NEVER = datetime.min.replace(tzinfo=UTC)


def outcome(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a DescribeExecution answer puts in the execution log: ``status`` (SUCCEEDED, FAILED,
    TIMED_OUT or ABORTED), ``error`` (``{"Error", "Cause"}``, None when it succeeded) and
    ``finished_at``; None while it runs (or waits for a redrive)."""
    status = answer.get("status")
    if status not in ENDED:
        return None
    error = None
    if status != "SUCCEEDED":
        default_error, default_cause = _ENDING_ERROR[str(status)]
        error = {
            "Error": str(answer.get("error") or default_error),
            "Cause": str(answer.get("cause") or default_cause),
        }
    stopped = answer.get("stopDate")
    return {
        "status": status,
        "error": error,
        "finished_at": format_ts(ensure_utc(stopped)) if isinstance(stopped, datetime) else None,
    }


def execution_input(record: Mapping[str, Any]) -> str:
    """The input of a recorded execution (the same text whoever starts it)."""
    document = {
        "trigger": record.get("input"),
        "payload": {"execution_id": record["execution_id"], "job_id": record["job_id"]},
    }
    return json.dumps(document, default=str, sort_keys=True, separators=(",", ":"))


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


class Launcher:
    """Starts state machine executions for fired jobs and records how they end (see the module
    docstring); leases, slots and the log are ``runner``'s."""

    def __init__(self, client: Any, *, arn_prefix: str, runner: Runner, batch: int) -> None:
        self.client = client
        self.arn_prefix = arn_prefix
        self.runner = runner
        self.batch = batch
        self._starting: set[str] = set()  # active sks between their record and StartExecution
        self._seen: dict[str, datetime] = {}  # active sk -> last DescribeExecution
        self._records: dict[str, dict[str, Any]] = {}  # log items of the executions it watches
        self._slot_renewed: dict[str, datetime] = {}

    def machine_arn(self, job_id: str) -> str:
        return f"{self.arn_prefix}{job_id}"

    def execution_arn(self, job_id: str, name: str) -> str:
        machine = self.machine_arn(job_id)
        return f"{machine.replace(':stateMachine:', ':execution:', 1)}:{name}"

    # -- starting -------------------------------------------------------------------------------

    async def start(self, job: Job, trigger: Trigger, *, redelivered: bool = False) -> str | None:
        """Record and start an execution of ``job`` for ``trigger``; its ARN, or None when the
        trigger was started before or no run slot is free (logged ``SKIPPED_OVERLAP``)."""
        runner = self.runner
        if redelivered and await runner.recorded(job, trigger):
            log.info("trigger_already_started", job_id=job.id, trigger=trigger.type.value)
            return None
        execution = await runner.begin(
            job,
            trigger,
            execution_id=trigger_digest(trigger),
            engine=ENGINE,
            inline_limit=min(runner.inline_limit, SFN_INLINE_MAX),
        )
        if execution is None:
            return None
        record, active_sk = execution.record, execution.active_sk
        self._starting.add(active_sk)
        try:
            arn = await self._start(job.id, record)
            if arn is None:  # this trigger's execution was started long ago
                log.info("trigger_already_started", job_id=job.id, execution=execution.id)
                await self._withdraw(job.id, record, active_sk)
                return None
        except Exception:
            await self._withdraw(job.id, record, active_sk)
            raise
        finally:
            self._starting.discard(active_sk)
        record["execution_arn"] = arn
        try:
            await runner.store.put_execution(record, runner=runner.owner)
        except Conflict:
            pass  # taken over meanwhile: the other replica watches it (and wrote its ARN)
        else:
            self._records[active_sk] = record
            self._slot_renewed[active_sk] = execution.started  # the slot was just taken
        return arn

    async def _start(self, job_id: str, record: Mapping[str, Any]) -> str | None:
        """StartExecution of a recorded execution: its ARN, or None when an execution of its
        name exists with another input or has ended (Step Functions starts a name once)."""
        try:
            answer = await self.client.start_execution(
                stateMachineArn=self.machine_arn(job_id),
                name=str(record["execution_id"]),
                input=execution_input(record),
            )
        except ClientError as err:
            if _code(err) == "ExecutionAlreadyExists":
                return None
            raise
        return str(answer["executionArn"])

    async def _withdraw(self, job_id: str, record: Mapping[str, Any], active_sk: str) -> None:
        """Undo the record of an execution that was not started (unless another replica has
        taken it over meanwhile)."""
        runner = self.runner
        until = runner.clock() + runner.execution_lease
        if not await runner.readmodel.extend_lease(
            keys.EXEC_ACTIVE_PK, active_sk, owner=runner.owner, until=until
        ):
            return
        await runner.readmodel.delete_item(str(record["pk"]), str(record["sk"]))
        await runner.free(job_id, str(record["execution_id"]), active_sk, slot=record.get("slot"))

    # -- watching -------------------------------------------------------------------------------

    async def poll(self) -> list[str]:
        """One round: describe the executions this replica watches and those nobody watches any
        more (at most ``batch``, the least recently seen first), record each one that ended;
        returns their execution ids."""
        runner = self.runner
        now = runner.clock()
        listed = [
            item
            for item in await runner.readmodel.partition(keys.EXEC_ACTIVE_PK, now=now)
            if item.get("engine") == ENGINE and str(item["sk"]) not in self._starting
        ]
        present = {str(item["sk"]) for item in listed}
        for memo in (self._seen, self._records, self._slot_renewed):
            for gone in [sk for sk in memo if sk not in present]:
                del memo[gone]
        due = [
            item
            for item in listed
            if item.get("owner") == runner.owner or str(item.get("until", "")) < format_ts(now)
        ]
        due.sort(key=lambda item: self._seen.get(str(item["sk"]), _NEVER))
        ended: list[str] = []
        looked: set[str] = set()
        for item in due[: self.batch]:
            looked.add(str(item["sk"]))
            try:
                done = await self._look(item, now)
            except ClientError as err:
                if _code(err) in _SLOW_DOWN:
                    log.warning("execution_poll_throttled", error=str(err))
                    break
                raise
            if done is not None:
                ended.append(done)
        # those it watches but did not get to this round stay its own: their turn comes
        for item in due:
            if item.get("owner") == runner.owner and str(item["sk"]) not in looked:
                await self._keep(item, now)
        return ended

    async def _look(self, item: Mapping[str, Any], now: datetime) -> str | None:
        runner = self.runner
        active_sk = str(item["sk"])
        job_id, exec_sk = keys.parse_exec_active_sk(active_sk)
        execution_id = exec_sk.rsplit("#", 1)[-1]
        taken = item.get("owner") != runner.owner
        if taken and not await runner.readmodel.acquire_lease(
            keys.EXEC_ACTIVE_PK,
            active_sk,
            owner=runner.owner,
            now=now,
            until=now + runner.execution_lease,
            attributes={"engine": ENGINE},
        ):
            return None  # another replica was quicker
        self._seen[active_sk] = now
        record = None if taken else self._records.get(active_sk)
        if record is None:
            record = await runner.readmodel.get_item(keys.exec_pk(job_id), exec_sk)
        if record is None or record.get("status") != "RUNNING":
            # withdrawn, or its outcome recorded: only its slot and lease were left
            slot = record.get("slot") if record else None
            await runner.free(job_id, execution_id, active_sk, slot=slot)
            return None
        if taken:
            previous = record.get("runner")
            record["runner"] = runner.owner
            try:
                await runner.store.put_execution(record, runner=previous)
            except Conflict:
                return None
            log.info("execution_watch_taken_over", job_id=job_id, execution_id=execution_id)
        self._records[active_sk] = record
        arn = self.execution_arn(job_id, execution_id)
        try:
            answer = await self.client.describe_execution(executionArn=arn)
        except ClientError as err:
            if _code(err) != "ExecutionDoesNotExist":
                raise
            return await self._start_late(job_id, record, active_sk)
        ended = outcome(answer)
        if ended is None:
            await self._renew(job_id, record, item, now)
            return None
        record.update(ended, execution_arn=arn)
        if answer.get("output") is not None:
            record["output"] = await runner.offload(
                job_id,
                parse_ts(str(record["started_at"])),
                execution_id,
                name="output",
                value=json.loads(str(answer["output"])),
                limit=runner.log_inline,
                text=True,
            )
        return await self._close(job_id, record, active_sk)

    async def _start_late(self, job_id: str, record: dict[str, Any], active_sk: str) -> str | None:
        """Start an execution that was recorded and never started (its replica stopped between
        the two); one that Step Functions refuses for good is recorded FAILED."""
        try:
            arn = await self._start(job_id, record)
        except ClientError as err:
            if _code(err) not in _REFUSED:
                raise
            record.update(
                status="FAILED",
                error={"Error": _code(err), "Cause": str(err)},
                finished_at=format_ts(self.runner.clock()),
            )
            return await self._close(job_id, record, active_sk)
        log.info("execution_started_late", job_id=job_id, execution_id=record["execution_id"])
        if arn is not None:
            record["execution_arn"] = arn
            await self._write(record, active_sk)
        return None

    async def _close(self, job_id: str, record: dict[str, Any], active_sk: str) -> str | None:
        """Write the outcome, then free the slot and the lease."""
        if not await self._write(record, active_sk):
            return None
        execution_id = str(record["execution_id"])
        await self.runner.free(job_id, execution_id, active_sk, slot=record.get("slot"))
        self._records.pop(active_sk, None)
        log.info(
            "execution_finished",
            job_id=job_id,
            execution_id=execution_id,
            status=record["status"],
            error=record.get("error"),
        )
        return execution_id

    async def _write(self, record: dict[str, Any], active_sk: str) -> bool:
        """The log item, while this replica watches it (False: another one took it over)."""
        try:
            await self.runner.store.put_execution(record, runner=self.runner.owner)
        except Conflict:
            self._records.pop(active_sk, None)
            return False
        return True

    async def _renew(
        self, job_id: str, record: Mapping[str, Any], item: Mapping[str, Any], now: datetime
    ) -> None:
        """Keep the leases of a running execution: its own (:meth:`_keep`), its run slot's every
        third of the run lease."""
        runner = self.runner
        active_sk = str(item["sk"])
        if not await self._keep(item, now):
            return
        slot = record.get("slot")
        renewed = self._slot_renewed.get(active_sk)
        if slot is not None and (renewed is None or now - renewed >= runner.lease / 3):
            await runner.readmodel.extend_lease(
                keys.job_pk(job_id),
                keys.running_sk(int(slot)),
                owner=str(record["execution_id"]),
                until=now + runner.lease,
            )
            self._slot_renewed[active_sk] = now

    async def _keep(self, item: Mapping[str, Any], now: datetime) -> bool:
        """Renew this replica's lease on an execution once a third of it has passed; False when
        another replica has taken it over."""
        runner = self.runner
        active_sk = str(item["sk"])
        left = parse_ts(str(item["until"])) - now if item.get("until") else timedelta(0)
        if left >= runner.execution_lease * 2 / 3 or await runner.readmodel.extend_lease(
            keys.EXEC_ACTIVE_PK, active_sk, owner=runner.owner, until=now + runner.execution_lease
        ):
            return True
        self._records.pop(active_sk, None)  # the other replica watches it now
        return False

    async def hand_over(self) -> None:
        """On stop: end the leases of the executions it watches now, so another replica watches
        them at once instead of after the lease."""
        runner = self.runner
        for active_sk in list(self._records):
            with contextlib.suppress(Exception):  # if storage does not answer, they run out
                await runner.readmodel.extend_lease(
                    keys.EXEC_ACTIVE_PK,
                    active_sk,
                    owner=runner.owner,
                    until=runner.clock() - timedelta(milliseconds=1),
                )
        self._records.clear()
