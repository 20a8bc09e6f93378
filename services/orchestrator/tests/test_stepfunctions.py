"""Jobs on Step Functions, on real servers: the exported state machine runs on the emulator's
Step Functions (moto's interpreter: Pass, Task, Parallel, Choice, Wait, Retry and Catch really
run), its Task states invoke the task function (``aegis_orchestrator.sfn_task``) through Lambda's
Invoke API, served from this process as a Lambda runtime serves a function; the function reads
the job from the read model and calls the webhook stand-in, NATS and DynamoDB. The same job on
the same trigger is run by the built-in engine, and both must reach the same context.

Also: the function refuses what no exported machine sends; the orchestrator's ``stepfunctions``
engine starts one execution per trigger however often it is delivered; and the whole path from
the template of ``aegis jobs export-sfn``, deployed by the emulator's CloudFormation, to a
finished execution fired by a change event."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import urllib.request
import zipfile
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aegis_contracts.times import utc_now
from aegis_devstack.testing.emulator import register_lambda
from aegis_devstack.testing.lambdaruntime import lambda_runtime
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook
from aegis_orchestration.asl import export_asl
from aegis_orchestration.engine import Interpreter
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_orchestration.triggers import biz_object_trigger
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_orchestrator.sfn_task import Container, TaskRequest, open_function
from aegis_orchestrator.sfn_template import render
from aegis_runtime import natsio
from aegis_runtime.broker import command_broker, ensure_streams
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
    env = {"AEGIS_JOB_MAINTENANCE_URL": webhook.url + "/maintenance"}
    s = make_settings(slack_webhook_url=webhook.url + "/slack")
    trigger = change(factory_pk)
    broker = await command_broker(s, name="test-streams")
    try:
        await ensure_streams(broker)  # the evacuation event's stream
    finally:
        await natsio.close(broker)

    # the built-in engine: notify ok, the maintenance webhook fails all 3 attempts (caught)
    webhook.script(200, 500, 500, 500)
    async with contextlib.AsyncExitStack() as stack:
        function = await open_function(stack, s, environment=env)
        interpreter = Interpreter(
            job,
            function.tasks.executors(job, "builtin-run-0001"),
            clock=lambda: datetime.now(UTC),
            environment=env,
        )
        builtin = await interpreter.run(trigger, {"execution_id": "builtin", "job_id": job.id})
    builtin_calls = [(r.path, r.body) for r in webhook.requests]
    assert builtin.status == "SUCCEEDED", (
        builtin.error,
        [(r.step_id, r.status, r.error) for r in builtin.records],
    )
    webhook.requests.clear()

    # the same job on Step Functions, its tasks run by the task function
    name = f"aegis-task-{unique_id}"
    container = Container(lambda: s, env)
    try:
        async with lambda_runtime(container.invoke) as runtime:
            await register_lambda(aws_endpoint, name, runtime.url)
            machine = await sfn.create_state_machine(
                name=f"aegis-job-{job.id}-{unique_id}",
                definition=json.dumps(export_asl(job, function_arn=function_arn(name))),
                roleArn=ROLE,
            )
            webhook.script(200, 500, 500, 500)
            started = await sfn.start_execution(
                stateMachineArn=machine["stateMachineArn"],
                name=f"run-{unique_id}",
                input=json.dumps(
                    {"trigger": trigger, "payload": {"execution_id": "sfn", "job_id": job.id}}
                ),
            )
            result = await finished(sfn, started["executionArn"])
            events = list(runtime.events)
    finally:
        await asyncio.to_thread(container.close)
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
    assert sorted(map(json.dumps, ((r.path, r.body) for r in webhook.requests))) == sorted(
        map(json.dumps, builtin_calls)
    )
    # every retry of one run of a step sends the same idempotency key
    keys = {r.headers.get("Idempotency-Key") for r in webhook.requests if "maint" in r.path}
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
        assert [r["status"] for r in runs] == ["STARTED"]
        assert runs[0]["execution_arn"] == listed["executions"][0]["executionArn"]
        # overlap_allowed 1 and one running: another trigger is skipped, and logged
        assert [j.id for j in await app.handle(trigger_at("2026-12-01T00:00:05Z"))] == [job.id]
        listed = await sfn.list_executions(stateMachineArn=prefix + job.id)
        assert len(listed["executions"]) == 1
        assert sorted(r["status"] for r in await store.executions(job.id)) == [
            "SKIPPED_OVERLAP",
            "STARTED",
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
    finally:
        await app.stop()
        await asyncio.to_thread(container.close)
    assert [(r.path, r.body) for r in webhook.requests] == [
        (f"/hook/{factory}", {"level": "CRITICAL"})
    ]
    assert json.loads(result["output"])["steps"]["call"]["status"] == 200
