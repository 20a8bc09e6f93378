"""``python -m aegis_devstack.motoserver -H HOST -p PORT``: moto_server with one request at a time.

moto serves each request in its own thread and checks a condition (DynamoDB's
``attribute_not_exists``, S3's ``If-None-Match``) and then writes, with nothing in between to stop a
second thread from doing the same: under load two concurrent conditional writes can both succeed,
which real DynamoDB and S3 never allow. The claims that make N replicas do a piece of work once
rely on exactly that, so the local emulator runs its requests under one lock. moto is GIL-bound
Python, so this costs little throughput.

Its full garbage collections are deferred too: moto keeps every object and item in one Python
heap, and a full collection of a heap that a test suite has filled stalls every request for up to
a second (measured by ``make bench``), which AWS does not do and which made latency assertions
flaky. What moto would keep of every request served is not kept (:func:`bound_memory`): with
full collections deferred, a `make run` grew the emulator by ~190 MB a minute, almost none of it
data.

A Query reads its partition (an index's Query, the table's items unsorted), not every item of
the table sorted by key as moto's does (:func:`query_reads_only_what_it_may_answer`): the same
answer, at a cost that grows with the partition instead of the table.

An SQS long poll waits for its messages outside the lock (:func:`long_polls_wait_outside`):
moto waits inside the request, which under the lock held every other request for the poll's
whole wait.

A client's connection is kept for its next request, as S3 and DynamoDB keep it
(:func:`keep_connections_alive`); werkzeug's development server closed it after every answer, so
each request cost a TCP connection, a server thread and the client's connection set-up. A request
whose answer could not be written, its connection gone, is logged (``answer not delivered``,
:func:`log_undelivered_answers`): its client may send it again.

``AEGIS_MOTO_LATENCY_MS`` adds a round trip to every request (benchmarks only, default 0).

CopyObject honours ``If-None-Match: *`` as S3 does (412 PreconditionFailed when the destination
exists); moto 5.2 honours it on PutObject and CompleteMultipartUpload but ignores it on
CopyObject, and the migration's never-overwrite-raw/ guarantee rests on it. Under the request
lock the check and the copy are one step.

When IAM enforcement is switched on (``POST /moto-api/reset-auth`` with ``0``, or
``INITIAL_NO_AUTH_ACTION_COUNT``), requests are authorized as AWS would: moto's own S3 action names
that IAM does not have are mapped to IAM's (HeadBucket needs ``s3:ListBucket``), DynamoDB calls are
checked against the table's ARN, an index's ARN for a Query or Scan of an index, and every table
named by a batch call (moto checks them against ``*``, so no table-scoped policy could allow
anything), each item of a TransactWriteItems by its own action (PutItem, UpdateItem, ...: IAM has
no action for the transaction itself), and DeleteObjects is checked per key (moto checks the
bucket's ARN), DeleteObject of a version as s3:DeleteObjectVersion. The identity, trust and
bucket policies are evaluated as AWS documents it (:mod:`aegis_devstack.motopolicy`: moto knows
one condition operator and reads no bucket policy). Without enforcement these checks never run.
Whether enforcement is on or not, a policy document that evaluator does not implement is refused
when it is stored (:func:`refuse_unsupported_policies`), so no policy is half-applied.
Everything else is moto_server's own ``main``.

A POST Object (a browser-based upload with a signed POST policy, what a gateway's presigned
upload sends) is decided as S3 decides it (:mod:`aegis_devstack.motopost`): the policy's
signature, expiration and conditions (key, content type, size range, no extra fields), and, with
IAM enforcement on, the signer's own s3:PutObject on the key (identity and bucket policies, as
for any request); moto 5 stores whatever a POST sends. Without enforcement, as moto does for
every other request, a form signed by an access key the emulator never issued is not checked
for its signature (the policy still is) and a form without a policy is accepted; with it, both
are refused. The expiration is read against the emulator's clock, which a test may stop at an
instant (``POST /_aegis/clock`` ``{"now": ISO-8601}``, ``{"now": null}`` to follow the system
clock again; ``GET`` answers it).

Every AWS request is counted, under the same lock, so that tests and benchmarks can prove at the
emulator which requests the platform sends (no DynamoDB Scan on a recurring path, items DynamoDB
read per item returned): per service (the SigV4 credential scope's, ``monitoring`` reported as
``cloudwatch``) and operation (S3's named from method, path and query; DynamoDB's from
``X-Amz-Target``, ``Query@<index>`` / ``Scan@<index>`` for an index; others' from ``X-Amz-Target``
or ``Action``), with items returned, items scanned, unprocessed keys and response bytes for
DynamoDB. ``GET /_aegis/requests`` answers them as JSON and ``POST /_aegis/requests/reset`` zeroes
them (see :mod:`aegis_devstack.testing.emulator`); neither these nor ``/moto-api/`` requests are
counted, and neither waits ``AEGIS_MOTO_LATENCY_MS``.

A test can hold one named request (``/_aegis/holds``, :mod:`aegis_devstack.motoholds`): before
it is applied, or after, with its answer waiting, until the test releases or aborts it; so a
fault test proves its fault landed while that very request was in flight.

A Lambda function's code can run in the test process instead of in moto (which would need Docker
to run it at all): ``POST /_aegis/lambda`` with ``{"function": name, "url": invocation URL}``
registers the URL of a local runtime that speaks what AWS's Lambda Runtime Interface Emulator
speaks (``POST`` the event, answer the result; :mod:`aegis_devstack.testing.lambdaruntime`), and
``"url": null`` removes it; ``GET /_aegis/lambda`` answers ``{"functions": {name: url}}``. The
registrations are the emulator's, not moto's: ``/moto-api/reset`` keeps them. An Invoke
(``POST /2015-03-31/functions/<name, ARN or partial ARN>/invocations``, any qualifier ignored) of a
registered function is forwarded there with its body as is and answered as Lambda answers
(``X-Amz-Executed-Version: $LATEST``, and the runtime's ``X-Amz-Function-Error`` when the code
raised); a runtime that cannot be reached, or answers an HTTP error, is Lambda's
ServiceException (502). Only ``RequestResponse`` invocations are forwarded (an ``Event`` or
``DryRun`` one is refused, 400). That is how a Step Functions Task on a function ARN runs for real:
moto's interpreter (``POST /moto-api/config`` ``{"stepfunctions": {"execute_state_machine":
true}}``) invokes the function through this very server (at ``localhost:$MOTO_PORT``, which
:func:`aegis_devstack.localservers.start_moto_server` sets), and the Lambda error's ``errorType``
becomes the Task's Error as on AWS. The invocation is forwarded outside the request lock (the
function's code calls this emulator in turn), is counted as ``lambda`` / ``Invoke``, waits
``AEGIS_MOTO_LATENCY_MS`` like any request, and is not authorized even with IAM enforcement on
(moto's interpreter signs with made-up keys). Other functions are moto's, as before.

State machines a CloudFormation stack declares are made where the Step Functions API finds them:
moto keeps two Step Functions backends (the interpreter's when ``execute_state_machine`` is on,
the plain one otherwise) and its CloudFormation always writes to the plain one, so a deployed
machine was invisible, and could not be started, once executions were switched on.
"""

from __future__ import annotations

import copy
import datetime
import functools
import gc
import gzip
import importlib
import inspect
import io
import json
import os
import pickle
import re
import socket
import string
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from html import unescape
from typing import Any
from urllib.parse import parse_qs, parse_qsl, unquote, urlsplit

from aegis_devstack import motoholds, motojson, motopolicy, motopost

LATENCY_ENV = "AEGIS_MOTO_LATENCY_MS"
COUNTS_PATH = "/_aegis/requests"
RESET_PATH = "/_aegis/requests/reset"
LAMBDA_PATH = "/_aegis/lambda"
CLOCK_PATH = "/_aegis/clock"
# Lambda's longest run: a local function's answer is awaited this long
INVOKE_TIMEOUT_S = 900.0

# moto's S3 action names that are not IAM actions, and the IAM action AWS checks instead
_IAM_ACTIONS = {
    "s3:HeadBucket": "s3:ListBucket",
    "s3:GetPublicAccessBlock": "s3:GetBucketPublicAccessBlock",
    "s3:PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock",
    "s3:DeletePublicAccessBlock": "s3:PutBucketPublicAccessBlock",
}
_DELETE_KEY = re.compile(rb"<Key>([^<]*)</Key>")
_VERSION_ID = re.compile(r"[?&]versionId=")
# TransactWriteItems is no IAM action: AWS authorizes each item's own action on its table
_TRANSACT_ACTIONS = {
    "Put": "dynamodb:PutItem",
    "Update": "dynamodb:UpdateItem",
    "Delete": "dynamodb:DeleteItem",
    "ConditionCheck": "dynamodb:ConditionCheckItem",
}


