"""The AWS client factory every service uses: aiobotocore for the control plane, obstore for the
per-message S3 calls (:mod:`aegis_storage.objectclient`) and aiodynamo for the read model's item
calls (:mod:`aegis_storage.dynamo`), all with the same settings and credentials.

One session, clients opened for the life of a service (in its lifespan), the endpoint overridable for
LocalStack/moto, a connection pool sized for the service's concurrency, standard retries, and the
per-request client CPU trimmed: checksums only when an API requires them, no parameter validation.
Beside the aiobotocore clients, the obstore client of the per-message S3 calls
(:mod:`aegis_storage.objectclient`), with the same settings and the session's credential chain.
"""

from __future__ import annotations

import functools
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession
    from botocore.loaders import Loader
    from types_aiobotocore_dynamodb import DynamoDBClient
    from types_aiobotocore_s3 import S3Client

    from aegis_storage.dynamo import DynamoItems
    from aegis_storage.objectclient import ObjectClient


@dataclass(frozen=True, slots=True)
class AwsConfig:
    region: str = "ap-south-1"
    endpoint_url: str | None = None
    max_pool_connections: int = 64
    max_attempts: int = 5
    retry_mode: str = "standard"
    connect_timeout: float = 5.0
    read_timeout: float = 30.0


def aio_config(cfg: AwsConfig) -> AioConfig:
    # aiobotocore is imported when a client is made, not with this module: AwsConfig is part of
    # every process's settings, and `aegis --help` should not load an AWS SDK
    from aiobotocore.config import AioConfig  # noqa: PLC0415

    return AioConfig(
        region_name=cfg.region,
        max_pool_connections=cfg.max_pool_connections,
        retries={"mode": cfg.retry_mode, "total_max_attempts": cfg.max_attempts},
        connect_timeout=cfg.connect_timeout,
        read_timeout=cfg.read_timeout,
        tcp_keepalive=True,
        # measured: checksum calculation and parameter validation are a large share of the client
        # CPU per request; S3 still gets a checksum where an API requires one
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        parameter_validation=False,
    )


def emulator_credentials(cfg: AwsConfig) -> dict[str, str]:
    # an emulator accepts any key; real AWS uses the default chain (env, profile, IRSA, task role)
    if cfg.endpoint_url and not os.environ.get("AWS_ACCESS_KEY_ID"):
        return {"aws_access_key_id": "test", "aws_secret_access_key": "test"}
    return {}


def client_arguments(cfg: AwsConfig) -> dict[str, Any]:
    """What every aiobotocore client of ``cfg`` is created with: the region, the endpoint, the
    settings of :func:`aio_config` and the emulator's keys where they apply. A plain-http
    endpoint (the local emulator) has no TLS, so there is no certificate to verify: its clients
    get ``verify=False``. Left on, aiobotocore loads the CA bundle into an SSL context for every
    client all the same (measured: ~23 ms of CPU a client, four fifths of what opening one
    costs), and the context is never used."""
    arguments: dict[str, Any] = {
        "region_name": cfg.region,
        "endpoint_url": cfg.endpoint_url,
        "config": aio_config(cfg),
        **emulator_credentials(cfg),
    }
    if cfg.endpoint_url is not None and cfg.endpoint_url.lower().startswith("http://"):
        arguments["verify"] = False
    return arguments


@dataclass(slots=True)
class AwsClients:
    s3: S3Client
    dynamodb: DynamoDBClient  # the control plane: tables, indexes, TTL, tags
    config: AwsConfig
    objects: ObjectClient  # the per-message S3 calls (puts, gets, listings)
    items: DynamoItems  # item reads and writes (the read model's)


@functools.cache
def _models() -> Loader:
    """The API models' loader every session of this process shares (the first session's)."""
    from aiobotocore.session import get_session  # noqa: PLC0415 - see aio_config

    loader: Loader = get_session().get_component("data_loader")
    return loader


def new_session() -> AioSession:
    """A new aiobotocore session (credentials and settings of its own) that reads the API
    models through the process's one loader. A session of its own reads and parses the JSON of
    every model a client needs (endpoints, partitions, the service's definition) again:
    measured, ~400 ms of CPU for the clients of :func:`open_clients` and one more, most of what
    a command or a test spends before its first request. The models do not change while the
    process runs; the loader keeps what it parsed."""
    from aiobotocore.session import get_session  # noqa: PLC0415 - see aio_config

    session = get_session()
    session.register_component("data_loader", _models())
    return session


@asynccontextmanager
async def open_clients(cfg: AwsConfig) -> AsyncIterator[AwsClients]:
    """Open S3 and DynamoDB clients that share one session, and the obstore client beside them
    (signing with that session's credentials); closed on exit."""
    from aegis_storage.dynamo import open_items  # noqa: PLC0415 - as aiobotocore
    from aegis_storage.objectclient import ChainCredentials, ObjectClient  # noqa: PLC0415

    session = new_session()
    kwargs = client_arguments(cfg)
    async with AsyncExitStack() as stack:
        s3 = await stack.enter_async_context(session.create_client("s3", **kwargs))
        dynamodb = await stack.enter_async_context(session.create_client("dynamodb", **kwargs))
        keys = emulator_credentials(cfg)
        objects = ObjectClient(cfg, keys or ChainCredentials(await session.get_credentials()))
        stack.callback(objects.close)
        items = await stack.enter_async_context(open_items(cfg, session, keys))
        yield AwsClients(s3=s3, dynamodb=dynamodb, config=cfg, objects=objects, items=items)


@asynccontextmanager
async def open_client(service: str, cfg: AwsConfig) -> AsyncIterator[Any]:
    """Any other AWS client (cloudwatch, sts, …) with the same settings."""
    session = new_session()
    async with session.create_client(
        service,  # type: ignore[call-overload]
        **client_arguments(cfg),
    ) as client:
        yield client
