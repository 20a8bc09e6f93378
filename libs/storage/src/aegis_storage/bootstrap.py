"""The foundation resources: what the bucket and table must look like, creating them
idempotently, and reading back what exists so drift can be reported.

``FOUNDATION`` is the single description used by ``aegis bootstrap``, by the slow cloud collector's
drift check and by the infrastructure-as-code test; nothing else spells these settings.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aegis_contracts import keys
from aegis_storage import fleetindex
from aegis_storage.clients import AwsClients
from aegis_storage.errors import NotFound, StorageError, translated
from aegis_storage.tasks import all_of

# how long the orchestrator's claim checks are kept: the execution log's default ttl
ORCHESTRATION_DAYS = 30
ORCHESTRATION_RULE = f"orchestration-expire-{ORCHESTRATION_DAYS}d"
LIFECYCLE_RULES: list[dict[str, Any]] = [
    {
        "ID": "raw-to-glacier-ir-90d",
        "Filter": {"Prefix": "raw/"},
        "Status": "Enabled",
        "Transitions": [{"Days": 90, "StorageClass": "GLACIER_IR"}],
        "NoncurrentVersionExpiration": {"NoncurrentDays": 90},
    },
    {
        "ID": "processed-to-standard-ia-365d",
        "Filter": {"Prefix": "processed/"},
        "Status": "Enabled",
        "Transitions": [{"Days": 365, "StorageClass": "STANDARD_IA"}],
        "NoncurrentVersionExpiration": {"NoncurrentDays": 90},
    },
    {
        "ID": "abort-incomplete-multipart-7d",
        "Filter": {"Prefix": ""},
        "Status": "Enabled",
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
    },
    {
        # claim checks of the orchestrator (execution inputs and step values passed by
        # reference): they live as long as the execution log that points at them (30 days);
        # the version an expiration turns noncurrent goes a day later, and with it its delete
        # marker (S3 removes an expired object's delete marker under a Days expiration)
        "ID": ORCHESTRATION_RULE,
        "Filter": {"Prefix": keys.ORCHESTRATION_PREFIX},
        "Status": "Enabled",
        "Expiration": {"Days": ORCHESTRATION_DAYS},
        "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
    },
]

PUBLIC_ACCESS_BLOCK = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}

KEY_SCHEMA = [
    {"AttributeName": "pk", "KeyType": "HASH"},
    {"AttributeName": "sk", "KeyType": "RANGE"},
]
ATTRIBUTE_DEFINITIONS = [
    {"AttributeName": "pk", "AttributeType": "S"},
    {"AttributeName": "sk", "AttributeType": "S"},
    {"AttributeName": keys.FLEET_PK, "AttributeType": "S"},
    {"AttributeName": keys.FLEET_SK, "AttributeType": "S"},
]
# the sparse fleet index (see aegis_contracts.keys): FACTORY LATEST items and firing alerts only
FLEET_INDEX: dict[str, Any] = {
    "IndexName": keys.FLEET_INDEX,
    "KeySchema": [
        {"AttributeName": keys.FLEET_PK, "KeyType": "HASH"},
        {"AttributeName": keys.FLEET_SK, "KeyType": "RANGE"},
    ],
    "Projection": {"ProjectionType": "KEYS_ONLY"},
}
INDEX_WAIT_S = 600.0
STREAM = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
TTL_ATTRIBUTE = "ttl"


@dataclass(slots=True)
class Step:
    resource: str
    setting: str
    action: str  # created | updated | unchanged
    detail: str = ""


@dataclass(slots=True)
class BootstrapReport:
    steps: list[Step] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(s.action != "unchanged" for s in self.steps)

    @property
    def store_created(self) -> bool:
        """Whether this run created the bucket or the table: the store was empty."""
        return any(s.setting in {"bucket", "table"} and s.action == "created" for s in self.steps)

    def add(self, resource: str, setting: str, action: str, detail: str = "") -> None:
        self.steps.append(Step(resource, setting, action, detail))


def normalize_rules(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lifecycle rules in a comparable form (emulators add defaults such as an empty prefix)."""
    out = []
    for rule in sorted(rules, key=lambda r: str(r.get("ID"))):
        norm: dict[str, Any] = {
            "ID": rule.get("ID"),
            "Prefix": (rule.get("Filter") or {}).get("Prefix", rule.get("Prefix", "")) or "",
            "Status": rule.get("Status"),
        }
        if rule.get("Transitions"):
            norm["Transitions"] = [
                {"Days": t.get("Days"), "StorageClass": t.get("StorageClass")}
                for t in rule["Transitions"]
            ]
        if rule.get("NoncurrentVersionExpiration"):
            norm["NoncurrentDays"] = rule["NoncurrentVersionExpiration"].get("NoncurrentDays")
        if (rule.get("Expiration") or {}).get("Days"):
            norm["ExpirationDays"] = rule["Expiration"]["Days"]
        if rule.get("AbortIncompleteMultipartUpload"):
            norm["AbortDays"] = rule["AbortIncompleteMultipartUpload"].get("DaysAfterInitiation")
        out.append(norm)
    return out


