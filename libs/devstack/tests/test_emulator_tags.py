"""The emulator's DynamoDB tags follow AWS's tagging rules: a key is unique per resource."""

from __future__ import annotations

import pytest

from aegis_devstack.testing.emulator import fleet_table

pytestmark = pytest.mark.integration


async def test_tagging_a_table_with_a_key_it_has_replaces_the_value(aws, unique_id):
    ddb = aws.dynamodb
    table = f"tags-{unique_id}"
    await ddb.create_table(**fleet_table(table, projection="KEYS_ONLY"))
    arn = (await ddb.describe_table(TableName=table))["Table"]["TableArn"]
    await ddb.tag_resource(
        ResourceArn=arn, Tags=[{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "x"}]
    )
    await ddb.tag_resource(ResourceArn=arn, Tags=[{"Key": "a", "Value": "2"}])
    tags = (await ddb.list_tags_of_resource(ResourceArn=arn))["Tags"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("a", "2"), ("b", "x")]
