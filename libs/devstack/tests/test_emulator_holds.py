"""The emulator's hold points (aegis_devstack.motoholds) through aegis_devstack.testing.holds: a
held request waits while the others are served; released it is applied, aborted before it is not,
aborted after it is applied and its caller hears a failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from aegis_devstack.testing.holds import Holds

pytestmark = pytest.mark.integration

BUCKET = "aegis-holds"


@pytest.fixture(scope="module")
def emulator(private_emulator: str) -> str:
    return private_emulator


@pytest.fixture
async def s3(emulator: str) -> AsyncIterator[Any]:
    async with get_session().create_client(
        "s3",
        endpoint_url=emulator,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=AioConfig(retries={"mode": "standard", "total_max_attempts": 1}),  # no retry
    ) as client:
        await client.create_bucket(Bucket=BUCKET)
        yield client


async def keys(s3: Any) -> list[str]:
    listed = await s3.list_objects_v2(Bucket=BUCKET)
    return sorted(o["Key"] for o in listed.get("Contents", []))


async def test_a_request_held_before_it_is_applied_waits_while_others_are_served(
    s3: Any, emulator: str
) -> None:
    holds = Holds(emulator)
    holds.arm("put-a", "s3", "PutObject", contains=["/held-a", "payload-a"])
    put = asyncio.create_task(s3.put_object(Bucket=BUCKET, Key="held-a", Body=b"payload-a"))
    await holds.held("put-a", within=10)
    await s3.put_object(Bucket=BUCKET, Key="other", Body=b"x")  # not held: served meanwhile
    assert await keys(s3) == ["other"]  # the held one is not applied yet
    assert not put.done()
    holds.release("put-a")
    await put
    assert await keys(s3) == ["held-a", "other"]
    assert holds.state("put-a") == "released"


async def test_a_request_aborted_before_it_is_applied_is_not_applied_and_fails(
    s3: Any, emulator: str
) -> None:
    holds = Holds(emulator)
    holds.arm("put-b", "s3", "PutObject", contains=["/held-b"])
    put = asyncio.create_task(s3.put_object(Bucket=BUCKET, Key="held-b", Body=b"b"))
    await holds.held("put-b", within=10)
    holds.abort("put-b")
    with pytest.raises(ClientError) as failed:
        await put
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "held-b" not in await keys(s3)


async def test_a_request_held_after_it_is_applied_stands_when_its_answer_is_aborted(
    s3: Any, emulator: str
) -> None:
    holds = Holds(emulator)
    holds.arm("put-c", "s3", "PutObject", contains=["/held-c"], when="after")
    put = asyncio.create_task(s3.put_object(Bucket=BUCKET, Key="held-c", Body=b"c"))
    await holds.held("put-c", within=10)
    assert "held-c" in await keys(s3)  # applied; its caller still waits for the answer
    assert not put.done()
    holds.abort("put-c")
    with pytest.raises(ClientError):
        await put
    assert "held-c" in await keys(s3)


async def test_a_hold_no_request_reaches_says_so(emulator: str) -> None:
    holds = Holds(emulator)
    holds.arm("never", "s3", "PutObject", contains=["/no-such-key"])
    with pytest.raises(AssertionError, match="no request reached it"):
        await holds.held("never", within=0.3)
    holds.forget("never")
