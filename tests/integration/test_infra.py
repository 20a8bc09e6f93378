"""deploy/infra: the CloudFormation template creates what ``aegis bootstrap`` creates, and the IAM
policy of each service allows what its code calls and nothing else, proven on moto_server with IAM
enforcement on (the emulator authorizes like AWS: see aegis_devstack.motoserver).

The policies under test are the committed JSON files (deploy/infra/policies), the calls are the
project's own storage library (ObjectStore, ReadModel, bootstrap), so a policy that stops matching
the code fails here.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
import yaml
from botocore.exceptions import ClientError

from aegis_aggregator.aggregate import JOB as AGGREGATE_JOB
from aegis_aggregator.aggregate import Aggregator, Source
from aegis_contracts import keys
from aegis_contracts.keys import raw_metadata_key
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.localservers import free_port, start_moto_server
from aegis_devstack.testing.emulator import post_form
from aegis_devstack.testing.infra import cfn_lifecycle_rule, load_render, resolve
from aegis_orchestrator.expiry import READER, ExpiryAnnouncer
from aegis_runtime.metrics import Metrics
from aegis_storage import fleetindex
from aegis_storage.bootstrap import (
    bootstrap,
    describe_foundation,
    expected_foundation,
    normalize_rules,
)
from aegis_storage.clients import AwsClients, AwsConfig, aio_config, new_session, open_client
from aegis_storage.dynamo import open_items
from aegis_storage.errors import StorageError
from aegis_storage.items import Put
from aegis_storage.objectclient import ChainCredentials, ObjectClient, StaticKeys
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore, PresignedPost, post_policy
from aegis_storage_tools.audit import Auditor, AuditStatus
from aegis_storage_tools.seal import Outcome, Sealer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "deploy" / "infra"
REGION = "ap-south-1"
ACCOUNT = "123456789012"  # moto's account
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


render = load_render(INFRA)
SERVICES = render.policy_names()


def policy_for(service: str, bucket: str, table: str) -> dict[str, Any]:
    values = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "BucketName": bucket,
        "TableName": table,
    }
    doc: dict[str, Any] = render.substitute(render.load_policy(service), values)
    return doc


# -- the template ------------------------------------------------------------------------------


def test_the_committed_template_is_the_rendered_one():
    committed = (INFRA / "foundation.yaml").read_text()
    assert committed == render.rendered_text(), (
        "deploy/infra/foundation.yaml is stale: run .venv/bin/python deploy/infra/render.py"
    )


def test_cfn_lint_accepts_the_template_and_knows_every_iam_action():
    from cfnlint.api import ManualArgs, lint_all, lint_file  # noqa: PLC0415

    found = lint_file(INFRA / "foundation.yaml", config=ManualArgs(regions=[REGION]))
    assert [str(m) for m in found] == []
    # the same linter does see a misspelt action or CloudFormation property
    broken = (INFRA / "foundation.yaml").read_text().replace("s3:GetObject", "s3:GetObjekt")
    broken = broken.replace("TransitionInDays", "TransitionDays")
    rules = {m.rule.id for m in lint_all(broken)}
    assert {"W3037", "E3002"} <= rules


def test_every_policy_denies_deletes_under_raw_and_only_ingest_and_migration_write_it():
    for service in SERVICES:
        statements = render.load_policy(service)["Statement"]
        denies = [s for s in statements if s["Effect"] == "Deny"]
        assert any(
            s["Action"] == "s3:DeleteObject*" and s["Resource"].endswith("/raw/*") for s in denies
        ), service
        raw_writes = [
            s
            for s in statements
            if s["Effect"] == "Allow"
            and "s3:PutObject" in _list(s["Action"])
            and any(r.endswith(("/raw/*", "}/*")) for r in _list(s["Resource"]))
        ]
        assert bool(raw_writes) == (service in {"ingest", "storage-tools"}), service


def _list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def foundation_from_template(template: dict[str, Any], *, bucket: str, table: str) -> dict:
    """The template's bucket and table in the shape of ``describe_foundation`` (CloudFormation's
    property names mapped to the S3/DynamoDB API's, independently of render.py)."""
    res = template["Resources"]
    b, t = res["DataBucket"]["Properties"], res["ReadModelTable"]["Properties"]
    rules = [cfn_lifecycle_rule(rule) for rule in b["LifecycleConfiguration"]["Rules"]]
    stream = t.get("StreamSpecification", {})
    ttl = t.get("TimeToLiveSpecification", {})
    return {
        "bucket": {
            "name": bucket,
            "region": REGION,
            "versioning": b.get("VersioningConfiguration", {}).get("Status"),
            "lifecycle": normalize_rules(rules),
            "public_access_block": b.get("PublicAccessBlockConfiguration"),
        },
        "table": {
            "name": table,
            "key_schema": sorted((k["AttributeName"], k["KeyType"]) for k in t["KeySchema"]),
            "attributes": sorted(
                (a["AttributeName"], a["AttributeType"]) for a in t["AttributeDefinitions"]
            ),
            "billing": t.get("BillingMode"),
            "indexes": {
                i["IndexName"]: {
                    "name": i["IndexName"],
                    "key_schema": [(k["AttributeName"], k["KeyType"]) for k in i["KeySchema"]],
                    "projection": i["Projection"]["ProjectionType"],
                }
                for i in t.get("GlobalSecondaryIndexes", [])
            },
            "stream": {"enabled": bool(stream), "view_type": stream.get("StreamViewType")},
            "ttl": {
                "status": "ENABLED" if ttl.get("Enabled") else "DISABLED",
                "attribute": ttl.get("AttributeName"),
            },
            "pitr": "ENABLED"
            if t.get("PointInTimeRecoverySpecification", {}).get("PointInTimeRecoveryEnabled")
            else "DISABLED",
        },
    }


async def test_the_template_deploys_and_equals_what_bootstrap_creates(aws_endpoint, aws, unique_id):
    text = (INFRA / "foundation.yaml").read_text()
    bucket, table = f"aegis-cfn-{unique_id}", f"AEGIS-cfn-{unique_id}"
    stack = f"aegis-foundation-{unique_id}"
    async with open_client("cloudformation", AwsConfig(endpoint_url=aws_endpoint)) as cfn:
        await cfn.create_stack(
            StackName=stack,
            TemplateBody=text,
            Parameters=[
                {"ParameterKey": "BucketName", "ParameterValue": bucket},
                {"ParameterKey": "TableName", "ParameterValue": table},
                # IAM names are account-wide: a stack of its own in this shared emulator
                {"ParameterKey": "NamePrefix", "ParameterValue": unique_id},
            ],
            Capabilities=["CAPABILITY_NAMED_IAM"],
        )
        described = (await cfn.describe_stacks(StackName=stack))["Stacks"][0]
        assert described["StackStatus"] == "CREATE_COMPLETE", described
        resources = await cfn.list_stack_resources(StackName=stack)
        created = [r["LogicalResourceId"] for r in resources["StackResourceSummaries"]]
    template = yaml.safe_load(text)
    # the emulator's CloudFormation has no AWS::S3::BucketPolicy (it lists one resource without
    # a name or type and applies nothing): the bucket policy is put on a bucket and attacked below;
    # without EcsClusterArn the schedules and their roles are not made (listed the same way)
    off = {name for name, r in template["Resources"].items() if r.get("Condition") == "SchedulesOn"}
    assert {"SealRawSchedule", "SealRawSchedulerRole"} <= off
    made = set(template["Resources"]) - {"DataBucketPolicy"} - off
    assert sorted(created) == sorted(["", *[""] * len(off), *made])

    # bootstrap on the same emulator, fresh names
    boot_bucket, boot_table = f"aegis-boot-{unique_id}", f"AEGIS-boot-{unique_id}"
    await bootstrap(aws, bucket=boot_bucket, table=boot_table)
    booted = await describe_foundation(aws, bucket=boot_bucket, table=boot_table)
    assert booted == expected_foundation(bucket=boot_bucket, table=boot_table, region=REGION)

    def renamed_to_boot(found: dict) -> dict:
        found = copy.deepcopy(found)
        found["bucket"]["name"], found["table"]["name"] = boot_bucket, boot_table
        return found

    # everything the template declares, read the way CloudFormation reads it ...
    declared = foundation_from_template(template, bucket=bucket, table=table)
    assert renamed_to_boot(declared) == booted
    # ... and what the emulator's CloudFormation really made: it creates the bucket and the table
    # with keys, billing and stream, but drops versioning, lifecycle, public access block, TTL and
    # PITR (moto's AWS::S3::Bucket / AWS::DynamoDB::Table ignore them), which the line above covers
    deployed = renamed_to_boot(await describe_foundation(aws, bucket=bucket, table=table))
    for field in ("key_schema", "attributes", "billing", "indexes", "stream"):
        assert deployed["table"][field] == booted["table"][field], field
    assert deployed["bucket"]["region"] == REGION

    # the managed policies the stack created are the policy files, placeholders resolved
    async with open_client("iam", AwsConfig(endpoint_url=aws_endpoint)) as iam:
        for service in SERVICES:
            arn = f"arn:aws:iam::{ACCOUNT}:policy/{unique_id}-{service}"
            version = (await iam.get_policy(PolicyArn=arn))["Policy"]["DefaultVersionId"]
            doc = (await iam.get_policy_version(PolicyArn=arn, VersionId=version))["PolicyVersion"][
                "Document"
            ]
            if isinstance(doc, str):
                doc = json.loads(unquote(doc))
            assert doc == policy_for(service, bucket, table), service


