"""The Step Functions task function: the Lambda handler (``aegis_orchestrator.sfn_task.handler``)
that the Task states of an exported job (:mod:`aegis_orchestration.asl`) call.

It receives exactly what :func:`aegis_orchestration.asl.task_parameters` sends: the job and its
version, the step, the execution's name, the time the state was entered and the whole context;
it reads the job from the read model and runs one attempt of the step with
:func:`aegis_orchestration.engine.run_task`, the function the built-in engine runs: the same
param resolution, executors (:class:`aegis_orchestrator.tasks.Tasks`), timeout and redaction.
Retries, catch paths and the flow are the state machine's. So a job runs alike on either.

- The output is the step's output (the machine puts it in ``$.steps.{step}``).
- A trigger that came by reference (``$.trigger`` is ``{"claim_check": {"bucket", "key"}}``, an
  object under ``orchestration/`` of the data bucket: its data was too large for Step
  Functions) is read back from S3 before the params are resolved (the last few are kept for the
  container's next invocations); the state machine's data keeps only the reference.
- A failure raises an exception whose type is named as the engine names the error
  (``TaskFailed``, ``ParamError``, ``States.Timeout``, ...): Lambda reports the type's name as
  ``errorType``, which Step Functions matches in ``Retry``/``Catch`` and puts in
  ``$.errors.{step}.Error`` (its ``Cause`` is Lambda's error document, the engine's cause in its
  ``errorMessage``).
- The idempotency key of side effects is ``{execution}:{step}@{entered}``: every retry of one
  run of the step (one entry into its state) sends the same key; a loop's next pass another.
- A machine exported from another version of the job than the one stored is refused
  (``StaleStateMachine``): re-export and deploy it (``aegis jobs export-sfn``).

Settings are the orchestrator's (``AEGIS_TABLE``, ``AEGIS_BUCKET``, ``AEGIS_JOB_EGRESS_ALLOW``,
the Slack webhook, NATS for PUBLISH_EVENT, ``AEGIS_JOB_*`` for ENVIRONMENT params). Clients, the
HTTP session and the NATS connection are opened on the first invocation and kept for the
container's life, on one event loop that every invocation of the container runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from functools import cache
from typing import Any

import pydantic
import structlog
from faststream.nats import NatsBroker

from aegis_contracts import keys
from aegis_contracts.events import SystemEvent
from aegis_contracts.times import utc_now
from aegis_orchestration.engine import StepFailed, run_task
from aegis_orchestration.limits import claim_check
from aegis_orchestration.model import Job, StepType, TaskKind
from aegis_orchestration.store import JobStore
from aegis_orchestrator.app import job_environment
from aegis_orchestrator.egress import EgressPolicy, guarded_session
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.tasks import Tasks
from aegis_runtime import logging as aegis_logging
from aegis_runtime import natsio
from aegis_runtime.bus import command_broker, publish
from aegis_storage.clients import open_clients
from aegis_storage.errors import NotFound
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

log = structlog.get_logger(__name__)
# triggers read back from S3 kept per container (the steps of one execution read the same one)
TRIGGERS_KEPT = 4


class TaskRequest(pydantic.BaseModel):
    """The input of one invocation (:func:`aegis_orchestration.asl.task_parameters`)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    job_id: str
    job_version: int
    step_id: str
    kind: str
    execution: str = pydantic.Field(min_length=1)
    entered: str = pydantic.Field(min_length=1)
    context: dict[str, Any]

    @property
    def key(self) -> str:
        """This run of the step within the execution (retries share it)."""
        return f"{self.step_id}@{self.entered}"


class BadTaskInput(Exception):
    """The invocation is not what an exported machine sends."""


class StaleStateMachine(Exception):
    """The machine was exported from another version of the job than the one stored."""


class JobGone(Exception):
    """The job the machine was exported from is not stored (deleted)."""


class TriggerGone(Exception):
    """The trigger's data, passed by reference, is no longer in S3 (its lifecycle expired it)."""


@cache
def error_type(name: str) -> type[Exception]:
    """An exception type named ``name`` (Lambda reports a failure by its type's name)."""
    return type(name, (Exception,), {"__module__": __name__})


