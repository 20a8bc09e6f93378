"""The emulator's direct encoding of DynamoDB's item answers and DynamoDB Streams' records gives
what moto's serializer gives, for results of every kind these calls return, and leaves to moto
what it cannot tell."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto.core.serialize import JSONSerializer, XFormedAttributePicker
from moto.core.utils import get_service_model

from aegis_devstack.motojson import DIRECT, NotPlain, encode
from aegis_devstack.testing.storage import Foundation


def operation(name: str, service: str = "dynamodb") -> Any:
    return get_service_model(service).operation_model(name)


def by_moto(result: Any, name: str, service: str = "dynamodb") -> Any:
    serializer = JSONSerializer(
        operation_model=operation(name, service),
        pretty_print=False,
        value_picker=XFormedAttributePicker(),
    )
    return json.loads(serializer.serialize(result)["body"])


ITEM = {
    "pk": {"S": "FACTORY#factory-a"},
    "sk": {"S": "LATEST"},
    "score": {"N": "71.5"},
    "count": {"N": 3},  # a number moto kept as a Python int: its text on the wire
    "raw": {"B": b"\x00\xffbytes"},
    "blobs": {"BS": [b"a", b"\x01"]},
    "tags": {"SS": ["fire", "gas"]},
    "levels": {"NS": ["1", "2.5"]},
    "ok": {"BOOL": False},
    "gone": {"NULL": True},
    "nested": {
        "M": {
            "reasons": {"L": [{"S": "CO_HIGH"}, {"N": "2"}, {"M": {"deep": {"BOOL": True}}}]},
            "empty": {"M": {}},
            "none": {"L": []},
        }
    },
}
KEY = {"pk": ITEM["pk"], "sk": ITEM["sk"]}
CAPACITY = {
    "TableName": "AEGIS",
    "CapacityUnits": 1.5,
    "ReadCapacityUnits": 1,
    "Table": {"CapacityUnits": 1.0},
    "GlobalSecondaryIndexes": {"fleet": {"CapacityUnits": 0.5}},
}

RESULTS: list[tuple[str, dict[str, Any]]] = [
    ("GetItem", {"Item": ITEM, "ConsumedCapacity": CAPACITY}),
    ("GetItem", {}),
    ("PutItem", {}),
    ("PutItem", {"Attributes": ITEM}),
    ("UpdateItem", {"Attributes": {"score": {"N": "80"}}, "ConsumedCapacity": CAPACITY}),
    (
        "DeleteItem",
        {
            "Attributes": ITEM,
            "ItemCollectionMetrics": {
                "ItemCollectionKey": {"pk": ITEM["pk"]},
                "SizeEstimateRangeGB": [0, 1.0],
            },
        },
    ),
    ("Query", {"Items": [ITEM, KEY], "Count": 2, "ScannedCount": 2, "LastEvaluatedKey": KEY}),
    ("Query", {"Items": [], "Count": 0, "ScannedCount": 5, "LastEvaluatedKey": None}),
    ("Scan", {"Items": [ITEM], "Count": 1, "ScannedCount": 1, "ConsumedCapacity": CAPACITY}),
    (
        "BatchGetItem",
        {
            "Responses": {"AEGIS": [ITEM, KEY]},
            "UnprocessedKeys": {"AEGIS": {"Keys": [KEY], "ConsistentRead": True}},
            "ConsumedCapacity": [CAPACITY],
        },
    ),
    (
        "BatchWriteItem",
        {
            "UnprocessedItems": {
                "AEGIS": [{"PutRequest": {"Item": ITEM}}, {"DeleteRequest": {"Key": KEY}}]
            },
            "ConsumedCapacity": [CAPACITY],
        },
    ),
    ("TransactGetItems", {"Responses": [{"Item": ITEM}, {}], "ConsumedCapacity": [CAPACITY]}),
    ("TransactWriteItems", {"ConsumedCapacity": [CAPACITY]}),
    ("TransactWriteItems", {}),
]


@pytest.mark.parametrize(
    ("name", "result"), RESULTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(RESULTS)]
)
def test_an_item_answer_is_encoded_as_moto_encodes_it(name: str, result: dict[str, Any]) -> None:
    assert json.loads(encode(result, operation(name))) == by_moto(result, name)


def test_every_call_answered_directly_has_a_result_compared() -> None:
    compared = {("dynamodb", name) for name, _ in RESULTS}
    compared |= {("dynamodbstreams", "GetRecords") for page in STREAM_PAGES if page}
    assert compared == DIRECT


scalars = st.one_of(
    st.builds(lambda s: {"S": s}, st.text(max_size=8)),
    st.builds(
        lambda n: {"N": n},
        st.one_of(st.integers(), st.decimals(allow_nan=False, allow_infinity=False).map(str)),
    ),
    st.builds(lambda b: {"B": b}, st.binary(max_size=8)),
    st.builds(lambda b: {"BOOL": b}, st.booleans()),
    st.just({"NULL": True}),
    st.builds(lambda s: {"SS": s}, st.lists(st.text(max_size=4), min_size=1, max_size=3)),
    st.builds(lambda s: {"NS": s}, st.lists(st.integers().map(str), min_size=1, max_size=3)),
    st.builds(lambda s: {"BS": s}, st.lists(st.binary(max_size=4), min_size=1, max_size=3)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.builds(
            lambda m: {"M": m}, st.dictionaries(st.text(min_size=1, max_size=6), inner, max_size=3)
        ),
        st.builds(lambda items: {"L": items}, st.lists(inner, max_size=3)),
    ),
    max_leaves=12,
)
items = st.dictionaries(st.text(min_size=1, max_size=6), values, max_size=5)


@settings(max_examples=150, deadline=None)
@given(found=st.lists(items, max_size=3), last=st.one_of(st.none(), items))
def test_any_query_answer_is_encoded_as_moto_encodes_it(
    found: list[dict[str, Any]], last: dict[str, Any] | None
) -> None:
    result: dict[str, Any] = {"Items": found, "Count": len(found), "ScannedCount": len(found)}
    if last is not None:
        result["LastEvaluatedKey"] = last
    assert json.loads(encode(result, operation("Query"))) == by_moto(result, "Query")


@pytest.mark.parametrize(
    ("name", "result"),
    [
        # a key the shape does not name: moto might find the member under it (an alias)
        ("GetItem", {"item": ITEM}),
        ("Query", {"Items": [{"pk": {"S": "a", "s": "b"}}]}),
        # not a dict where a structure is: moto reads attributes of objects
        ("GetItem", {"Item": {"pk": object()}}),
        # a None inside a list or a map: moto keeps it as it is
        ("Query", {"Items": [None]}),
        ("GetItem", {"Item": {"pk": None}}),
        # the empty name in a map: moto encodes its value into the map itself
        ("GetItem", {"Item": {"m": {"M": {"": {"S": "x"}}}}}),
        # a result that is not a dict
        ("PutItem", object()),
    ],
    ids=[
        "alias-key",
        "unknown-member",
        "object",
        "none-in-list",
        "none-in-map",
        "empty-name",
        "object-result",
    ],
)
def test_what_the_encoder_cannot_tell_is_left_to_moto(name: str, result: Any) -> None:
    with pytest.raises(NotPlain):
        encode(result, operation(name))


@pytest.mark.parametrize(
    "created",
    [
        datetime(2026, 12, 4, 15, 0, 1, 234567, tzinfo=UTC),
        datetime(2026, 12, 4, 15, 0, 1, tzinfo=UTC),
        datetime(2026, 12, 4, 15, 0, 1, 500),  # naive, under a millisecond
        1_700_000_000.25,
        1_700_000_000,
    ],
    ids=["micro", "whole", "naive", "float", "int"],
)
def test_a_timestamp_is_encoded_as_moto_encodes_it(created: Any) -> None:
    description = {"Table": {"TableName": "AEGIS", "CreationDateTime": created}}
    encoded = json.loads(encode(description, operation("DescribeTable")))
    assert encoded == by_moto(description, "DescribeTable")


# the images a NEW_AND_OLD_IMAGES record of each event carries
IMAGES = {"INSERT": ("NewImage",), "MODIFY": ("NewImage", "OldImage"), "REMOVE": ("OldImage",)}


def stream_record(n: int, event: str, created: datetime) -> dict[str, Any]:
    """A record as moto's StreamRecord builds it."""
    images = dict.fromkeys(IMAGES[event], ITEM)
    return {
        "eventID": f"{n:032x}",
        "eventName": event,
        "eventSource": "aws:dynamodb",
        "eventVersion": "1.0",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "StreamViewType": "NEW_AND_OLD_IMAGES",
            "ApproximateCreationDateTime": created,
            "SequenceNumber": str(n),
            "SizeBytes": 812,
            "Keys": KEY,
            **images,
        },
    }


