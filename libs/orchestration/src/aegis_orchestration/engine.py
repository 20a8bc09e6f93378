"""The built-in workflow interpreter: runs a Job's steps with the semantics that
:mod:`aegis_orchestration.asl` exports, so Step Functions and this engine run a job alike.

- A container (the job's top level, a SEQUENCE) runs its steps by ``seq`` from its first step (the
  top level from the start point); ``next_step_id`` jumps within the container.
- TASK: params resolved from the context, the executor called with a timeout and an idempotency
  key (the same for every attempt of one run of the step); failures are retried (``retry``), then
  recorded in ``errors.{step}`` and, with ``catch_step_id``, execution goes on there; otherwise
  the execution fails. The output lands in ``steps.{step}``.
- PARALLEL: every child is a branch run concurrently on a copy of the context; the PARALLEL's
  output is the list of the branches' ``steps`` maps. One failing branch fails the PARALLEL.
- CHOICE: counts its arrivals in ``loops.{step}.n`` (across the whole execution, PARALLEL
  branches included); past ``repeat_limit`` it takes no branch (the loop ends); else the first
  branch whose DSL condition holds on the context (the default branch, without condition, last)
  runs, then its ``next_step_id`` (a step of the CHOICE's container: a loop back) or the CHOICE's
  successor.
- WAIT records its wake-up time (a WAITING record) before it waits on the injected clock, so a
  resumed execution wakes at the same time; DUMMY does nothing.

Every run of a step has an **occurrence** key, derived from the job's structure only (``wait_2m.2``
is the second run of ``wait_2m`` at the top level, ``respond.1/evacuate.1`` a PARALLEL branch).
Given the records of an interrupted execution (its ``journal``), :meth:`Interpreter.run` replays
the recorded occurrences without running them again (outputs, errors, choices taken, wake-up
times) and goes on from the first one not recorded. The bounds of
:mod:`aegis_orchestration.limits` apply; passing one fails the execution, never a catch path.

No I/O here: executors, sleep and clock are injected.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from aegis_orchestration.dsl import parse
from aegis_orchestration.graph import run_order, successor
from aegis_orchestration.limits import (
    ExecutionError,
    LimitExceeded,
    Limits,
    allowed_runs,
    check_context,
    check_runs,
    check_steps,
)
from aegis_orchestration.model import FlowKind, Job, JobStep, StepType, TaskKind
from aegis_orchestration.params import (
    ParamError,
    environment_secrets,
    resolve_params,
    scrub,
    slack_escape,
    write_outputs,
)


class Executor(Protocol):
    """Runs one TASK: ``key`` identifies this run of the step within its execution (the
    idempotency key a side effect carries, so a replayed or retried call is recognised)."""

    def __call__(
        self, step: JobStep, params: dict[str, Any], context: Mapping[str, Any], /, *, key: str
    ) -> Awaitable[Any]: ...


Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], datetime]
# how often a WAIT looks at the clock (the clock may be a test's, moved by hand)
WAIT_POLL_S = 1.0


class StepFailed(ExecutionError):
    """A step failed: one attempt (:func:`run_task`), or for good after its retries, when a
    catch path may take over."""


@dataclass
class StepRecord:
    step_id: str
    kind: str
    status: str  # SUCCEEDED | FAILED | CAUGHT | REPEAT_LIMIT | SKIPPED | WAITING (a WAIT begun)
    started_at: datetime
    finished_at: datetime | None = None
    attempts: int = 0
    input: Any = None
    output: Any = None
    error: dict[str, str] | None = None
    branch: str | None = None  # the choice taken, or the PARALLEL branch it ran in
    occurrence: str = ""  # this run of the step (see the module docstring)
    wake_at: datetime | None = None  # WAIT: when it ends


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


def occurrence(parent: str | None, step_id: str, n: int) -> str:
    return f"{parent}/{step_id}.{n}" if parent else f"{step_id}.{n}"


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
        limits: Limits | None = None,
        wait_poll_s: float = WAIT_POLL_S,
    ) -> None:
        self.job = job
        self.executors = executors
        self.clock = clock
        self.sleep = sleep
        self.environment = environment or {}
        self.on_step = on_step
        self.limits = limits or Limits()
        self.wait_poll_s = wait_poll_s
        self.records: list[StepRecord] = []
        self._conditions = {
            s.id: parse(s.condition_expr) for s in job.steps if s.condition_expr is not None
        }
        self._journal: Mapping[str, StepRecord] = {}
        self._runs: dict[str, int] = {}  # per step id, across the execution
        self._loops: dict[str, int] = {}  # CHOICE arrivals, across the execution
        self._count = 0
        self._allowed_runs = allowed_runs(
            job.repeat_limit, sum(s.step_sub_type is FlowKind.CHOICE for s in job.steps)
        )

    async def run(
        self,
        trigger: Mapping[str, Any],
        payload: Mapping[str, Any] | None = None,
        journal: Mapping[str, StepRecord] | None = None,
    ) -> ExecutionResult:
        """Run the job; with ``journal`` (the records of an interrupted run of the same job and
        input, by occurrence) resume it after its last recorded step."""
        context = initial_context(self.job, trigger, payload or {})
        self._journal = journal or {}
        try:
            await self._container(None, None, self.job.start_step.id, context, None)
        except ExecutionError as err:
            return ExecutionResult(
                "FAILED", context, self.records, {"Error": err.error, "Cause": err.cause}
            )
        return ExecutionResult("SUCCEEDED", context, self.records)

    # -- containers and steps -----------------------------------------------------------------

    async def _container(
        self,
        parent: str | None,
        parent_occurrence: str | None,
        start: str,
        context: dict[str, Any],
        branch: str | None,
    ) -> None:
        visits: dict[str, int] = {}
        current: str | None = start
        while current is not None:
            visits[current] = visits.get(current, 0) + 1
            step = self.job.step(current)
            key = occurrence(parent_occurrence, current, visits[current])
            jump = await self._step(step, key, context, branch)
            current = jump if jump is not None else successor(self.job, step)

    async def _step(
        self, step: JobStep, key: str, context: dict[str, Any], branch: str | None
    ) -> str | None:
        """Run (or replay) one run of a step; returns the step to go to instead of the usual
        successor, if any."""
        self._count += 1
        self._runs[step.id] = self._runs.get(step.id, 0) + 1
        check_steps(step.id, self._count, self.limits)
        check_runs(step.id, self._runs[step.id], self._allowed_runs)
        done = self._journal.get(key)
        if (
            done is not None
            and done.status != "WAITING"
            and step.step_sub_type
            not in (
                FlowKind.SEQUENCE,
                FlowKind.CHOICE,
            )
        ):
            return self._replay(step, done, context)
        record = StepRecord(
            step.id, _kind(step), "SUCCEEDED", self.clock(), branch=branch, occurrence=key
        )
        try:
            if step.step_type is StepType.DUMMY:
                pass
            elif step.step_type is StepType.TASK:
                await self._task(step, key, context, record)
            elif step.step_sub_type is FlowKind.WAIT:
                await self._wait(step, done, record)
            elif step.step_sub_type is FlowKind.SEQUENCE:
                first = run_order(self.job, step.id)[0].id
                await self._container(step.id, key, first, context, branch)
            elif step.step_sub_type is FlowKind.PARALLEL:
                record.output = await self._parallel(step, key, context)
            elif step.step_sub_type is FlowKind.CHOICE:
                return await self._choice(step, key, context, record, branch=branch, done=done)
        except LimitExceeded as err:
            record.status = "FAILED"
            record.error = {"Error": err.error, "Cause": err.cause}
            await self._finish(record)
            raise
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

    def _replay(self, step: JobStep, done: StepRecord, context: dict[str, Any]) -> str | None:
        """What a recorded TASK, PARALLEL, WAIT or DUMMY did to the context and the path."""
        self.records.append(done)
        if done.status == "SUCCEEDED":
            if step.step_type is StepType.TASK or step.step_sub_type is FlowKind.PARALLEL:
                context["steps"][step.id] = done.output
            if step.step_type is StepType.TASK:
                _write_outputs(self.job, step, done.output, context)
            return None
        error = done.error or {"Error": "Unknown", "Cause": "recorded without an error"}
        context["errors"][step.id] = error
        if done.status == "CAUGHT" and step.catch_step_id is not None:
            return step.catch_step_id
        raise StepFailed(step.id, error.get("Error", "Unknown"), error.get("Cause", ""))

    async def _finish(self, record: StepRecord) -> None:
        record.finished_at = self.clock()
        self.records.append(record)
        if self.on_step is not None:
            await self.on_step(record)

    async def _task(
        self, step: JobStep, key: str, context: dict[str, Any], record: StepRecord
    ) -> None:
        kind = step.step_sub_type
        assert isinstance(kind, TaskKind)
        executor = self.executors.get(kind)
        attempts = step.retry.max_attempts + 1
        for attempt in range(1, attempts + 1):
            record.attempts = attempt
            try:
                output = await run_task(
                    self.job,
                    step,
                    context,
                    self.environment,
                    executor,
                    key=key,
                    on_input=lambda params: setattr(record, "input", params),
                )
            except StepFailed:
                if attempt == attempts:
                    raise
                await self.sleep(step.retry.delay(attempt))
            else:
                context["steps"][step.id] = output
                record.output = output
                _write_outputs(self.job, step, output, context)
                check_context(step.id, context, self.limits)
                return

    async def _wait(self, step: JobStep, begun: StepRecord | None, record: StepRecord) -> None:
        """Wait until the wake-up time, recorded before waiting (kept from ``begun`` on resume)."""
        if begun is not None and begun.wake_at is not None:
            record.started_at, record.wake_at = begun.started_at, begun.wake_at
        else:
            record.wake_at = record.started_at + timedelta(seconds=float(step.wait_seconds or 0))
            waiting = StepRecord(
                step.id,
                record.kind,
                "WAITING",
                record.started_at,
                branch=record.branch,
                occurrence=record.occurrence,
                wake_at=record.wake_at,
            )
            if self.on_step is not None:
                await self.on_step(waiting)
        while (left := (record.wake_at - self.clock()).total_seconds()) > 0:
            await self.sleep(min(left, self.wait_poll_s))

    async def _parallel(self, step: JobStep, key: str, context: dict[str, Any]) -> list[Any]:
        branches = run_order(self.job, step.id)
        copies = [copy.deepcopy(context) for _ in branches]
        try:
            async with asyncio.TaskGroup() as group:
                for child, ctx in zip(branches, copies, strict=True):
                    group.create_task(
                        self._step(
                            child, occurrence(key, child.id, 1), ctx, f"{step.id}[{child.id}]"
                        )
                    )
        except* LimitExceeded as limits:
            first_limit = limits.exceptions[0]
            assert isinstance(first_limit, LimitExceeded)
            raise LimitExceeded(step.id, first_limit.error, first_limit.cause) from None
        except* StepFailed as failures:
            first = failures.exceptions[0]
            assert isinstance(first, StepFailed)
            raise StepFailed(step.id, first.error, first.cause) from None
        output = [ctx["steps"] for ctx in copies]
        context["steps"][step.id] = output
        check_context(step.id, context, self.limits)
        return output

    async def _choice(
        self,
        step: JobStep,
        key: str,
        context: dict[str, Any],
        record: StepRecord,
        *,
        branch: str | None,
        done: StepRecord | None,
    ) -> str | None:
        n = self._loops[step.id] = self._loops.get(step.id, 0) + 1
        context["loops"][step.id] = {"n": n}
        if done is not None:  # the choice taken before the interruption
            self.records.append(done)
            chosen = self.job.step(done.branch) if done.branch else None
        elif n > self.job.repeat_limit:
            record.status = "REPEAT_LIMIT"
            await self._finish(record)
            return None
        else:
            chosen = next(
                (
                    k
                    for k in run_order(self.job, step.id)
                    if k.condition_expr is None or self._conditions[k.id](context)
                ),
                None,
            )
            record.branch = chosen.id if chosen else None
            await self._finish(record)
        if chosen is None:
            return None
        jump = await self._step(chosen, occurrence(key, chosen.id, 1), context, branch)
        return jump if jump is not None else chosen.next_step_id


async def run_task(
    job: Job,
    step: JobStep,
    context: Mapping[str, Any],
    environment: Mapping[str, str],
    executor: Executor | None,
    *,
    key: str,
    on_input: Callable[[Any], None] | None = None,
) -> Any:
    """One attempt of a TASK step, as the engine runs it and as the Step Functions task function
    (``aegis_orchestrator.sfn_task``) runs it: params resolved from ``context``, the executor
    called within the step's timeout, the output returned. Values read from the environment
    reach the executor only: the params given to ``on_input``, the output and an error's cause
    carry them redacted (an echoing webhook cannot leak them either). Any failure raises
    :class:`StepFailed` with the error's name (``States.Timeout`` for the timeout)."""
    kind = step.step_sub_type
    assert isinstance(kind, TaskKind)
    secrets = environment_secrets(job, step.id, environment)
    try:
        params = resolve_params(
            job,
            step.id,
            context,
            environment,
            escape=slack_escape if kind is TaskKind.SLACK_NOTIFY else None,
        )
        if on_input is not None:
            on_input(scrub(params, secrets))
        if executor is None:
            raise StepFailed(step.id, "NoExecutor", f"no executor for {kind.value}")  # noqa: TRY301
        async with asyncio.timeout(step.timeout_s):
            output = await executor(step, params, context, key=key)
    except StepFailed as err:
        raise StepFailed(err.step_id, err.error, scrub(err.cause, secrets)) from None
    except TimeoutError:
        raise StepFailed(step.id, "States.Timeout", f"over {step.timeout_s}s") from None
    except Exception as err:
        raise StepFailed(step.id, type(err).__name__, scrub(str(err), secrets)[:1000]) from None
    return scrub(output, secrets)


def _write_outputs(job: Job, step: JobStep, output: Any, context: dict[str, Any]) -> None:
    """The step's OUT and INOUT params written back (:func:`params.write_outputs`); one the
    output cannot give fails the step like any other param error."""
    try:
        write_outputs(job, step.id, output, context)
    except ParamError as err:
        raise StepFailed(step.id, "ParamError", str(err)) from None


def _kind(step: JobStep) -> str:
    return step.step_sub_type.value if step.step_sub_type is not None else step.step_type.value
