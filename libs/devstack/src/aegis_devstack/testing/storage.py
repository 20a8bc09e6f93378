"""pytest plugin: storage fixtures over real S3/DynamoDB (the emulator of ``aws_endpoint``):
clients opened once a session (``aws``) and a freshly bootstrapped bucket and table unique to
the test (``foundation``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsClients, AwsConfig, open_clients
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore


@dataclass
class Foundation:
    clients: AwsClients
    bucket: str
    table: str
    store: ObjectStore
    readmodel: ReadModel


@pytest.fixture(scope="session")
async def aws(aws_endpoint: str) -> AsyncIterator[AwsClients]:
    """Clients of the session's emulator, opened once for all of a worker's tests (opening them
    is ~15 ms of CPU: a session's handlers, each client's endpoint rules). A test changes no
    client: one that needs other settings or credentials opens its own."""
    async with open_clients(AwsConfig(endpoint_url=aws_endpoint)) as clients:
        yield clients


@pytest.fixture
async def foundation(aws: AwsClients, unique_id: str) -> Foundation:
    """A freshly bootstrapped bucket and table, unique to the test."""
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    await bootstrap(aws, bucket=bucket, table=table)
    return Foundation(aws, bucket, table, ObjectStore(aws, bucket), ReadModel(aws.items, table))


@pytest.fixture
def foundation_env(
    foundation: Foundation, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> Foundation:
    """``foundation``, with the variables that point an ``aegis`` command (run in this process,
    as typer's CliRunner does) at its bucket and table."""
    for name, value in {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
    }.items():
        monkeypatch.setenv(name, value)
    return foundation