def serialize_requests(
    latency_s: float = 0.0,
    counter: RequestCounter | None = None,
    functions: dict[str, str] | None = None,
    holds: motoholds.Holds | None = None,
    clock: motopost.EmulatorClock | None = None,
) -> threading.Lock:
    """One request at a time (under the lock returned); with ``latency_s``, each request first
        waits that long outside the lock (concurrent requests wait together), as a remote
        S3/DynamoDB's round trip would: for benchmarks that compare clients whose concurrency
        matters against a real endpoint.

        Each AWS request is counted in ``counter`` (a new one by default), which the server answers at
        :data:`COUNTS_PATH` and zeroes at :data:`RESET_PATH`.

        ``functions`` (function name to a local runtime's invocation URL; a new, empty one by default,
        kept at :data:`LAMBDA_PATH`) are the Lambda functions whose Invoke is forwarded, outside the
        lock: their code calls this server in turn, and would wait for the lock forever.

    ``holds`` are the hold points tests arm at ``/_aegis/holds`` (:mod:`aegis_devstack.motoholds`):
    a held request waits outside the lock, so the others go on. ``clock`` is the one
    :data:`CLOCK_PATH` answers and fixes (:class:`aegis_devstack.motopost.EmulatorClock`)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication  # noqa: PLC0415

    lock = threading.Lock()
    dispatch = DomainDispatcherApplication.__call__
    counts = counter if counter is not None else RequestCounter()
    runtimes = functions if functions is not None else {}
    held = holds if holds is not None else motoholds.Holds()
    emulator_clock = clock if clock is not None else motopost.EmulatorClock()

    def serialized(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        path = _path(environ)
        if path.startswith("/_aegis/"):  # the emulator's own endpoints: not AWS, not delayed
            return _own_endpoint(environ, start_response, path)
        if latency_s > 0:
            time.sleep(latency_s)
        invoked = _invoked_function(environ)
        if invoked is not None:
            with lock:
                url = runtimes.get(invoked)
                if url is not None:
                    counts.add("lambda", "Invoke")
            if url is not None:
                return _forward_invocation(url, environ, start_response)
        own = path.startswith("/moto-api") or path == "/favicon.ico"  # moto's, not counted
        hold = _hold_of(held, environ, path) if held.armed() and not own else None
        if hold is not None:
            return _held_request(self, environ, start_response, hold)
        with lock:
            if own:
                return dispatch(self, environ, start_response)
            return _served(self, environ, start_response)

    def _own_endpoint(environ: dict[str, Any], start_response: Any, path: str) -> list[bytes]:
        if path.startswith(motoholds.HOLDS_PATH):  # decided outside the lock: holds wait
            method = environ.get("REQUEST_METHOD", "GET")
            status, answer = held.answer(path, method, _read_body(environ))
            return _respond(start_response, status, json.dumps(answer).encode(), "application/json")
        if path == CLOCK_PATH:
            method = environ.get("REQUEST_METHOD", "GET")
            status, answer = emulator_clock.answer(method, _read_body(environ))
            return _respond(start_response, status, json.dumps(answer).encode(), "application/json")
        with lock:
            if path == LAMBDA_PATH:
                return _answer_functions(runtimes, environ, start_response)
            return _answer_counter(counts, environ, start_response)

    def _held_request(
        self: Any, environ: dict[str, Any], start_response: Any, hold: motoholds.Hold
    ) -> list[bytes]:
        """A request a test holds: waiting outside the lock before it is applied, or after,
        with its answer; aborted, its caller gets a 503 (and, after, the write stands)."""
        if hold.when == "before" and held.wait(hold) == "abort":
            return _respond(start_response, "503 Service Unavailable", b"held, then aborted")
        answered: list[Any] = []
        with lock:
            body = _collect(_served(self, environ, lambda *a: answered.append(a)))
        if hold.when == "after" and held.wait(hold) == "abort":
            return _respond(start_response, "503 Service Unavailable", b"held, then aborted")
        start_response(*answered[0])
        return [body]

    def _served(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        service, op = environ[OPERATION_KEY] = _classify(environ)
        response = dispatch(self, environ, start_response)
        if service != "dynamodb":
            counts.add(service, op)
            return response
        body = _collect(response)
        counts.add(service, op, **_dynamodb_figures(op, body))
        return [body]

    DomainDispatcherApplication.__call__ = serialized  # type: ignore[method-assign]
    return lock


def long_polls_wait_outside(lock: threading.Lock) -> None:
    """An SQS long poll (ReceiveMessage with WaitTimeSeconds) waits for its messages with the
    request lock released, as SQS serves other requests while one waits. moto waits inside the
    request (a second at a time, until a message is added): under the lock, that held every
    other request of every service for the poll's whole wait, the SendMessage it waited for
    among them. The queue is read again under the lock once the wait ends."""
    from moto.sqs.models import Queue  # noqa: PLC0415

    wait = Queue.wait_for_messages

    def wait_outside_the_lock(self: Any, timeout: int) -> None:
        lock.release()
        try:
            wait(self, timeout)
        finally:
            lock.acquire()

    Queue.wait_for_messages = wait_outside_the_lock  # type: ignore[method-assign]


def _hold_of(held: motoholds.Holds, environ: dict[str, Any], path: str) -> motoholds.Hold | None:
    """The armed hold this request matches (its path, query and body searched), if any."""
    service, op = _classify(environ)
    body = _read_body(environ).decode("utf-8", "replace")
    text = f"{path}?{environ.get('QUERY_STRING', '')}\n{body}"
    return held.take(service, op, text)


# -- request counting --------------------------------------------------------------------------

# The figures kept for every DynamoDB operation (the other services' keep a count only)
DYNAMODB_FIGURES = ("count", "items_returned", "items_scanned", "unprocessed", "bytes_returned")
# Signing names reported under botocore's client name
_SERVICE_NAMES = {"monitoring": "cloudwatch"}
_CREDENTIAL_SCOPE = re.compile(r"Credential=[^/,\s]*/[^/,\s]*/[^/,\s]*/([^/,\s]+)/aws4_request")
_RPC_V2_PATH = re.compile(r"/service/[^/]+/operation/([^/?]+)$")
# S3 query parameters that are arguments, not the subresource that names the operation
_S3_ARGUMENTS = frozenset({
    "continuation-token", "delimiter", "encoding-type", "fetch-owner", "key-marker", "list-type",
    "marker", "max-keys", "max-parts", "max-uploads", "optional-object-attributes",
    "part-number-marker", "partNumber", "prefix", "start-after", "upload-id-marker", "uploadId",
    "version-id-marker", "versionId", "x-id",
})  # fmt: skip
_S3_VIRTUAL_HOST = re.compile(r"(.+)\.s3(?:[.-][a-z0-9-]+)*\.amazonaws\.com")


class RequestCounter:
    """Requests per service and operation since the last :meth:`reset`.

    Not locked of its own: :func:`serialize_requests` calls it under the request lock."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, dict[str, int]]] = {}
        self.since = time.time()

    def add(self, service: str, op: str, **figures: int) -> None:
        ops = self._counts.setdefault(service, {})
        if op not in ops:
            names = DYNAMODB_FIGURES if service == "dynamodb" else ("count",)
            ops[op] = dict.fromkeys(names, 0)
        stats = ops[op]
        stats["count"] += 1
        for name, value in figures.items():
            stats[name] = stats.get(name, 0) + value

    def reset(self) -> None:
        self._counts = {}
        self.since = time.time()

    def snapshot(self) -> dict[str, Any]:
        """``{"requests": {service: {op: {"count": n, ...}}}, "since": t0, "at": now}``."""
        requests = {
            service: {op: dict(stats) for op, stats in ops.items()}
            for service, ops in self._counts.items()
        }
        return {"requests": requests, "since": self.since, "at": time.time()}


def _path(environ: dict[str, Any]) -> str:
    path = environ.get("PATH_INFO", "")
    return path.decode("utf-8", "replace") if isinstance(path, bytes) else str(path)


def _answer_counter(
    counter: RequestCounter, environ: dict[str, Any], start_response: Any
) -> list[bytes]:
    path, method = _path(environ), environ.get("REQUEST_METHOD", "GET")
    if path == COUNTS_PATH and method == "GET":
        body = json.dumps(counter.snapshot()).encode()
        return _respond(start_response, "200 OK", body, "application/json")
    if path == RESET_PATH and method == "POST":
        counter.reset()
        return _respond(start_response, "204 No Content", b"")
    if path in (COUNTS_PATH, RESET_PATH):
        allow = "GET" if path == COUNTS_PATH else "POST"
        return _respond(start_response, "405 Method Not Allowed", b"", allow=allow)
    return _respond(start_response, "404 Not Found", b"")