# -- IAM enforcement ---------------------------------------------------------------------------

BUCKET, TABLE = "aegis-iam", "AEGIS-iam"
F = "factory-iam"
RAW = f"raw/{F}/factory_state/yyyy=2026/mm=11/dd=30/m-00000001.json"
PROCESSED = f"processed/{F}/factory_state/yyyy=2026/mm=11/dd=30/hh=12/m-00000001.json"
SNAPSHOT = f"processed/{F}/state_snapshot/yyyy=2026/mm=11/dd=30/hh=12/2026-11-30T12:00:00.000Z.json"
REPORT = f"reports/daily/yyyy=2026/mm=11/dd=29/{F}/report.md"
IMAGE = f"image_snapshot/factory_id={F}/yyyy=2026/mm=11/dd=30/hh=12/cam-1.jpg"
INCIDENT_ID = "20261130-0123abcd"
INCIDENT = f"incidents/{F}/yyyy=2026/mm=11/dd=30/{INCIDENT_ID}.json"
# a closed record already there (seeded): what the reporter reads
CLOSED_INCIDENT = f"incidents/{F}/yyyy=2026/mm=11/dd=29/20261129-0123abcd.json"
LEGACY = "datasets/factory-iam/old.json"
WINDOW_OBJECT = f"processed_agg/{F}/metrics_5m/yyyy=2026/mm=11/dd=30/hh=12/mm=00.json"


@pytest.fixture(scope="module")
def iam_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto_server of this module's own: IAM enforcement is server-wide."""
    log = tmp_path_factory.mktemp("iam-moto") / "moto.log"
    server = start_moto_server("127.0.0.1", free_port(), log_file=log)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="module")
async def credentials(iam_endpoint: str) -> dict[str, tuple[str, str]]:
    """Bucket, table and seed data made while auth is off; then a user per service with its
    policy, then enforcement on (``/moto-api/reset-auth`` 0: every later request is checked)."""
    cfg = AwsConfig(endpoint_url=iam_endpoint)
    async with AsyncExitStack() as stack:
        admin = await _clients(stack, cfg, ("test", "test"))
        await bootstrap(admin, bucket=BUCKET, table=TABLE)
        store = ObjectStore(admin, BUCKET)
        for key in (RAW, PROCESSED, SNAPSHOT, REPORT, IMAGE, LEGACY, CLOSED_INCIDENT):
            await store.put_bytes(key, b'{"seed": true}')
        await ReadModel(admin.items, TABLE).put_item(
            {"pk": f"FACTORY#{F}", "sk": "LATEST", "updated_at": "2026-11-30T12:00:00.000Z"}
        )
        iam = await stack.enter_async_context(open_client("iam", cfg))
        keys: dict[str, tuple[str, str]] = {}
        for service in SERVICES:
            user = f"aegis-{service}"
            await iam.create_user(UserName=user)
            arn = (
                await iam.create_policy(
                    PolicyName=user,
                    PolicyDocument=json.dumps(policy_for(service, BUCKET, TABLE)),
                )
            )["Policy"]["Arn"]
            await iam.attach_user_policy(UserName=user, PolicyArn=arn)
            key = (await iam.create_access_key(UserName=user))["AccessKey"]
            keys[service] = (key["AccessKeyId"], key["SecretAccessKey"])
        keys[OPERATOR] = await _operator_and_break_glass(iam)
        # below every identity: the template's bucket policy
        await admin.s3.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps(bucket_policy()))
    async with httpx.AsyncClient() as http:
        enforce = await http.post(f"{iam_endpoint}/moto-api/reset-auth", content=b"0")
        enforce.raise_for_status()
    return keys


OPERATOR = "operator"  # an account administrator: s3:* and dynamodb:* on everything
PREFIX = "aegis"  # the template's NamePrefix
BREAK_GLASS_ROLE = f"arn:aws:iam::{ACCOUNT}:role/{PREFIX}-raw-break-glass"


def bucket_policy() -> dict[str, Any]:
    values = {"AWS::Partition": "aws", "AWS::AccountId": ACCOUNT, "BucketName": BUCKET}
    doc: dict[str, Any] = render.substitute(
        render.load_document(render.BUCKET_POLICY), {**values, "NamePrefix": PREFIX}
    )
    return doc


async def _operator_and_break_glass(iam: Any) -> tuple[str, str]:
    """An operator whose own policy allows everything, and the template's break-glass role
    that it may assume (the template's trust policy, this operator as BreakGlassPrincipal)."""
    await iam.create_user(UserName=f"aegis-{OPERATOR}")
    everything = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": ["s3:*", "dynamodb:*", "sts:*"], "Resource": "*"}
        ],
    }
    await iam.put_user_policy(
        UserName=f"aegis-{OPERATOR}", PolicyName="all", PolicyDocument=json.dumps(everything)
    )
    operator_arn = f"arn:aws:iam::{ACCOUNT}:user/aegis-{OPERATOR}"
    template = render.render()
    role = template["Resources"]["RawBreakGlassRole"]["Properties"]
    parameters = {
        "AWS::Partition": "aws",
        "AWS::AccountId": ACCOUNT,
        "AWS::Region": REGION,
        "BucketName": BUCKET,
        "NamePrefix": PREFIX,
        "BreakGlassPrincipal": operator_arn,
    }
    resolved = resolve(render, role, parameters, {"BreakGlassPrincipalGiven": True})
    await iam.create_role(
        RoleName=resolved["RoleName"],
        AssumeRolePolicyDocument=json.dumps(resolved["AssumeRolePolicyDocument"]),
    )
    for policy in resolved["Policies"]:
        await iam.put_role_policy(
            RoleName=resolved["RoleName"],
            PolicyName=policy["PolicyName"],
            PolicyDocument=json.dumps(policy["PolicyDocument"]),
        )
    key = (await iam.create_access_key(UserName=f"aegis-{OPERATOR}"))["AccessKey"]
    return (key["AccessKeyId"], key["SecretAccessKey"])


