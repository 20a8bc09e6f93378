"""DynamoDB item calls on a lean client: what the read model sends per message, at a fraction of
the client CPU botocore spends on it.

Every call the read model makes (GetItem, PutItem, UpdateItem, DeleteItem, BatchGetItem,
TransactWriteItems, Query and Scan pages) is a JSON document in and a JSON document out. botocore
builds each one through its model, event hooks, endpoint rules and user-agent string; measured on
one conditional PutItem that is ~0.9 ms of client CPU, where aiodynamo's request path (sign, send
on a kept-alive aiohttp session, parse) costs ~0.38 ms. :class:`DynamoItems` sends the very
request bodies the read model already builds (DynamoDB attribute values) through aiodynamo's
``send_request`` and returns the response documents as botocore would (botocore passes DynamoDB's
JSON through unchanged: numbers stay strings, there are no binary attributes in AEGIS's items).
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
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiodynamo.client import Client
from aiodynamo.credentials import Credentials, Key, StaticCredentials
from aiodynamo.http.types import Request, RequestFailed, Response
from aiodynamo.models import RetryConfig, RetryTimeout
from yarl import URL

from aegis_contracts.backoff import jittered_s

if TYPE_CHECKING:
    from aiobotocore.session import AioSession
    from aiodynamo.http.types import HttpImplementation

    from aegis_storage.clients import AwsConfig

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


class DynamoItems:
    """Item reads and writes of one table family, request bodies as DynamoDB's API takes them."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def call(self, action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        """One request (``action``: the API's name, ``PutItem``), retried as the module says."""
        return await self.client.send_request(action=action, payload=payload)

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