def _respond(
    start_response: Any,
    status: str,
    body: bytes,
    content_type: str = "text/plain",
    *,
    allow: str | None = None,
    headers: Iterable[tuple[str, str]] = (),
) -> list[bytes]:
    sent = [("Content-Type", content_type), ("Content-Length", str(len(body))), *headers]
    if allow:
        sent.append(("Allow", allow))
    start_response(status, sent)
    return [body]


# -- Lambda functions run by a local runtime ---------------------------------------------------

# the runtime is local: never through an HTTP(S)_PROXY of the environment
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_INVOKE_PATH = re.compile(r"/2015-03-31/functions/([^/]+)/invocations/?")


def function_name(reference: str) -> str:
    """The function's name in an Invoke's path: a name, ``name:qualifier``, a partial ARN
    (``123456789012:function:name``) or an ARN, URL-encoded or not."""
    parts = unquote(reference).split(":")
    if parts[0] == "arn" and len(parts) > 6:  # arn:aws:lambda:region:account:function:name[:q]
        return parts[6]
    if len(parts) > 2 and parts[1] == "function":  # account:function:name[:qualifier]
        return parts[2]
    return parts[0]


def _invoked_function(environ: dict[str, Any]) -> str | None:
    """The function a Lambda Invoke request names (None for any other request)."""
    if environ.get("REQUEST_METHOD", "GET").upper() != "POST":
        return None
    found = _INVOKE_PATH.fullmatch(_path(environ))
    return function_name(found.group(1)) if found else None


def _answer_functions(
    functions: dict[str, str], environ: dict[str, Any], start_response: Any
) -> list[bytes]:
    """``GET``: the registered functions; ``POST {"function", "url"}``: register (or remove)."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method == "GET":
        body = json.dumps({"functions": functions}).encode()
        return _respond(start_response, "200 OK", body, "application/json")
    if method != "POST":
        return _respond(start_response, "405 Method Not Allowed", b"", allow="GET, POST")
    data = _json_object(_read_body(environ))
    name, url = data.get("function"), data.get("url")
    if not isinstance(name, str) or not name:
        return _respond(start_response, "400 Bad Request", b'"function" must name a function')
    if url is None:
        functions.pop(function_name(name), None)
    elif isinstance(url, str) and urlsplit(url).scheme in ("http", "https"):
        functions[function_name(name)] = url
    else:
        return _respond(start_response, "400 Bad Request", b'"url" must be an http(s) URL or null')
    return _respond(start_response, "204 No Content", b"")


def _lambda_error(start_response: Any, status: str, kind: str, message: str) -> list[bytes]:
    """An error as Lambda's API answers it (botocore reads the code from ``X-Amzn-ErrorType``)."""
    body = json.dumps({"Type": "Service" if status.startswith("5") else "User", "message": message})
    headers = [("X-Amzn-ErrorType", kind), ("X-Amzn-RequestId", str(uuid.uuid4()))]
    return _respond(start_response, status, body.encode(), "application/json", headers=headers)