async def _clients(stack: AsyncExitStack, cfg: AwsConfig, key: tuple[str, str]) -> AwsClients:
    session = new_session()
    kwargs: dict[str, Any] = {
        "region_name": REGION,
        "endpoint_url": cfg.endpoint_url,
        "config": aio_config(cfg),
        "aws_access_key_id": key[0],
        "aws_secret_access_key": key[1],
    }
    s3 = await stack.enter_async_context(session.create_client("s3", **kwargs))
    ddb = await stack.enter_async_context(session.create_client("dynamodb", **kwargs))
    objects = ObjectClient(cfg, ChainCredentials(StaticKeys(*key)))
    static = {"aws_access_key_id": key[0], "aws_secret_access_key": key[1]}
    items = await stack.enter_async_context(open_items(cfg, session, static))
    return AwsClients(s3=s3, dynamodb=ddb, config=cfg, objects=objects, items=items)


class As:
    """One service's view: its storage library objects, signed with its own keys."""

    def __init__(self, clients: AwsClients) -> None:
        self.clients = clients
        self.store = ObjectStore(clients, BUCKET)
        self.readmodel = ReadModel(clients.items, TABLE)


@pytest.fixture
async def as_service(
    iam_endpoint: str, credentials: dict[str, tuple[str, str]]
) -> AsyncIterator[Callable[[str], Awaitable[As]]]:
    async with AsyncExitStack() as stack:

        async def make(service: str) -> As:
            cfg = AwsConfig(endpoint_url=iam_endpoint, max_attempts=1)
            return As(await _clients(stack, cfg, credentials[service]))

        yield make


async def denied(call: Awaitable[Any]) -> None:
    with pytest.raises(StorageError, match="AccessDenied"):
        await call


async def scan_table(me: As, **kwargs: Any) -> Any:
    """A Scan of the read-model table (granted to the index backfill's writers only, keys only:
    listings use the index)."""
    try:
        return await me.clients.dynamodb.scan(TableName=TABLE, **kwargs)
    except Exception as err:
        raise StorageError(str(err)) from err


def item(pk: str, sk: str) -> dict[str, Any]:
    return {"pk": pk, "sk": sk, "at": "2026-11-30T12:00:00.000Z"}


@pytest.mark.parametrize("service", SERVICES)
async def test_nobody_deletes_under_raw(as_service, service):
    me = await as_service(service)
    with pytest.raises(Exception, match="AccessDenied"):
        await me.clients.s3.delete_object(Bucket=BUCKET, Key=RAW)
    # nor a version of it (with versioning on, that is what really removes bytes)
    with pytest.raises(Exception, match="AccessDenied"):
        await me.clients.s3.delete_object(Bucket=BUCKET, Key=RAW, VersionId="null")
    # a batch delete is authorized key by key, as on AWS
    assert await delete_refused(me, [RAW])


async def delete_refused(me: As, keys: list[str]) -> bool:
    """A batch delete of ``keys`` refused: the whole call (this emulator) or each key (AWS)."""
    try:
        failed = await me.store.delete_many(keys)
    except StorageError as err:
        return "AccessDenied" in str(err)
    return failed == keys


async def test_ingest_writes_raw_once_and_nothing_else(as_service):
    me = await as_service("ingest")
    key = f"raw/{F}/factory_state/yyyy=2026/mm=11/dd=30/m-ingest-0001.json"
    assert (await me.store.put_immutable(key, b"{}")).outcome.value == "created"
    # the conditional put's duplicate path reads the existing object back
    assert (await me.store.put_immutable(key, b"{}")).outcome.value == "duplicate"
    await denied(me.store.put_bytes(PROCESSED, b"{}"))
    await denied(me.readmodel.put_item(item(f"FACTORY#{F}", "LATEST")))
    await denied(me.readmodel.put_items([Put(item(f"ALERT#{F}", "INTENT#STATE#x"))]))
    await denied(me.store.get_bytes(REPORT))


async def test_processor_writes_processed_and_the_read_model_not_raw(as_service):
    me = await as_service("processor")
    assert await me.store.get_bytes(RAW)
    await me.store.put_bytes(PROCESSED.replace("m-00000001", "m-processor1"), b"{}")
    await me.store.put_json(SNAPSHOT.replace("12:00:00", "12:00:01"), {"ok": True})
    assert await me.store.exists(REPORT)
    assert not await me.store.exists(REPORT.replace("dd=29", "dd=28"))
    await me.readmodel.put_item(item(f"FACTORY#{F}", "HISTORY#STATE#2026-11-30T12:00:00.000Z"))
    assert await me.readmodel.get_latest(F)
    assert await me.readmodel.factory_latest_items()
    await denied(scan_table(me))
    await me.readmodel.delete_item(f"FACTORY#{F}", "HISTORY#STATE#2026-11-30T12:00:00.000Z")
    await me.clients.s3.head_bucket(Bucket=BUCKET)
    await me.clients.dynamodb.describe_table(TableName=TABLE)
    await denied(me.store.put_bytes(RAW.replace("m-00000001", "m-processor1"), b"{}"))
    await denied(me.store.put_immutable(RAW.replace("m-00000001", "m-processor2"), b"{}"))
    await denied(me.store.put_bytes(REPORT, b"#"))
    await denied(me.store.put_bytes(IMAGE, b"jpg"))


async def test_aggregator(as_service):
    me = await as_service("aggregator")
    await me.store.put_bytes(WINDOW_OBJECT, b"{}")
    assert await me.readmodel.claim_window(AGGREGATE_JOB, NOW, owner="t", now=NOW, ttl=1)
    assert await me.readmodel.first_window(AGGREGATE_JOB, NOW, now=NOW) == NOW
    assert await me.readmodel.fleet_ids() == [F]
    assert await me.readmodel.history_states(F, NOW, NOW, now=NOW) == []
    # the window folds: the processed/ records and the windows already written
    assert await me.store.get_bytes(PROCESSED)
    assert await me.store.get_bytes(WINDOW_OBJECT) == b"{}"
    # a window older than HISTORY holds: its state_snapshot objects, listed and read
    hour = SNAPSHOT.rsplit("/", 1)[0] + "/"
    listed = await me.store.list_keys_between(hour, hour, hour + "~")
    assert SNAPSHOT in listed  # with the processor test's, when it ran first
    assert await me.store.get_bytes(SNAPSHOT) == b'{"seed": true}'
    agg = Aggregator(
        readmodel=me.readmodel,
        store=me.store,
        publish=no_events,
        ttl=TtlSettings(),
        clock=lambda: NOW,
        owner="t",
    )
    run = await agg.run_window(NOW, [F], now=NOW + timedelta(hours=3))
    # every object there was read; none is a real snapshot (seeds)
    assert (run.source, run.skipped_items) == (Source.SNAPSHOTS, len(listed))
    await denied(me.store.put_bytes(PROCESSED, b"{}"))
    await denied(me.store.put_bytes(SNAPSHOT, b"{}"))
    await denied(me.store.get_bytes(RAW))
    await denied(me.store.get_bytes(REPORT))


async def no_events(subject: str, event: Any, *, msg_id: str) -> bool:
    return False


async def test_cloud_collector(as_service):
    me = await as_service("cloud-collector")
    found = await describe_foundation(me.clients, bucket=BUCKET, table=TABLE)
    assert found == expected_foundation(bucket=BUCKET, table=TABLE, region=REGION)
    assert RAW in await me.store.list_keys("raw/")
    await me.store.put_json("processed/cloud_infra/fast/yyyy=2026/mm=11/dd=30/hh=12/x.json", {})
    assert await me.readmodel.get_cloud_latest() is None
    assert [i["pk"] for i in await me.readmodel.factory_latest_items()] == [f"FACTORY#{F}"]
    await denied(me.store.put_bytes(PROCESSED, b"{}"))
    await denied(me.store.get_bytes(RAW))


