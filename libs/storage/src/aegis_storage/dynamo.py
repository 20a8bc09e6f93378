"""DynamoDB item calls on a lean client: what the read model sends per message, at a fraction of
the client CPU botocore spends on it.

Every call the read model makes (GetItem, PutItem, UpdateItem, DeleteItem, BatchGetItem,
TransactWriteItems, Query and Scan pages) is a JSON document in and a JSON document out. botocore
builds each one through its model, event hooks, endpoint rules and user-agent string; measured on
one conditional PutItem that is ~0.9 ms of client CPU, where aiodynamo's request path (sign, send
on a kept-alive aiohttp session, parse) costs ~0.38 ms. :class:`DynamoItems` sends the very
request bodies the read model already builds (DynamoDB attribute values) on aiodynamo's
transport, credentials, retry configuration and error classes, and returns the response
documents as botocore would (botocore passes DynamoDB's JSON through unchanged: numbers stay
strings, there are no binary attributes in AEGIS's items). Of what aiodynamo still spent, two
thirds went to ``json.dumps`` and to deriving the signing key for every request: bodies are
encoded by orjson, once for all attempts, and :class:`Signer` keeps its signing key per day
(its signatures are botocore's, checked by the tests).
The control plane (tables, indexes, TTL, tags) stays on aiobotocore.

Kept from the aiobotocore client, so nothing about a call changes but its CPU:
- credentials: the same botocore credential chain (environment, profile, IRSA web identity, ECS
  task role, instance profile), refreshed by botocore before they expire, or the emulator's
  fixed key exactly when the aiobotocore clients use it;
- endpoint, region, connection pool size, connect and read time-outs of :class:`AwsConfig`;
- retries: throttling, 5xx, time-outs and dropped connections are retried up to
  ``max_attempts`` with capped exponential back-off and full jitter (what botocore's standard
  mode does); an expired token is retried with fresh credentials;
- errors: raised as aiodynamo's, turned into :mod:`aegis_storage.errors` by ``translated`` like
  botocore's (a failed condition is a ``Conflict``, a missing table ``NotFound``, throttling
  after the last attempt ``Transient``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiodynamo.client import Client
from aiodynamo.credentials import Credentials, Key, StaticCredentials
from aiodynamo.errors import BrokenThrottleConfig, NoCredentialsFound, exception_from_response
from aiodynamo.http.types import Request, RequestFailed, Response
from aiodynamo.models import RetryConfig, RetryTimeout
from aiodynamo.sign import make_default_endpoint
from yarl import URL

from aegis_contracts.backoff import jittered_s

if TYPE_CHECKING:
    from aiobotocore.session import AioSession
    from aiodynamo.http.types import HttpImplementation

    from aegis_storage.clients import AwsConfig

_SERVICE = "dynamodb"
_CONTENT_TYPE = "application/x-amz-json-1.0"
_API_VERSION = "DynamoDB_20120810"
_ALGORITHM = "AWS4-HMAC-SHA256"
_SIGNED_HEADERS = "content-type;host;x-amz-date;x-amz-target"
# signing keys kept (one per access key and day: a handful; cleared past this)
_SIGNING_KEYS_KEPT = 16

BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 20.0


def backoff_s(attempt: int) -> float:
    """The wait before retry ``attempt`` (1 for the first retry), with full jitter."""
    return jittered_s(attempt, first=BACKOFF_BASE_S, cap=BACKOFF_CAP_S)


@dataclass(frozen=True)
class Attempts(RetryConfig):
    """At most ``max_attempts`` tries. After the last one aiodynamo raises the last error seen
    (a :class:`RetryTimeout` from here makes it do so; a loop that simply ended would not)."""

    max_attempts: int = 5

    def delays(self) -> Iterable[float]:
        return (backoff_s(n) for n in range(1, self.max_attempts))

    async def attempts(self) -> AsyncIterable[None]:
        for n in range(1, self.max_attempts + 1):
            yield
            if n == self.max_attempts:
                raise RetryTimeout
            await asyncio.sleep(backoff_s(n))


class BotocoreCredentials(Credentials):
    """The botocore credential chain, as aiodynamo asks for it: the same credentials as every
    aiobotocore client of the process, refreshed by botocore before they expire."""

    def __init__(self, session: AioSession) -> None:
        self._session = session
        self._credentials: Any = None

    async def get_key(self, http: HttpImplementation) -> Key | None:
        if self._credentials is None:
            self._credentials = await self._session.get_credentials()
            if self._credentials is None:
                return None
        frozen = await self._credentials.get_frozen_credentials()
        return Key(id=frozen.access_key, secret=frozen.secret_key, token=frozen.token)

    def invalidate(self) -> bool:
        # refreshable credentials refresh themselves ahead of expiry; asking the chain again
        # finds a rotated key in the environment or profile
        self._credentials = None
        return True

    def is_disabled(self) -> bool:
        return False


@dataclass(frozen=True)
class _Http:
    """aiodynamo's requests on an aiohttp session. aiodynamo signs the endpoint's host without
    its port; the Host header sent says the same, so that a service that checks signatures on a
    non-default port (an emulator, a proxy) computes the one that was signed. AWS's endpoints
    use the default port, where both are the same."""

    session: aiohttp.ClientSession

    async def __call__(self, request: Request) -> Response:
        headers = dict(request.headers or {})
        url = URL(request.url)
        if url.explicit_port is not None and url.host:
            headers["Host"] = url.host
        try:
            async with self.session.request(
                request.method, url, headers=headers, data=request.body
            ) as response:
                return Response(response.status, await response.read())
        except aiohttp.ClientError as err:
            raise RequestFailed(err) from err


class _Pages:
    """``paginate(**request)``: the pages of a Query or Scan, as botocore's paginator yields them."""

    def __init__(self, items: DynamoItems, action: str) -> None:
        self._items = items
        self._action = action

    async def paginate(self, **request: Any) -> AsyncIterator[dict[str, Any]]:
        """``PaginationConfig={"PageSize": n}`` becomes each page's ``Limit``, as botocore's
        paginator sends it; the config is never sent (DynamoDB does not know it)."""
        config = dict(request.pop("PaginationConfig", None) or {})
        if "PageSize" in config:
            request["Limit"] = config.pop("PageSize")
        if config:
            raise ValueError(f"PaginationConfig keys not supported here: {sorted(config)}")
        while True:
            page = await self._items.call(self._action, request)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            request = {**request, "ExclusiveStartKey": last}


