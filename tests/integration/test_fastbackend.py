"""The bench-only S3/DynamoDB responder (tests/bench/fastbackend) answers AEGIS's calls as S3 and
DynamoDB do, through the real storage adapters. Each behaviour is checked on the responder and on
the moto emulator alike (the same assertions), so the expectations are the emulator's, not the
responder's; what it does not follow is refused loudly (a 501 naming it and a counter)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from botocore.exceptions import ClientError

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_devstack.testing.builders import history_item
from aegis_storage import fleetindex
from aegis_storage.bootstrap import bootstrap, describe_foundation, drift, expected_foundation
from aegis_storage.clients import AwsClients, AwsConfig, open_clients
from aegis_storage.errors import Conflict, NotFound, StorageError
from aegis_storage.items import Put
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore, PutOutcome

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
RAW = keys.raw_key("factory-a", "factory_state", T0, "msg-00000001")


def _load_starter() -> ModuleType:
    # loaded from its file: putting tests/bench on sys.path would shadow other modules' names
    path = Path(__file__).parents[1] / "bench" / "fastbackend.py"
    spec = importlib.util.spec_from_file_location("aegis_bench_fastbackend", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


starter = _load_starter()


@pytest.fixture(scope="module")
def fast() -> Iterator[Any]:
    """The responder, one for the module (no modelled round trip)."""
    backend = starter.start_fast_backend()
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture(scope="module", params=["fastbackend", "emulator"])
def endpoint(request: pytest.FixtureRequest) -> str:
    """The responder's URL, then the emulator's: every test using it runs on both."""
    if request.param == "fastbackend":
        return str(request.getfixturevalue("fast").url)
    return str(request.getfixturevalue("aws_endpoint"))


@dataclass
class Store:
    clients: AwsClients
    bucket: str
    table: str
    objects: ObjectStore
    model: ReadModel


@contextlib.asynccontextmanager
async def _bootstrapped(url: str, unique_id: str) -> AsyncIterator[Store]:
    """Clients of ``url`` and a freshly bootstrapped bucket and table unique to the test."""
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    async with open_clients(AwsConfig(endpoint_url=url)) as clients:
        await bootstrap(clients, bucket=bucket, table=table)
        yield Store(
            clients,
            bucket,
            table,
            ObjectStore(clients, bucket),
            ReadModel(clients.items, table),
        )


@pytest.fixture
async def store(endpoint: str, unique_id: str) -> AsyncIterator[Store]:
    async with _bootstrapped(endpoint, unique_id) as opened:
        yield opened


@pytest.fixture
async def fast_store(fast: Any, unique_id: str) -> AsyncIterator[Store]:
    async with _bootstrapped(fast.url, unique_id) as opened:
        yield opened


def _code(err: BaseException) -> str:
    cause = err if isinstance(err, ClientError) else err.__cause__
    assert isinstance(cause, ClientError), err
    return str(cause.response["Error"]["Code"])


# -- S3 -----------------------------------------------------------------------------------------


async def test_bootstrap_makes_the_foundation_and_a_second_run_changes_nothing(
    store: Store,
) -> None:
    again = await bootstrap(store.clients, bucket=store.bucket, table=store.table)
    found = await describe_foundation(store.clients, bucket=store.bucket, table=store.table)
    expected = expected_foundation(bucket=store.bucket, table=store.table, region="ap-south-1")
    assert (again.changed, drift(found, expected)) == (False, [])


async def test_put_once_is_refused_over_an_existing_key_and_keeps_the_first_body(
    store: Store,
) -> None:
    first = await store.objects.put_immutable(RAW, b"first", metadata={"topic": "aegis/a/b"})
    again = await store.objects.put_immutable(RAW, b"first")
    with pytest.raises(Conflict, match="different body"):
        await store.objects.put_immutable(RAW, b"second")
    with pytest.raises(ClientError) as refused:
        await store.clients.s3.put_object(
            Bucket=store.bucket, Key=RAW, Body=b"third", IfNoneMatch="*"
        )
    assert (first.outcome, again.outcome) == (PutOutcome.CREATED, PutOutcome.DUPLICATE)
    assert (_code(refused.value), refused.value.response["ResponseMetadata"]["HTTPStatusCode"]) == (
        "PreconditionFailed",
        412,
    )
    assert await store.objects.get_bytes(RAW) == b"first"
    head = await store.objects.head(RAW)
    assert head is not None and head["Metadata"] == {"topic": "aegis/a/b"}


async def test_a_body_is_read_whole_in_one_ranged_get_an_empty_one_too(store: Store) -> None:
    """``get_bytes`` asks for the range from the first byte to far past the end: the whole body
    comes back (a 206); an empty object, which no range names (416 InvalidRange), is read
    plainly; a missing key is NotFound. The ranges a client may send beyond that one form are
    the responder's to refuse (loudly)."""
    body = bytes(range(256)) * 40  # 10 KiB, every byte value
    await store.objects.put_bytes("processed/f/whole.bin", body)
    await store.objects.put_bytes("processed/f/empty.bin", b"")
    assert await store.objects.get_bytes("processed/f/whole.bin") == body
    assert await store.objects.get_bytes("processed/f/empty.bin") == b""
    with pytest.raises(NotFound):
        await store.objects.get_bytes("processed/f/none.bin")
    part = await store.clients.s3.get_object(
        Bucket=store.bucket, Key="processed/f/whole.bin", Range="bytes=10-19"
    )
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["ContentRange"] == f"bytes 10-19/{len(body)}"
    async with part["Body"] as stream:
        assert await stream.read() == body[10:20]
    with pytest.raises(ClientError) as unsatisfiable:
        await store.clients.s3.get_object(
            Bucket=store.bucket, Key="processed/f/empty.bin", Range="bytes=0-9"
        )
    assert _code(unsatisfiable.value) == "InvalidRange"