async def test_alert_dispatcher(as_service):
    me = await as_service("alert-dispatcher")
    assert await me.store.get_json(SNAPSHOT) == {"seed": True}
    await me.readmodel.put_item(item(f"ALERT#{F}", "CRITICAL#FIRE#FIRING"))
    assert await me.readmodel.get_item(f"ALERT#{F}", "CRITICAL#FIRE#FIRING")
    await me.readmodel.delete_item(f"ALERT#{F}", "CRITICAL#FIRE#FIRING")
    # a send's claim and its confirmation: conditional puts in one transaction
    await me.readmodel.put_items(
        [Put(item(f"ALERT#{F}", "INTENT#STATE#x"), if_absent=True), Put(item(f"ALERT#{F}", "y"))]
    )
    await denied(me.store.put_bytes(SNAPSHOT, b"{}"))
    await denied(me.readmodel.factory_latest_items())


async def test_alert_dispatcher_keeps_incidents_and_writes_each_record_once(as_service):
    me = await as_service("alert-dispatcher")
    await me.readmodel.put_item(item(f"INCIDENT#{INCIDENT_ID}", "INCIDENT"), if_absent=True)
    # the open incidents are listed through the index (a denied query would raise)
    assert (f"INCIDENT#{INCIDENT_ID}", "INCIDENT") in await me.readmodel.index_members("INCIDENT")
    assert await me.readmodel.batch_get([(f"INCIDENT#{INCIDENT_ID}", "INCIDENT")])
    await me.readmodel.put_item(item("REPLICA#alert-dispatcher", "host:1"))
    await denied(me.readmodel.put_item(item("REPLICA#processor", "host:1")))
    await denied(me.readmodel.batch_get([(f"FACTORY#{F}", "LATEST")]))
    await me.store.put_immutable(INCIDENT, b'{"closed": true}')
    assert await me.store.get_json(INCIDENT) == {"closed": True}
    # the record cannot be replaced: without If-None-Match, with another value, nor deleted
    await denied(me.store.put_bytes(INCIDENT, b"{}"))
    s3 = me.clients.s3
    with pytest.raises(ClientError, match="AccessDenied"):
        await s3.put_object(Bucket=BUCKET, Key=INCIDENT, Body=b"{}", IfNoneMatch='"abc"')
    with pytest.raises(ClientError, match="AccessDenied"):
        await s3.delete_object(Bucket=BUCKET, Key=INCIDENT)
    assert await me.store.get_json(INCIDENT) == {"closed": True}
    await denied(me.readmodel.put_item(item(f"FACTORY#{F}", "LATEST")))


async def test_reporter(as_service):
    me = await as_service("reporter")
    assert PROCESSED in await me.store.list_keys(f"processed/{F}/")
    assert await me.store.get_bytes(PROCESSED)
    await me.store.put_bytes(REPORT.replace("report.md", "report-context.json"), b"{}")
    await me.store.exists(WINDOW_OBJECT)  # the window folds it merges: readable
    await denied(me.store.put_bytes(PROCESSED, b"{}"))
    await denied(me.store.get_bytes(RAW))
    await denied(me.store.get_bytes(IMAGE))
    assert await me.readmodel.fleet_ids() == [F]
    # the closed incidents' records: listed and read, never written or removed
    assert CLOSED_INCIDENT in await me.store.list_keys(f"incidents/{F}/yyyy=2026/mm=11/dd=29/")
    assert await me.store.get_json(CLOSED_INCIDENT) == {"seed": True}
    await denied(me.store.put_bytes(CLOSED_INCIDENT, b"{}"))
    await denied(me.store.put_immutable(INCIDENT.replace("0123abcd", "0123abce"), b"{}"))
    with pytest.raises(ClientError, match="AccessDenied"):
        await me.clients.s3.delete_object(Bucket=BUCKET, Key=CLOSED_INCIDENT)
    # the fleet's alert incidents beside the targets' folders
    await me.store.put_bytes(
        "reports/daily/yyyy=2026/mm=11/dd=29/fleet-incidents-summary.json", b"{}"
    )


async def test_orchestrator(as_service):
    me = await as_service("orchestrator")
    claim_check = "orchestration/executions/j/yyyy=2026/mm=11/dd=30/e/input.json"
    await me.store.put_bytes(claim_check, b"{}")
    assert await me.store.get_bytes(claim_check) == b"{}"
    # its claim checks go by the bucket's lifecycle rule, never by its hand
    with pytest.raises(ClientError, match="AccessDenied"):
        await me.clients.s3.delete_object(Bucket=BUCKET, Key=claim_check)
    await me.readmodel.put_item(item("JOB#registry", "JOB#j"))
    assert await me.readmodel.partition("JOB#registry", now=NOW)
    # an execution's leases (either engine): its run slot and its EXEC-ACTIVE item, taken,
    # renewed and given back; a withdrawn start's log item deleted
    later = NOW + timedelta(minutes=1)
    for pk, sk in (("JOB#j", "RUNNING#000"), ("EXEC-ACTIVE", "j#2026-11-30T12:00:00.000Z#e")):
        assert await me.readmodel.acquire_lease(pk, sk, owner="me", now=NOW, until=later)
        assert await me.readmodel.extend_lease(pk, sk, owner="me", until=later)
        assert await me.readmodel.release_lease(pk, sk, owner="me")
    await me.readmodel.put_item(item("EXEC#j", "2026-11-30T12:00:00.000Z#e"))
    await me.readmodel.delete_item("EXEC#j", "2026-11-30T12:00:00.000Z#e")
    await denied(me.store.get_bytes(PROCESSED))
    await denied(me.store.put_bytes(REPORT, b"#"))
    await denied(me.readmodel.factory_latest_items())  # the fleet is none of its business


async def test_the_orchestrator_reads_the_table_stream_for_expiries(
    as_service, iam_endpoint, credentials
):
    """The expiry announcer under the orchestrator's policy: the stream's shards and records,
    its lease and checkpoint (``STREAM#orch-expiry``); a role without the stream's actions is
    refused them."""
    me = await as_service("orchestrator")
    async with AsyncExitStack() as stack:

        async def streams_of(service: str) -> Any:
            key, secret = credentials[service]
            return await stack.enter_async_context(
                new_session().create_client(
                    "dynamodbstreams",
                    region_name=REGION,
                    endpoint_url=iam_endpoint,
                    aws_access_key_id=key,
                    aws_secret_access_key=secret,
                )
            )

        announced: list[str] = []

        async def publish(subject: str, event: Any, *, msg_id: str) -> bool:
            announced.append(subject)
            return False

        reader = ExpiryAnnouncer(
            clients=me.clients,
            streams=await streams_of("orchestrator"),
            table=TABLE,
            publish=publish,
            producer="orchestrator",
            owner="replica-1",
            clock=lambda: NOW,
            metrics=Metrics("orchestrator"),
        )
        await reader.poll()
        assert reader.read._value.get() > 0  # records of the seeded table were read
        marks = await me.readmodel.partition(keys.stream_reader_pk(READER), now=NOW)
        assert {str(m["sk"]).split("#")[0] for m in marks} == {"CHECKPOINT", "LEASE"}
        await reader.close()
        other = await streams_of("dashboard-api")
        arn = (await me.clients.dynamodb.describe_table(TableName=TABLE))["Table"][
            "LatestStreamArn"
        ]
        with pytest.raises(Exception, match="AccessDenied"):
            await other.describe_stream(StreamArn=arn)


async def test_dashboard_only_reads(as_service):
    me = await as_service("dashboard-api")
    assert await me.readmodel.get_latest(F)
    assert await me.readmodel.factory_latest_items()
    assert await me.readmodel.firing_alerts(now=NOW) == []
    await denied(scan_table(me))
    assert await me.readmodel.partition(f"FACTORY#{F}", now=NOW)
    assert await me.store.get_bytes(REPORT)
    assert await me.store.get_bytes(IMAGE)
    assert REPORT in await me.store.list_keys("reports/daily/")
    await denied(me.store.put_bytes(REPORT, b"#"))
    await denied(me.store.put_bytes(IMAGE, b"jpg"))
    await denied(me.readmodel.put_item(item(f"FACTORY#{F}", "LATEST")))
    await denied(me.readmodel.delete_item(f"FACTORY#{F}", "LATEST"))
    await denied(me.store.get_bytes(RAW))