async def ensure_bucket(clients: AwsClients, bucket: str, report: BootstrapReport) -> None:
    """Create the bucket or correct it. A bucket made here has none of the settings yet (no
    versioning, no lifecycle, no public access block of its own), so they are written without
    being read first."""
    s3 = clients.s3
    res = f"s3://{bucket}"
    created = False
    try:
        with translated(f"head bucket {bucket}"):
            await s3.head_bucket(Bucket=bucket)
        report.add(res, "bucket", "unchanged")
    except NotFound:
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if clients.config.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": clients.config.region}
        with translated(f"create bucket {bucket}"):
            await s3.create_bucket(**kwargs)
        created = True
        report.add(res, "bucket", "created", clients.config.region)

    with translated(f"versioning of {bucket}"):
        status = None if created else (await s3.get_bucket_versioning(Bucket=bucket)).get("Status")
        if status != "Enabled":
            await s3.put_bucket_versioning(
                Bucket=bucket, VersioningConfiguration={"Status": "Enabled"}
            )
            report.add(res, "versioning", "updated", "Enabled")
        else:
            report.add(res, "versioning", "unchanged", "Enabled")

    current = [] if created else await bucket_lifecycle(clients, bucket)
    if normalize_rules(current) != normalize_rules(LIFECYCLE_RULES):
        with translated(f"lifecycle of {bucket}"):
            await s3.put_bucket_lifecycle_configuration(
                Bucket=bucket,
                LifecycleConfiguration={"Rules": LIFECYCLE_RULES},  # type: ignore[typeddict-item]
            )
        report.add(res, "lifecycle", "updated", f"{len(LIFECYCLE_RULES)} rules")
    else:
        report.add(res, "lifecycle", "unchanged", f"{len(LIFECYCLE_RULES)} rules")

    # (AWS blocks public access on a new bucket by default; the block is written all the same,
    # so that the bucket does not depend on the account's defaults)
    current_block = {} if created else await _public_access_block(clients, bucket)
    if current_block != PUBLIC_ACCESS_BLOCK:
        with translated(f"public access block of {bucket}"):
            await s3.put_public_access_block(
                Bucket=bucket,
                PublicAccessBlockConfiguration=PUBLIC_ACCESS_BLOCK,  # type: ignore[arg-type]
            )
        report.add(res, "public-access-block", "updated", "all blocked")
    else:
        report.add(res, "public-access-block", "unchanged", "all blocked")


async def bucket_lifecycle(clients: AwsClients, bucket: str) -> list[dict[str, Any]]:
    try:
        with translated(f"lifecycle of {bucket}"):
            resp = await clients.s3.get_bucket_lifecycle_configuration(Bucket=bucket)
    except StorageError as err:
        if "NoSuchLifecycleConfiguration" in str(err):
            return []
        raise
    return [dict(r) for r in resp.get("Rules", [])]


async def _public_access_block(clients: AwsClients, bucket: str) -> dict[str, Any]:
    try:
        with translated(f"public access block of {bucket}"):
            resp = await clients.s3.get_public_access_block(Bucket=bucket)
    except StorageError as err:
        if "NoSuchPublicAccessBlockConfiguration" in str(err):
            return {}
        raise
    return dict(resp.get("PublicAccessBlockConfiguration", {}))


