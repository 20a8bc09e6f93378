"""The emulator's Query reads only the partition it asks for (an index's Query, the table's items
unsorted), and answers exactly what moto answers reading the whole table sorted: the same items
in the same order, the same count and scanned count, the same key to go on from. Checked on
tables of string, number and binary keys (numbers equal by value: ``1`` and ``1.0`` are one key),
with and without a sort key, through a global and a local index, with every key condition, page
size, direction and start key."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.table import Table

from aegis_devstack.motoserver import reading_only_what_it_may_answer

REGION = "ap-south-1"

# hash key values per type: "1" and "1.0" are one number, so one key
HASHES = {"S": ["a", "b", "c"], "N": ["1", "1.0", "2", "-3.5"], "B": [b"\x00", b"\x01"]}
SORTS = ["0", "1", "10", "2", "a", "ab", "b"]
GROUPS = ["g1", "g2"]


@pytest.fixture(scope="module")
def dynamodb() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client(
            "dynamodb", region_name=REGION, aws_access_key_id="t", aws_secret_access_key="t"
        )


def create(client: Any, name: str, hash_type: str, *, sorted_: bool) -> None:
    keys = [{"AttributeName": "pk", "KeyType": "HASH"}]
    attributes = [{"AttributeName": "pk", "AttributeType": hash_type}]
    extra: dict[str, Any] = {}
    if sorted_:
        keys.append({"AttributeName": "sk", "KeyType": "RANGE"})
        attributes += [
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "l", "AttributeType": "S"},
        ]
        extra["LocalSecondaryIndexes"] = [
            {
                "IndexName": "local",
                "KeySchema": [keys[0], {"AttributeName": "l", "KeyType": "RANGE"}],
                "Projection": {"ProjectionType": "ALL"},
            }
        ]
    attributes += [
        {"AttributeName": "g", "AttributeType": "S"},
        {"AttributeName": "r", "AttributeType": "N"},
    ]
    extra["GlobalSecondaryIndexes"] = [
        {
            "IndexName": "global",
            "KeySchema": [
                {"AttributeName": "g", "KeyType": "HASH"},
                {"AttributeName": "r", "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        }
    ]
    client.create_table(
        TableName=name,
        KeySchema=keys,
        AttributeDefinitions=attributes,
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )


item_fields = st.fixed_dictionaries(
    {
        "hash": st.integers(0, 3),
        "sort": st.sampled_from(SORTS),
        "l": st.sampled_from(SORTS),
        "g": st.one_of(st.none(), st.sampled_from(GROUPS)),  # not every item is in the index
        "r": st.integers(-2, 2),
    }
)

queries = st.fixed_dictionaries(
    {
        "index": st.sampled_from([None, "global", "local"]),
        "hash": st.integers(0, 3),
        "condition": st.sampled_from(
            [None, None, "=", "<", "<=", ">", ">=", "BETWEEN", "begins_with"]
        ),
        "values": st.lists(st.sampled_from(SORTS), min_size=2, max_size=2).map(sorted),
        "limit": st.sampled_from([None, 1, 2, 3]),
        "forward": st.booleans(),
        "start": st.one_of(st.none(), st.integers(0, 40)),
        "filtered": st.sampled_from([False, False, True]),
    }
)


def hash_value(hash_type: str, n: int) -> dict[str, Any]:
    values = HASHES[hash_type]
    return {hash_type: values[n % len(values)]}


def request(
    name: str, hash_type: str, sorted_: bool, q: dict[str, Any], items: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The Query ``q`` describes on table ``name``, None where it asks what the table has not."""
    index = q["index"]
    if index == "local" and not sorted_:
        return None
    names = {"#h": "pk"}
    values: dict[str, Any] = {":h": hash_value(hash_type, q["hash"])}
    sort_attribute = {None: "sk", "local": "l", "global": "r"}[index]
    if index == "global":
        names["#h"] = "g"
        values[":h"] = {"S": GROUPS[q["hash"] % 2]}
    condition = "#h = :h"
    cmp = q["condition"]
    if cmp is not None and (sorted_ or index is not None):
        names["#s"] = sort_attribute
        low, high = q["values"]
        if index == "global":
            low, high = str(len(low) - 2), str(len(high) - 1)
            if cmp == "begins_with":
                cmp = "="  # a number has no prefix
        kind = "N" if index == "global" else "S"
        values[":a"] = {kind: low}
        if cmp == "BETWEEN":
            values[":b"] = {kind: high}
            condition += " AND #s BETWEEN :a AND :b"
        elif cmp == "begins_with":
            condition += " AND begins_with(#s, :a)"
        else:
            condition += f" AND #s {cmp} :a"
    asked: dict[str, Any] = {
        "TableName": name,
        "KeyConditionExpression": condition,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        "ScanIndexForward": q["forward"],
    }
    if index is not None:
        asked["IndexName"] = index
    if q["limit"] is not None:
        asked["Limit"] = q["limit"]
    if q["filtered"] and index != "global":
        names["#f"] = "l"
        values[":f"] = {"S": "1"}
        asked["FilterExpression"] = "#f >= :f"
    if q["start"] is not None and items:
        start = items[q["start"] % len(items)]
        key = {"pk": start["pk"]} | ({"sk": start["sk"]} if sorted_ else {})
        if index == "global":
            if "g" not in start:
                return asked
            key |= {"g": start["g"], "r": start["r"]}
        elif index == "local":
            key |= {"l": start["l"]}
        asked["ExclusiveStartKey"] = key
    return asked


