"""Read and reset the AWS requests the local emulator (:mod:`aegis_devstack.motoserver`) counted:
for tests and benchmarks that assert which S3/DynamoDB requests the platform sends. And register
the Lambda functions whose code a local runtime runs (:mod:`aegis_devstack.testing.lambdaruntime`)
instead of moto, and stop the emulator's clock (what a POST policy's expiration is read against).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "RequestCounts",
    "arequest_counts",
    "areset_request_counts",
    "emulator_clock_at",
    "fleet_table",
    "lambda_functions",
    "register_lambda",
    "request_counts",
    "reset_request_counts",
    "set_emulator_clock",
    "unregister_lambda",
]


def fleet_table(name: str, *, projection: str = "ALL", stream: bool = False) -> dict[str, Any]:
    """CreateTable arguments for a table of the read model's shape: pk/sk strings and the "fleet"
    index on fleet_pk/fleet_sk (``projection``), on demand; ``stream``: NEW_AND_OLD_IMAGES."""
    spec: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": attr, "AttributeType": "S"}
            for attr in ("pk", "sk", "fleet_pk", "fleet_sk")
        ],
        "KeySchema": [
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": "fleet",
                "KeySchema": [
                    {"AttributeName": "fleet_pk", "KeyType": "HASH"},
                    {"AttributeName": "fleet_sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": projection},
            }
        ],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if stream:
        spec["StreamSpecification"] = {
            "StreamEnabled": True,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        }
    return spec


COUNTS_PATH = "/_aegis/requests"  # aegis_devstack.motoserver.COUNTS_PATH
RESET_PATH = "/_aegis/requests/reset"
LAMBDA_PATH = "/_aegis/lambda"  # aegis_devstack.motoserver.LAMBDA_PATH
CLOCK_PATH = "/_aegis/clock"  # aegis_devstack.motoserver.CLOCK_PATH

Figures = Mapping[str, int]


@dataclass(frozen=True)
class RequestCounts:
    """One snapshot of the emulator's counts, or the difference of two (``after - before``).

    ``requests`` maps service (``s3``, ``dynamodb``, ``cloudwatch``, ``sts``, ...) to operation to
    figures: ``count`` for every operation; for DynamoDB also ``items_returned``,
    ``items_scanned``, ``unprocessed`` and ``bytes_returned``. A Query or Scan of an index is its
    own operation, ``Query@<index>``. ``since`` is when the counts were last reset, ``at`` when the
    snapshot was taken (both epoch seconds; for a difference, the two snapshots' ``at``)."""

    requests: Mapping[str, Mapping[str, Figures]]
    since: float
    at: float

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestCounts:
        requests = {
            str(service): {
                str(op): {str(name): int(value) for name, value in figures.items()}
                for op, figures in ops.items()
            }
            for service, ops in data["requests"].items()
        }
        since = float(data["since"])
        return cls(requests=requests, since=since, at=float(data.get("at", since)))

    def count(self, service: str, op: str) -> int:
        """Requests of ``op`` (e.g. ``"GetObject"``, ``"Query@fleet"``) to ``service``."""
        return self._figure(service, op, "count")

    def total(self, service: str) -> int:
        """All requests to ``service``."""
        return sum(figures.get("count", 0) for figures in self.requests.get(service, {}).values())

    def ops(self, service: str) -> dict[str, int]:
        """The number of requests per operation to ``service`` (operations never sent left out)."""
        return {
            op: figures.get("count", 0)
            for op, figures in self.requests.get(service, {}).items()
            if figures.get("count", 0)
        }

    def items_returned(self, op: str | None = None) -> int:
        """Items DynamoDB returned to ``op`` (every operation's when None)."""
        return self._dynamodb("items_returned", op)

    def items_scanned(self, op: str | None = None) -> int:
        """Items DynamoDB read for ``op`` (ScannedCount; every operation's when None)."""
        return self._dynamodb("items_scanned", op)

    def unprocessed(self, op: str | None = None) -> int:
        """Keys DynamoDB left unprocessed in ``op``'s answers (BatchGetItem)."""
        return self._dynamodb("unprocessed", op)

    def bytes_returned(self, op: str | None = None) -> int:
        """Response bytes DynamoDB sent for ``op`` (every operation's when None)."""
        return self._dynamodb("bytes_returned", op)

    def __sub__(self, earlier: RequestCounts) -> RequestCounts:
        """What was counted between ``earlier`` and this snapshot (of the same counting period)."""
        if not isinstance(earlier, RequestCounts):
            return NotImplemented
        if earlier.since != self.since:
            raise ValueError("the counts were reset between the two snapshots")
        requests: dict[str, dict[str, dict[str, int]]] = {}
        for service, ops in self.requests.items():
            for op, figures in ops.items():
                before = earlier.requests.get(service, {}).get(op, {})
                delta = {name: value - before.get(name, 0) for name, value in figures.items()}
                if any(delta.values()):
                    requests.setdefault(service, {})[op] = delta
        return RequestCounts(requests=requests, since=earlier.at, at=self.at)

    def _figure(self, service: str, op: str, name: str) -> int:
        return self.requests.get(service, {}).get(op, {}).get(name, 0)

    def _dynamodb(self, name: str, op: str | None) -> int:
        if op is not None:
            return self._figure("dynamodb", op, name)
        return sum(figures.get(name, 0) for figures in self.requests.get("dynamodb", {}).values())


def _request(endpoint_url: str, path: str, method: str, body: Any = None) -> urllib.request.Request:
    if urlsplit(endpoint_url).scheme not in ("http", "https"):
        raise ValueError(f"not an http(s) endpoint: {endpoint_url!r}")
    url = endpoint_url.rstrip("/") + path
    if body is not None:
        data: bytes | None = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
    else:
        data, headers = (b"" if method == "POST" else None), {}
    return urllib.request.Request(url, data=data, headers=headers, method=method)  # noqa: S310


def _call(request: urllib.request.Request, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 (http(s) only)
            body: bytes = answer.read()
            return body
    except urllib.error.HTTPError as err:
        err.close()
        raise RuntimeError(
            f"{request.get_method()} {request.full_url} answered {err.code}: "
            "is this the AEGIS emulator (python -m aegis_devstack.motoserver)?"
        ) from err


def request_counts(endpoint_url: str, *, timeout: float = 5.0) -> RequestCounts:
    """The requests the emulator at ``endpoint_url`` counted since its last reset."""
    answer = _call(_request(endpoint_url, COUNTS_PATH, "GET"), timeout)
    return RequestCounts.from_json(json.loads(answer))


def reset_request_counts(endpoint_url: str, *, timeout: float = 5.0) -> None:
    """Zero the emulator's request counts."""
    _call(_request(endpoint_url, RESET_PATH, "POST"), timeout)


async def arequest_counts(endpoint_url: str) -> RequestCounts:
    """:func:`request_counts` from async code (in a worker thread)."""
    return await asyncio.to_thread(request_counts, endpoint_url)


async def areset_request_counts(endpoint_url: str) -> None:
    """:func:`reset_request_counts` from async code (in a worker thread)."""
    await asyncio.to_thread(reset_request_counts, endpoint_url)


async def register_lambda(endpoint_url: str, function: str, url: str) -> None:
    """Have the emulator forward Invoke requests of ``function`` (a name or ARN) to the local
    runtime whose invocation URL is ``url``, instead of running them in moto; a registration of the
    same function is replaced."""
    request = _request(endpoint_url, LAMBDA_PATH, "POST", {"function": function, "url": url})
    await asyncio.to_thread(_call, request, 5.0)


async def unregister_lambda(endpoint_url: str, function: str) -> None:
    """Invoke requests of ``function`` are moto's again (nothing happens if it was not registered)."""
    request = _request(endpoint_url, LAMBDA_PATH, "POST", {"function": function, "url": None})
    await asyncio.to_thread(_call, request, 5.0)


async def lambda_functions(endpoint_url: str) -> dict[str, str]:
    """The registered functions: name to the local runtime's invocation URL."""
    answer = await asyncio.to_thread(_call, _request(endpoint_url, LAMBDA_PATH, "GET"), 5.0)
    functions = json.loads(answer)["functions"]
    return {str(name): str(url) for name, url in functions.items()}


async def set_emulator_clock(endpoint_url: str, at: datetime | None) -> None:
    """Stop the emulator's clock at ``at`` (aware), or let it follow the system clock (None)."""
    body = {"now": None if at is None else at.isoformat()}
    await asyncio.to_thread(_call, _request(endpoint_url, CLOCK_PATH, "POST", body), 5.0)


@asynccontextmanager
async def emulator_clock_at(endpoint_url: str, at: datetime) -> AsyncIterator[None]:
    """The emulator's clock stopped at ``at`` for the block, then following the system's."""
    await set_emulator_clock(endpoint_url, at)
    try:
        yield
    finally:
        await set_emulator_clock(endpoint_url, None)


async def post_form(
    url: str, fields: Mapping[str, str], body: bytes, *, filename: str = "image"
) -> tuple[int, str]:
    """POST ``fields`` and then ``body`` as the form's ``file`` (multipart/form-data, the file
    last, as S3 wants it) to ``url``: what a gateway does with a presigned upload. Returns the
    status and the answer's text (S3's error XML when refused)."""
    import httpx  # noqa: PLC0415 (only the upload tests need it)

    async with httpx.AsyncClient(timeout=10) as http:
        answer = await http.post(url, data=dict(fields), files={"file": (filename, body)})
    return answer.status_code, answer.text