def _forward_invocation(url: str, environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """An Invoke answered by the local runtime at ``url`` (run without the request lock)."""
    invocation = environ.get("HTTP_X_AMZ_INVOCATION_TYPE") or "RequestResponse"
    if invocation != "RequestResponse":
        return _lambda_error(
            start_response,
            "400 Bad Request",
            "InvalidParameterValueException",
            f"InvocationType {invocation} is not supported for a function run by a local runtime "
            "(only RequestResponse)",
        )
    forwarded = urllib.request.Request(  # noqa: S310 (an http(s) URL, checked when registered)
        url,
        data=_read_body(environ),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with _DIRECT.open(forwarded, timeout=INVOKE_TIMEOUT_S) as answer:
            payload: bytes = answer.read()
            error = answer.headers.get("X-Amz-Function-Error")
            content_type = answer.headers.get("Content-Type") or "application/json"
    except urllib.error.HTTPError as err:
        detail = err.read(200).decode("utf-8", "replace")
        err.close()
        return _lambda_error(
            start_response,
            "502 Bad Gateway",
            "ServiceException",
            f"the local runtime at {url} answered {err.code}: {detail}",
        )
    except (OSError, ValueError) as err:
        return _lambda_error(
            start_response,
            "502 Bad Gateway",
            "ServiceException",
            f"the local runtime at {url} cannot be reached: {err}",
        )
    headers = [("X-Amz-Executed-Version", "$LATEST"), ("X-Amzn-RequestId", str(uuid.uuid4()))]
    if error:
        headers.append(("X-Amz-Function-Error", error))
    return _respond(start_response, "200 OK", payload, content_type, headers=headers)


def _collect(response: Iterable[bytes]) -> bytes:
    try:
        return b"".join(response)
    finally:
        close: Callable[[], object] | None = getattr(response, "close", None)
        if close is not None:
            close()


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request's body, put back for moto to read again."""
    stream = environ.get("wsgi.input")
    if stream is None:
        return b""
    try:
        length = int(environ.get("CONTENT_LENGTH") or -1)
    except ValueError:
        length = -1
    if length >= 0:
        body: bytes = stream.read(length)
    elif environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        body = stream.read()
    else:
        return b""
    environ["wsgi.input"] = io.BytesIO(body)
    if environ.get("HTTP_CONTENT_ENCODING", "").lower() == "gzip":
        try:
            return gzip.decompress(body)
        except (OSError, EOFError):
            return b""
    return body


def _service(environ: dict[str, Any], target: str) -> str:
    credential = environ.get("HTTP_AUTHORIZATION", "")
    if not credential:  # a presigned URL carries it in the query string
        credential = "Credential=" + "".join(
            parse_qs(environ.get("QUERY_STRING", "")).get("X-Amz-Credential", [""])[:1]
        )
    found = _CREDENTIAL_SCOPE.search(credential)
    if found:
        service = found.group(1).lower()
    elif target:
        service = target.split("_", 1)[0].split(".", 1)[0].lower()
    else:
        service = "s3"  # moto's own default for a request it cannot place
    if service == "dynamodb" and target.startswith("DynamoDBStreams"):
        return "dynamodbstreams"
    return _SERVICE_NAMES.get(service, service)


def _classify(environ: dict[str, Any]) -> tuple[str, str]:
    """(service, operation) of an AWS request, as counted."""
    method = environ.get("REQUEST_METHOD", "GET").upper()
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    service = _service(environ, target)
    if service == "s3":
        return service, _s3_operation(environ, method)
    if service == "dynamodb":
        action = target.rsplit(".", 1)[-1] if target else method
        if action in ("Query", "Scan"):
            index = _json_object(_read_body(environ)).get("IndexName")
            if isinstance(index, str) and index:
                action = f"{action}@{index}"
        return service, action
    if target:
        return service, target.rsplit(".", 1)[-1]
    if service == "lambda" and _invoked_function(environ) is not None:
        return service, "Invoke"
    rpc = _RPC_V2_PATH.search(_path(environ))
    if rpc:
        return service, rpc.group(1)
    action = parse_qs(environ.get("QUERY_STRING", "")).get("Action")
    if not action and environ.get("CONTENT_TYPE", "").startswith(
        "application/x-www-form-urlencoded"
    ):
        action = parse_qs(_read_body(environ).decode("utf-8", "replace")).get("Action")
    return service, action[0] if action else method


def _s3_operation(environ: dict[str, Any], method: str) -> str:
    """S3's name for a path-style (``/bucket/key``) or virtual-host request."""
    path = _path(environ)
    host = environ.get("HTTP_HOST", "")
    name = "" if host.startswith("[") else host.split(":", 1)[0].lower()
    virtual = _S3_VIRTUAL_HOST.fullmatch(name)
    if name.endswith(".localhost") or virtual:
        bucket, key = "virtual-host", path.lstrip("/")
    else:
        bucket, _, key = path.lstrip("/").partition("/")
    params: dict[str, str] = dict(
        parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
    )
    if params.get("x-id"):  # botocore names some operations itself
        return params["x-id"]
    sub = next(
        (p for p in params if p not in _S3_ARGUMENTS and not p.startswith(("X-Amz-", "response-"))),
        "",
    )
    copy = bool(environ.get("HTTP_X_AMZ_COPY_SOURCE"))
    upload = "uploadId" in params
    if not bucket:
        return "ListBuckets" if method == "GET" and not sub else _named("Service", method, sub)
    if not key:
        bucket_ops = {
            ("GET", ""): "ListObjectsV2" if params.get("list-type") == "2" else "ListObjects",
            ("GET", "versions"): "ListObjectVersions",
            ("GET", "uploads"): "ListMultipartUploads",
            ("HEAD", ""): "HeadBucket",
            ("PUT", ""): "CreateBucket",
            ("DELETE", ""): "DeleteBucket",
            ("POST", "delete"): "DeleteObjects",
            ("POST", ""): "PostObject",
        }
        return bucket_ops.get((method, sub)) or _named("Bucket", method, sub)
    object_ops = {
        ("GET", ""): "ListParts" if upload else "GetObject",
        ("HEAD", ""): "HeadObject",
        ("PUT", ""): ("UploadPartCopy" if copy else "UploadPart")
        if upload
        else ("CopyObject" if copy else "PutObject"),
        ("DELETE", ""): "AbortMultipartUpload" if upload else "DeleteObject",
        ("POST", "uploads"): "CreateMultipartUpload",
        ("POST", ""): "CompleteMultipartUpload" if upload else "",
    }
    return object_ops.get((method, sub)) or _named("Object", method, sub)


def _named(level: str, method: str, sub: str) -> str:
    return f"{level}:{method}:{sub}" if sub else f"{level}:{method}"


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _dynamodb_figures(op: str, body: bytes) -> dict[str, int]:
    data = _json_object(body)
    action = op.split("@", 1)[0]
    returned = scanned = unprocessed = 0
    if action in ("Query", "Scan"):
        items = data.get("Items")
        returned = len(items) if isinstance(items, list) else 0
        scanned_count = data.get("ScannedCount")
        scanned = scanned_count if isinstance(scanned_count, int) else returned
    elif action == "GetItem":
        returned = scanned = 1 if data.get("Item") else 0
    elif action == "BatchGetItem":
        responses = data.get("Responses")
        if isinstance(responses, dict):
            returned = scanned = sum(len(items) for items in responses.values())
        pending = data.get("UnprocessedKeys")
        if isinstance(pending, dict):
            unprocessed = sum(len(keys.get("Keys", [])) for keys in pending.values())
    elif action == "TransactGetItems":
        responses = data.get("Responses")
        if isinstance(responses, list):
            returned = scanned = sum(1 for answer in responses if answer.get("Item"))
    return {
        "items_returned": returned,
        "items_scanned": scanned,
        "unprocessed": unprocessed,
        "bytes_returned": len(body),
    }


def honour_copy_if_none_match() -> None:
    from moto.s3.exceptions import PreconditionFailed  # noqa: PLC0415
    from moto.s3.responses import S3Response  # noqa: PLC0415

    copy_object = S3Response.copy_object

    def conditional_copy_object(self: Any) -> Any:
        if self.headers.get("If-None-Match") == "*" and (
            self.backend.get_object(self.bucket_name, self.parse_key_name()) is not None
        ):
            raise PreconditionFailed("If-None-Match")
        return copy_object(self)

    S3Response.copy_object = conditional_copy_object  # type: ignore[method-assign]


# the additional checksums S3 takes on a PutObject, by the header that carries each
_CHECKSUM_HEADERS = {
    "x-amz-checksum-crc32": "CRC32",
    "x-amz-checksum-crc32c": "CRC32C",
    "x-amz-checksum-crc64nvme": "CRC64NVME",
    "x-amz-checksum-sha1": "SHA1",
    "x-amz-checksum-sha256": "SHA256",
}
# the ones this emulator can compute exactly (moto falls back to CRC32 for the others when an
# optional library is missing, so they are stored as given, not checked)
_CHECKED_CHECKSUMS = {"CRC32", "SHA1", "SHA256"}


def keep_and_check_put_checksums() -> None:
    from moto.s3.exceptions import S3ClientError  # noqa: PLC0415
    from moto.s3.responses import S3Response  # noqa: PLC0415
    from moto.s3.utils import compute_checksum  # noqa: PLC0415

    class Mismatch(S3ClientError):
        def __init__(self, algorithm: str) -> None:
            super().__init__(
                "BadDigest", f"The {algorithm} you specified did not match the calculated checksum."
            )

    get_checksum = S3Response._get_checksum

    def checked_checksum(self: Any, response_headers: dict[str, Any]) -> tuple[str, str | None]:
        value: str | None
        if not self.headers.get("x-amz-sdk-checksum-algorithm"):
            given = [(h, a) for h, a in _CHECKSUM_HEADERS.items() if self.headers.get(h)]
            if not given:
                return get_checksum(self, response_headers)
            header, algorithm = given[0]
            value = str(self.headers[header])
            response_headers[header] = value
        else:
            algorithm, value = get_checksum(self, response_headers)
            algorithm = algorithm.upper()
        if value and algorithm in _CHECKED_CHECKSUMS:
            computed = compute_checksum(self.body or b"", algorithm=algorithm).decode()
            if computed != value:
                raise Mismatch(algorithm.lower())
        return algorithm, value

    S3Response._get_checksum = checked_checksum  # type: ignore[method-assign]


def replace_dynamodb_tag_values() -> None:
    """DynamoDB's TagResource with a key the table already carries replaces that tag's value
    (AWS's tagging rules: keys are unique per resource); moto appends a second tag of the same
    key, so the first value read back would be the stale one."""
    from moto.dynamodb.models import DynamoDBBackend  # noqa: PLC0415

    def tag_resource(self: Any, arn: str, tags: dict[str, str]) -> None:
        new = dict(tags)
        for table in self.tables.values():
            if table.table_arn == arn:
                kept = [t for t in table.tags if t["Key"] not in new]
                table.tags = kept + [{"Key": k, "Value": v} for k, v in new.items()]

    DynamoDBBackend.tag_resource = tag_resource  # type: ignore[method-assign]


def route_cloudformation_state_machines() -> None:
    """CloudFormation's ``AWS::StepFunctions::StateMachine`` into the backend the API uses (see
    the module docstring): the models module's own backend lookups go through moto's
    ``get_backend``, which picks by the configuration at the time of the call."""
    from moto.stepfunctions import models  # noqa: PLC0415
    from moto.stepfunctions.responses import get_backend  # noqa: PLC0415

    class _Account:
        def __init__(self, account: str) -> None:
            self.account = account

        def __getitem__(self, region: str) -> Any:
            return get_backend(self.account, region)

    class _Configured:
        def __getitem__(self, account: str) -> _Account:
            return _Account(account)

    models.stepfunctions_backends = _Configured()  # type: ignore[assignment]


# -- memory: what moto keeps of requests it has answered -----------------------------------------

# DynamoDB Streams keeps a record 24 hours, and a shard iterator expires 15 minutes after it was
# issued (read at call time: tests shorten them)
STREAM_RETENTION_S = 24 * 3600.0
SHARD_ITERATOR_LIFETIME_S = 15 * 60.0


def bound_memory() -> None:
    """Keep what AWS keeps, not every object a request ever made.

    moto's ``BaseModel`` appends every instance it makes to its class's ``instances_tracked``
    (for moto's own dashboard, ``/moto-api/data.json``) and never lets go: each item a Query,
    Scan or GetItem copies into its answer, each item replaced, each stream record, and each
    whole-table copy that TransactWriteItems takes (one per item in the transaction) to roll back
    with. None of it is garbage, so no collection frees it. The lists are made weak, so the
    dashboard still lists what lives. A table's stream shard points back at its table: that cycle
    kept every discarded table copy until a full collection, which this server defers, so the
    shard's link is weak (a copied table's shard links to the copy).

    A stream record keeps the item's old and new images, in moto as nested dicts of every
    attribute (~40 KB for a LATEST row, most of the emulator's memory in a `make run`); it is
    kept packed (pickled, compressed) and unpacked when read. Stream records older than
    :data:`STREAM_RETENTION_S` are trimmed and shard iterators expire
    :data:`SHARD_ITERATOR_LIFETIME_S` after they were issued, as on AWS (moto keeps both forever).

    moto runs its Flask apps in debug mode, where Flask gives each request whose form it reads a
    class of its own (a better KeyError for a browser's form upload), which references the
    request: a cycle per request, holding the request, its environ and its socket, that only a
    full collection frees. That class is not made.

    TransactWriteItems deep-copies the whole table, its stream records included, once for every
    item of the transaction, to roll back with: the cost of each transaction, and the memory it
    briefly needs, grow with the table, and the high-water mark of the heap with them (a
    `make run` grew ~20 MB a minute with 4 MB of data). A transaction keeps a copy of the items
    it names, and the stream's length, instead."""
    _track_instances_weakly()
    _make_no_class_per_request()
    _link_stream_shards_weakly()
    _pack_stream_records()
    _trim_stream_records()
    _expire_shard_iterators()
    _transactions_keep_only_what_they_touch()


class _Ref(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("key",)
    key: int


class WeakInstances:
    """The list-like ``instances_tracked`` moto reads (``append``, iteration, ``len``), holding
    its instances weakly (moto's models are not all hashable, so no WeakSet)."""

    __slots__ = ("__weakref__", "_gone", "_refs")

    def __init__(self) -> None:
        refs: dict[int, _Ref] = {}

        def gone(ref: _Ref) -> None:
            if refs.get(ref.key) is ref:
                del refs[ref.key]

        self._refs = refs
        self._gone = gone

    def append(self, instance: object) -> None:
        ref = _Ref(instance, self._gone)
        ref.key = id(instance)
        self._refs[ref.key] = ref

    def __iter__(self) -> Iterator[Any]:
        alive = (ref() for ref in list(self._refs.values()))
        return iter([instance for instance in alive if instance is not None])

    def __len__(self) -> int:
        return len(self._refs)


def _track_instances_weakly() -> None:
    from moto.core.common_models import BaseModel  # noqa: PLC0415

    new = BaseModel.__new__

    def tracked_weakly(cls: type, *args: Any, **kwargs: Any) -> Any:
        # a class's list is made when the class is (some modules load on first use) and set
        # anew by /moto-api/reset: replaced by a weak one before the first instance goes in
        if type(cls.__dict__.get("instances_tracked")) is not WeakInstances:
            cls.instances_tracked = WeakInstances()  # type: ignore[attr-defined]
        return new(cls, *args, **kwargs)

    BaseModel.__new__ = staticmethod(tracked_weakly)  # type: ignore[method-assign]


def _make_no_class_per_request() -> None:
    from flask import debughelpers  # noqa: PLC0415 (flask.wrappers imports it on each call)

    def unchanged(request: Any) -> None:
        return None

    debughelpers.attach_enctype_error_multidict = unchanged


def _link_stream_shards_weakly() -> None:
    from moto.dynamodb.models.table import StreamShard  # noqa: PLC0415

    def table(self: Any) -> Any:
        return self._aegis_table()

    def set_table(self: Any, value: Any) -> None:
        self._aegis_table = weakref.ref(value)

    def deepcopy(self: Any, memo: dict[int, Any]) -> Any:
        # copy.deepcopy keeps a weak reference as it is: the copy of a shard copied with its
        # table links to that table's copy (already in memo), as a strong link would
        copied: Any = StreamShard.__new__(StreamShard)
        memo[id(self)] = copied
        for name, value in vars(self).items():
            if name != "_aegis_table":
                setattr(copied, name, copy.deepcopy(value, memo))
        linked = self._aegis_table()
        copied.table = memo.get(id(linked), linked)
        return copied

    StreamShard.table = property(table, set_table)  # type: ignore[assignment]
    StreamShard.__deepcopy__ = deepcopy  # type: ignore[attr-defined]


def _pack_stream_records() -> None:
    from moto.dynamodb.models.table import StreamRecord  # noqa: PLC0415

    init = StreamRecord.__init__

    def record(self: Any) -> Any:
        # while moto's __init__ builds it: the dict itself; after: a copy from the packed bytes
        building = self.__dict__.get("_building")
        if building is not None:
            return building
        return pickle.loads(zlib.decompress(self._packed))  # noqa: S301 (our own bytes)

    def set_record(self: Any, value: Any) -> None:
        self.__dict__["_building"] = value

    def packed(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        built = self.__dict__.pop("_building")
        self.created = built["dynamodb"]["ApproximateCreationDateTime"]
        self._packed = zlib.compress(pickle.dumps(built, protocol=pickle.HIGHEST_PROTOCOL), 1)

    StreamRecord.record = property(record, set_record)  # type: ignore[assignment]
    StreamRecord.__init__ = packed  # type: ignore[method-assign]


def _trim_stream_records() -> None:
    from moto.core.exceptions import JsonRESTError  # noqa: PLC0415
    from moto.core.utils import utcnow  # noqa: PLC0415 (the clock moto stamps records with)
    from moto.dynamodb.models.table import StreamShard  # noqa: PLC0415

    add, get = StreamShard.add, StreamShard.get

    def add_and_trim(self: Any, old: Any, new: Any) -> None:
        add(self, old, new)
        items = self.items
        cutoff = utcnow() - datetime.timedelta(seconds=STREAM_RETENTION_S)
        trimmed = 0
        while trimmed < len(items) and items[trimmed].created < cutoff:
            trimmed += 1
        if trimmed:
            # records are numbered from the shard's first kept one (moto's get and iterators)
            del items[:trimmed]
            self.starting_sequence_number += trimmed

    def get_kept(self: Any, start: int, quantity: int) -> Any:
        if start < self.starting_sequence_number:
            raise JsonRESTError(
                "TrimmedDataAccessException",
                "The operation attempted to read past the oldest stream record in a shard.",
            )
        return get(self, start, quantity)

    StreamShard.add = add_and_trim  # type: ignore[method-assign]
    StreamShard.get = get_kept  # type: ignore[method-assign]


class _ExpiringIterators(OrderedDict[str, Any]):
    """A streams backend's shard iterators, oldest first: one older than
    :data:`SHARD_ITERATOR_LIFETIME_S` is dropped when the next is issued and is refused as
    expired (moto raised a KeyError, a 500, for one it did not know)."""

    def __setitem__(self, arn: str, iterator: Any) -> None:
        now = time.monotonic()
        iterator._aegis_issued = now
        while self:
            oldest = next(iter(self.values()))
            if now - oldest._aegis_issued <= SHARD_ITERATOR_LIFETIME_S:
                break
            self.popitem(last=False)
        super().__setitem__(arn, iterator)

    def __getitem__(self, arn: str) -> Any:
        from moto.core.exceptions import JsonRESTError  # noqa: PLC0415

        iterator = self.get(arn)
        if (
            iterator is None
            or time.monotonic() - iterator._aegis_issued > SHARD_ITERATOR_LIFETIME_S
        ):
            raise JsonRESTError(
                "ExpiredIteratorException", "The shard iterator has expired or is not valid."
            )
        return iterator


def _expire_shard_iterators() -> None:
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend  # noqa: PLC0415

    init = DynamoDBStreamsBackend.__init__

    def expiring(self: Any, region_name: str, account_id: str) -> None:
        init(self, region_name, account_id)
        self.shard_iterators = _ExpiringIterators()

    DynamoDBStreamsBackend.__init__ = expiring  # type: ignore[method-assign]


def _transactions_keep_only_what_they_touch() -> None:
    from moto.dynamodb import models  # noqa: PLC0415
    from moto.dynamodb.models.dynamo_type import DynamoType  # noqa: PLC0415
    from moto.dynamodb.models.table import Table  # noqa: PLC0415

    transact = models.DynamoDBBackend.transact_write_items

    def keep_tables(value: Any, memo: dict[int, Any] | None = None) -> Any:
        # the backup moto takes of each table: the table itself (rolled back below instead)
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)

    class _KeepTables:  # the `copy` module as moto's DynamoDB backend sees it in a transaction
        deepcopy = staticmethod(keep_tables)
        copy = staticmethod(copy.copy)

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved: list[tuple[Any, Any, Any, Any]] = []
        streams: dict[int, tuple[Any, int]] = {}
        for entry in transact_items:
            for op in entry.values():
                table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
                if table is None:
                    continue
                key = op.get("Item") or op.get("Key") or {}
                try:
                    hash_value = DynamoType(key[table.hash_key_attr])
                    range_value = (
                        DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
                    )
                    current = table.get_item(hash_value, range_value)
                except Exception:  # noqa: S112 - a bad key: moto refuses it itself
                    continue
                saved.append((table, hash_value, range_value, copy.deepcopy(current)))
                shard = table.stream_shard
                if shard is not None and id(table) not in streams:
                    streams[id(table)] = (shard, shard.starting_sequence_number + len(shard.items))
        models.copy = _KeepTables  # type: ignore[attr-defined,assignment]
        try:
            transact(self, transact_items)
        except BaseException:
            for table, hash_value, range_value, item in reversed(saved):
                _put_back(table, hash_value, range_value, item)
            for shard, next_sequence in streams.values():
                del shard.items[max(0, next_sequence - shard.starting_sequence_number) :]
            raise
        finally:
            models.copy = copy  # type: ignore[attr-defined]

    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _put_back(table: Any, hash_value: Any, range_value: Any, item: Any) -> None:
    """Item ``(hash_value, range_value)`` of ``table`` as it was (``item``; None: absent)."""
    if range_value is None:
        if item is None:
            table.items.pop(hash_value, None)
        else:
            table.items[hash_value] = item
        return
    partition = table.items[hash_value]
    if item is None:
        partition.pop(range_value, None)
        if not partition:
            del table.items[hash_value]
    else:
        partition[range_value] = item


def enforce_post_policies(clock: motopost.EmulatorClock) -> None:
    """POST Object as S3 decides it (see the module docstring and :mod:`aegis_devstack.motopost`),
    expirations read on ``clock``."""
    from moto.s3.responses import S3Response  # noqa: PLC0415

    post = S3Response._bucket_response_post

    def checked_post(self: Any, request: Any, bucket_name: str) -> Any:
        if "delete" in request.args or not request.headers.get("Content-Length"):
            return post(self, request, bucket_name)  # DeleteObjects; moto's own 411
        enforced = _iam_enforced()
        files = list(request.files.values())
        fields = {str(k): str(v) for k, v in self.form_data.items()}
        form = motopost.PostForm.read(
            fields,
            len(self.body or b"") if files or "file" in fields else None,
            (files[0].filename or "") if files else "",
        )
        try:
            _check_post(self, form, bucket_name, clock.now(), enforced=enforced)
        except motopost.PostRefused as refused:
            return refused.status, {"Content-Type": "application/xml"}, refused.xml()
        if enforced:  # authorized above, as the form's signer; moto would look for a header
            self._authenticate_and_authorize_s3_action = _authorized
        return post(self, request, bucket_name)

    S3Response._bucket_response_post = checked_post  # type: ignore[method-assign]


def _authorized(**_: Any) -> None:
    return None


def _iam_enforced() -> bool:
    from moto import settings  # noqa: PLC0415
    from moto.core.authorization import ActionAuthenticatorMixin  # noqa: PLC0415

    return ActionAuthenticatorMixin.request_count >= settings.INITIAL_NO_AUTH_ACTION_COUNT


def _check_post(
    response: Any, form: motopost.PostForm, bucket: str, now: datetime.datetime, *, enforced: bool
) -> None:
    """A signed form: its policy and signature, and, with enforcement on, its signer's
    s3:PutObject on the key, as a request signed by that key would be authorized. An anonymous
    one (no policy) is refused with enforcement on: the bucket is not publicly writable."""
    from moto.iam.access_control import S3IAMRequest  # noqa: PLC0415

    if not form.signed:
        if enforced:
            raise motopost.PostRefused(403, "AccessDenied", "Access Denied")
        return
    policy = motopost.check_form(form)
    headers = {
        "Authorization": f"{motopost.ALGORITHM} Credential={form.fields['x-amz-credential']}, "
        f"SignedHeaders=host, Signature={form.fields['x-amz-signature']}"
    }
    if form.fields.get("x-amz-security-token"):
        headers["X-Amz-Security-Token"] = form.fields["x-amz-security-token"]
    try:
        signer = S3IAMRequest(
            account_id=response.current_account,
            method="POST",
            path=f"/{bucket}",
            data={},
            body=b"",
            headers=headers,
            action="PutObject",
        )
    except Exception:  # an access key the emulator never issued
        if enforced:
            raise motopost.PostRefused(
                403,
                "InvalidAccessKeyId",
                "The AWS Access Key Id you provided does not exist in our records.",
            ) from None
        signer = None
    if signer is not None:
        motopost.check_signature(form, signer._access_key._secret_access_key)
    motopost.check_policy(policy, form, bucket=bucket, now=now)
    if enforced and signer is not None:
        resource = f"arn:aws:s3:::{bucket}/{form.fields['key']}"
        try:
            _authorize(signer, resource)
        except Exception as err:  # moto's AccessDenied for the signer
            raise motopost.PostRefused(403, "AccessDenied", "Access Denied") from err


def authorize_like_aws() -> None:
    from moto.iam.access_control import IAMRequestBase  # noqa: PLC0415
    from moto.s3.models import FakeBucket  # noqa: PLC0415

    def checked(self: Any, resource: str) -> None:
        _authorize(self, resource)

    IAMRequestBase.check_action_permitted = checked  # type: ignore[method-assign]
    # moto's own look at a bucket policy runs before authentication, without the request's
    # context and for DeleteObject of a version too; the bucket policy is applied with the IAM
    # check instead (see _check_in)
    FakeBucket.get_permission = _neutral  # type: ignore[method-assign]


def _authorize(request: Any, resource: str) -> None:
    """moto's check of one request, as AWS would make it (see the module's docstring)."""
    request._action = _IAM_ACTIONS.get(request._action, request._action)
    service = str(request._action).split(":", 1)[0].lower()
    if service in motopolicy.NOT_EMULATED_SERVICES:
        from moto.core.exceptions import AccessDeniedError  # noqa: PLC0415

        raise AccessDeniedError(
            user_arn=request._access_key.arn,
            action=f"{request._action} (this emulator does not authorize {service} requests "
            "as AWS would, so it refuses every one while policies are enforced)",
        )
    arn = motopolicy.principal_arn(request._access_key.arn)
    # the emulator stands for AWS's HTTPS endpoints (plain HTTP on loopback here): every
    # request counts as one made over TLS
    request._aegis_context = {"aws:PrincipalArn": [arn], "aws:SecureTransport": ["true"]}
    if request._action == "sts:AssumeRole":
        if request._data.get("TokenCode"):
            # a one-time code with the call: what a trust policy's MFA condition asks for
            request._aegis_context["aws:MultiFactorAuthPresent"] = ["true"]
        if request._data.get("ExternalId"):
            request._aegis_context["sts:ExternalId"] = _listed(request._data["ExternalId"])
    if request._action.startswith("dynamodb:"):
        _authorize_dynamodb(request, resource)
        return
    if request._action.startswith("s3:"):
        request._aegis_context.update(motopolicy.s3_context(request._headers))
        if request._action == "s3:DeleteObject" and _VERSION_ID.search(request._path):
            request._action = "s3:DeleteObjectVersion"
    if request._action == "s3:DeleteObject" and "/" not in resource.split(":::", 1)[-1]:
        # DeleteObjects: AWS authorizes s3:DeleteObject on each key, not on the bucket
        for key in _DELETE_KEY.findall(request._body or b""):
            _check_in(request, f"{resource}/{unescape(key.decode())}", {})
        return
    _check_in(request, resource, {})


def _listed(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _authorize_dynamodb(request: Any, resource: str) -> None:
    body = json.loads(request._body or b"{}")
    table_arn = f"arn:aws:dynamodb:{request._region}:{request.account_id}:table/"

    def hash_key(table: str) -> str | None:
        return _hash_key(request.account_id, request._region, table)

    if body.get("RequestItems"):
        # BatchGetItem / BatchWriteItem: AWS authorizes the action on every table named
        for name in body["RequestItems"]:
            batch = motopolicy.dynamodb_context(body, hash_key(name), name, request._action)
            _check_in(request, table_arn + name, batch)
        return
    if request._action == "dynamodb:TransactWriteItems":
        for entry in body.get("TransactItems", []):
            for kind, item in entry.items():
                request._action = _TRANSACT_ACTIONS[kind]
                table = item["TableName"]
                one = motopolicy.dynamodb_context(item, hash_key(table), None, request._action)
                _check_in(request, table_arn + table, one)
        return
    context: dict[str, list[str]] = {}
    if body.get("ResourceArn"):  # tags: authorized on the tagged table
        resource = str(body["ResourceArn"])
    elif body.get("StreamArn"):  # DescribeStream, GetShardIterator: on the stream
        resource = str(body["StreamArn"])
    elif body.get("ShardIterator"):
        # GetRecords: AWS authorizes it on the iterator's stream; moto's iterators begin with
        # that stream's ARN (``{stream_arn}|1|{id}``)
        resource = str(body["ShardIterator"]).split("|", 1)[0]
    elif body.get("TableName"):
        resource = table_arn + body["TableName"]
        context = motopolicy.dynamodb_context(
            body, hash_key(body["TableName"]), None, request._action
        )
        if body.get("IndexName"):  # a Query or Scan of an index is authorized on it
            resource += f"/index/{body['IndexName']}"
    _check_in(request, resource, context)


def _hash_key(account: str, region: str, table: str) -> str | None:
    from moto.dynamodb.models import dynamodb_backends  # noqa: PLC0415

    try:
        return str(dynamodb_backends[account][region].get_table(table).hash_key_attr)
    except Exception:  # no such table: the call itself will say so
        return None


def _check_in(request: Any, resource: str, context: dict[str, list[str]]) -> None:
    """The caller's identity policies and the bucket's policy, decided as AWS does
    (:func:`aegis_devstack.motopolicy.decide`) with the request's context; for AssumeRole, the
    role's trust policy as well."""
    if request._action == "sts:GetCallerIdentity":  # AWS answers it whatever the policies say
        return
    caller = request._access_key.arn
    token = motopolicy.CURRENT.set({**request._aegis_context, **context})
    try:
        documents = [_document(p) for p in request._access_key.collect_policies()]
        decision = motopolicy.decide(
            documents,
            request._action,
            resource,
            bucket_policy=_bucket_policy(request, resource),
            caller=caller,
        )
        if decision is not motopolicy.Decision.ALLOW:
            request._raise_access_denied()
        trust = _trust_policy(request, resource)
        if trust is not None and not motopolicy.trust_allows(
            trust, caller, request._action, resource
        ):
            request._raise_access_denied()
    finally:
        motopolicy.CURRENT.reset(token)


def _document(policy: Any) -> Any:
    """A stored policy's document: a managed policy's default version, an inline one as given."""
    from moto.iam.access_control import IAMPolicy  # noqa: PLC0415

    if isinstance(policy, dict) and "Statement" in policy:  # a CloudFormation role's inline one
        return policy
    return IAMPolicy(policy)._policy_json


def _bucket_policy(request: Any, resource: str) -> bytes | None:
    from moto.s3.models import s3_backends  # noqa: PLC0415

    if not request._action.startswith("s3:"):
        return None
    name = resource.split(":::", 1)[-1].split("/", 1)[0]
    bucket = s3_backends[request.account_id]["aws"].buckets.get(name)
    return bucket.policy if bucket is not None else None


def _trust_policy(request: Any, resource: str) -> Any:
    """The trust policy of the role an AssumeRole names (None for any other request)."""
    if request._action != "sts:AssumeRole" or ":role/" not in resource:
        return None
    try:
        role = request.backend.get_role_by_arn(resource)
    except Exception:  # no such role: the call itself will say so
        return None
    return _document(role.assume_role_policy_document)


def _neutral(self: Any, action: str, resource: str) -> Any:
    from moto.iam.access_control import PermissionResult  # noqa: PLC0415

    return PermissionResult.NEUTRAL


# every moto method that stores a policy document: (class path, method, document parameter, kind)
_POLICY_SETTERS = (
    ("moto.iam.models.IAMBackend", "create_policy", "policy_document", "identity"),
    ("moto.iam.models.IAMBackend", "create_policy_version", "policy_document", "identity"),
    ("moto.iam.models.IAMBackend", "put_role_policy", "policy_json", "identity"),
    ("moto.iam.models.IAMBackend", "put_user_policy", "policy_json", "identity"),
    ("moto.iam.models.IAMBackend", "put_group_policy", "policy_json", "identity"),
    ("moto.iam.models.Role", "put_policy", "policy_json", "identity"),
    ("moto.iam.models.IAMBackend", "create_role", "assume_role_policy_document", "trust"),
    ("moto.iam.models.IAMBackend", "update_assume_role_policy", "policy_document", "trust"),
    ("moto.s3.models.S3Backend", "put_bucket_policy", "policy", "bucket"),
)


def refuse_unsupported_policies() -> None:
    """A policy document the evaluator would not apply as AWS does is refused when it is stored
    (:func:`aegis_devstack.motopolicy.validate_policy`): IAM answers MalformedPolicyDocument, S3
    MalformedPolicy (400), naming every problem. moto's CloudFormation stores policies through
    the same methods, so a template's are checked too."""
    for path, name, parameter, kind in _POLICY_SETTERS:
        module, cls_name = path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), cls_name)
        setattr(cls, name, _validating(getattr(cls, name), parameter, kind))


def _validating(method: Callable[..., Any], parameter: str, kind: str) -> Callable[..., Any]:
    signature = inspect.signature(method)

    @functools.wraps(method)
    def stored(*args: Any, **kwargs: Any) -> Any:
        document = signature.bind(*args, **kwargs).arguments[parameter]
        try:
            motopolicy.validate_policy(document, kind)  # type: ignore[arg-type]
        except motopolicy.UnsupportedPolicy as err:
            raise _refusal(kind, str(err)) from err
        return method(*args, **kwargs)

    return stored


def _refusal(kind: str, problems: str) -> Exception:
    message = f"this emulator does not evaluate this policy as AWS would: {problems}"
    if kind == "bucket":
        from moto.s3.exceptions import S3ClientError  # noqa: PLC0415

        return S3ClientError("MalformedPolicy", message)
    from moto.iam.exceptions import MalformedPolicyDocument  # noqa: PLC0415

    return MalformedPolicyDocument(message)


class _BodyReader(io.RawIOBase):
    """A kept-alive connection's reader: between requests it reads the socket as it is (the
    request line and headers); while a request is served it reads that request's body and
    nothing past it, so neither the application nor werkzeug's drain after the answer (which
    reads whatever the socket holds, to spare a client a reset) can take the next request's
    bytes. ``body_left`` None: not in a request."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw
        self.body_left: int | None = None

    def readable(self) -> bool:
        return True

    def _limit(self, size: int | None) -> int | None:
        if self.body_left is None:
            return size
        if size is None or size < 0:
            return self.body_left
        return min(size, self.body_left)

    def _took(self, data: bytes) -> bytes:
        if self.body_left is not None:
            self.body_left -= len(data)
        return data

    def read(self, size: int | None = -1) -> bytes:
        limit = self._limit(size)
        if limit == 0:
            return b""
        return self._took(self.raw.read(limit if limit is not None else -1))

    def read1(self, size: int = -1) -> bytes:
        limit = self._limit(size)
        if limit == 0:
            return b""
        return self._took(self.raw.read1(limit if limit is not None else -1))

    def readline(self, size: int | None = -1) -> bytes:
        limit = self._limit(size)
        if limit == 0:
            return b""
        return self._took(self.raw.readline(limit if limit is not None else -1))

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.raw.close()
        super().close()


# the environ key of an AWS request's (service, operation), as counted
OPERATION_KEY = "aegis.operation"
# what the emulator logs when an answer could not be written (see log_undelivered_answers)
UNDELIVERED = "answer not delivered"


def log_undelivered_answers() -> None:
    """Log each request whose answer could not be written, its connection gone (werkzeug
    otherwise drops it silently): ``answer not delivered: <service> <operation> <method> <path>
    (<error>)``. What was applied stands; the client never learned it was, and an AWS SDK sends
    such a request again, so a create sent again finds what the first one made ("already
    exists"). The line tells that case apart from a client that gave up on its own."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler  # noqa: PLC0415

    def dropped(self: Any, error: BaseException, environ: Any = None) -> None:
        if environ is None:  # between requests: a client that closed an idle connection
            return
        sys.stderr.write(
            f"{UNDELIVERED}: {' '.join(environ.get(OPERATION_KEY, ('-',)))}"
            f" {environ.get('REQUEST_METHOD')}"
            f" {environ.get('PATH_INFO')} ({error!r})\n"
        )
        sys.stderr.flush()

    MotoRequestHandler.connection_dropped = dropped  # type: ignore[method-assign]


def keep_connections_alive() -> None:
    """Answer on the connection the request came on, as S3 and DynamoDB do, instead of closing
    it after every answer as werkzeug's development server does: each request then cost a TCP
    connection, a server thread and the client's connection set-up (measured: a simple GetItem
    or PutObject 3.4-4.1 ms of the emulator's CPU).

    werkzeug closes because http.server cannot tell where a request's body ends: whatever is
    left unread would be taken for the next request, and werkzeug's own drain after an answer
    reads everything the socket holds. So a kept connection reads through :class:`_BodyReader`,
    which, while a request is served, reads that request's body (its ``Content-Length``) and
    nothing more, and whatever of it the application left is read before the next request line.
    A request without a length it can trust (a chunked body, HTTP/1.0, ``Connection: close``)
    still closes the connection after its answer."""
    from moto.moto_server.werkzeug_app import MotoRequestHandler  # noqa: PLC0415

    setup, make_environ = MotoRequestHandler.setup, MotoRequestHandler.make_environ
    send_header, run_wsgi = MotoRequestHandler.send_header, MotoRequestHandler.run_wsgi

    def kept_setup(self: Any) -> None:
        setup(self)
        # an answer is written in pieces (status and headers, then the body): without this, the
        # body of a kept connection waits for the client's delayed ACK of the headers (~40 ms)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = _BodyReader(self.rfile)
        self.aegis_keep = False

    def framed_environ(self: Any) -> dict[str, Any]:
        environ: dict[str, Any] = make_environ(self)
        length = environ.get("CONTENT_LENGTH") or "0"
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        self.aegis_keep = (
            self.request_version == "HTTP/1.1"
            and not self.close_connection
            and not chunked
            and length.isdigit()
        )
        if self.aegis_keep:
            self.rfile.body_left = int(length)
        return environ

    def kept_header(self: Any, keyword: str, value: str) -> None:
        if self.aegis_keep and keyword.lower() == "connection" and value.lower() == "close":
            return  # werkzeug's "always close": this connection is kept
        send_header(self, keyword, value)

    def served(self: Any) -> None:
        try:
            run_wsgi(self)
        finally:
            reader: _BodyReader = self.rfile
            if self.aegis_keep:
                try:
                    while reader.body_left and reader.read(65536):
                        pass  # what the application left of the body, not the next request
                except OSError:
                    self.close_connection = True
                if reader.body_left:
                    self.close_connection = True  # the client sent less than it said
            reader.body_left = None
            self.aegis_keep = False

    MotoRequestHandler.setup = kept_setup  # type: ignore[method-assign]
    MotoRequestHandler.make_environ = framed_environ  # type: ignore[method-assign]
    MotoRequestHandler.send_header = kept_header  # type: ignore[method-assign]
    MotoRequestHandler.run_wsgi = served  # type: ignore[method-assign]


# the DynamoDB calls that write nothing (an item's size measured before one still holds after it)
DYNAMODB_READS = frozenset(
    {
        "GetItem",
        "BatchGetItem",
        "Query",
        "Scan",
        "TransactGetItems",
        "DescribeTable",
        "ListTables",
        "DescribeTimeToLive",
        "DescribeContinuousBackups",
        "ListTagsOfResource",
    }
)
# moto's item limit (LimitedSizeDict's): AWS's 400 KB, which it measured to lie between 409 and 410 KB
ITEM_SIZE_LIMIT = 405_000


def serve_without_waste() -> None:
    """What moto_server does per request that answers nothing, each measured under the test
    suite (sampling profiles of the session's emulator):

    - it lists its own package's folders, a stat per folder, to tell a service's name from a
      host (twice per request): the list is read once, it never changes while running;
    - werkzeug writes an access-log line per request: only a request answered with a server
      error (5xx) is logged now; every request is counted at ``/_aegis/requests`` instead;
    - moto checks DynamoDB's 400 KB item limit at each attribute it sets while it builds an item,
      sizing every attribute set so far again (an item of n attributes is sized n times over,
      ~10 % of the emulator's CPU under the services' tests): an item is built, then sized once,
      and refused alike (ItemSizeTooLarge) when it is over; an update's attribute is still
      checked as it is set;
    - a Query sizes every item of the partition it reads, those its key condition leaves out
      too, for its 1 MB page: ~10 % of the emulator's CPU under the services' tests. An item's
      size is kept until the next DynamoDB request that may write (any but the reads in
      :data:`DYNAMODB_READS`; an update changes items in place, so none is trusted past it);
    - to find the method of an action it lists every member of the handler's class with
      ``inspect.getmembers`` (~12 % of a GetItem's CPU): the names are listed once per class,
      which never changes while it runs;
    - a request's id (52 characters) is drawn one ``random.choice`` at a time: drawn in one call
      of moto's own random source now (seeding it through ``/moto-api/seed`` still fixes them)."""
    import moto.core.responses  # noqa: PLC0415
    from moto import backends  # noqa: PLC0415
    from moto.core.utils import method_names_from_class  # noqa: PLC0415
    from moto.dynamodb.exceptions import ItemSizeTooLarge  # noqa: PLC0415
    from moto.dynamodb.models.dynamo_type import DynamoType, Item, LimitedSizeDict  # noqa: PLC0415
    from moto.dynamodb.responses import DynamoHandler  # noqa: PLC0415
    from moto.moto_api._internal import mock_random  # noqa: PLC0415
    from werkzeug.serving import WSGIRequestHandler  # noqa: PLC0415

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules
    log_request = WSGIRequestHandler.log_request

    def log_server_error(self: WSGIRequestHandler, code: Any = "-", size: Any = "-") -> None:
        if str(getattr(code, "value", code)).startswith("5"):
            log_request(self, code, size)

    WSGIRequestHandler.log_request = log_server_error  # type: ignore[method-assign]

    def sized_once(self: Item, hash_key: Any, range_key: Any, attrs: dict[str, Any]) -> None:
        self.hash_key, self.range_key = hash_key, range_key
        self.attrs = LimitedSizeDict()
        for key, value in attrs.items():
            dict.__setitem__(self.attrs, key, DynamoType(value))
        if self.size() > ITEM_SIZE_LIMIT:
            raise ItemSizeTooLarge

    Item.__init__ = sized_once  # type: ignore[method-assign]

    # how many DynamoDB requests that may write were served so far, and whether the one being
    # served may write
    writes, writing = [0], [False]
    size, call_action = Item.size, DynamoHandler.call_action

    def kept_size(self: Item) -> int:
        if writing[0]:  # its items may change under it: measured each time, and not kept
            return int(size(self))
        kept: tuple[int, int] | None = self.__dict__.get("_aegis_size")
        if kept is not None and kept[0] == writes[0]:
            return kept[1]
        measured = int(size(self))
        self.__dict__["_aegis_size"] = (writes[0], measured)
        return measured

    def counted_action(self: Any) -> Any:
        writing[0] = self._get_action() not in DYNAMODB_READS
        if writing[0]:
            writes[0] += 1
        return call_action(self)

    Item.size = kept_size  # type: ignore[method-assign]
    DynamoHandler.call_action = counted_action  # type: ignore[method-assign]

    methods_of = functools.cache(lambda cls: frozenset(method_names_from_class(cls)))
    moto.core.responses.method_names_from_class = methods_of  # type: ignore[attr-defined,assignment]

    def request_id(headers: dict[str, Any] | None = None) -> str:
        drawn = "".join(mock_random.choices(REQUEST_ID_CHARACTERS, k=52))
        if isinstance(headers, dict):
            headers["x-amzn-requestid"] = drawn
        return drawn

    moto.core.responses.gen_amzn_requestid_long = request_id  # type: ignore[attr-defined,assignment]


# what moto draws a request's id from
REQUEST_ID_CHARACTERS = string.ascii_letters + string.digits


def query_reads_only_what_it_may_answer() -> None:
    """A Query of a table reads that partition's items, and a Query of an index the table's items
    as they are, unsorted. moto's ``Table.query`` starts from ``all_items()``: every item of the
    table, sorted by its key (a comparison of two numbers makes two Decimals), of which it keeps
    the partition, or the index's matches, and sorts those again. A Query of one item in a
    1,050-item table of 20 partitions took 10.5 ms of the emulator's CPU (2.2 ms now), and every
    Query of a long ``make run`` grew with the whole table.

    The answer is the same item for item: the partition of a hash key is the table's
    ``items[hash_key]`` (the items it holds are those whose key equals it, by the same equality),
    and what an index's Query keeps moto sorts by the index's keys and then the table's, which
    tell every item apart, so the order it was read in cannot show. A table Query without a hash
    key is left to moto as it is. The emulator serves one request at a time, so a Query's own view
    of ``all_items`` is never seen by another."""
    from moto.dynamodb.models.table import Table  # noqa: PLC0415

    Table.query = reading_only_what_it_may_answer(Table.query)  # type: ignore[method-assign]


def reading_only_what_it_may_answer(query: Callable[..., Any]) -> Callable[..., Any]:
    """moto's ``Table.query`` given, for the Query it answers, only the items it may answer
    from (see :func:`query_reads_only_what_it_may_answer`)."""

    @functools.wraps(query)
    def partition_first(self: Any, hash_key: Any, *args: Any, **kwargs: Any) -> Any:
        # moto passes the index's name by position, after the projection (None: the table's)
        index_name = args[6] if len(args) > 6 else kwargs.get("index_name")
        if index_name:
            held = list(self.items.values())
            read = [i for h in held for i in h.values()] if self.range_key_attr else held
        elif hash_key is not None:
            partition = self.items.get(hash_key)  # (a defaultdict: get adds nothing)
            if partition is None:
                read = []
            else:
                read = list(partition.values()) if self.range_key_attr else [partition]
        else:
            return query(self, hash_key, *args, **kwargs)
        self.__dict__["all_items"] = lambda: read
        try:
            return query(self, hash_key, *args, **kwargs)
        finally:
            del self.__dict__["all_items"]

    return partition_first


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main  # noqa: PLC0415

    gc.set_threshold(700, 10, 1_000_000)
    serve_without_waste()
    query_reads_only_what_it_may_answer()
    keep_connections_alive()
    log_undelivered_answers()
    motojson.answer_item_calls_directly()
    bound_memory()
    clock = motopost.EmulatorClock()
    lock = serialize_requests(float(os.environ.get(LATENCY_ENV, "0")) / 1000, clock=clock)
    long_polls_wait_outside(lock)
    enforce_post_policies(clock)
    honour_copy_if_none_match()
    keep_and_check_put_checksums()
    replace_dynamodb_tag_values()
    route_cloudformation_state_machines()
    authorize_like_aws()
    refuse_unsupported_policies()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