async def test_listing_pages_through_keys_in_order_with_prefixes_and_start_after(
    store: Store,
) -> None:
    names = [f"processed/f/{i:03d}.json" for i in range(7)] + ["processed/g/x.json", "raw/a.json"]
    for name in reversed(names):
        await store.objects.put_bytes(name, b"{}")
    paged = store.clients.s3.get_paginator("list_objects_v2").paginate(
        Bucket=store.bucket, Prefix="processed/", PaginationConfig={"PageSize": 3}
    )
    listed = [o["Key"] async for page in paged for o in page.get("Contents", [])]
    assert listed == names[:8]
    assert await store.objects.child_prefixes("processed/") == ["processed/f/", "processed/g/"]
    assert await store.objects.list_keys_between("processed/f/", names[2], names[5]) == names[3:5]


# -- DynamoDB conditions ----------------------------------------------------------------------


async def test_latest_is_replaced_only_while_it_is_the_version_read(store: Store) -> None:
    model = store.model
    first = {"updated_at": format_ts(T0), "level": "NORMAL"}
    second = {"updated_at": format_ts(T0 + timedelta(seconds=1)), "level": "WARNING"}
    created = await model.replace_latest("f1", first, expected=None)
    created_twice = await model.replace_latest("f1", second, expected=None)
    stale = await model.replace_latest("f1", second, expected=format_ts(T0 - timedelta(seconds=1)))
    replaced = await model.replace_latest("f1", second, expected=format_ts(T0))
    assert (created, created_twice, stale, replaced) == (True, False, False, True)
    latest = await model.get_latest("f1")
    assert latest is not None and latest["level"] == "WARNING"
    assert await model.fleet_ids() == ["f1"]


