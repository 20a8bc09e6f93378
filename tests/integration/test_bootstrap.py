"""``aegis bootstrap`` against the emulator: what it leaves, read back with describe/get calls,
matches the S3 and DynamoDB contract exactly; a second run changes nothing; drift is found and repaired."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts import keys
from aegis_devstack.testing.cli import run_aegis
from aegis_devstack.testing.emulator import arequest_counts, areset_request_counts
from aegis_storage.bootstrap import (
    LIFECYCLE_RULES,
    bootstrap,
    describe_foundation,
    drift,
    expected_foundation,
)
from aegis_storage.clients import AwsConfig, open_clients
from aegis_storage.fleetindex import FAMILIES, Backfilled, IndexBackfill
from aegis_storage.readmodel import ReadModel

pytestmark = pytest.mark.integration

DEFAULT_BUCKET = "aegis-bucket-data"
DEFAULT_TABLE = "AEGIS-DynamoDB-FactoryStatus"


async def run_cli(endpoint: str, *args: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``aegis bootstrap ARGS`` as a process of its own, on ``endpoint`` with ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")}
    env |= {"AEGIS_AWS_ENDPOINT_URL": endpoint, "AEGIS_LOG_FORMAT": "console", **settings}
    code, out, err = await run_aegis(env, "bootstrap", *args)
    return subprocess.CompletedProcess(["aegis", "bootstrap", *args], code, out, err)


async def test_bootstrap_command_leaves_the_contract_and_is_idempotent(aws_endpoint, aws):
    # the default settings: exactly what `make run` creates
    first = await run_cli(aws_endpoint)
    assert first.returncode == 0, first.stderr
    second = await run_cli(aws_endpoint)
    assert second.returncode == 0, second.stderr
    assert "nothing to change" in second.stdout
    assert "created" not in second.stdout
    assert "updated" not in second.stdout

    actual = await describe_foundation(aws, bucket=DEFAULT_BUCKET, table=DEFAULT_TABLE)
    assert actual == expected_foundation(
        bucket=DEFAULT_BUCKET, table=DEFAULT_TABLE, region="ap-south-1"
    )
    # spelled out once more, independent of the module's own description
    lifecycle = {r["ID"]: r for r in actual["bucket"]["lifecycle"]}
    assert lifecycle["raw-to-glacier-ir-90d"]["Prefix"] == "raw/"
    assert lifecycle["raw-to-glacier-ir-90d"]["Transitions"] == [
        {"Days": 90, "StorageClass": "GLACIER_IR"}
    ]
    assert lifecycle["raw-to-glacier-ir-90d"]["NoncurrentDays"] == 90
    assert lifecycle["processed-to-standard-ia-365d"]["Prefix"] == "processed/"
    assert lifecycle["processed-to-standard-ia-365d"]["Transitions"] == [
        {"Days": 365, "StorageClass": "STANDARD_IA"}
    ]
    assert lifecycle["processed-to-standard-ia-365d"]["NoncurrentDays"] == 90
    assert lifecycle["abort-incomplete-multipart-7d"]["AbortDays"] == 7
    # the orchestrator's claim checks go after 30 days, their noncurrent versions a day later
    assert lifecycle["orchestration-expire-30d"]["Prefix"] == "orchestration/"
    assert lifecycle["orchestration-expire-30d"]["ExpirationDays"] == 30
    assert lifecycle["orchestration-expire-30d"]["NoncurrentDays"] == 1
    assert not any(
        r["Prefix"].startswith(("processed_agg/", "image_snapshot/", "reports/"))
        for r in lifecycle.values()
    )
    table = actual["table"]
    assert table["billing"] == "PAY_PER_REQUEST"
    assert table["stream"] == {"enabled": True, "view_type": "NEW_AND_OLD_IMAGES"}
    assert table["ttl"] == {"status": "ENABLED", "attribute": "ttl"}
    assert table["pitr"] == "ENABLED"
    assert actual["bucket"]["versioning"] == "Enabled"
    assert actual["bucket"]["region"] == "ap-south-1"

    check = await run_cli(aws_endpoint, "--check")
    assert check.returncode == 0
    assert "matches the contract" in check.stdout


async def test_drift_is_reported_then_repaired(aws_endpoint, aws, unique_id):
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    await bootstrap(aws, bucket=bucket, table=table)
    await aws.s3.put_bucket_versioning(
        Bucket=bucket, VersioningConfiguration={"Status": "Suspended"}
    )
    await aws.s3.put_bucket_lifecycle_configuration(
        Bucket=bucket, LifecycleConfiguration={"Rules": LIFECYCLE_RULES[2:]}
    )

    found = drift(
        await describe_foundation(aws, bucket=bucket, table=table),
        expected_foundation(bucket=bucket, table=table, region="ap-south-1"),
    )
    assert any(line.startswith("bucket.versioning") for line in found)
    assert any(line.startswith("bucket.lifecycle") for line in found)

    check = await run_cli(aws_endpoint, "--check", AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert check.returncode == 3
    assert "bucket.versioning" in check.stderr

    repaired = await run_cli(aws_endpoint, AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert repaired.returncode == 0, repaired.stderr
    assert "changes applied" in repaired.stdout
    assert "updated" in repaired.stdout
    assert (
        await run_cli(aws_endpoint, "--check", AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    ).returncode == 0


async def test_bootstrap_fails_clearly_when_the_endpoint_is_down():
    # two attempts a request, not five: the give-up, without the back-off of three more retries
    result = await run_cli(
        "http://127.0.0.1:9", AEGIS_BUCKET="aegis-nowhere", AEGIS_AWS_MAX_ATTEMPTS="2"
    )
    assert result.returncode == 5  # aegis_cli.exitcodes.UNAVAILABLE: nothing answered
    assert "bootstrap failed" in result.stderr and "http://127.0.0.1:9" in result.stderr


# -- the fleet index on a table of the previous version ------------------------------------

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


async def test_bootstrap_adds_the_index_to_a_previous_version_table_and_its_writers_backfill_it(
    aws_endpoint, aws, unique_id, fire_alert
):
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    ddb = aws.dynamodb
    # the table as the version before the index made it, with its data
    await ddb.create_table(
        TableName=table,
        KeySchema=[
            {"AttributeName": "pk", "KeyType": "HASH"},
            {"AttributeName": "sk", "KeyType": "RANGE"},
        ],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    factories = [f"factory-{i:02d}" for i in range(12)]
    ttl = str(int(T0.timestamp()) + 3600)
    for f in factories:
        pk = {"S": keys.factory_pk(f)}
        await ddb.put_item(
            TableName=table, Item={"pk": pk, "sk": {"S": "LATEST"}, "factory_id": {"S": f}}
        )
        for n in range(3):
            sk = keys.history_state_sk(T0 + timedelta(seconds=n))
            await ddb.put_item(TableName=table, Item={"pk": pk, "sk": {"S": sk}, "ttl": {"N": ttl}})
    for scope, firing in (("factory-00", True), ("factory-01", False), ("cloud-infra", True)):
        item = fire_alert(scope, firing=firing, version=1, ttl=int(ttl)).model_dump(mode="json")
        await ddb.put_item(
            TableName=table,
            Item={
                k: {"BOOL": v}
                if isinstance(v, bool)
                else {"N": str(v)}
                if isinstance(v, int)
                else {"S": str(v)}
                for k, v in item.items()
                if v is not None
            },
        )
    await aws.s3.create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
    )

    check = await run_cli(aws_endpoint, "--check", AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert check.returncode == 3
    assert "table.indexes.fleet" in check.stderr

    first = await run_cli(aws_endpoint, AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert first.returncode == 0, first.stderr
    assert "fleet-index" in first.stdout and "created" in first.stdout
    assert "generation 1 asked of the processor and the alert dispatcher" in first.stdout

    rm = ReadModel(aws.items, table)
    assert await rm.fleet_ids() == []  # asked, not yet done: bootstrap's role writes no item
    backfills = {
        family.name: IndexBackfill(ddb, table, family, clock=lambda: T0, interval=timedelta(1))
        for family in FAMILIES
    }
    done = {name: await b.check() for name, b in backfills.items()}
    assert done == {
        "factory": Backfilled("factory", 1, 12),
        "alert": Backfilled("alert", 1, 2),  # the two firing ones
    }
    assert await rm.fleet_ids() == factories
    assert [a["pk"] for a in await rm.firing_alerts(now=T0)] == [
        "ALERT#cloud-infra",
        "ALERT#factory-00",
    ]
    found = drift(
        await describe_foundation(aws, bucket=bucket, table=table),
        expected_foundation(bucket=bucket, table=table, region="ap-south-1"),
    )
    assert found == []

    again = await run_cli(aws_endpoint, AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert again.returncode == 0, again.stderr
    assert "nothing to change" in again.stdout
    assert "generation 1" in again.stdout and "asked" not in again.stdout
    assert [await b.check() for b in backfills.values()] == [None, None]  # no second scan
    assert (
        await run_cli(aws_endpoint, "--check", AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    ).returncode == 0
    report = await bootstrap(aws, bucket=bucket, table=table)
    assert not report.changed

    # a writer of the previous version, still running during the rollout, adds a factory
    # without index keys; --reindex asks again, the processor's next check picks it up
    await ddb.put_item(
        TableName=table,
        Item={"pk": {"S": "FACTORY#factory-late"}, "sk": {"S": "LATEST"}},
    )
    assert "factory-late" not in await rm.fleet_ids()
    reindexed = await run_cli(aws_endpoint, "--reindex", AEGIS_BUCKET=bucket, AEGIS_TABLE=table)
    assert reindexed.returncode == 0, reindexed.stderr
    assert "generation 2 asked" in reindexed.stdout
    assert await backfills["factory"].check() == Backfilled("factory", 2, 1)
    assert await rm.fleet_ids() == sorted([*factories, "factory-late"])
    assert await backfills["factory"].check() is None


async def test_a_new_table_is_made_with_the_index_and_never_scanned(aws, unique_id):
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    report = await bootstrap(aws, bucket=bucket, table=table)
    steps = {s.setting: s for s in report.steps}
    assert steps["fleet-index-backfill"].detail == "new table: nothing to backfill"
    assert "index fleet" in steps["table"].detail
    again = await bootstrap(aws, bucket=bucket, table=table)
    assert not again.changed


async def test_a_new_bucket_and_table_are_made_without_reading_settings_they_cannot_have(
    private_emulator, unique_id
):
    """Bootstrap of a new bucket and table writes each setting without reading it first (a
    resource just made has none) and leaves the contract; the second run reads each one and
    writes nothing."""
    bucket, table = f"aegis-{unique_id}", f"AEGIS-{unique_id}"
    async with open_clients(AwsConfig(endpoint_url=private_emulator)) as clients:
        await areset_request_counts(private_emulator)
        await bootstrap(clients, bucket=bucket, table=table)
        made = await arequest_counts(private_emulator)
        await areset_request_counts(private_emulator)
        again = await bootstrap(clients, bucket=bucket, table=table)
        checked = await arequest_counts(private_emulator)
        found = await describe_foundation(clients, bucket=bucket, table=table)
    assert found == expected_foundation(bucket=bucket, table=table, region="ap-south-1")
    assert made.ops("s3") == {
        "HeadBucket": 1,
        "CreateBucket": 1,
        "Bucket:PUT:versioning": 1,
        "Bucket:PUT:lifecycle": 1,
        "Bucket:PUT:publicAccessBlock": 1,
    }
    assert made.ops("dynamodb") == {
        "DescribeTable": 1,  # the one that finds no table
        "CreateTable": 1,
        "UpdateTimeToLive": 1,
        "UpdateContinuousBackups": 1,
    }
    assert not again.changed
    assert checked.ops("s3") == {
        "HeadBucket": 1,
        "Bucket:GET:versioning": 1,
        "Bucket:GET:lifecycle": 1,
        "Bucket:GET:publicAccessBlock": 1,
    }
    assert checked.ops("dynamodb") == {
        "DescribeTable": 1,
        "DescribeTimeToLive": 1,
        "DescribeContinuousBackups": 1,
        "ListTagsOfResource": 1,  # the fleet index's backfill generation (a table tag)
    }
