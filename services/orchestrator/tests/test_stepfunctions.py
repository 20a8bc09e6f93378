"""Jobs on Step Functions, on real servers: the exported state machine runs on the emulator's
Step Functions (moto's interpreter: Pass, Task, Parallel, Choice, Wait, Retry and Catch really
run), its Task states invoke the task function (``aegis_orchestrator.sfn_task``) through Lambda's
Invoke API, served from this process as a Lambda runtime serves a function; the function reads
the job from the read model and calls the webhook stand-in, NATS and DynamoDB. The same job on
the same trigger is run by the built-in engine, and both must reach the same context.

Also: the function refuses what no exported machine sends; the orchestrator's ``stepfunctions``
engine starts one execution per trigger however often it is delivered; the whole path from
the template of ``aegis jobs export-sfn``, deployed by the emulator's CloudFormation, to a
finished execution fired by a change event; and what that engine holds: a 1 MB trigger goes by
reference and the function reads it back, every ending (SUCCEEDED, FAILED, TIMED_OUT, ABORTED)
reaches the execution log, two replicas starting a job at once start it once, the slot holds
until the outcome is recorded (by another replica once the first is gone), a round describes at
most its batch, and a loop without a CHOICE stops at the engine's bound.

What the emulator does not do, so these tests cannot show it: it accepts an execution input of
any size (Step Functions refuses one over 256 KB), so the 1 MB test shows that the input given
is a small reference, not that the inline one would have been refused; it never throttles
DescribeExecution, so a throttled round is not exercised; and it does not check the callers'
IAM permissions (the template's policy is checked as a document and by cfn-lint)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import urllib.request
import zipfile
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.times import utc_now
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.emulator import register_lambda
from aegis_devstack.testing.lambdaruntime import lambda_runtime
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook, running_webhook
from aegis_orchestration.asl import export_asl
from aegis_orchestration.engine import Interpreter
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_orchestration.triggers import Trigger, biz_object_trigger
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.sfn_task import Container, TaskRequest, open_function
from aegis_orchestrator.sfn_template import render
from aegis_runtime import natsio
from aegis_runtime.bus import command_broker, ensure_streams
from aegis_storage.clients import AwsConfig, open_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
EXAMPLES = Path(__file__).parents[3] / "deploy" / "jobs" / "examples.yaml"
ACCOUNT = "123456789012"
REGION = "ap-south-1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/aegis-state-machines"


def function_arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


def run_state_machines(endpoint: str) -> None:
    """The emulator's Step Functions runs executions only when told to."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/config",
        data=json.dumps({"stepfunctions": {"execute_state_machine": True}}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


@pytest.fixture
async def sfn(aws_endpoint: str) -> AsyncIterator[Any]:
    await asyncio.to_thread(run_state_machines, aws_endpoint)
    async with open_client("stepfunctions", AwsConfig(endpoint_url=aws_endpoint)) as client:
        yield client


def escalation_job() -> Job:
    """The gas-leak example (Task, Parallel with a catch path, Wait, a query, a Choice loop up
    to repeat_limit) with its 2-minute wait cut to one second."""
    job = next(j for j in load_jobs(EXAMPLES.read_text()) if j.id == "gas-leak-escalation")
    steps = [
        s.model_copy(update={"wait_seconds": 1}) if s.id == "wait_2m" else s for s in job.steps
    ]
    return job.model_copy(update={"steps": steps, "repeat_limit": 2})


def change(factory_pk: str) -> dict[str, Any]:
    return {
        "pk": factory_pk,
        "afterData": {
            "factory_id": "factory-b",
            "risk": {"level": "CRITICAL", "score": 91, "reasons": [{"code": "GAS_HIGH"}]},
        },
        "beforeData": {"factory_id": "factory-b", "risk": {"level": "WARNING"}},
    }


async def finished(client: Any, arn: str) -> dict[str, Any]:
    answer: dict[str, Any] = {}

    async def done() -> bool:
        answer.update(await client.describe_execution(executionArn=arn))
        return answer["status"] != "RUNNING"

    await eventually(done, within=90, what=f"{arn} to end", interval=0.5)
    return answer


async def test_the_exported_machine_runs_the_job_as_the_builtin_engine_does(
    sfn: Any,
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    webhook: FakeWebhook,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(escalation_job())
    factory_pk = f"FACTORY#{unique_id}"
    await foundation.readmodel.put_item(
        {"pk": factory_pk, "sk": "LATEST", "risk": {"level": "CRITICAL"}}
    )
    trigger = change(factory_pk)
    s = make_settings()
    broker = await command_broker(s, name="test-streams")
    try:
        await ensure_streams(broker)  # the evacuation event's stream
    finally:
        await natsio.close(broker)

    def configured(hook: FakeWebhook) -> tuple[OrchestratorSettings, dict[str, str]]:
        """An engine's settings and environment: Slack and the maintenance webhook on ``hook``,
        whose scripted answers are: notify ok, the maintenance webhook fails all 3 attempts
        (caught)."""
        hook.script(200, 500, 500, 500)
        env = {"AEGIS_JOB_MAINTENANCE_URL": hook.url + "/maintenance"}
        return make_settings(slack_webhook_url=hook.url + "/slack"), env

    async def on_the_builtin_engine(hook: FakeWebhook) -> Any:
        settings, env = configured(hook)
        async with contextlib.AsyncExitStack() as stack:
            function = await open_function(stack, settings, environment=env)
            interpreter = Interpreter(
                job,
                function.tasks.executors(job, "builtin-run-0001"),
                clock=lambda: datetime.now(UTC),
                environment=env,
            )
            return await interpreter.run(trigger, {"execution_id": "builtin", "job_id": job.id})

    async def on_step_functions(hook: FakeWebhook) -> tuple[dict[str, Any], list[Any]]:
        """The same job on Step Functions, its tasks run by the task function."""
        settings, env = configured(hook)
        name = f"aegis-task-{unique_id}"
        container = Container(lambda: settings, env)
        try:
            async with lambda_runtime(container.invoke) as runtime:
                await register_lambda(aws_endpoint, name, runtime.url)
                machine = await sfn.create_state_machine(
                    name=f"aegis-job-{job.id}-{unique_id}",
                    definition=json.dumps(export_asl(job, function_arn=function_arn(name))),
                    roleArn=ROLE,
                )
                started = await sfn.start_execution(
                    stateMachineArn=machine["stateMachineArn"],
                    name=f"run-{unique_id}",
                    input=json.dumps(
                        {"trigger": trigger, "payload": {"execution_id": "sfn", "job_id": job.id}}
                    ),
                )
                return await finished(sfn, started["executionArn"]), list(runtime.events)
        finally:
            await asyncio.to_thread(container.close)

    # both at once, each with a webhook of its own (their retries and waits are real seconds)
    async with running_webhook() as sfn_hook:
        builtin, (result, events) = await asyncio.gather(
            on_the_builtin_engine(webhook), on_step_functions(sfn_hook)
        )
    builtin_calls = [(r.path, r.body) for r in webhook.requests]
    assert builtin.status == "SUCCEEDED", (
        builtin.error,
        [(r.step_id, r.status, r.error) for r in builtin.records],
    )
    assert result["status"] == "SUCCEEDED", result
    output = json.loads(result["output"])

    # what the machine sent the function: exactly the exported fields, the whole context
    assert events
    for event in events:
        assert set(event) == set(TaskRequest.model_fields)  # every field, none more
        assert event["job_id"] == job.id
        assert event["job_version"] == job.version
        assert event["execution"] == f"run-{unique_id}"
        assert set(event["context"]) >= {"trigger", "payload", "globals", "steps", "loops"}
    # 1 notify, 3 attempts of call_maintenance, 1 evacuate, the fallback, and per pass of the
    # loop a query (+ an escalation while CRITICAL and the repeat limit allows)
    invoked = [e["step_id"] for e in events]
    assert invoked.count("call_maintenance") == 3

    # the same context as the built-in engine's: every step ran, the loop to its limit
    assert set(output["steps"]) == {"notify", "check", "maintenance_down", "escalate"}
    assert output["steps"]["check"]["count"] == 1
    assert output["loops"] == {"still_critical": {"n": job.repeat_limit + 1}}
    assert output["steps"] == builtin.context["steps"]
    assert output["loops"] == builtin.context["loops"]
    assert output["globals"] == builtin.context["globals"]
    assert set(output["errors"]) == set(builtin.context["errors"]) == {"respond"}
    sfn_error, builtin_error = output["errors"]["respond"], builtin.context["errors"]["respond"]
    assert sfn_error["Error"] == builtin_error["Error"] == "TaskFailed"
    assert json.loads(sfn_error["Cause"])["errorMessage"] == builtin_error["Cause"]
    # and the same calls went out
    assert sorted(map(json.dumps, ((r.path, r.body) for r in sfn_hook.requests))) == sorted(
        map(json.dumps, builtin_calls)
    )
    # every retry of one run of a step sends the same idempotency key
    keys = {r.headers.get("Idempotency-Key") for r in sfn_hook.requests if "maint" in r.path}
    assert len(keys) == 1


async def test_the_function_refuses_what_no_exported_machine_sends(
    foundation: Foundation, make_settings: Callable[..., OrchestratorSettings]
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(escalation_job())
    s = make_settings()
    container = Container(lambda: s, {})
    good = {
        "job_id": job.id,
        "job_version": job.version,
        "step_id": "check",
        "kind": "READ_MODEL_QUERY",
        "execution": "run-1",
        "entered": "2026-12-01T00:00:00Z",
        "context": {"trigger": {"pk": "FACTORY#nowhere"}, "steps": {}, "globals": {}},
    }

    def by_reference(bucket: str, key: str) -> dict[str, Any]:
        reference = {"claim_check": {"bucket": bucket, "key": key, "bytes": 2}}
        return {"context": {**good["context"], "trigger": reference}}

    try:
        assert (await asyncio.to_thread(container.invoke, good))["count"] == 0
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"context": None}, "BadTaskInput", "context"),
            ({"surprise": 1}, "BadTaskInput", "surprise"),
            ({"job_version": job.version + 1}, "StaleStateMachine", "export-sfn"),
            ({"step_id": "respond"}, "StaleStateMachine", "no TASK step"),
            ({"kind": "SLACK_NOTIFY"}, "StaleStateMachine", "READ_MODEL_QUERY"),
            ({"job_id": "no-such-job"}, "JobGone", "not registered"),
            # a step's own failure carries the engine's error name: a required param missing
            ({"context": {"trigger": {}, "steps": {}, "globals": {}}}, "ParamError", "check_pk"),
            # a trigger by reference: only the orchestrator's own objects, and one still there
            (by_reference("elsewhere", "orchestration/x.json"), "BadTaskInput", "not under"),
            (by_reference(s.bucket, "raw/x.json"), "BadTaskInput", "not under"),
            (by_reference(s.bucket, "orchestration/gone.json"), "TriggerGone", "30 days"),
        ]
        for change_, error, words in cases:
            with pytest.raises(Exception, match=r".") as raised:
                await asyncio.to_thread(container.invoke, good | change_)
            assert type(raised.value).__name__ == error, (change_, raised.value)
            assert words in str(raised.value), (change_, raised.value)
    finally:
        await asyncio.to_thread(container.close)