async def test_history_puts_are_once_only_and_a_range_query_leaves_out_the_end_and_expired_items(
    store: Store,
) -> None:
    model = store.model
    now = T0 + timedelta(hours=1)
    live, expired = int(now.timestamp()) + 3600, int(now.timestamp()) - 1
    ms = timedelta(milliseconds=1)
    for i in range(3):
        await model.put_item(
            history_item("f3", {"n": i}, updated_at=T0 + i * ms, ttl=live), if_absent=True
        )
    with pytest.raises(Conflict):
        await model.put_item(history_item("f3", {"n": 7}, updated_at=T0, ttl=live), if_absent=True)
    await model.put_item(
        history_item("f3", {"n": 9}, updated_at=T0 + timedelta(seconds=5), ttl=expired)
    )
    await model.put_item(
        history_item("f3", {"n": 10}, updated_at=T0 + timedelta(seconds=9), ttl=live)
    )
    found = await model.history_states("f3", T0, T0 + timedelta(seconds=9), now=now)
    assert [i["n"] for i in found] == [0, 1, 2]
    newest = await model.query_range(
        keys.factory_pk("f3"), keys.HISTORY_STATE_PREFIX, T0, now, now=now, descending=True, limit=2
    )
    assert [i["n"] for i in newest] == [10, 2]


async def test_claims_and_leases_are_taken_only_as_their_conditions_allow(store: Store) -> None:
    model = store.model
    ttl = int(T0.timestamp()) + 86_400
    lease = timedelta(minutes=5)
    claimed = await model.claim_window("job", T0, owner="a", now=T0, ttl=ttl)
    taken = await model.claim_window("job", T0, owner="b", now=T0, ttl=ttl)
    too_early = await model.claim_window(
        "job", T0, owner="b", now=T0 + timedelta(minutes=1), ttl=ttl, lease=lease
    )
    taken_over = await model.claim_window(
        "job", T0, owner="b", now=T0 + timedelta(minutes=6), ttl=ttl, lease=lease
    )
    finished_by_other = await model.finish_window("job", T0, owner="a", now=T0)
    finished = await model.finish_window("job", T0, owner="b", now=T0)
    assert (claimed, taken, too_early, taken_over, finished_by_other, finished) == (
        True,
        False,
        False,
        True,
        False,
        True,
    )
    held = await model.acquire_lease("LEASE#x", "L", owner="a", now=T0, until=T0 + lease)
    refused = await model.acquire_lease("LEASE#x", "L", owner="b", now=T0, until=T0 + lease)
    extended_by_other = await model.extend_lease("LEASE#x", "L", owner="b", until=T0 + lease)
    expired = await model.acquire_lease(
        "LEASE#x", "L", owner="b", now=T0 + 2 * lease, until=T0 + 3 * lease
    )
    released_by_other = await model.release_lease("LEASE#x", "L", owner="a")
    released = await model.release_lease("LEASE#x", "L", owner="b")
    assert (held, refused, extended_by_other, expired, released_by_other, released) == (
        True,
        False,
        False,
        True,
        False,
        True,
    )


async def test_late_marks_are_counted_and_cleared_only_while_unchanged(store: Store) -> None:
    model = store.model
    ttl = int(T0.timestamp()) + 86_400
    await model.mark_late("f4", T0, now=T0, ttl=ttl)
    await model.mark_late("f4", T0, now=T0, ttl=ttl)
    marks = [int(i["marks"]) for i in await model.late_hours(now=T0)]
    stale_clear = await model.clear_late("f4", T0, marks=1)
    cleared = await model.clear_late("f4", T0, marks=2)
    assert (marks, stale_clear, cleared, await model.late_hours(now=T0)) == ([2], False, True, [])