async def test_the_dashboard_writes_incidents_silences_slack_nonces_sessions_jobs_and_audit_once_only(
    as_service,
):
    me = await as_service("dashboard-api")
    # an audit record: written once, then neither replaced (in any form) nor deleted
    audit = "audit/yyyy=2026/mm=11/dd=30/20261130T030000000-0123abcd.json"
    await me.store.put_immutable(audit, b'{"action": "sign_in"}')
    assert await me.store.get_json(audit) == {"action": "sign_in"}
    await denied(me.store.put_bytes(audit, b"{}"))
    s3 = me.clients.s3
    for condition in ({}, {"IfNoneMatch": '"abc"'}, {"IfMatch": "*"}):
        with pytest.raises(ClientError, match="AccessDenied"):
            await s3.put_object(Bucket=BUCKET, Key=audit, Body=b"{}", **condition)
    with pytest.raises(ClientError, match="AccessDenied"):
        await s3.delete_object(Bucket=BUCKET, Key=audit)
    assert await me.store.get_json(audit) == {"action": "sign_in"}
    await denied(me.store.put_immutable(audit.replace("audit/", "reports/daily/"), b"{}"))
    await me.readmodel.put_item(item(f"INCIDENT#{INCIDENT_ID}", "INCIDENT"))
    await me.readmodel.put_item(item("SLACK#nonce", "x"), if_absent=True)
    await me.readmodel.put_item(item("SILENCE", "s-0123456789ab"), if_absent=True)
    await me.readmodel.put_item(item(f"SESSION#{'0' * 64}", "SESSION"), if_absent=True)
    await denied(me.readmodel.delete_item(f"SESSION#{'0' * 64}", "SESSION"))
    await denied(me.readmodel.put_item(item("SILENCEX", "s-0123456789ab")))
    await denied(me.readmodel.put_item(item(f"ALERT#{F}", "CRITICAL#FIRE#STATE")))
    # an admin's job change is a put of its registry item; a job's run slots and executions
    # are the orchestrator's
    await me.readmodel.put_item(item("JOB#registry", "JOB#x"))
    await denied(me.readmodel.put_item(item("JOB#x", "RUNNING#0")))
    await denied(me.readmodel.put_item(item("EXEC#x", "2026-11-30T03:00:00.000Z#e")))
    await denied(me.readmodel.delete_item("JOB#registry", "JOB#x"))
    await denied(me.readmodel.delete_item(f"INCIDENT#{INCIDENT_ID}", "INCIDENT"))
    await denied(me.store.put_immutable(INCIDENT, b"{}"))


async def test_simulator_uploads_images_only(as_service):
    me = await as_service("simulator")
    await me.store.put_bytes(IMAGE.replace("cam-1", "cam-2"), b"jpg")
    await denied(me.store.put_bytes(RAW, b"{}"))
    await denied(me.readmodel.get_latest(F))


async def test_ingest_presigns_gateway_uploads_that_only_its_role_and_the_form_allow(as_service):
    """A presigned POST is authorized as its signer when it arrives: ingest's role may write
    image_snapshot/ (PresignGatewayImageUploads), the dashboard's may not, and the bucket policy
    keeps even ingest's signature out of raw/ (a POST carries no If-None-Match)."""
    ingest, operator = await as_service("ingest"), await as_service(OPERATOR)
    image = IMAGE.replace("cam-1", "cam-gateway")

    async def presigned(me: As, key: str) -> PresignedPost:
        return await me.store.presign_upload(
            key, content_type="image/jpeg", size_bytes=3, expires_in_s=60
        )

    post = await presigned(ingest, image)
    assert (await post_form(post.url, post.fields, b"jpg"))[0] == 204
    assert await operator.store.get_bytes(image) == b"jpg"
    by_dashboard = await presigned(await as_service("dashboard-api"), image + "-2")
    raw_by_ingest = await presigned(ingest, RAW.replace("m-00000001", "m-presigned1"))
    for refused in (by_dashboard, raw_by_ingest):
        status, text = await post_form(refused.url, refused.fields, b"jpg")
        assert status == 403 and "<Code>AccessDenied</Code>" in text
        assert not await operator.store.exists(refused.fields["key"])
    # the form's policy rewritten for another key: the signature no longer holds
    policy = post_policy(post.fields)
    policy["conditions"] = [c for c in policy["conditions"] if "key" not in c]
    forged = {
        **post.fields,
        "key": image + "-forged",
        "policy": base64.b64encode(json.dumps(policy).encode()).decode(),
    }
    status, text = await post_form(post.url, forged, b"jpg")
    assert status == 403 and "<Code>SignatureDoesNotMatch</Code>" in text
    # no policy at all (anonymous), or an access key nobody issued
    status, text = await post_form(post.url, {"key": image + "-anon"}, b"jpg")
    assert status == 403 and "<Code>AccessDenied</Code>" in text
    unknown = post.fields["x-amz-credential"].replace(
        post.fields["x-amz-credential"].split("/")[0], "AKIANOBODYISSUEDTHIS"
    )
    status, text = await post_form(post.url, {**post.fields, "x-amz-credential": unknown}, b"jpg")
    assert status == 403 and "<Code>InvalidAccessKeyId</Code>" in text


async def test_storage_tools_migrates_onto_raw_and_deletes_only_legacy(as_service):
    me = await as_service("storage-tools")
    [source] = [info async for info in me.store.list_objects(LEGACY)]
    dest = f"raw/{F}/factory_state/yyyy=2026/mm=11/dd=29/m-migrated01.json"
    await me.store.copy(source, dest, if_absent=True)
    assert await me.store.get_bytes(dest) == b'{"seed": true}'
    assert await me.store.delete_many([LEGACY]) == []
    assert await delete_refused(me, [dest])
    await denied(me.readmodel.get_latest(F))


async def test_storage_tools_seals_and_audits_raw_with_what_its_role_allows(as_service):
    """`aegis seal raw` and `aegis audit raw --deep`: delimited listings, reads, and a seal put
    with If-None-Match (what the bucket policy asks of raw/ puts); the seal is never deleted."""
    me = await as_service("storage-tools")
    day = date(2026, 11, 27)
    await me.store.put_immutable(
        f"raw/{F}/factory_state/yyyy=2026/mm=11/dd=27/m-sealed001.json",
        b'{"schema_version":"1.0"}',
        metadata={"received_at": "2026-11-27T10:00:00.000Z"},
    )
    results = await Sealer(me.store, clock=lambda: NOW).seal([day], [F])
    assert [r.outcome for r in results if r.outcome is not Outcome.EMPTY] == [Outcome.SEALED]
    [audit] = await Auditor(me.store, deep=True).audit(F, day)
    assert (audit.status, audit.documents, audit.objects) == (AuditStatus.INTACT, 1, 1)
    assert await delete_refused(me, [raw_metadata_key(F, "factory_state", day)])