class Signer:
    """Signature Version 4 of a DynamoDB request, as aiodynamo's ``signed_dynamo_request`` makes
    it (POST /, the same four signed headers, the host without its port), with what does not
    change between requests made once: the signing key per key, day and region, the credential
    scope, the timestamp per second. The body is given as bytes, encoded once for every
    attempt."""

    def __init__(
        self, region: str, endpoint: URL, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.region = region
        self.endpoint = endpoint
        self._clock = clock
        self.host = endpoint.host or ""
        self._keys: dict[tuple[str, str], bytes] = {}
        self._second = -1
        self._stamp = ("", "")  # x-amz-date, its day

    def _now(self) -> tuple[str, str]:
        second = int(self._clock())
        if second != self._second:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            self._second, self._stamp = second, (stamp, stamp[:8])
        return self._stamp

    def _signing_key(self, secret: str, day: str) -> bytes:
        found = self._keys.get((secret, day))
        if found is None:
            if len(self._keys) > _SIGNING_KEYS_KEPT:
                self._keys.clear()
            found = b"AWS4" + secret.encode()
            for part in (day, self.region, _SERVICE, "aws4_request"):
                found = hmac.new(found, part.encode(), hashlib.sha256).digest()
            self._keys[(secret, day)] = found
        return found

    def request(self, key: Key, action: str, body: bytes) -> Request:
        stamp, day = self._now()
        target = f"{_API_VERSION}.{action}"
        canonical = (
            f"POST\n/\n\ncontent-type:{_CONTENT_TYPE}\nhost:{self.host}\n"
            f"x-amz-date:{stamp}\nx-amz-target:{target}\n\n{_SIGNED_HEADERS}\n"
            f"{hashlib.sha256(body).hexdigest()}"
        )
        scope = f"{day}/{self.region}/{_SERVICE}/aws4_request"
        to_sign = (
            f"{_ALGORITHM}\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        )
        signature = hmac.new(
            self._signing_key(key.secret, day), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        headers = {
            "Content-Type": _CONTENT_TYPE,
            "X-Amz-Date": stamp,
            "X-Amz-Target": target,
            "Authorization": f"{_ALGORITHM} Credential={key.id}/{scope}, "
            f"SignedHeaders={_SIGNED_HEADERS}, Signature={signature}",
        }
        if key.token:
            headers["X-Amz-Security-Token"] = key.token
        return Request(method="POST", url=str(self.endpoint), headers=headers, body=body)


class DynamoItems:
    """Item reads and writes of one table family, request bodies as DynamoDB's API takes them."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._signer = Signer(
            client.region, client.endpoint or make_default_endpoint(client.region)
        )

    async def call(self, action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """One request (``action``: the API's name, ``PutItem``), retried as the module says.

        aiodynamo's ``send_request`` loop (its credentials, retry configuration, error classes
        and their handling) with the body encoded once, by orjson, and signed by
        :class:`Signer`: the two thirds of its CPU that went to ``json.dumps`` and to deriving
        the signing key anew for every request."""
        client, body = self.client, orjson.dumps(payload)
        failure: Exception | None = None
        try:
            async for _ in client.throttle_config.attempts():
                key = await client.credentials.get_key(client.http)
                if key is None:
                    failure = NoCredentialsFound()
                    continue
                try:
                    response = await client.http(self._signer.request(key, action, body))
                except TimeoutError as err:
                    failure = err
                    continue
                except RequestFailed as err:
                    failure = err.inner
                    continue
                if response.status == HTTPStatus.OK:
                    found: dict[str, Any] = orjson.loads(response.body)
                    return found
                failure = exception_from_response(response.status, response.body)
                client.handle_exception(failure)  # raises what is not worth another attempt
        except RetryTimeout:
            if failure is not None:
                raise failure from None
            raise
        raise BrokenThrottleConfig

    async def get_item(self, **request: Any) -> dict[str, Any]:
        return await self.call("GetItem", request)

    async def put_item(self, **request: Any) -> dict[str, Any]:
        return await self.call("PutItem", request)

    async def update_item(self, **request: Any) -> dict[str, Any]:
        return await self.call("UpdateItem", request)

    async def delete_item(self, **request: Any) -> dict[str, Any]:
        return await self.call("DeleteItem", request)

    async def batch_get_item(self, **request: Any) -> dict[str, Any]:
        return await self.call("BatchGetItem", request)

    async def transact_write_items(self, **request: Any) -> dict[str, Any]:
        return await self.call("TransactWriteItems", request)

    def get_paginator(self, operation: str) -> _Pages:
        actions = {"query": "Query", "scan": "Scan"}
        if operation not in actions:
            raise ValueError(f"no pages for {operation!r}: only query and scan")
        return _Pages(self, actions[operation])


@asynccontextmanager
async def open_items(
    cfg: AwsConfig,
    session: AioSession,
    static_key: Mapping[str, str] | None = None,
    http: HttpImplementation | None = None,
) -> AsyncIterator[DynamoItems]:
    """:class:`DynamoItems` on a kept-alive connection pool of ``cfg``'s size and time-outs,
    credentials from ``static_key`` (the emulator's) or else ``session``'s chain. ``http``
    replaces the transport (a test's, to fail calls on purpose)."""
    credentials: Credentials = (
        StaticCredentials(Key(static_key["aws_access_key_id"], static_key["aws_secret_access_key"]))
        if static_key
        else BotocoreCredentials(session)
    )
    timeout = aiohttp.ClientTimeout(sock_connect=cfg.connect_timeout, sock_read=cfg.read_timeout)
    connector = aiohttp.TCPConnector(limit=cfg.max_pool_connections)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as client_session:
        client = Client(
            http or _Http(client_session),
            credentials,
            cfg.region,
            endpoint=URL(cfg.endpoint_url) if cfg.endpoint_url else None,
            throttle_config=Attempts(max_attempts=cfg.max_attempts),
        )
        yield DynamoItems(client)