async def test_puts_with_expected_values_and_their_old_images(store: Store) -> None:
    model = store.model
    item = {"pk": "JOB#j", "sk": "DEF", "version": 1, "body": "a"}
    await model.put_item(item, if_absent=True)
    with pytest.raises(Conflict):
        await model.put_item({**item, "body": "b"}, if_absent=True)
    with pytest.raises(Conflict):
        await model.put_item({**item, "version": 2}, expected={"version": 7})
    await model.put_item({**item, "version": 2, "body": "c"}, expected={"version": 1})
    await model.put_item({**item, "version": 3}, if_absent=True, expected={"version": 2})
    response = await store.clients.dynamodb.put_item(
        TableName=store.table,
        Item={"pk": {"S": "JOB#j"}, "sk": {"S": "DEF"}, "version": {"N": "4"}},
        ConditionExpression="version = :v",
        ExpressionAttributeValues={":v": {"N": "3.0"}},
        ReturnValues="ALL_OLD",
    )
    assert response["Attributes"]["version"] == {"N": "3"}
    with pytest.raises(ClientError) as refused:
        await store.clients.dynamodb.update_item(
            TableName=store.table,
            Key={"pk": {"S": "JOB#j"}, "sk": {"S": "DEF"}},
            UpdateExpression="SET body = :b",
            ConditionExpression="version < :v",
            ExpressionAttributeValues={":b": {"S": "x"}, ":v": {"N": "4"}},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    assert _code(refused.value) == "ConditionalCheckFailedException"
    assert refused.value.response["Item"]["version"] == {"N": "4"}


async def test_the_fleet_index_backfill_scans_and_updates_only_items_without_its_keys(
    store: Store,
) -> None:
    ddb = store.clients.dynamodb
    for factory in ("old-1", "old-2"):
        await ddb.put_item(
            TableName=store.table,
            Item={
                "pk": {"S": f"FACTORY#{factory}"},
                "sk": {"S": "LATEST"},
                "factory_id": {"S": factory},
            },
        )
    await store.model.replace_latest("new-1", {"updated_at": format_ts(T0)}, expected=None)
    before = await store.model.fleet_ids()
    added = await fleetindex.backfill(ddb, store.table, fleetindex.FACTORIES)
    again = await fleetindex.backfill(ddb, store.table, fleetindex.FACTORIES)
    assert (before, added, again) == (["new-1"], 2, 0)
    assert await store.model.fleet_ids() == ["new-1", "old-1", "old-2"]
    assert await fleetindex.wanted_generation(ddb, store.table) == 0


async def test_requests_dynamodb_refuses_are_refused(store: Store) -> None:
    ddb = store.clients.dynamodb
    key = {"pk": {"S": "X#1"}, "sk": {"S": "A"}}
    with pytest.raises(ClientError) as reserved:
        await ddb.put_item(
            TableName=store.table, Item=key, ConditionExpression="attribute_not_exists(ttl)"
        )
    with pytest.raises(ClientError) as key_update:
        await ddb.update_item(
            TableName=store.table,
            Key=key,
            UpdateExpression="SET sk = :s",
            ExpressionAttributeValues={":s": {"S": "B"}},
        )
    assert (_code(reserved.value), _code(key_update.value)) == ("ValidationException",) * 2
    assert "reserved keyword" in str(reserved.value)
    assert await store.model.get_item("X#1", "A") is None


# -- what only the responder does -----------------------------------------------------------


async def test_the_kept_sha256_is_the_bodys_and_a_checksum_of_other_bytes_is_refused(
    fast_store: Store,
) -> None:
    """S3 checks an x-amz-checksum-sha256 against the body (BadDigest); moto does not, so this
    runs on the responder only."""
    store = fast_store
    await store.objects.put_immutable(RAW, b"the body")
    other = base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode()
    with pytest.raises(ClientError) as refused:
        await store.clients.s3.put_object(
            Bucket=store.bucket, Key=f"{RAW}.2", Body=b"the body", ChecksumSHA256=other
        )
    assert (
        await store.objects.kept_sha256(RAW)
        == base64.b64encode(hashlib.sha256(b"the body").digest()).decode()
    )
    assert (_code(refused.value), await store.objects.exists(f"{RAW}.2")) == ("BadDigest", False)


async def test_placeholders_unused_or_undefined_are_refused_as_dynamodb_refuses_them(
    fast_store: Store,
) -> None:
    """DynamoDB refuses a request with a value its expressions do not use, or an expression
    naming a value not given (ValidationException); moto accepts the first and fails the
    second with a 500, so this runs on the responder only."""
    ddb = fast_store.clients.dynamodb
    key = {"pk": {"S": "X#1"}, "sk": {"S": "A"}}
    with pytest.raises(ClientError) as unused:
        await ddb.put_item(
            TableName=fast_store.table,
            Item=key,
            ConditionExpression="attribute_not_exists(pk)",
            ExpressionAttributeValues={":unused": {"S": "x"}},
        )
    with pytest.raises(ClientError) as undefined:
        await ddb.put_item(
            TableName=fast_store.table, Item=key, ConditionExpression="sk = :nothing"
        )
    assert (_code(unused.value), _code(undefined.value)) == ("ValidationException",) * 2
    assert "unused in expressions: keys: {:unused}" in str(unused.value)
    assert "not defined; attribute value: :nothing" in str(undefined.value)
    assert await fast_store.model.get_item("X#1", "A") is None


async def test_what_it_does_not_follow_is_refused_loudly_and_counted(
    fast: Any, fast_store: Store
) -> None:
    before = fast.counters()
    with pytest.raises(StorageError) as transaction:
        await fast_store.model.put_items(
            [Put({"pk": "A#1", "sk": "x"}), Put({"pk": "A#2", "sk": "x"})]
        )
    with pytest.raises(ClientError) as tagging:
        await fast_store.clients.s3.put_object_tagging(
            Bucket=fast_store.bucket, Key=RAW, Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}
        )
    with pytest.raises(ClientError) as comparator:
        await fast_store.clients.dynamodb.put_item(
            TableName=fast_store.table,
            Item={"pk": {"S": "A#3"}, "sk": {"S": "x"}},
            ConditionExpression="sk <> :x",
            ExpressionAttributeValues={":x": {"S": "y"}},
        )
    await fast_store.objects.put_bytes("processed/f/ten.bin", b"0123456789")
    with pytest.raises(ClientError) as suffix_range:  # the last 4 bytes: a form AEGIS never sends
        await fast_store.clients.s3.get_object(
            Bucket=fast_store.bucket, Key="processed/f/ten.bin", Range="bytes=-4"
        )
    after = fast.counters()
    refused = {
        op: c["refused"] - before["ops"].get(op, {}).get("refused", 0)
        for op, c in after["ops"].items()
    }
    messages = [
        str(transaction.value),  # the read model's client names the refusal in its error
        *(
            str(e.response["Error"]["Message"])
            for e in (tagging.value, comparator.value, suffix_range.value)
        ),
    ]
    assert {op: n for op, n in refused.items() if n} == {
        "TransactWriteItems": 1,
        "S3 PUT": 1,
        "PutItem": 1,
        "GetObject": 1,
    }
    assert len(messages) == 4 and all("does not follow" in m for m in messages)
    assert "TransactWriteItems" in messages[0] and "tagging" in messages[1] and "<>" in messages[2]
    assert "bytes=-4" in messages[3]
    assert await fast_store.model.get_item("A#3", "x") is None


async def test_connections_are_kept_alive_across_requests(fast: Any, fast_store: Store) -> None:
    await fast_store.objects.put_bytes("warm.json", b"{}")
    await fast_store.model.get_item("FACTORY#x", "LATEST")
    before = fast.counters()["connections"]
    for i in range(30):
        await fast_store.objects.put_bytes(f"k/{i}.json", b"{}")
        await fast_store.model.get_item("FACTORY#x", "LATEST")
    # reading the counters opens a connection of its own, counted in the next reading: that one only
    assert fast.counters()["connections"] - before == 1