def answered(client: Any, asked: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of the Query, each page asked from the key the one before ended at."""
    pages: list[dict[str, Any]] = []
    while True:
        try:
            got = client.query(**asked)
        except client.exceptions.ClientError as err:
            return [*pages, {"error": err.response["Error"]}]
        got.pop("ResponseMetadata")
        pages.append(dict(got))
        if "LastEvaluatedKey" not in got or len(pages) > 30:
            return pages
        asked = asked | {"ExclusiveStartKey": got["LastEvaluatedKey"]}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    hash_type=st.sampled_from(["S", "N", "B"]),
    sorted_=st.booleans(),
    rows=st.lists(item_fields, min_size=4, max_size=30),
    asked=st.lists(queries, min_size=1, max_size=6),
)
def test_a_query_answers_what_moto_answers_reading_the_whole_table(
    dynamodb: Any,
    monkeypatch: pytest.MonkeyPatch,
    hash_type: str,
    sorted_: bool,
    rows: list[dict[str, Any]],
    asked: list[dict[str, Any]],
) -> None:
    name = f"q-{hash_type}-{int(sorted_)}-{len(dynamodb.list_tables()['TableNames'])}"
    create(dynamodb, name, hash_type, sorted_=sorted_)
    items = []
    for row in rows:
        item = {"pk": hash_value(hash_type, row["hash"]), "l": {"S": row["l"]}}
        item |= {"r": {"N": str(row["r"])}}
        if sorted_:
            item["sk"] = {"S": row["sort"]}
        if row["g"] is not None:
            item["g"] = {"S": row["g"]}
        dynamodb.put_item(TableName=name, Item=item)
        items.append(item)
    whole_table = Table.query
    for q in asked:
        query = request(name, hash_type, sorted_, q, items)
        if query is None:
            continue
        by_moto = answered(dynamodb, query)
        monkeypatch.setattr(Table, "query", reading_only_what_it_may_answer(whole_table))
        try:
            ours = answered(dynamodb, query)
        finally:
            monkeypatch.setattr(Table, "query", whole_table)
        assert ours == by_moto, query


def test_a_query_of_a_partition_reads_none_of_the_others(
    dynamodb: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto's query is given the three items of the partition asked for, not the table's six,
    and none for a partition the table does not have; the table keeps no view of its own
    afterwards."""
    create(dynamodb, "partitioned", "S", sorted_=True)
    for p in ("a", "b"):
        for s in ("1", "2", "3"):
            item = {"pk": {"S": p}, "sk": {"S": s}, "l": {"S": s}}
            dynamodb.put_item(TableName="partitioned", Item=item)
    read: list[int] = []
    whole_table = Table.query

    def counted(self: Table, *args: Any, **kwargs: Any) -> Any:
        read.append(len(self.all_items()))
        return whole_table(self, *args, **kwargs)

    monkeypatch.setattr(Table, "query", reading_only_what_it_may_answer(counted))
    got = dynamodb.query(
        TableName="partitioned",
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": "b"}},
    )
    assert [i["sk"]["S"] for i in got["Items"]] == ["1", "2", "3"]
    missing = dynamodb.query(
        TableName="partitioned",
        KeyConditionExpression="pk = :p",
        ExpressionAttributeValues={":p": {"S": "none"}},
    )
    assert missing["Items"] == []
    assert read == [3, 0]
    table = dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table("partitioned")
    assert "all_items" not in vars(table)
