"""Lambda functions run by a local runtime (aegis_devstack.testing.lambdaruntime) behind the
emulator (aegis_devstack.motoserver): Step Functions executions that call them run for real."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from botocore.exceptions import ClientError

from aegis_devstack.testing.emulator import (
    arequest_counts,
    areset_request_counts,
    lambda_functions,
    register_lambda,
    request_counts,
    unregister_lambda,
)
from aegis_devstack.testing.lambdaruntime import LambdaContext, lambda_runtime
from aegis_storage.clients import AwsConfig, open_client

pytestmark = pytest.mark.integration

REGION = "ap-south-1"
ACCOUNT = "123456789012"  # moto's default account


def _arn(name: str) -> str:
    return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{name}"


class Boom(Exception):
    """The error the state machine retries and catches, by its class's name."""


@pytest.fixture(scope="module")
def emulator(private_emulator: str) -> str:
    """A private emulator of this module's own."""
    return private_emulator


@dataclass
class Clients:
    stepfunctions: Any
    lambda_: Any


@pytest.fixture
async def clients(emulator: str) -> AsyncIterator[Clients]:
    cfg = AwsConfig(region=REGION, endpoint_url=emulator, max_attempts=1)  # a 502 not retried
    async with open_client("stepfunctions", cfg) as sfn, open_client("lambda", cfg) as lam:
        yield Clients(sfn, lam)


async def _post_json(endpoint: str, path: str, body: Any) -> None:
    def post() -> None:
        request = urllib.request.Request(
            endpoint + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5):
            pass

    await asyncio.to_thread(post)


