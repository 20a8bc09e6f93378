"""A Lambda function's code run in the test process, behind what AWS's Lambda Runtime Interface
Emulator (RIE) offers: ``POST`` the event to ``/2015-03-31/functions/function/invocations``, get
the function's result back.

moto can only run a function's code in Docker, and a test wants the code it asserts on in its own
process anyway (its fakes, its clock, its breakpoints). :func:`lambda_runtime` serves a
synchronous Lambda-style ``handler(event, context)``; registered with the emulator
(:func:`aegis_devstack.testing.emulator.register_lambda`), it is what a Lambda Invoke of that
function runs, a Step Functions Task on the function's ARN included (see
:mod:`aegis_devstack.motoserver`)::

    async with lambda_runtime(handler, function_name="double") as runtime:
        await register_lambda(endpoint, "double", runtime.url)
        ...  # run the state machine
        assert runtime.events == [{"n": 21}]

As one Lambda execution environment does, it runs one invocation at a time (others wait), in a
worker thread: the handler may block, and may call the emulator with a synchronous client. An
exception the handler raises is answered as RIE answers it: 200, ``X-Amz-Function-Error:
Unhandled`` and ``{"errorType", "errorMessage", "requestId", "stackTrace"}``, which Lambda passes
on and Step Functions turns into the Task's Error (``errorType``) and Cause (the payload's JSON).
The function's timeout is what ``context.get_remaining_time_in_millis()`` counts down from, and is
not enforced: a thread cannot be stopped, and a test that needs a timeout can raise one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from aegis_devstack.testing.emulator import register_lambda, unregister_lambda
from aegis_devstack.testing.webhook import serving

__all__ = [
    "INVOCATION_PATH",
    "LambdaContext",
    "LambdaRuntime",
    "lambda_runtime",
    "register_lambda",
    "unregister_lambda",
]

INVOCATION_PATH = "/2015-03-31/functions/function/invocations"  # RIE's
# Lambda's largest synchronous payload, with room for the HTTP framing
_MAX_PAYLOAD = 6 * 1024 * 1024 + 64 * 1024

Handler = Callable[[Any, "LambdaContext"], Any]


@dataclass
class LambdaContext:
    """What the Python runtime passes as ``context``: the attributes a handler reads."""

    aws_request_id: str
    function_name: str
    invoked_function_arn: str
    deadline: float  # time.monotonic() at which the function would time out
    function_version: str = "$LATEST"
    memory_limit_in_mb: str = "128"  # a string, as the Python runtime's
    log_group_name: str = ""
    log_stream_name: str = ""
    identity: Any = None
    client_context: Any = None

    def __post_init__(self) -> None:
        self.log_group_name = self.log_group_name or f"/aws/lambda/{self.function_name}"
        self.log_stream_name = self.log_stream_name or f"local/[$LATEST]{self.aws_request_id}"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.deadline - time.monotonic()) * 1000))


@dataclass
class LambdaRuntime:
    """A running local runtime: its invocation ``url``, and every event it was invoked with
    (``events``, in arrival order, recorded before the handler runs) and every exception the
    handler raised (``errors``)."""

    handler: Handler
    function_name: str
    invoked_function_arn: str
    timeout_s: float
    url: str = ""
    events: list[Any] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)
    _one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    async def _invoke(self, request: web.Request) -> web.Response:
        raw = await request.read()
        async with self._one_at_a_time:
            context = LambdaContext(
                aws_request_id=str(uuid.uuid4()),
                function_name=self.function_name,
                invoked_function_arn=self.invoked_function_arn,
                deadline=time.monotonic() + self.timeout_s,
            )
            try:
                event = json.loads(raw) if raw.strip() else {}
            except ValueError as err:
                return _error(
                    context, "Runtime.UnmarshalError", f"Unable to unmarshal input: {err}"
                )
            self.events.append(event)
            outcome = await asyncio.to_thread(self._run, event, context)
            if isinstance(outcome, _Failure):  # the function's error, answered as RIE answers it
                self.errors.append(outcome.error)
                error = outcome.error
                return _error(context, type(error).__name__, str(error), outcome.stack)
            result = outcome
            try:
                body = json.dumps(result)
            except (TypeError, ValueError) as err:
                return _error(context, "Runtime.MarshalError", f"Unable to marshal response: {err}")
            return web.Response(body=body.encode(), content_type="application/json")

    def _run(self, event: Any, context: LambdaContext) -> Any:
        """The handler's result, or its exception with the stack from the handler's frame down
        (as the Python runtime reports it: none of this module's or asyncio's frames)."""
        try:
            return self.handler(event, context)
        except Exception as exc:
            tb = exc.__traceback__
            return _Failure(exc, traceback.format_tb(tb.tb_next if tb is not None else None))


@dataclass(frozen=True)
class _Failure:
    error: Exception
    stack: list[str]


def _error(
    context: LambdaContext, kind: str, message: str, stack: list[str] | None = None
) -> web.Response:
    payload = {
        "errorMessage": message,
        "errorType": kind,
        "requestId": context.aws_request_id,
        "stackTrace": stack or [],
    }
    return web.Response(
        body=json.dumps(payload).encode(),
        content_type="application/json",
        headers={"X-Amz-Function-Error": "Unhandled"},
    )


@contextlib.asynccontextmanager
async def lambda_runtime(
    handler: Handler,
    *,
    function_name: str = "function",
    invoked_function_arn: str | None = None,
    timeout_s: float = 300.0,
) -> AsyncIterator[LambdaRuntime]:
    """``handler`` served on a free port of 127.0.0.1 for the block, as RIE serves a function:
    the yielded runtime's ``url`` is its invocation URL (``.../2015-03-31/functions/function/
    invocations``; any function name in that path is accepted).

    ``function_name`` and ``invoked_function_arn`` are what the context says (by default RIE's
    made-up account and region), ``timeout_s`` what it counts down from (RIE's default)."""
    runtime = LambdaRuntime(
        handler=handler,
        function_name=function_name,
        invoked_function_arn=invoked_function_arn
        or f"arn:aws:lambda:us-east-1:012345678912:function:{function_name}",
        timeout_s=timeout_s,
    )
    app = web.Application(client_max_size=_MAX_PAYLOAD)
    app.router.add_post("/2015-03-31/functions/{name}/invocations", runtime._invoke)
    async with serving(app) as base:
        runtime.url = base + INVOCATION_PATH
        yield runtime