class TaskFunction:
    """Runs one invocation: the job read (kept while its version is the one asked for), one
    attempt of the step, the output or the engine's error."""

    def __init__(
        self,
        *,
        store: JobStore,
        tasks: Tasks,
        environment: Mapping[str, str],
        objects: ObjectStore,
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.environment = environment
        self.objects = objects
        self._jobs: dict[str, Job] = {}
        self._triggers: dict[str, Any] = {}  # by S3 key, oldest first

    async def __call__(self, event: Any) -> Any:
        try:
            request = TaskRequest.model_validate(event)
        except pydantic.ValidationError as err:
            raise BadTaskInput(
                f"not a task state's input ({err.error_count()} problems: "
                f"{err.errors()[0]['loc']} {err.errors()[0]['msg']})"
            ) from None
        job = await self._job(request)
        step = next((s for s in job.steps if s.id == request.step_id), None)
        if step is None or step.step_type is not StepType.TASK:
            raise StaleStateMachine(
                f"job {job.id} v{job.version} has no TASK step {request.step_id!r}"
            )
        kind = step.step_sub_type
        assert isinstance(kind, TaskKind)
        if kind.value != request.kind:
            raise StaleStateMachine(
                f"step {step.id} of job {job.id} is {kind.value}, the machine says {request.kind}"
            )
        context = request.context
        if (reference := claim_check(context.get("trigger"))) is not None:
            context = {**context, "trigger": await self._trigger(reference)}
        executor = self.tasks.executors(job, request.execution).get(kind)
        log.info("sfn_task_started", job_id=job.id, step_id=step.id, execution=request.execution)
        try:
            return await run_task(job, step, context, self.environment, executor, key=request.key)
        except StepFailed as err:
            log.info(
                "sfn_task_failed",
                job_id=job.id,
                step_id=step.id,
                execution=request.execution,
                error=err.error,
            )
            raise error_type(err.error)(err.cause) from None

    async def _trigger(self, reference: Mapping[str, Any]) -> Any:
        """The trigger's data a claim check stands for (only the orchestrator's own objects)."""
        bucket, key = reference.get("bucket"), str(reference.get("key", ""))
        if bucket != self.objects.bucket or not key.startswith(keys.ORCHESTRATION_PREFIX):
            raise BadTaskInput(
                f"the trigger's claim check points at s3://{bucket}/{key}, not under "
                f"s3://{self.objects.bucket}/{keys.ORCHESTRATION_PREFIX}"
            )
        if key in self._triggers:
            return self._triggers[key]
        try:
            body = await self.objects.get_bytes(key)
        except NotFound:
            raise TriggerGone(
                f"the trigger's data s3://{bucket}/{key} is gone (claim checks are kept 30 days)"
            ) from None
        data = json.loads(body)
        self._triggers[key] = data
        while len(self._triggers) > TRIGGERS_KEPT:
            del self._triggers[next(iter(self._triggers))]
        return data

    async def _job(self, request: TaskRequest) -> Job:
        job = self._jobs.get(request.job_id)
        if job is None or job.version != request.job_version:
            job = await self.store.get(request.job_id)
            if job is None:
                raise JobGone(f"job {request.job_id} is not registered")
            self._jobs[job.id] = job
        if job.version != request.job_version:
            raise StaleStateMachine(
                f"the state machine runs job {request.job_id} v{request.job_version}, the "
                f"registered one is v{job.version}: export and deploy it again "
                "(aegis jobs export-sfn)"
            )
        return job


class _LazyBus:
    """PUBLISH_EVENT's connection, opened on the first publish (most functions never publish)."""

    def __init__(self, settings: OrchestratorSettings, stack: AsyncExitStack) -> None:
        self.settings = settings
        self.stack = stack
        self.broker: NatsBroker | None = None

    async def publish(self, subject: str, event: SystemEvent, *, msg_id: str) -> bool:
        if self.broker is None:
            broker = await command_broker(self.settings, name="orchestrator-task")
            self.stack.push_async_callback(natsio.close, broker)
            self.broker = broker
        return await publish(self.broker, subject, event, msg_id=msg_id)


async def open_function(
    stack: AsyncExitStack,
    settings: OrchestratorSettings,
    *,
    environment: Mapping[str, str] | None = None,
) -> TaskFunction:
    """A task function with its clients, session and bus entered on ``stack``."""
    egress = EgressPolicy.parse(
        settings.job_egress_allow, max_response_bytes=settings.orchestrator_response_max_bytes
    )
    clients = await stack.enter_async_context(open_clients(settings.aws()))
    session = await stack.enter_async_context(guarded_session(egress))
    readmodel = ReadModel(clients.items, settings.table)
    bus = _LazyBus(settings, stack)
    tasks = Tasks(
        session=session,
        readmodel=readmodel,
        publish=bus.publish,
        clock=utc_now,
        slack_webhook_url=(
            settings.slack_webhook_url.get_secret_value() if settings.slack_webhook_url else None
        ),
        commands=settings.orchestrator_commands,
        command_timeout=settings.orchestrator_command_timeout_s,
        egress=egress,
    )
    return TaskFunction(
        store=JobStore(readmodel, utc_now),
        tasks=tasks,
        environment=job_environment(os.environ if environment is None else environment),
        objects=ObjectStore(clients, settings.bucket),
    )


class Container:
    """What one Lambda container keeps between invocations: its event loop and its function
    (built from ``settings()`` and ``environment``, the process's own by default, on the
    first invocation)."""

    def __init__(
        self,
        settings: Callable[[], OrchestratorSettings] = OrchestratorSettings,
        environment: Mapping[str, str] | None = None,
        *,
        configure_logging: bool = False,
    ) -> None:
        self.settings = settings
        self.environment = environment
        self.configure_logging = configure_logging
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.function: TaskFunction | None = None
        # Lambda gives a container one invocation at a time; a local runtime may not
        self.lock = threading.Lock()

    def invoke(self, event: Any, context: Any = None) -> Any:
        """Lambda's ``handler(event, context)``."""
        with self.lock:
            return self.loop.run_until_complete(self._invoke(event))

    async def _invoke(self, event: Any) -> Any:
        if self.function is None:
            settings = self.settings()
            if self.configure_logging:
                aegis_logging.configure(settings.log_format, settings.log_level)
            self.function = await open_function(self.stack, settings, environment=self.environment)
        return await self.function(event)

    def close(self) -> None:
        """Close what the invocations opened, and the loop."""
        with self.lock:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.stack.aclose())
            self.function = None
            self.loop.close()


_container: Container | None = None


def handler(event: Any, context: Any) -> Any:
    """The Lambda entry point."""
    global _container  # noqa: PLW0603 - one per Lambda container, kept between invocations
    if _container is None:
        _container = Container(configure_logging=True)
    return _container.invoke(event)