def _double(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    assert context.get_remaining_time_in_millis() > 0
    return {"doubled": event["n"] * 2, "request": context.aws_request_id}


def _double_calling(endpoint: str) -> Callable[[dict[str, Any], LambdaContext], Any]:
    """:func:`_double` that first calls the emulator, which serves its requests under one lock:
    an invocation forwarded while holding it would never get an answer."""

    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        request_counts(endpoint)
        return _double(event, context)

    return handler


def _explode(event: dict[str, Any], context: LambdaContext) -> None:
    raise Boom(f"no {event['n']} for {context.function_name}")


def _definition(double: str, explode: str) -> str:
    return json.dumps(
        {
            "StartAt": "Double",
            "States": {
                "Double": {
                    "Type": "Task",
                    "Resource": _arn(double),
                    "Parameters": {
                        "n.$": "$.n",
                        "execution.$": "$$.Execution.Name",
                        "entered.$": "$$.State.EnteredTime",
                    },
                    "ResultPath": "$.first",
                    "Next": "Explode",
                },
                "Explode": {
                    "Type": "Task",
                    "Resource": _arn(explode),
                    "Parameters": {"n.$": "$.first.doubled"},
                    "Retry": [{"ErrorEquals": ["Boom"], "MaxAttempts": 1, "IntervalSeconds": 1}],
                    "Catch": [
                        {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Done"}
                    ],
                    "End": True,
                },
                "Done": {"Type": "Pass", "End": True},
            },
        }
    )


async def _finished(stepfunctions: Any, execution_arn: str, within_s: float = 30.0) -> Any:
    deadline = time.monotonic() + within_s
    while True:
        described = await stepfunctions.describe_execution(executionArn=execution_arn)
        if described["status"] != "RUNNING":
            return described
        assert time.monotonic() < deadline, f"execution still running: {described}"
        await asyncio.sleep(0.2)


async def test_a_state_machine_runs_local_functions_with_retry_and_catch(
    emulator: str, clients: Clients
) -> None:
    await _post_json(
        emulator, "/moto-api/config", {"stepfunctions": {"execute_state_machine": True}}
    )
    sfn = clients.stepfunctions
    async with (
        lambda_runtime(_double_calling(emulator), function_name="double") as double,
        lambda_runtime(_explode, function_name="explode") as explode,
    ):
        await register_lambda(emulator, "double", double.url)
        await register_lambda(emulator, _arn("explode"), explode.url)  # an ARN names it too
        assert await lambda_functions(emulator) == {"double": double.url, "explode": explode.url}
        await areset_request_counts(emulator)
        machine = await sfn.create_state_machine(
            name="local-lambdas",
            definition=_definition("double", "explode"),
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/sfn",
        )
        started = await sfn.start_execution(
            stateMachineArn=machine["stateMachineArn"], name="run-21", input='{"n": 21}'
        )
        described = await _finished(sfn, started["executionArn"])
        counts = await arequest_counts(emulator)
        history = await sfn.get_execution_history(executionArn=started["executionArn"])
        await unregister_lambda(emulator, "double")
        await unregister_lambda(emulator, "explode")
        assert await lambda_functions(emulator) == {}

    assert described["status"] == "SUCCEEDED", described
    output = json.loads(described["output"])
    assert output["n"] == 21
    assert output["first"]["doubled"] == 42

    # the handler saw the Parameters exactly: the execution's name, the state's entry time
    [seen] = double.events
    assert seen["n"] == 21
    assert seen["execution"] == "run-21"
    assert set(seen) == {"n", "execution", "entered"}
    entered = datetime.fromisoformat(seen["entered"].replace("Z", "+00:00"))
    assert described["startDate"] <= entered <= described["stopDate"]

    # the failing one ran twice (one retry), then the Catch put its error in $.error
    assert explode.events == [{"n": 42}, {"n": 42}]
    assert [type(err) for err in explode.errors] == [Boom, Boom]
    assert output["error"]["Error"] == "Boom"
    cause = json.loads(output["error"]["Cause"])
    assert cause["errorType"] == "Boom"
    assert cause["errorMessage"] == "no 42 for explode"
    assert "in _explode" in cause["stackTrace"][0]  # the handler's frames only, as RIE's

    failed = [e for e in history["events"] if e["type"] == "LambdaFunctionFailed"]
    assert [e["lambdaFunctionFailedEventDetails"]["error"] for e in failed] == ["Boom", "Boom"]
    assert counts.count("lambda", "Invoke") == 3


async def test_only_registered_functions_are_forwarded(emulator: str, clients: Clients) -> None:
    async with lambda_runtime(_double, function_name="double") as double:
        await register_lambda(emulator, "double", double.url)
        try:
            answer = await clients.lambda_.invoke(
                FunctionName=_arn("double") + ":$LATEST", Payload=b'{"n": 5}'
            )
            payload = json.loads(await answer["Payload"].read())
            assert payload["doubled"] == 10
            assert answer["StatusCode"] == 200
            assert answer["ExecutedVersion"] == "$LATEST"
            assert "FunctionError" not in answer

            with pytest.raises(ClientError) as refused:
                await clients.lambda_.invoke(
                    FunctionName="double", InvocationType="Event", Payload=b"{}"
                )
            assert refused.value.response["Error"]["Code"] == "InvalidParameterValueException"

            # a function nobody registered is moto's own, which has no such function
            with pytest.raises(ClientError) as unknown:
                await clients.lambda_.invoke(FunctionName="nobody", Payload=b"{}")
            assert unknown.value.response["Error"]["Code"] == "ResourceNotFoundException"
            assert unknown.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        finally:
            await unregister_lambda(emulator, "double")
    assert double.events == [{"n": 5}]


async def test_a_runtime_that_is_gone_is_a_service_exception(
    emulator: str, clients: Clients
) -> None:
    async with lambda_runtime(_double) as gone:
        url = gone.url
    await register_lambda(emulator, "gone", url)
    try:
        with pytest.raises(ClientError) as failed:
            await clients.lambda_.invoke(FunctionName="gone", Payload=b"{}")
    finally:
        await unregister_lambda(emulator, "gone")
    error = failed.value.response
    assert error["Error"]["Code"] == "ServiceException"
    assert "cannot be reached" in error["Error"]["Message"]
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 502