# pages of GetRecords (fixed instants: the encoding depends on none being now)
STREAM_PAGES = [
    [
        stream_record(1, "INSERT", datetime(2026, 12, 4, 15, 0, 1, 234567)),
        stream_record(2, "MODIFY", datetime(2026, 12, 4, 15, 0, 2)),
        stream_record(3, "REMOVE", datetime(2026, 12, 4, 15, 0, 3, 999999)),
    ],
    [],
]


@pytest.mark.parametrize("records", STREAM_PAGES, ids=["three", "none"])
def test_stream_records_are_encoded_as_moto_encodes_them(records: list[dict[str, Any]]) -> None:
    result = {"Records": records, "NextShardIterator": "arn:aws:dynamodb:x/stream/y|1|2"}
    encoded = json.loads(encode(result, operation("GetRecords", "dynamodbstreams")))
    assert encoded == by_moto(result, "GetRecords", "dynamodbstreams")
    assert len(encoded["Records"]) == len(records)


@pytest.mark.integration
async def test_the_emulator_answers_item_calls_with_every_kind_of_value_as_stored(
    foundation: Foundation,
) -> None:
    """Through the emulator's HTTP (the session's, which encodes item answers directly): an
    item of every attribute type comes back from GetItem, Query and BatchGetItem as it went in."""
    ddb, table = foundation.clients.dynamodb, foundation.table
    item = {
        "pk": {"S": "FACTORY#encode"},
        "sk": {"S": "LATEST"},
        "score": {"N": "71.5"},
        "raw": {"B": b"\x00\xffbytes"},
        "blobs": {"BS": [b"a", b"\x01"]},
        "tags": {"SS": ["fire", "gas"]},
        "levels": {"NS": ["1", "2.5"]},
        "ok": {"BOOL": False},
        "gone": {"NULL": True},
        "nested": {"M": {"reasons": {"L": [{"S": "CO_HIGH"}, {"M": {"d": {"BOOL": True}}}]}}},
    }
    key = {"pk": item["pk"], "sk": item["sk"]}
    await ddb.put_item(TableName=table, Item=item)
    got = await ddb.get_item(TableName=table, Key=key, ConsistentRead=True)
    queried = await ddb.query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": item["pk"]},
    )
    batch = await ddb.batch_get_item(RequestItems={table: {"Keys": [key]}})

    def normal(found: dict[str, Any]) -> dict[str, Any]:  # sets come back in any order
        return {
            k: {t: sorted(v) if t in ("BS", "SS", "NS") else v for t, v in value.items()}
            for k, value in found.items()
        }

    assert normal(got["Item"]) == normal(item)
    assert [normal(i) for i in queried["Items"]] == [normal(item)] and queried["Count"] == 1
    assert [normal(i) for i in batch["Responses"][table]] == [normal(item)]