ITEM_ACTIONS = {
    f"dynamodb:{a}"
    for a in (
        "GetItem",
        "BatchGetItem",
        "Query",
        "Scan",
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactGetItems",
        "TransactWriteItems",
        "PartiQLSelect",
        "PartiQLInsert",
        "PartiQLUpdate",
        "PartiQLDelete",
    )
}
WRITE_ACTIONS = {
    f"dynamodb:{a}"
    for a in ("PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "PartiQLUpdate")
}


def _allowed_actions(statement: dict[str, Any]) -> set[str]:
    return set(_list(statement.get("Action", []))) if statement["Effect"] == "Allow" else set()


async def test_bootstrap_role_checks_the_foundation_and_reads_no_data(as_service):
    me = await as_service("bootstrap")
    report = await bootstrap(me.clients, bucket=BUCKET, table=TABLE)
    assert not report.changed
    await denied(me.store.get_bytes(RAW))
    await denied(me.readmodel.get_latest(F))
    await denied(scan_table(me, ProjectionExpression="pk, sk", Select="SPECIFIC_ATTRIBUTES"))
    policy = render.load_policy("bootstrap")["Statement"]
    assert not {a for st in policy for a in _allowed_actions(st)} & ITEM_ACTIONS


def test_every_role_that_may_write_an_item_may_read_it():
    """An UpdateItem, PutItem or DeleteItem whose condition fails returns the whole item when it
    asks for ``ReturnValuesOnConditionCheckFailure: ALL_OLD``, and no IAM condition key covers
    that parameter: a role that may write items it may not read would read them that way. So
    every role with a write grant also holds an unconditioned GetItem of the table."""
    writers = []
    for service in SERVICES:
        statements = render.load_policy(service)["Statement"]
        if not any(_allowed_actions(st) & WRITE_ACTIONS for st in statements):
            continue
        writers.append(service)
        assert any(
            "dynamodb:GetItem" in _allowed_actions(st)
            and "Condition" not in st
            and str(st["Resource"]).endswith(":table/${TableName}")
            for st in statements
        ), service
    assert {"processor", "alert-dispatcher", "dashboard-api", "orchestrator"} <= set(writers)


def test_only_the_index_backfills_writers_scan_and_only_keys():
    scanners = {}
    for service in SERVICES:
        for st in render.load_policy(service)["Statement"]:
            if "dynamodb:Scan" in _allowed_actions(st):
                scanners[service] = st
    assert set(scanners) == {"processor", "alert-dispatcher"}
    for statement in scanners.values():
        condition = statement["Condition"]
        assert condition["StringEquals"] == {"dynamodb:Select": "SPECIFIC_ATTRIBUTES"}
        assert condition["ForAllValues:StringEquals"]["dynamodb:Attributes"] == list(
            fleetindex.SCAN_ATTRIBUTES
        )
        # ForAllValues holds on an empty set: the attributes must be named as well
        assert condition["Null"] == {"dynamodb:Attributes": "false"}


async def test_the_bootstrap_role_cannot_rewrite_the_buckets_rules_after_the_template_made_them(
    as_service,
):
    """A lifecycle rule is carried out by S3 itself, which no bucket policy binds: one that
    expired raw/ would delete the archive. The bucket's rules are the template's; the bootstrap
    role reads them (its --check) and changes none, in any form."""
    me = await as_service("bootstrap")
    s3 = me.clients.s3
    expire_raw = {
        "Rules": [
            {
                "ID": "x",
                "Status": "Enabled",
                "Filter": {"Prefix": "raw/"},
                "Expiration": {"Days": 1},
            }
        ]
    }
    before = await s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)
    attempts = [
        s3.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration=expire_raw),
        s3.delete_bucket_lifecycle(Bucket=BUCKET),
        s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Suspended"}),
        s3.delete_public_access_block(Bucket=BUCKET),
        s3.put_bucket_policy(Bucket=BUCKET, Policy='{"Version": "2012-10-17", "Statement": []}'),
        s3.delete_bucket_policy(Bucket=BUCKET),
        s3.create_bucket(
            Bucket=f"{BUCKET}-other", CreateBucketConfiguration={"LocationConstraint": REGION}
        ),
    ]
    for attempt in attempts:
        with pytest.raises(ClientError, match="AccessDenied"):
            await attempt
    after = await s3.get_bucket_lifecycle_configuration(Bucket=BUCKET)
    assert after["Rules"] == before["Rules"]
    assert (await s3.get_bucket_versioning(Bucket=BUCKET))["Status"] == "Enabled"


KEYS_ONLY = "pk, sk, firing"
LATEST_KEY = {"pk": {"S": f"FACTORY#{F}"}, "sk": {"S": "LATEST"}}


def _scan(**kwargs: Any) -> dict[str, Any]:
    return {"op": "scan", "TableName": TABLE, **kwargs}


def _update(expression: str, **kwargs: Any) -> dict[str, Any]:
    values = {":v": {"S": "x"}}
    return {
        "op": "update_item",
        "TableName": TABLE,
        "Key": LATEST_KEY,
        "UpdateExpression": expression,
        "ExpressionAttributeValues": values,
        **kwargs,
    }


# the ways a holder of a keys-only Scan grant would try to read data through it
SCANS_FOR_DATA = [
    pytest.param(_scan(), id="scan-bare"),
    pytest.param(_scan(Select="ALL_ATTRIBUTES"), id="scan-select-all"),
    pytest.param(_scan(Select="COUNT"), id="scan-select-count"),
    pytest.param(_scan(ProjectionExpression=KEYS_ONLY), id="scan-keys-without-select"),
    pytest.param(
        _scan(Select="SPECIFIC_ATTRIBUTES", ProjectionExpression="pk, sk, payload"),
        id="scan-projects-payload",
    ),
    pytest.param(
        _scan(
            Select="SPECIFIC_ATTRIBUTES",
            ProjectionExpression="pk, #p",
            ExpressionAttributeNames={"#p": "payload"},
        ),
        id="scan-projects-payload-aliased",
    ),
    pytest.param(
        _scan(
            Select="SPECIFIC_ATTRIBUTES",
            ProjectionExpression=KEYS_ONLY,
            FilterExpression="begins_with(payload, :v)",
            ExpressionAttributeValues={":v": {"S": "{"}},
        ),
        id="scan-filters-on-payload",
    ),
    pytest.param(
        _scan(Select="SPECIFIC_ATTRIBUTES", AttributesToGet=["pk", "payload"]),
        id="scan-legacy-attributes-to-get",
    ),
]


@pytest.mark.parametrize("service", ["processor", "alert-dispatcher"])
@pytest.mark.parametrize("call", SCANS_FOR_DATA)
async def test_the_backfills_scan_grant_reads_no_data_in_any_form(as_service, service, call):
    me = await as_service(service)
    assert "Items" in await scan_table(
        me, ProjectionExpression="pk, sk", Select="SPECIFIC_ATTRIBUTES"
    )
    kwargs = {k: v for k, v in call.items() if k != "op"}
    with pytest.raises(ClientError, match="AccessDenied"):
        await me.clients.dynamodb.scan(**kwargs)