async def test_the_stepfunctions_engine_starts_one_execution_per_trigger(
    sfn: Any,
    foundation: Foundation,
    unique_id: str,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(
        escalation_job().model_copy(update={"id": f"sfn-{unique_id}"[:40].lower()})
    )
    prefix = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:aegis-job-"
    # a machine that only waits (keeps running): this test is about starting executions
    await sfn.create_state_machine(
        name=f"aegis-job-{job.id}",
        definition=json.dumps(
            {"StartAt": "Hold", "States": {"Hold": {"Type": "Wait", "Seconds": 30, "End": True}}}
        ),
        roleArn=ROLE,
    )
    app = OrchestratorApp(
        make_settings(
            orchestrator_engine="stepfunctions", orchestrator_state_machine_arn_prefix=prefix
        ),
        environment={},
    )
    await app.start()
    try:
        await app.refresh()

        def trigger_at(at: str) -> Any:
            return biz_object_trigger(
                {
                    "table": foundation.table,
                    "pk": f"FACTORY#{unique_id}",
                    "sk": "LATEST",
                    "event_name": "MODIFY",
                    "old_image": change("x")["beforeData"],
                    "new_image": change("x")["afterData"],
                    "producer": "processor",
                    "at": at,
                },
                "factory_latest",
            )

        trigger = trigger_at("2026-12-01T00:00:00Z")
        fired = await app.handle(trigger)
        assert [j.id for j in fired] == [job.id]
        await app.handle(trigger, redelivered=True)  # the same trigger again: not started again
        listed = await sfn.list_executions(stateMachineArn=prefix + job.id)
        assert len(listed["executions"]) == 1
        execution = await sfn.describe_execution(
            executionArn=listed["executions"][0]["executionArn"]
        )
        document = json.loads(execution["input"])
        assert document["trigger"] == trigger.data
        assert document["payload"]["job_id"] == job.id
        runs = await store.executions(job.id)
        assert [r["status"] for r in runs] == ["RUNNING"]
        assert runs[0]["execution_arn"] == listed["executions"][0]["executionArn"]
        assert runs[0]["engine"] == "stepfunctions"
        # overlap_allowed 1 and one running: another trigger is skipped, and logged
        assert [j.id for j in await app.handle(trigger_at("2026-12-01T00:00:05Z"))] == [job.id]
        listed = await sfn.list_executions(stateMachineArn=prefix + job.id)
        assert len(listed["executions"]) == 1
        assert sorted(r["status"] for r in await store.executions(job.id)) == [
            "RUNNING",
            "SKIPPED_OVERLAP",
        ]
    finally:
        await app.stop()


async def test_from_the_template_to_a_finished_execution(
    sfn: Any,
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    webhook: FakeWebhook,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    """The whole path on the emulator: the template `aegis jobs export-sfn` writes, deployed by
    its CloudFormation; the orchestrator in the stepfunctions engine with the template's
    StateMachineArnPrefix; a change event fires the job, the deployed state machine runs, its
    Task invokes the deployed function (its code served from this process) and the call
    reaches the webhook."""
    factory = f"f-{unique_id}"[:40].lower()
    [job] = load_jobs(
        f"""
jobs:
  - id: {f"hook-{unique_id}"[:48].lower()}
    job_name: call the hook when {factory} turns CRITICAL
    trigger_type: BizObject
    object_id: factory_latest
    trigger_sub_type: Update
    trigger_condition_expr: 'StringEQ([$.afterData.factory_id], "{factory}")'
    steps:
      - {{id: call, step_type: TASK, step_sub_type: HTTP_WEBHOOK, is_start_point: true}}
    params:
      - {{id: call_url, step_id: call, param_key: url, source_type: ENVIRONMENT,
         param_value: '${{AEGIS_JOB_HOOK_URL}}/{factory}', is_required: true}}
      - {{id: call_body, step_id: call, param_key: body, data_type: OBJECT}}
      - {{id: call_level, step_id: call, parent_param_id: call_body, param_key: level,
         source_type: TRIGGER_DATA, ref_path: $.afterData.risk.level}}
"""
    )
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(job)
    env = {"AEGIS_JOB_HOOK_URL": webhook.url}
    function, role = f"task-{unique_id}", f"orch-{unique_id}"
    template = render([job], function_name=function, state_machine_prefix=f"{unique_id}-")
    cfg = AwsConfig(endpoint_url=aws_endpoint)
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:  # what make lambda builds: its handler is served here
        z.writestr("aegis_orchestrator/sfn_task.py", "def handler(event, context): ...\n")
    async with open_client("iam", cfg) as iam, open_client("cloudformation", cfg) as cfn:
        await iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")
        await foundation.clients.s3.put_object(
            Bucket=foundation.bucket, Key="code/task.zip", Body=code.getvalue()
        )
        parameters = {
            "CodeBucket": foundation.bucket,
            "CodeKey": "code/task.zip",
            "OrchestratorRoleName": role,
            "TableName": foundation.table,
        }
        await cfn.create_stack(
            StackName=f"aegis-jobs-{unique_id}",
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM"],
        )
        stack = (await cfn.describe_stacks(StackName=f"aegis-jobs-{unique_id}"))["Stacks"][0]
    assert stack["StackStatus"] == "CREATE_COMPLETE", stack
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}

    container = Container(make_settings, env)
    app = OrchestratorApp(
        make_settings(
            orchestrator_engine="stepfunctions",
            orchestrator_state_machine_arn_prefix=outputs["StateMachineArnPrefix"],
        ),
        environment={},
    )
    try:
        async with lambda_runtime(container.invoke) as runtime:
            await register_lambda(aws_endpoint, outputs["TaskFunctionArn"], runtime.url)
            await app.start()
            await app.refresh()
            change_event = {
                "table": foundation.table,
                "pk": f"FACTORY#{factory}",
                "sk": "LATEST",
                "event_name": "MODIFY",
                "old_image": {"factory_id": factory, "risk": {"level": "WARNING"}},
                "new_image": {"factory_id": factory, "risk": {"level": "CRITICAL"}},
                "producer": "processor",
                "at": "2026-12-01T00:00:00Z",
            }
            fired = await app.handle(biz_object_trigger(change_event, "factory_latest"))
            assert [j.id for j in fired] == [job.id]
            [run] = await store.executions(job.id)
            result = await finished(sfn, run["execution_arn"])
            assert result["status"] == "SUCCEEDED", result
            assert [e["step_id"] for e in runtime.events] == ["call"]
            # and the orchestrator writes how it ended into the execution log
            run = await logged(app, store, job.id)
            assert run["status"] == "SUCCEEDED"
    finally:
        await app.stop()
        await asyncio.to_thread(container.close)
    assert [(r.path, r.body) for r in webhook.requests] == [
        (f"/hook/{factory}", {"level": "CRITICAL"})
    ]
    assert json.loads(result["output"])["steps"]["call"]["status"] == 200


# -- what the stepfunctions engine holds: claim checks, outcomes, overlap, bounds ----------------

START = datetime(2026, 12, 1, 6, 0, tzinfo=UTC)


@contextlib.asynccontextmanager
async def replica(
    make_settings: Callable[..., OrchestratorSettings], prefix: str, clock: FakeClock
) -> AsyncIterator[OrchestratorApp]:
    """An orchestrator in the stepfunctions engine whose watching rounds the test runs itself
    (``watch_executions``), on the test's clock."""
    app = OrchestratorApp(
        make_settings(
            orchestrator_engine="stepfunctions",
            orchestrator_state_machine_arn_prefix=prefix,
            orchestrator_resume_scan_s=3600,
        ),
        environment={},
        clock=clock,
    )
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@contextlib.asynccontextmanager
async def task_function(
    aws_endpoint: str, settings: OrchestratorSettings, env: dict[str, str], name: str
) -> AsyncIterator[Any]:
    """The task function served from this process as the Lambda function ``name``."""
    container = Container(lambda: settings, env)
    try:
        async with lambda_runtime(container.invoke) as runtime:
            await register_lambda(aws_endpoint, name, runtime.url)
            yield runtime
    finally:
        await asyncio.to_thread(container.close)


def hook_job(job_id: str, *params: str) -> Job:
    """A job whose one step posts trigger data (``params``: name=ref_path) to the webhook (its
    trigger condition only tells it from the test's other jobs: the tests launch it by hand)."""
    body = "".join(
        f"""
      - {{id: p_{name}, step_id: call, parent_param_id: call_body, param_key: {name},
         source_type: TRIGGER_DATA, ref_path: '{path}'}}"""
        for name, path in (p.split("=", 1) for p in params)
    )
    [job] = load_jobs(
        f"""
jobs:
  - id: {job_id}
    job_name: post the trigger's data
    trigger_type: BizObject
    object_id: factory_latest
    trigger_sub_type: Update
    trigger_condition_expr: 'StringEQ([$.afterData.job], "{job_id}")'
    steps:
      - {{id: call, step_type: TASK, step_sub_type: HTTP_WEBHOOK, is_start_point: true}}
    params:
      - {{id: call_url, step_id: call, param_key: url, source_type: ENVIRONMENT,
         param_value: '${{AEGIS_JOB_HOOK_URL}}/{job_id}', is_required: true}}
      - {{id: call_body, step_id: call, param_key: body, data_type: OBJECT}}{body}
"""
    )
    return job


def changed(factory: str, at: str, **new: Any) -> Trigger:
    return biz_object_trigger(
        {
            "table": "t",
            "pk": f"FACTORY#{factory}",
            "sk": "LATEST",
            "event_name": "MODIFY",
            "old_image": {"factory_id": factory},
            "new_image": {"factory_id": factory, **new},
            "producer": "processor",
            "at": at,
        },
        "factory_latest",
    )


async def logged(app: OrchestratorApp, store: JobStore, job_id: str) -> dict[str, Any]:
    """The job's one execution, once the orchestrator recorded how it ended."""
    found: dict[str, Any] = {}

    async def ended() -> bool:
        await app.watch_executions()
        runs = [r for r in await store.executions(job_id) if r["status"] != "SKIPPED_OVERLAP"]
        found.update(runs[-1] if runs else {})
        return found.get("status") not in (None, "RUNNING")

    await eventually(ended, within=60, what=f"the outcome of {job_id} in the log", interval=0.5)
    return found


async def slots(foundation: Foundation, job_id: str) -> list[dict[str, Any]]:
    """The run slots of the job still held (``JOB#{id}`` / ``RUNNING#n``)."""
    return await foundation.readmodel.partition(keys.job_pk(job_id), now=START)


async def deploy(sfn: Any, unique_id: str, job: Job, definition: dict[str, Any]) -> str:
    """The job's state machine, named as the orchestrator finds it; returns the ARN prefix."""
    prefix = f"{unique_id}-"
    await sfn.create_state_machine(
        name=prefix + job.id, definition=json.dumps(definition), roleArn=ROLE
    )
    return f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{prefix}"


async def test_a_1_mb_trigger_runs_by_reference_and_its_function_reads_it_back(
    sfn: Any,
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    webhook: FakeWebhook,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(
        hook_job(f"big-{unique_id}", "factory=$.afterData.factory_id", "blob=$.afterData.blob")
    )
    name = f"task-{unique_id}"
    machine_prefix = await deploy(
        sfn, unique_id, job, export_asl(job, function_arn=function_arn(name))
    )
    blob = "x" * 1_000_000
    trigger = changed("factory-b", "2026-12-01T06:00:00Z", blob=blob)
    settings = make_settings()
    async with (
        task_function(aws_endpoint, settings, {"AEGIS_JOB_HOOK_URL": webhook.url}, name),
        replica(make_settings, machine_prefix, FakeClock(START)) as app,
    ):
        assert await app.launch(job, trigger) is None  # it runs on Step Functions, not here
        run = await logged(app, store, job.id)
        described = await sfn.describe_execution(executionArn=run["execution_arn"])
    assert run["status"] == "SUCCEEDED", run
    # Step Functions was given a reference, far under its 256 KB, not the megabyte
    document = json.loads(described["input"])
    assert len(described["input"]) < 1024
    reference = document["trigger"]["claim_check"]
    assert reference["key"].startswith("orchestration/executions/")
    assert reference["bytes"] > 1_000_000
    assert run["input"] == document["trigger"]  # the log points at the same object
    assert json.loads(await foundation.store.get_bytes(reference["key"])) == trigger.data
    # the task function read it back: the whole blob reached the webhook
    [request] = webhook.requests
    assert request.body == {"factory": "factory-b", "blob": blob}
    assert json.loads(run["output"])["steps"]["call"]["status"] == 200
    assert await slots(foundation, job.id) == []


async def test_a_failed_execution_s_error_and_cause_reach_the_execution_log(
    sfn: Any,
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    webhook: FakeWebhook,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(hook_job(f"fails-{unique_id}", "factory=$.afterData.factory_id"))
    name = f"task-{unique_id}"
    machine_prefix = await deploy(
        sfn, unique_id, job, export_asl(job, function_arn=function_arn(name))
    )
    webhook.script(500)
    async with (
        task_function(aws_endpoint, make_settings(), {"AEGIS_JOB_HOOK_URL": webhook.url}, name),
        replica(make_settings, machine_prefix, FakeClock(START)) as app,
    ):
        await app.launch(job, changed("factory-c", "2026-12-01T06:00:00Z"))
        run = await logged(app, store, job.id)
    assert run["status"] == "FAILED"
    # the error the engine names, and Lambda's error document with the engine's cause as cause
    assert run["error"]["Error"] == "TaskFailed"
    assert "500" in json.loads(run["error"]["Cause"])["errorMessage"]
    assert run["finished_at"] >= run["started_at"]
    assert await slots(foundation, job.id) == []


async def test_each_way_an_execution_ends_reaches_the_execution_log(
    sfn: Any,
    foundation: Foundation,
    unique_id: str,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    """SUCCEEDED, FAILED (the Fail state's error and cause), TIMED_OUT (the machine's
    TimeoutSeconds) and ABORTED (StopExecution), each recorded and its run slot freed."""
    store = JobStore(foundation.readmodel, utc_now)
    machines = {
        "SUCCEEDED": {"StartAt": "Ok", "States": {"Ok": {"Type": "Pass", "End": True}}},
        "FAILED": {
            "StartAt": "No",
            "States": {"No": {"Type": "Fail", "Error": "Refused", "Cause": "by design"}},
        },
        "TIMED_OUT": {
            "TimeoutSeconds": 1,
            "StartAt": "Hold",
            "States": {"Hold": {"Type": "Wait", "Seconds": 20, "End": True}},
        },
        "ABORTED": {
            "StartAt": "Hold",
            "States": {"Hold": {"Type": "Wait", "Seconds": 300, "End": True}},
        },
    }
    jobs = {}
    for status, definition in machines.items():
        job = await store.register(hook_job(f"{status.lower().replace('_', '-')}-{unique_id}"))
        machine_prefix = await deploy(sfn, unique_id, job, definition)
        jobs[status] = job
    async with replica(make_settings, machine_prefix, FakeClock(START)) as app:
        for job in jobs.values():
            await app.launch(job, changed("factory-d", "2026-12-01T06:00:00Z"))
        await app.watch_executions()
        [aborted] = await store.executions(jobs["ABORTED"].id)
        assert aborted["status"] == "RUNNING"  # it runs on: nothing recorded yet
        assert len(await slots(foundation, jobs["ABORTED"].id)) == 1
        await sfn.stop_execution(executionArn=aborted["execution_arn"])
        runs = {status: await logged(app, store, job.id) for status, job in jobs.items()}
    assert {status: run["status"] for status, run in runs.items()} == {s: s for s in machines}
    assert runs["SUCCEEDED"]["error"] is None
    assert runs["FAILED"]["error"] == {"Error": "Refused", "Cause": "by design"}
    assert runs["TIMED_OUT"]["error"]["Error"] == "States.Timeout"
    assert runs["ABORTED"]["error"]["Error"] == "Aborted"
    for job in jobs.values():
        assert await slots(foundation, job.id) == [], job.id


async def test_two_replicas_starting_a_job_at_once_run_it_once_until_its_outcome_is_recorded(
    sfn: Any,
    foundation: Foundation,
    unique_id: str,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    """overlap_allowed 1, two replicas, two triggers at the same instant: one execution starts,
    the other trigger is SKIPPED_OVERLAP. The slot stays taken after the execution ended until
    its outcome is recorded; the replica that started it dies, its lease runs out, the other
    replica records the outcome and frees the slot, and the next trigger starts."""
    store = JobStore(foundation.readmodel, utc_now)
    job = await store.register(hook_job(f"once-{unique_id}"))
    hold = {"StartAt": "Hold", "States": {"Hold": {"Type": "Wait", "Seconds": 300, "End": True}}}
    machine_prefix = await deploy(sfn, unique_id, job, hold)
    clock = FakeClock(START)
    async with (
        replica(make_settings, machine_prefix, clock) as first,
        replica(make_settings, machine_prefix, clock) as second,
    ):
        await asyncio.gather(
            first.launch(job, changed("factory-e", "2026-12-01T06:00:00Z")),
            second.launch(job, changed("factory-f", "2026-12-01T06:00:00Z")),
        )
        listed = (await sfn.list_executions(stateMachineArn=machine_prefix + job.id))["executions"]
        assert len(listed) == 1
        runs = await store.executions(job.id)
        assert sorted(r["status"] for r in runs) == ["RUNNING", "SKIPPED_OVERLAP"]
        [running] = [r for r in runs if r["status"] == "RUNNING"]
        assert running["execution_arn"] == listed[0]["executionArn"]
        winner, other = (first, second) if running["runner"] == first.owner else (second, first)

        # it ends on Step Functions; until its outcome is recorded its slot holds
        await sfn.stop_execution(executionArn=running["execution_arn"])
        await finished(sfn, running["execution_arn"])
        await other.launch(job, changed("factory-g", "2026-12-01T06:00:01Z"))
        assert len(await slots(foundation, job.id)) == 1
        runs = await store.executions(job.id)
        assert sorted(r["status"] for r in runs) == [
            "RUNNING",
            "SKIPPED_OVERLAP",
            "SKIPPED_OVERLAP",
        ]

        # the winner dies (it watches no more); its lease is the other's once it ran out
        assert await other.watch_executions() == []  # not yet
        clock.advance(timedelta(seconds=other.settings.orchestrator_execution_lease_s + 1))
        run = await logged(other, store, job.id)
        assert run["status"] == "ABORTED"
        assert run["runner"] == other.owner != winner.owner
        assert await slots(foundation, job.id) == []
        await other.launch(job, changed("factory-h", "2026-12-01T06:01:00Z"))
        listed = (await sfn.list_executions(stateMachineArn=machine_prefix + job.id))["executions"]
        assert len(listed) == 2
        assert [r["status"] for r in await store.executions(job.id)][-1] == "RUNNING"


# loops no CHOICE ends, and a CHOICE on the trigger's data (the export's own tests use them too)
LOOPS = Path(__file__).parents[3] / "libs" / "orchestration" / "tests" / "loops.yaml"


def loop_job(job_id: str) -> Job:
    return next(j for j in load_jobs(LOOPS.read_text()) if j.id == job_id)


@pytest.mark.parametrize("job_id", ["spin", "caught-spin"])
async def test_a_loop_without_a_choice_stops_at_the_engines_bound_on_step_functions(
    sfn: Any, unique_id: str, job_id: str
) -> None:
    """The exported machine fails where the built-in engine fails, with its error and cause,
    and a PARALLEL's catch path does not catch it (as in the engine)."""
    job = loop_job(job_id)
    engine = await Interpreter(job, {}, clock=FakeClock(START)).run({})
    assert engine.status == "FAILED"
    assert engine.error is not None and engine.error["Error"] == "RepeatLimitExceeded"
    machine = await sfn.create_state_machine(
        name=f"{unique_id}-{job.id}", definition=json.dumps(export_asl(job)), roleArn=ROLE
    )
    started = await sfn.start_execution(
        stateMachineArn=machine["stateMachineArn"],
        input=json.dumps({"trigger": {}, "payload": {}}),
    )
    result = await finished(sfn, started["executionArn"])
    assert result["status"] == "FAILED", result
    assert {"Error": result["error"], "Cause": result["cause"]} == engine.error
    history = await sfn.get_execution_history(executionArn=started["executionArn"])
    entered = [
        e["stateEnteredEventDetails"]["name"]
        for e in history["events"]
        if "stateEnteredEventDetails" in e
    ]
    # tick ran as often as the engine allows (1 + repeat_limit), never once more
    assert entered.count("tick__Run") == 1 + job.repeat_limit
    assert "handled" not in entered


async def test_a_choice_on_a_trigger_passed_by_reference_fails_instead_of_guessing(
    sfn: Any, unique_id: str
) -> None:
    job = loop_job("on-the-trigger")
    machine = await sfn.create_state_machine(
        name=f"{unique_id}-{job.id}", definition=json.dumps(export_asl(job)), roleArn=ROLE
    )
    results = {}
    for name, trigger in {
        "inline": {"level": "CRITICAL"},
        "by-reference": {"claim_check": {"bucket": "b", "key": "orchestration/x", "bytes": 9}},
    }.items():
        started = await sfn.start_execution(
            stateMachineArn=machine["stateMachineArn"],
            name=name,
            input=json.dumps({"trigger": trigger, "payload": {}}),
        )
        results[name] = await finished(sfn, started["executionArn"])
    assert results["inline"]["status"] == "SUCCEEDED"
    assert json.loads(results["inline"]["output"])["loops"] == {"pick": {"n": 1}}
    assert results["by-reference"]["status"] == "FAILED"
    assert results["by-reference"]["error"] == "TriggerByReference"


async def test_a_round_describes_at_most_its_batch_and_the_rest_come_next_round(
    sfn: Any,
    foundation: Foundation,
    unique_id: str,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    store = JobStore(foundation.readmodel, utc_now)
    jobs = [await store.register(hook_job(f"quick{n}-{unique_id}")) for n in range(3)]
    quick = {"StartAt": "Ok", "States": {"Ok": {"Type": "Pass", "End": True}}}
    for job in jobs:
        machine_prefix = await deploy(sfn, unique_id, job, quick)
    app = OrchestratorApp(
        make_settings(
            orchestrator_engine="stepfunctions",
            orchestrator_state_machine_arn_prefix=machine_prefix,
            orchestrator_resume_scan_s=3600,
            orchestrator_sfn_poll_batch=2,
        ),
        environment={},
        clock=FakeClock(START),
    )
    await app.start()
    try:
        for n, job in enumerate(jobs):
            await app.launch(job, changed(f"factory-{n}", "2026-12-01T06:00:00Z"))
        started = set()
        for job in jobs:
            [run] = await store.executions(job.id)
            await finished(sfn, run["execution_arn"])
            started.add(run["execution_id"])
        first = await app.watch_executions()
        second = await app.watch_executions()
    finally:
        await app.stop()
    assert len(first) == 2  # the batch
    assert len(second) == 1
    assert set(first) | set(second) == started
    for job in jobs:
        [run] = await store.executions(job.id)
        assert run["status"] == "SUCCEEDED", job.id
