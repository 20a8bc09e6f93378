"""The built-in workflow interpreter: runs a Job's steps with the semantics that
:mod:`aegis_orchestration.asl` exports, so Step Functions and this engine run a job alike.

- A container (the job's top level, a SEQUENCE) runs its steps by ``seq`` from its first step (the
  top level from the start point); ``next_step_id`` jumps within the container.
- TASK: params resolved from the context, the executor called with a timeout; failures are retried
  (``retry``), then recorded in ``errors.{step}`` and, with ``catch_step_id``, execution goes on
  there; otherwise the execution fails. The output lands in ``steps.{step}``.
- PARALLEL: every child is a branch run concurrently on a copy of the context; the PARALLEL's
  output is the list of the branches' ``steps`` maps. One failing branch fails the PARALLEL.
- CHOICE: counts its arrivals in ``loops.{step}.n``; past ``repeat_limit`` it takes no branch
  (the loop ends); else the first branch whose DSL condition holds on the context (the default
  branch, without condition, last) runs, then its ``next_step_id`` (a step of the CHOICE's
  container: a loop back) or the CHOICE's successor.
- WAIT sleeps; DUMMY does nothing.

No I/O here: executors, sleep and clock are injected.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aegis_orchestration.dsl import parse
from aegis_orchestration.model import FlowKind, Job, JobStep, StepType, TaskKind
from aegis_orchestration.params import resolve_params

Executor = Callable[[JobStep, dict[str, Any], Mapping[str, Any]], Awaitable[Any]]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], datetime]


class StepFailed(Exception):
    """A step failed for good; ``error`` is the ASL-style error name, ``cause`` the detail."""

    def __init__(self, step_id: str, error: str, cause: str) -> None:
        super().__init__(f"step {step_id}: {error}: {cause}")
        self.step_id = step_id
        self.error = error
        self.cause = cause


@dataclass
class StepRecord:
    step_id: str
    kind: str
    status: str  # SUCCEEDED | FAILED | CAUGHT | REPEAT_LIMIT | SKIPPED
    started_at: datetime
    finished_at: datetime | None = None
    attempts: int = 0
    input: Any = None
    output: Any = None
    error: dict[str, str] | None = None
    branch: str | None = None  # the choice taken, or the PARALLEL branch it ran in


@dataclass
class ExecutionResult:
    status: str  # SUCCEEDED | FAILED
    context: dict[str, Any]
    records: list[StepRecord] = field(default_factory=list)
    error: dict[str, str] | None = None


def initial_context(
    job: Job, trigger: Mapping[str, Any], payload: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "trigger": dict(trigger),
        "payload": dict(payload),
        "globals": dict(job.global_params),
        "steps": {},
        "errors": {},
        "loops": {s.id: {"n": 0} for s in job.steps if s.step_sub_type is FlowKind.CHOICE},
    }


class Interpreter:
    def __init__(
        self,
        job: Job,
        executors: Mapping[TaskKind, Executor],
        *,
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
        environment: Mapping[str, str] | None = None,
        on_step: Callable[[StepRecord], Awaitable[None]] | None = None,
    ) -> None:
        self.job = job
        self.executors = executors
        self.clock = clock
        self.sleep = sleep
        self.environment = environment or {}
        self.on_step = on_step
        self.records: list[StepRecord] = []
        self._conditions = {
            s.id: parse(s.condition_expr) for s in job.steps if s.condition_expr is not None
        }

    async def run(
        self, trigger: Mapping[str, Any], payload: Mapping[str, Any] | None = None
    ) -> ExecutionResult:
        context = initial_context(self.job, trigger, payload or {})
        try:
            await self._container(None, self.job.start_step.id, context, None)
        except StepFailed as err:
            return ExecutionResult(
                "FAILED", context, self.records, {"Error": err.error, "Cause": err.cause}
            )
        return ExecutionResult("SUCCEEDED", context, self.records)

    # -- containers and steps -----------------------------------------------------------------

    async def _container(
        self, parent: str | None, start: str, context: dict[str, Any], branch: str | None
    ) -> None:
        steps = self.job.children(parent)
        order = [s.id for s in steps]
        visits: dict[str, int] = {}
        current: str | None = start
        while current is not None:
            visits[current] = visits.get(current, 0) + 1
            if visits[current] > self.job.repeat_limit + 1:
                raise StepFailed(current, "RepeatLimitExceeded", "a loop ran past repeat_limit")
            step = self.job.step(current)
            jump = await self._step(step, context, branch)
            if jump is not None:
                current = jump
            elif step.next_step_id is not None:
                current = step.next_step_id
            else:
                i = order.index(current) + 1
                current = order[i] if i < len(order) else None

    async def _step(self, step: JobStep, context: dict[str, Any], branch: str | None) -> str | None:
        """Run one step; returns the step to go to instead of the usual successor, if any."""
        record = StepRecord(step.id, _kind(step), "SUCCEEDED", self.clock(), branch=branch)
        try:
            if step.step_type is StepType.DUMMY:
                pass
            elif step.step_type is StepType.TASK:
                await self._task(step, context, record)
            elif step.step_sub_type is FlowKind.WAIT:
                await self.sleep(float(step.wait_seconds or 0))
            elif step.step_sub_type is FlowKind.SEQUENCE:
                first = self.job.children(step.id)[0].id
                await self._container(step.id, first, context, branch)
            elif step.step_sub_type is FlowKind.PARALLEL:
                record.output = await self._parallel(step, context)
            elif step.step_sub_type is FlowKind.CHOICE:
                return await self._choice(step, context, record, branch)
        except StepFailed as err:
            error = {"Error": err.error, "Cause": err.cause}
            context["errors"][step.id] = error
            record.error = error
            if step.catch_step_id is None:
                record.status = "FAILED"
                await self._finish(record)
                raise
            record.status = "CAUGHT"
            await self._finish(record)
            return step.catch_step_id
        await self._finish(record)
        return None

    async def _finish(self, record: StepRecord) -> None:
        record.finished_at = self.clock()
        self.records.append(record)
        if self.on_step is not None:
            await self.on_step(record)

    async def _task(self, step: JobStep, context: dict[str, Any], record: StepRecord) -> None:
        kind = step.step_sub_type
        assert isinstance(kind, TaskKind)
        executor = self.executors.get(kind)
        attempts = step.retry.max_attempts + 1
        for attempt in range(1, attempts + 1):
            record.attempts = attempt
            try:
                params = resolve_params(self.job, step.id, context, self.environment)
                record.input = params
                if executor is None:
                    raise StepFailed(  # noqa: TRY301 - retried like any failure
                        step.id, "NoExecutor", f"no executor for {kind.value}"
                    )
                async with asyncio.timeout(step.timeout_s):
                    output = await executor(step, params, context)
            except StepFailed as err:
                failure = err
            except TimeoutError:
                failure = StepFailed(step.id, "States.Timeout", f"over {step.timeout_s}s")
            except Exception as err:
                failure = StepFailed(step.id, type(err).__name__, str(err)[:1000])
            else:
                context["steps"][step.id] = output
                record.output = output
                return
            if attempt < attempts:
                await self.sleep(step.retry.delay(attempt))
        raise failure

    async def _parallel(self, step: JobStep, context: dict[str, Any]) -> list[Any]:
        branches = self.job.children(step.id)
        copies = [copy.deepcopy(context) for _ in branches]
        try:
            async with asyncio.TaskGroup() as group:
                for child, ctx in zip(branches, copies, strict=True):
                    group.create_task(self._step(child, ctx, f"{step.id}[{child.id}]"))
        except* StepFailed as failures:
            first = failures.exceptions[0]
            assert isinstance(first, StepFailed)
            raise StepFailed(step.id, first.error, first.cause) from None
        output = [ctx["steps"] for ctx in copies]
        context["steps"][step.id] = output
        return output

    async def _choice(
        self, step: JobStep, context: dict[str, Any], record: StepRecord, branch: str | None
    ) -> str | None:
        counter = context["loops"].setdefault(step.id, {"n": 0})
        counter["n"] += 1
        if counter["n"] > self.job.repeat_limit:
            record.status = "REPEAT_LIMIT"
            await self._finish(record)
            return None
        kids = self.job.children(step.id)
        ordered = [k for k in kids if k.condition_expr is not None] + [
            k for k in kids if k.condition_expr is None
        ]
        chosen = next(
            (k for k in ordered if k.condition_expr is None or self._conditions[k.id](context)),
            None,
        )
        record.branch = chosen.id if chosen else None
        await self._finish(record)
        if chosen is None:
            return None
        jump = await self._step(chosen, context, branch)
        return jump if jump is not None else chosen.next_step_id


def _kind(step: JobStep) -> str:
    return step.step_sub_type.value if step.step_sub_type is not None else step.step_type.value