@pytest.mark.parametrize(
    "call",
    [
        *SCANS_FOR_DATA,
        pytest.param(
            _scan(Select="SPECIFIC_ATTRIBUTES", ProjectionExpression=KEYS_ONLY), id="scan-keys"
        ),
        pytest.param(
            _update(
                "SET fleet_pk = :v",
                ConditionExpression="attribute_not_exists(pk)",
                ReturnValues="NONE",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            ),
            id="update-index-key-returning-the-item-when-its-condition-fails",
        ),
        pytest.param(_update("SET fleet_pk = :v", ReturnValues="NONE"), id="update-index-key-only"),
        pytest.param(_update("SET payload = :v"), id="update-sets-payload"),
        pytest.param(
            _update("SET #p = :v", ExpressionAttributeNames={"#p": "payload"}),
            id="update-sets-payload-aliased",
        ),
        pytest.param(
            _update("REMOVE payload", ExpressionAttributeValues=None), id="update-removes"
        ),
        pytest.param(
            _update("SET fleet_pk = :v", ReturnValues="ALL_OLD"), id="update-returns-all-old"
        ),
        pytest.param(
            {
                "op": "update_item",
                "TableName": TABLE,
                "Key": LATEST_KEY,
                "AttributeUpdates": {"payload": {"Value": {"S": "x"}, "Action": "PUT"}},
            },
            id="update-legacy-attribute-updates",
        ),
        pytest.param(
            {
                "op": "put_item",
                "TableName": TABLE,
                "Item": {**LATEST_KEY, "fleet_pk": {"S": "x"}},
                "ConditionExpression": "attribute_not_exists(pk)",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            },
            id="put-item-returning-the-item-when-its-condition-fails",
        ),
        pytest.param(
            {"op": "delete_item", "TableName": TABLE, "Key": LATEST_KEY, "ReturnValues": "ALL_OLD"},
            id="delete-item-returning-the-item",
        ),
        pytest.param({"op": "get_item", "TableName": TABLE, "Key": LATEST_KEY}, id="get-item"),
        pytest.param(
            {
                "op": "get_item",
                "TableName": TABLE,
                "Key": LATEST_KEY,
                "ProjectionExpression": KEYS_ONLY,
            },
            id="get-item-keys-only",
        ),
        pytest.param(
            {
                "op": "query",
                "TableName": TABLE,
                "KeyConditionExpression": "pk = :p",
                "ExpressionAttributeValues": {":p": {"S": f"FACTORY#{F}"}},
                "ProjectionExpression": KEYS_ONLY,
                "Select": "SPECIFIC_ATTRIBUTES",
            },
            id="query-keys-only",
        ),
    ],
)
async def test_the_bootstrap_role_reads_and_writes_no_item_in_any_form(as_service, call):
    """The bootstrap role manages the table, not its items: every item read or write refused,
    the keys-only forms and a failed condition's returned item included."""
    me = await as_service("bootstrap")
    kwargs = {k: v for k, v in call.items() if k != "op" and v is not None}
    with pytest.raises(ClientError, match="AccessDenied"):
        await getattr(me.clients.dynamodb, call["op"])(**kwargs)


async def test_each_writer_backfills_its_own_items_into_the_fleet_index_when_bootstrap_asks(
    as_service,
):
    """Items written before the index (no fleet keys; a payload beside the keys) get their
    index keys once bootstrap raised the table's backfill generation: FACTORY LATEST from the
    processor's role, firing alert states from the alert dispatcher's, each with exactly the
    calls its policy allows and neither the other's."""
    admin = await as_service(OPERATOR)
    factory, alert = "FACTORY#factory-backfill", "ALERT#factory-backfill"
    await admin.clients.dynamodb.put_item(
        TableName=TABLE,
        Item={"pk": {"S": factory}, "sk": {"S": "LATEST"}, "payload": {"S": "{}"}},
    )
    await admin.clients.dynamodb.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": alert},
            "sk": {"S": "CRITICAL#FIRE#STATE"},
            "firing": {"BOOL": True},
            "payload": {"S": "{}"},
        },
    )
    boot = await as_service("bootstrap")
    report = await bootstrap(boot.clients, bucket=BUCKET, table=TABLE, reindex=True)
    [asked] = [s for s in report.steps if s.setting == "fleet-index-backfill"]
    assert asked.action == "updated" and "asked" in asked.detail

    processor = await as_service("processor")
    dispatcher = await as_service("alert-dispatcher")
    await denied(fleetindex.backfill(processor.clients.dynamodb, TABLE, fleetindex.FIRING_ALERTS))
    await denied(fleetindex.backfill(dispatcher.clients.dynamodb, TABLE, fleetindex.FACTORIES))
    for me, family in ((processor, fleetindex.FACTORIES), (dispatcher, fleetindex.FIRING_ALERTS)):
        done = await fleetindex.backfill_if_asked(me.clients.dynamodb, TABLE, family, now=NOW)
        assert done is not None and done.items >= 1, family.name
        assert (
            await fleetindex.backfill_if_asked(me.clients.dynamodb, TABLE, family, now=NOW) is None
        )
    for pk, sk in ((factory, "LATEST"), (alert, "CRITICAL#FIRE#STATE")):
        got = await admin.clients.dynamodb.get_item(
            TableName=TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}}
        )
        assert {"fleet_pk", "fleet_sk"} <= set(got["Item"]), pk
        assert got["Item"]["payload"] == {"S": "{}"}  # the rest of the item untouched


# -- key families: each role writes only the partitions that are its own -----------------------


@pytest.mark.parametrize(
    ("service", "own", "foreign"),
    [
        ("processor", f"FACTORY#{F}", f"ALERT#{F}"),
        ("processor", "CLAIM#refresh-3", "CLAIM#report-daily"),
        ("aggregator", f"FACTORY#{F}", "JOB#registry"),
        ("aggregator", f"CLAIM#{AGGREGATE_JOB}", "CLAIM#refresh-0"),
        ("alert-dispatcher", f"ALERT#{F}", f"FACTORY#{F}"),
        ("cloud-collector", "CLOUD#infra", f"FACTORY#{F}"),
        ("cloud-collector", "CLAIM#cloud-fast", f"ALERT#{F}"),
        ("reporter", "CLAIM#report-daily", "CLAIM#graph-5m"),
        ("orchestrator", "EXEC#j", f"FACTORY#{F}"),
        ("orchestrator", "CLAIM#orch-j", "CLOUD#infra"),
    ],
)
async def test_a_role_cannot_write_another_roles_key_family(as_service, service, own, foreign):
    """A compromised service forging LATEST, an alert state or another job's claim: its own
    family is written (so the policy is not simply closed), the other refused, by put, delete
    and inside a transaction with one of its own."""
    me = await as_service(service)
    await me.readmodel.put_item(item(own, "SK#leading-keys"))
    await denied(me.readmodel.put_item(item(foreign, "SK#leading-keys")))
    await denied(me.readmodel.delete_item(foreign, "LATEST"))
    await denied(me.readmodel.put_items([Put(item(own, "SK#tx")), Put(item(foreign, "SK#tx"))]))


# -- the bucket policy: below every role, administrators included ------------------------------


async def test_the_bucket_policy_refuses_raw_overwrites_and_deletes_to_an_administrator(
    as_service,
):
    """An operator whose own policy allows s3:* (or a role that a mistake gave too much):
    the bucket policy still refuses to overwrite or delete raw/, in every form."""
    me = await as_service(OPERATOR)
    s3 = me.clients.s3
    fresh = RAW.replace("m-00000001", "m-operator01")
    # a plain PUT (no If-None-Match) under raw/: refused, for a new key and for an existing one
    with pytest.raises(Exception, match="AccessDenied"):
        await s3.put_object(Bucket=BUCKET, Key=fresh, Body=b"{}")
    with pytest.raises(Exception, match="AccessDenied"):
        await s3.put_object(Bucket=BUCKET, Key=RAW, Body=b'{"co_ppm": 9999}')
    # the write ingest makes (only where nothing is) is allowed, and cannot overwrite either
    await s3.put_object(Bucket=BUCKET, Key=fresh, Body=b"{}", IfNoneMatch="*")
    with pytest.raises(Exception, match="PreconditionFailed"):
        await s3.put_object(Bucket=BUCKET, Key=RAW, Body=b'{"co_ppm": 9999}', IfNoneMatch="*")
    assert await me.store.get_bytes(RAW) == b'{"seed": true}'
    # deletes: the object, a version of it, and a batch
    with pytest.raises(Exception, match="AccessDenied"):
        await s3.delete_object(Bucket=BUCKET, Key=RAW)
    [version] = (await s3.list_object_versions(Bucket=BUCKET, Prefix=RAW))["Versions"]
    with pytest.raises(Exception, match="AccessDenied"):
        await s3.delete_object(Bucket=BUCKET, Key=RAW, VersionId=version["VersionId"])
    assert await delete_refused(me, [RAW])
    assert await me.store.get_bytes(RAW) == b'{"seed": true}'
    # the same administrator outside raw/: overwrite and delete work (the policy is not closed)
    scratch = PROCESSED.replace("m-00000001", "m-operator01")
    await s3.put_object(Bucket=BUCKET, Key=scratch, Body=b"{}")
    await s3.put_object(Bucket=BUCKET, Key=scratch, Body=b"{}")
    await s3.delete_object(Bucket=BUCKET, Key=scratch)


