"""The emulator's request counter (aegis_devstack.motoserver) read through aegis_devstack.testing.emulator."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from aiobotocore.session import get_session

from aegis_devstack.testing.emulator import (
    RequestCounts,
    arequest_counts,
    areset_request_counts,
    fleet_table,
    request_counts,
    reset_request_counts,
)

pytestmark = pytest.mark.integration

REGION = "ap-south-1"
BUCKET = "aegis-counts"
TABLE = "aegis-counts"


@pytest.fixture(scope="module")
def emulator(private_emulator: str) -> str:
    """A private emulator of this module's own."""
    return private_emulator


@dataclass
class Clients:
    s3: Any
    dynamodb: Any
    sts: Any
    cloudwatch: Any


@pytest.fixture
async def clients(emulator: str) -> AsyncIterator[Clients]:
    session = get_session()
    options: dict[str, Any] = {
        "endpoint_url": emulator,
        "region_name": REGION,
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    async with AsyncExitStack() as stack:
        made = [
            await stack.enter_async_context(session.create_client(name, **options))
            for name in ("s3", "dynamodb", "sts", "cloudwatch")
        ]
        yield Clients(*made)


@pytest.fixture
async def stored(emulator: str, clients: Clients) -> Clients:
    """A bucket and a table (pk/sk, index "fleet" on fleet_pk/fleet_sk) with 5 items, 2 of them in
    the index; counts reset afterwards."""
    await _post(emulator, "/moto-api/reset")
    await clients.s3.create_bucket(
        Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    await clients.dynamodb.create_table(**fleet_table(TABLE, projection="KEYS_ONLY"))
    for n in range(5):
        item = {"pk": {"S": "site#1"}, "sk": {"S": f"device#{n}"}, "note": {"S": "x" * 50}}
        if n < 2:
            item |= {"fleet_pk": {"S": "fleet"}, "fleet_sk": {"S": f"device#{n}"}}
        await clients.dynamodb.put_item(TableName=TABLE, Item=item)
    await areset_request_counts(emulator)
    return clients


async def _post(endpoint: str, path: str) -> None:
    def post() -> None:
        request = urllib.request.Request(endpoint + path, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=5):
            pass

    await asyncio.to_thread(post)


def _key(n: int) -> dict[str, Any]:
    return {"pk": {"S": "site#1"}, "sk": {"S": f"device#{n}"}}


async def test_each_dynamodb_and_s3_request_is_counted_once(emulator: str, stored: Clients) -> None:
    ddb, s3 = stored.dynamodb, stored.s3
    assert (await arequest_counts(emulator)).requests == {}

    scanned = await ddb.scan(TableName=TABLE)
    assert len(scanned["Items"]) == 5
    in_fleet = await ddb.query(
        TableName=TABLE,
        IndexName="fleet",
        KeyConditionExpression="fleet_pk = :f",
        ExpressionAttributeValues={":f": {"S": "fleet"}},
    )
    assert len(in_fleet["Items"]) == 2
    batch = await ddb.batch_get_item(RequestItems={TABLE: {"Keys": [_key(1), _key(3)]}})
    assert len(batch["Responses"][TABLE]) == 2
    assert "Item" in await ddb.get_item(TableName=TABLE, Key=_key(4))
    for n in range(3):
        await s3.put_object(Bucket=BUCKET, Key=f"raw/{n}.json", Body=b"{}")
    for n in range(2):
        await (await s3.get_object(Bucket=BUCKET, Key=f"raw/{n}.json"))["Body"].read()
    await s3.list_objects_v2(Bucket=BUCKET, Prefix="raw/")
    await s3.head_object(Bucket=BUCKET, Key="raw/2.json")

    counts = await arequest_counts(emulator)
    assert counts.ops("dynamodb") == {"Scan": 1, "Query@fleet": 1, "BatchGetItem": 1, "GetItem": 1}
    assert counts.count("dynamodb", "Scan") == 1
    assert counts.items_scanned("Scan") == 5
    assert counts.items_returned("Scan") == 5
    assert counts.count("dynamodb", "Query@fleet") == 1
    assert counts.count("dynamodb", "Query") == 0  # the table itself was never queried
    assert counts.items_returned("Query@fleet") == 2
    assert counts.items_scanned("Query@fleet") == 2
    assert counts.items_returned("BatchGetItem") == 2
    assert counts.items_scanned("BatchGetItem") == 2
    assert counts.unprocessed("BatchGetItem") == 0
    assert counts.items_returned("GetItem") == 1
    assert counts.items_returned() == 5 + 2 + 2 + 1
    assert counts.bytes_returned("Scan") > counts.bytes_returned("GetItem") > 0
    assert counts.total("dynamodb") == 4
    assert counts.ops("s3") == {"PutObject": 3, "GetObject": 2, "ListObjectsV2": 1, "HeadObject": 1}
    assert counts.total("s3") == 7
    assert counts.requests["dynamodb"]["Scan"] == {
        "count": 1,
        "items_returned": 5,
        "items_scanned": 5,
        "unprocessed": 0,
        "bytes_returned": counts.bytes_returned("Scan"),
    }
    assert counts.requests["s3"]["PutObject"] == {"count": 3}

    reset_request_counts(emulator)
    zeroed = request_counts(emulator)
    assert zeroed.requests == {}
    assert zeroed.total("s3") == zeroed.total("dynamodb") == 0
    assert zeroed.count("dynamodb", "Scan") == 0
    assert zeroed.items_scanned() == 0
    assert zeroed.since > counts.since


async def test_a_missing_item_and_a_query_by_key_condition(emulator: str, stored: Clients) -> None:
    ddb = stored.dynamodb
    assert "Item" not in await ddb.get_item(TableName=TABLE, Key=_key(9))
    await ddb.query(
        TableName=TABLE,
        KeyConditionExpression="pk = :p",
        FilterExpression="sk = :s",
        ExpressionAttributeValues={":p": {"S": "site#1"}, ":s": {"S": "device#3"}},
    )
    counts = await arequest_counts(emulator)
    assert counts.ops("dynamodb") == {"GetItem": 1, "Query": 1}
    assert counts.items_returned("GetItem") == counts.items_scanned("GetItem") == 0
    # a filter reads every item under the key and returns one: what "items read per item" measures
    assert counts.items_returned("Query") == 1
    assert counts.items_scanned("Query") == 5


async def test_the_difference_of_two_snapshots_counts_what_happened_in_between(
    emulator: str, stored: Clients
) -> None:
    await stored.s3.put_object(Bucket=BUCKET, Key="before", Body=b"1")
    before = await arequest_counts(emulator)
    await stored.dynamodb.get_item(TableName=TABLE, Key=_key(0))
    await stored.dynamodb.get_item(TableName=TABLE, Key=_key(1))
    await stored.s3.put_object(Bucket=BUCKET, Key="between", Body=b"2")
    after = await arequest_counts(emulator)

    between = after - before
    assert isinstance(between, RequestCounts)
    assert between.ops("dynamodb") == {"GetItem": 2}
    assert between.items_returned("GetItem") == 2
    assert between.ops("s3") == {"PutObject": 1}
    assert between.since == before.at
    assert between.at == after.at
    assert before.ops("s3") == {"PutObject": 1}
    assert after.ops("s3") == {"PutObject": 2}
    assert (after - after).requests == {}

    await areset_request_counts(emulator)
    with pytest.raises(ValueError, match="reset"):
        _ = await arequest_counts(emulator) - before


async def test_s3_operations_are_named_as_aws_names_them(emulator: str, stored: Clients) -> None:
    s3 = stored.s3
    await s3.put_object(Bucket=BUCKET, Key="a/b c.json", Body=b"{}")
    await s3.copy_object(
        Bucket=BUCKET, Key="copy.json", CopySource={"Bucket": BUCKET, "Key": "a/b c.json"}
    )
    await s3.list_objects(Bucket=BUCKET)
    await s3.get_bucket_versioning(Bucket=BUCKET)
    await s3.head_bucket(Bucket=BUCKET)
    await s3.delete_object(Bucket=BUCKET, Key="copy.json")
    await s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": "a/b c.json"}]})
    upload = await s3.create_multipart_upload(Bucket=BUCKET, Key="big")
    part = await s3.upload_part(
        Bucket=BUCKET, Key="big", UploadId=upload["UploadId"], PartNumber=1, Body=b"x"
    )
    await s3.complete_multipart_upload(
        Bucket=BUCKET,
        Key="big",
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
    )
    await s3.list_buckets()

    assert (await arequest_counts(emulator)).ops("s3") == {
        "PutObject": 1,
        "CopyObject": 1,
        "ListObjects": 1,
        "Bucket:GET:versioning": 1,
        "HeadBucket": 1,
        "DeleteObject": 1,
        "DeleteObjects": 1,
        "CreateMultipartUpload": 1,
        "UploadPart": 1,
        "CompleteMultipartUpload": 1,
        "ListBuckets": 1,
    }


async def test_other_services_are_counted_by_action(emulator: str, clients: Clients) -> None:
    await areset_request_counts(emulator)
    await clients.sts.get_caller_identity()
    await clients.cloudwatch.put_metric_data(
        Namespace="aegis", MetricData=[{"MetricName": "m", "Value": 1.0}]
    )
    counts = await arequest_counts(emulator)
    assert counts.ops("sts") == {"GetCallerIdentity": 1}
    assert counts.ops("cloudwatch") == {"PutMetricData": 1}
    assert counts.count("cloudwatch", "PutMetricData") == 1
    assert set(counts.requests) == {"sts", "cloudwatch"}


async def test_moto_api_and_the_counter_itself_are_not_counted(emulator: str) -> None:
    await areset_request_counts(emulator)
    await _post(emulator, "/moto-api/reset")
    for _ in range(3):
        await arequest_counts(emulator)
    counts = await arequest_counts(emulator)
    assert counts.requests == {}
    assert counts.at >= counts.since


def test_the_counter_endpoints_refuse_other_methods(emulator: str) -> None:
    for method, path in (("POST", "/_aegis/requests"), ("GET", "/_aegis/requests/reset")):
        request = urllib.request.Request(emulator + path, method=method)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 405
        refused.value.close()


def test_only_an_http_endpoint_is_asked() -> None:
    with pytest.raises(ValueError, match="http"):
        request_counts("ftp://127.0.0.1:1")