async def _create_table(ddb: Any, table: str) -> dict[str, Any]:
    """Create the table; its description, from CreateTable itself when the table is ACTIVE at
    once (the waiter and a DescribeTable only while it is CREATING)."""
    with translated(f"create table {table}"):
        made = await ddb.create_table(
            TableName=table,
            KeySchema=KEY_SCHEMA,
            AttributeDefinitions=ATTRIBUTE_DEFINITIONS,
            GlobalSecondaryIndexes=[FLEET_INDEX],
            BillingMode="PAY_PER_REQUEST",
            StreamSpecification=STREAM,
        )
        desc: dict[str, Any] = dict(made["TableDescription"])
        if desc.get("TableStatus") != "ACTIVE":
            waiter = ddb.get_waiter("table_exists")
            await waiter.wait(TableName=table, WaiterConfig={"Delay": 1, "MaxAttempts": 60})
            desc = dict((await ddb.describe_table(TableName=table))["Table"])
    return desc


async def ensure_table(
    clients: AwsClients, table: str, report: BootstrapReport, *, reindex: bool = False
) -> None:
    """Create the table or correct it. A table made here has no TTL and no point-in-time
    recovery yet, so they are written without being read first."""
    ddb = clients.dynamodb
    created = False
    try:
        with translated(f"describe table {table}"):
            desc: dict[str, Any] = dict((await ddb.describe_table(TableName=table))["Table"])
        report.add(table, "table", "unchanged")
    except NotFound:
        desc = await _create_table(ddb, table)
        created = True
        report.add(
            table,
            "table",
            "created",
            f"pk/sk, PAY_PER_REQUEST, stream NEW_AND_OLD_IMAGES, index {keys.FLEET_INDEX}",
        )

    if sorted(map(str, desc.get("KeySchema", [])), key=str) != sorted(map(str, KEY_SCHEMA)):
        raise StorageError(
            f"table {table} has key schema {desc.get('KeySchema')}; the contract needs pk (HASH) "
            "and sk (RANGE) strings. It cannot be changed in place: migrate to a new table."
        )
    billing = (desc.get("BillingModeSummary") or {}).get("BillingMode", "PROVISIONED")
    if billing != "PAY_PER_REQUEST":
        with translated(f"billing of {table}"):
            await ddb.update_table(TableName=table, BillingMode="PAY_PER_REQUEST")
        report.add(table, "billing", "updated", "PAY_PER_REQUEST")
    else:
        report.add(table, "billing", "unchanged", "PAY_PER_REQUEST")

    stream: dict[str, Any] = dict(desc.get("StreamSpecification", {}))
    if not stream.get("StreamEnabled"):
        with translated(f"stream of {table}"):
            await ddb.update_table(TableName=table, StreamSpecification=STREAM)  # type: ignore[arg-type]
        report.add(table, "stream", "updated", "NEW_AND_OLD_IMAGES")
    elif stream.get("StreamViewType") != STREAM["StreamViewType"]:
        raise StorageError(
            f"table {table} streams {stream.get('StreamViewType')}; the contract needs "
            "NEW_AND_OLD_IMAGES. Disable the stream and run bootstrap again (consumers will miss "
            "changes while it is off)."
        )
    else:
        report.add(table, "stream", "unchanged", "NEW_AND_OLD_IMAGES")

    await ensure_fleet_index(clients, table, dict(desc), report, empty=created, reindex=reindex)

    with translated(f"ttl of {table}"):
        ttl = (
            {}
            if created
            else (await ddb.describe_time_to_live(TableName=table)).get("TimeToLiveDescription", {})
        )
        if ttl.get("TimeToLiveStatus") in {"ENABLED", "ENABLING"} and (
            ttl.get("AttributeName") == TTL_ATTRIBUTE
        ):
            report.add(table, "ttl", "unchanged", TTL_ATTRIBUTE)
        else:
            await ddb.update_time_to_live(
                TableName=table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
            report.add(table, "ttl", "updated", TTL_ATTRIBUTE)

    with translated(f"point-in-time recovery of {table}"):
        backup_desc: dict[str, Any] = (
            {}
            if created
            else dict(
                (await ddb.describe_continuous_backups(TableName=table)).get(
                    "ContinuousBackupsDescription", {}
                )
            )
        )
        pitr = backup_desc.get("PointInTimeRecoveryDescription", {})
        if pitr.get("PointInTimeRecoveryStatus") == "ENABLED":
            report.add(table, "pitr", "unchanged", "ENABLED")
        else:
            await ddb.update_continuous_backups(
                TableName=table,
                PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": True},
            )
            report.add(table, "pitr", "updated", "ENABLED")


def _index_of(desc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next(
        (dict(i) for i in desc.get("GlobalSecondaryIndexes", []) if i.get("IndexName") == name),
        None,
    )


def _index_shape(index: dict[str, Any] | None) -> dict[str, Any] | None:
    """An index description in a comparable form (keys and projection), None when absent."""
    if index is None:
        return None
    return {
        "name": index.get("IndexName"),
        "key_schema": [(k["AttributeName"], k["KeyType"]) for k in index.get("KeySchema", [])],
        "projection": (index.get("Projection") or {}).get("ProjectionType"),
    }


async def ensure_fleet_index(
    clients: AwsClients,
    table: str,
    desc: dict[str, Any],
    report: BootstrapReport,
    *,
    empty: bool = False,
    reindex: bool = False,
    wait_s: float = INDEX_WAIT_S,
) -> None:
    """Add the fleet index to a table made without it (DynamoDB builds it in the background:
    wait until it is ACTIVE) and ask its writers to backfill it: the items written before the
    index lack its keys (see :mod:`aegis_storage.fleetindex`; this role reads and writes no
    item, it raises the table's backfill generation). ``reindex`` asks again (after a rollout in
    which writers of the previous version kept writing). A table just created (``empty``) asks
    for nothing. An index of that name with another shape is an error an operator must resolve
    (it cannot be changed in place)."""
    ddb = clients.dynamodb
    current = _index_of(desc, keys.FLEET_INDEX)
    if current is None:
        with translated(f"add index {keys.FLEET_INDEX} to {table}"):
            await ddb.update_table(
                TableName=table,
                AttributeDefinitions=ATTRIBUTE_DEFINITIONS,  # type: ignore[arg-type]
                GlobalSecondaryIndexUpdates=[{"Create": FLEET_INDEX}],  # type: ignore[typeddict-item]
            )
        report.add(table, "fleet-index", "created", f"{keys.FLEET_INDEX} (KEYS_ONLY)")
    elif _index_shape(current) != _index_shape(FLEET_INDEX):
        raise StorageError(
            f"table {table} has an index {keys.FLEET_INDEX} shaped {_index_shape(current)}; the "
            f"contract needs {_index_shape(FLEET_INDEX)}. Delete that index and run bootstrap "
            "again (dashboards and the refresh cannot list the fleet until it is rebuilt)."
        )
    else:
        report.add(table, "fleet-index", "unchanged", f"{keys.FLEET_INDEX} (KEYS_ONLY)")
    if current is None or not _index_active(current):
        await _wait_index_active(clients, table, wait_s)
    arn = str(desc["TableArn"])
    if empty:
        report.add(table, "fleet-index-backfill", "unchanged", "new table: nothing to backfill")
    elif current is None or reindex:
        generation = await fleetindex.ask_for_backfill(ddb, table, arn)
        report.add(
            table,
            "fleet-index-backfill",
            "updated",
            f"generation {generation} asked of the processor and the alert dispatcher "
            "(each backfills its items on its next check)",
        )
    else:
        generation = await fleetindex.wanted_generation(ddb, table, arn)
        report.add(table, "fleet-index-backfill", "unchanged", f"generation {generation}")


def _index_active(index: dict[str, Any]) -> bool:
    # emulators may leave the status out
    return index.get("IndexStatus", "ACTIVE") == "ACTIVE" and not index.get("Backfilling")


async def _wait_index_active(clients: AwsClients, table: str, wait_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        with translated(f"describe table {table}"):
            desc = (await clients.dynamodb.describe_table(TableName=table))["Table"]
        index = _index_of(dict(desc), keys.FLEET_INDEX) or {}
        status = index.get("IndexStatus", "ACTIVE")
        if _index_active(index):
            return
        if asyncio.get_running_loop().time() >= deadline:
            raise StorageError(
                f"index {keys.FLEET_INDEX} of {table} is still {status} after {wait_s:.0f} s; "
                "run bootstrap again once it is ACTIVE"
            )
        await asyncio.sleep(5.0)


async def bootstrap(
    clients: AwsClients, *, bucket: str, table: str, reindex: bool = False
) -> BootstrapReport:
    """Create or correct the bucket and the table. A second run reports every step unchanged.
    ``reindex``: ask the writers to backfill the fleet index again."""
    report = BootstrapReport()
    bucket_report, table_report = BootstrapReport(), BootstrapReport()
    await all_of(
        ensure_bucket(clients, bucket, bucket_report),
        ensure_table(clients, table, table_report, reindex=reindex),
    )
    report.steps = bucket_report.steps + table_report.steps
    return report


async def describe_foundation(clients: AwsClients, *, bucket: str, table: str) -> dict[str, Any]:
    """What exists, read back with describe/get calls, in the shape of :func:`expected_foundation`."""
    s3, ddb = clients.s3, clients.dynamodb
    with translated("read back the foundation"):
        versioning = await s3.get_bucket_versioning(Bucket=bucket)
        desc = (await ddb.describe_table(TableName=table))["Table"]
        ttl = (await ddb.describe_time_to_live(TableName=table)).get("TimeToLiveDescription", {})
        backups = await ddb.describe_continuous_backups(TableName=table)
        location: str | None = (await s3.get_bucket_location(Bucket=bucket)).get(
            "LocationConstraint"
        )
    backup_desc: dict[str, Any] = dict(backups.get("ContinuousBackupsDescription", {}))
    pitr = backup_desc.get("PointInTimeRecoveryDescription", {})
    stream: dict[str, Any] = dict(desc.get("StreamSpecification", {}))
    return {
        "bucket": {
            "name": bucket,
            "region": location or "us-east-1",
            "versioning": versioning.get("Status"),
            "lifecycle": normalize_rules(await bucket_lifecycle(clients, bucket)),
            "public_access_block": await _public_access_block(clients, bucket),
        },
        "table": {
            "name": table,
            "key_schema": sorted(
                ((k["AttributeName"], k["KeyType"]) for k in desc.get("KeySchema", [])),
            ),
            "attributes": sorted(
                (a["AttributeName"], a["AttributeType"])
                for a in desc.get("AttributeDefinitions", [])
            ),
            "billing": (desc.get("BillingModeSummary") or {}).get("BillingMode"),
            "indexes": {keys.FLEET_INDEX: _index_shape(_index_of(dict(desc), keys.FLEET_INDEX))},
            "stream": {
                "enabled": bool(stream.get("StreamEnabled")),
                "view_type": stream.get("StreamViewType"),
            },
            "ttl": {"status": ttl.get("TimeToLiveStatus"), "attribute": ttl.get("AttributeName")},
            "pitr": pitr.get("PointInTimeRecoveryStatus"),
        },
    }


def expected_foundation(*, bucket: str, table: str, region: str) -> dict[str, Any]:
    """The S3 and DynamoDB contract in the shape :func:`describe_foundation` returns."""
    return {
        "bucket": {
            "name": bucket,
            "region": region,
            "versioning": "Enabled",
            "lifecycle": normalize_rules(LIFECYCLE_RULES),
            "public_access_block": PUBLIC_ACCESS_BLOCK,
        },
        "table": {
            "name": table,
            "key_schema": [("pk", "HASH"), ("sk", "RANGE")],
            "attributes": sorted(
                (a["AttributeName"], a["AttributeType"]) for a in ATTRIBUTE_DEFINITIONS
            ),
            "billing": "PAY_PER_REQUEST",
            "indexes": {keys.FLEET_INDEX: _index_shape(FLEET_INDEX)},
            "stream": {"enabled": True, "view_type": "NEW_AND_OLD_IMAGES"},
            "ttl": {"status": "ENABLED", "attribute": TTL_ATTRIBUTE},
            "pitr": "ENABLED",
        },
    }


def drift(actual: Any, expected: Any, path: str = "") -> list[str]:
    """Human-readable differences between two foundation descriptions (empty when they match)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        found: list[str] = []
        for k, want in expected.items():
            found += drift(actual.get(k), want, f"{path}.{k}" if path else k)
        return found
    return [] if actual == expected else [f"{path}: expected {expected!r}, found {actual!r}"]