def _with_header(s3: Any, name: str, value: str) -> None:
    """Every PutObject of ``s3`` carries the header ``name`` (spelled as given) set to ``value``."""

    def add(request: Any, **_: Any) -> None:
        request.headers[name] = value

    s3.meta.events.register_first("before-sign.s3.PutObject", add)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("If-None-Match", '"abc"'),
        ("If-None-Match", "abc"),
        ("If-None-Match", '"*"'),
        ("If-None-Match", "*, abc"),
        ("if-none-match", "abc"),
        ("IF-NONE-MATCH", "abc"),
        ("If-Match", "*"),
    ],
)
async def test_the_bucket_policy_refuses_raw_puts_whose_if_none_match_is_not_a_star(
    as_service, header, value
):
    """An administrator's PutObject under raw/ with an If-None-Match that is present but not
    ``*`` (which S3 would not take as "only where nothing is"), however the header is spelled,
    or with If-Match instead: refused by the bucket policy, for a new key and an existing one."""
    me = await as_service(OPERATOR)
    _with_header(me.clients.s3, header, value)
    for key in (RAW.replace("m-00000001", "m-header001"), RAW):
        with pytest.raises(ClientError, match="AccessDenied"):
            await me.clients.s3.put_object(Bucket=BUCKET, Key=key, Body=b'{"co_ppm": 9999}')
    assert await me.store.get_bytes(RAW) == b'{"seed": true}'


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("If-None-Match", "m-star0001"),
        ("if-none-match", "m-star0002"),
        ("IF-NONE-MATCH", "m-star0003"),
    ],
)
async def test_a_raw_put_with_if_none_match_star_writes_a_new_key_and_never_an_existing_one(
    as_service, header, name
):
    """The one raw/ write the bucket policy lets through, whatever the header's case: a new key
    is written, an existing one is refused by S3 itself (412) and keeps its bytes."""
    me = await as_service(OPERATOR)
    _with_header(me.clients.s3, header, "*")
    fresh = RAW.replace("m-00000001", name)
    await me.clients.s3.put_object(Bucket=BUCKET, Key=fresh, Body=b"{}")
    with pytest.raises(ClientError, match="PreconditionFailed"):
        await me.clients.s3.put_object(Bucket=BUCKET, Key=RAW, Body=b'{"co_ppm": 9999}')
    assert await me.store.get_bytes(RAW) == b'{"seed": true}'


async def test_the_emulator_refuses_every_ecs_request_it_would_not_authorize_as_aws_does(
    iam_endpoint, credentials
):
    """The scheduled tasks' RunTask grant names the cluster (``ecs:cluster``), a key the emulator
    does not supply: with policies enforced, an ECS request is refused saying why, not decided
    on a context short of what AWS would see."""
    key, secret = credentials[OPERATOR]
    async with new_session().create_client(
        "ecs",
        region_name=REGION,
        endpoint_url=iam_endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    ) as ecs:
        with pytest.raises(ClientError, match="does not authorize ecs requests as AWS would"):
            await ecs.list_clusters()


async def test_the_emulator_refuses_policies_it_would_not_evaluate_as_aws_does(tmp_path):
    """A policy the emulator's evaluator does not implement is refused when it is stored, never
    half-applied: IAM answers MalformedPolicyDocument, S3 MalformedPolicy, naming the problem."""
    server = start_moto_server("127.0.0.1", free_port(), log_file=tmp_path / "moto.log")
    try:
        cfg = AwsConfig(endpoint_url=server.url)
        numeric = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "s3:GetObject",
                    "Resource": "*",
                    "Condition": {"NumericLessThan": {"s3:max-keys": "10"}},
                }
            ],
        }
        variable = copy.deepcopy(numeric)
        variable["Statement"][0].pop("Condition")
        variable["Statement"][0]["Resource"] = "arn:aws:s3:::b/${aws:username}/*"
        async with open_client("iam", cfg) as iam:
            await iam.create_user(UserName="refused")
            for document, named in ((numeric, "NumericLessThan"), (variable, "policy variable")):
                with pytest.raises(ClientError, match="MalformedPolicyDocument") as refused:
                    await iam.put_user_policy(
                        UserName="refused", PolicyName="p", PolicyDocument=json.dumps(document)
                    )
                assert named in str(refused.value)
                with pytest.raises(ClientError, match="MalformedPolicyDocument"):
                    await iam.create_policy(PolicyName="p", PolicyDocument=json.dumps(document))
            trust = {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "NotPrincipal": {"AWS": "*"}, "Action": "sts:AssumeRole"}
                ],
            }
            with pytest.raises(ClientError, match="MalformedPolicyDocument"):
                await iam.create_role(RoleName="r", AssumeRolePolicyDocument=json.dumps(trust))
        multivalued = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:PutObject",
                    "Resource": "arn:aws:s3:::refused/*",
                    "Condition": {"StringLike": {"dynamodb:LeadingKeys": "x*"}},
                }
            ],
        }
        granting = copy.deepcopy(multivalued)
        granting["Statement"][0].update(Effect="Allow", Condition={})
        async with open_client("s3", cfg) as s3:
            await s3.create_bucket(
                Bucket="refused", CreateBucketConfiguration={"LocationConstraint": REGION}
            )
            for document, named in ((multivalued, "multivalued"), (granting, "Allow")):
                with pytest.raises(ClientError, match="MalformedPolicy") as refused:
                    await s3.put_bucket_policy(Bucket="refused", Policy=json.dumps(document))
                assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
                assert named in str(refused.value)
            # the shipped bucket policy is taken
            await s3.put_bucket_policy(
                Bucket="refused",
                Policy=json.dumps(
                    render.substitute(
                        render.load_document(render.BUCKET_POLICY),
                        {
                            "AWS::Partition": "aws",
                            "AWS::AccountId": ACCOUNT,
                            "BucketName": "refused",
                            "NamePrefix": PREFIX,
                        },
                    )
                ),
            )
    finally:
        server.stop()


async def test_only_the_break_glass_role_deletes_raw_and_only_with_mfa(iam_endpoint, credentials):
    async with AsyncExitStack() as stack:
        sts = await stack.enter_async_context(
            new_session().create_client(
                "sts",
                region_name=REGION,
                endpoint_url=iam_endpoint,
                aws_access_key_id=credentials[OPERATOR][0],
                aws_secret_access_key=credentials[OPERATOR][1],
            )
        )
        with pytest.raises(Exception, match="AccessDenied"):  # no MFA: not trusted
            await sts.assume_role(RoleArn=BREAK_GLASS_ROLE, RoleSessionName="no-mfa")
        session = (
            await sts.assume_role(
                RoleArn=BREAK_GLASS_ROLE,
                RoleSessionName="incident-42",
                SerialNumber=f"arn:aws:iam::{ACCOUNT}:mfa/operator",
                TokenCode="123456",
            )
        )["Credentials"]
        glass = await stack.enter_async_context(
            new_session().create_client(
                "s3",
                region_name=REGION,
                endpoint_url=iam_endpoint,
                aws_access_key_id=session["AccessKeyId"],
                aws_secret_access_key=session["SecretAccessKey"],
                aws_session_token=session["SessionToken"],
            )
        )
        doomed = RAW.replace("m-00000001", "m-glass0001")
        await glass.put_object(Bucket=BUCKET, Key=doomed, Body=b"{}")  # a repair: no header
        [version] = (await glass.list_object_versions(Bucket=BUCKET, Prefix=doomed))["Versions"]
        await glass.delete_object(Bucket=BUCKET, Key=doomed, VersionId=version["VersionId"])
        assert not (await glass.list_object_versions(Bucket=BUCKET, Prefix=doomed)).get("Versions")
        # and nothing else: the role is for raw/ only
        with pytest.raises(Exception, match="AccessDenied"):
            await glass.delete_object(Bucket=BUCKET, Key=PROCESSED)
