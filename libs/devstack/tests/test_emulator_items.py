"""The emulator holds DynamoDB's item size limit as DynamoDB does: an item's attributes count
together (names and values), one over the limit is refused whole, one under it is stored."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from aegis_devstack.testing.emulator import fleet_table

pytestmark = pytest.mark.integration

KB = 1_000


def item(pk: str, *sizes: int) -> dict[str, dict[str, str]]:
    """An item of ``pk`` with one string attribute per size (bytes)."""
    return {"pk": {"S": pk}, "sk": {"S": "x"}} | {
        f"a{i}": {"S": "v" * n} for i, n in enumerate(sizes)
    }


async def test_an_item_over_the_limit_in_all_its_attributes_is_refused_and_one_under_it_kept(
    aws, unique_id
):
    ddb = aws.dynamodb
    table = f"items-{unique_id}"
    await ddb.create_table(**fleet_table(table, projection="KEYS_ONLY"))
    await ddb.put_item(TableName=table, Item=item("under", 130 * KB, 130 * KB, 130 * KB))
    with pytest.raises(ClientError) as refused:  # each under the limit, together over it
        await ddb.put_item(TableName=table, Item=item("over", 140 * KB, 140 * KB, 140 * KB))
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "maximum allowed size" in refused.value.response["Error"]["Message"]
    got = await ddb.get_item(TableName=table, Key={"pk": {"S": "under"}, "sk": {"S": "x"}})
    assert len(got["Item"]["a2"]["S"]) == 130 * KB
    missing = await ddb.get_item(TableName=table, Key={"pk": {"S": "over"}, "sk": {"S": "x"}})
    assert "Item" not in missing


async def test_a_query_pages_by_the_sizes_its_items_have_now_after_one_grew(aws, unique_id):
    """DynamoDB ends a Query's page at 1 MB of items. Four items of 240 KB fit one page; once
    the first has grown to 300 KB (an update, after a query measured it), they no longer do."""
    ddb = aws.dynamodb
    table = f"pages-{unique_id}"
    await ddb.create_table(**fleet_table(table, projection="KEYS_ONLY"))
    for n in range(4):
        row = {"pk": {"S": "p"}, "sk": {"S": f"{n}"}, "a": {"S": "v" * (240 * KB)}}
        await ddb.put_item(TableName=table, Item=row)
    query = {"TableName": table, "KeyConditionExpression": "pk = :p"}
    query["ExpressionAttributeValues"] = {":p": {"S": "p"}}
    whole = await ddb.query(**query)
    assert whole["Count"] == 4 and "LastEvaluatedKey" not in whole
    await ddb.update_item(
        TableName=table,
        Key={"pk": {"S": "p"}, "sk": {"S": "0"}},
        UpdateExpression="SET b = :b",
        ExpressionAttributeValues={":b": {"S": "v" * (60 * KB)}},
    )
    paged = await ddb.query(**query)
    assert paged["Count"] == 3 and paged["LastEvaluatedKey"]["sk"] == {"S": "2"}
