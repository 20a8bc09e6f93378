"""``aegis migrate`` under the shipped policies, on an emulator of this module's own with IAM
enforced (as tests/integration/test_infra.py does it: users and roles made, the template's bucket
policy put, then ``/moto-api/reset-auth 0``). The commands run as the storage-tools role
(``aegis-storage-tools-task``, the role the bucket policy names) through an assumed-role session,
and the hand-over is carried out as the raw break-glass role.

The ``aegis-legacy`` preset's flat-raw rule moves raw/ keys within raw/: the plan says its sources
cannot be deleted, a run refuses it, ``--keep-sources`` copies and verifies and deletes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiobotocore.session import get_session

from aegis_devstack.localservers import free_port, start_moto_server
from aegis_devstack.testing.cli import invoke
from aegis_devstack.testing.infra import load_render
from aegis_storage.bootstrap import bootstrap
from aegis_storage.clients import AwsConfig, open_client, open_clients
from aegis_storage.s3 import ObjectStore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "deploy" / "infra"
REGION, ACCOUNT, PREFIX = "ap-south-1", "123456789012", "aegis"
FLAT, MIXED = "aegis-migrate-flat", "aegis-migrate-mixed"  # a bucket per test
F = "factory-mig"
FLAT_KEYS = [f"raw/{F}/factory_state/m-0000000{i}.json" for i in (1, 2, 3)]
LATEST = f"latest/{F}/LATEST.json"
# the dated partition the flat keys move into, sealed by the migration (with the role's own rights)
SEAL = f"raw/{F}/factory_state/yyyy=2026/mm=11/dd=30/raw_metadata.json"


def dated(key: str) -> str:
    return key.replace("/m-", "/yyyy=2026/mm=11/dd=30/m-")


render = load_render(INFRA)


def substituted(doc: dict[str, Any], bucket: str) -> dict[str, Any]:
    values = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "BucketName": bucket,
        "TableName": "AEGIS-migrate",
        "NamePrefix": PREFIX,
    }
    out: dict[str, Any] = render.substitute(doc, values)
    return out


@dataclass(frozen=True)
class Session:
    key: str
    secret: str
    token: str


@dataclass(frozen=True)
class Emulator:
    url: str
    storage_tools: Session
    break_glass: Session


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    log = tmp_path_factory.mktemp("migrate-iam-moto") / "moto.log"
    server = start_moto_server("127.0.0.1", free_port(), log_file=log)
    try:
        yield asyncio.run(_prepare(server.url))
    finally:
        server.stop()


async def _prepare(url: str) -> Emulator:
    """Buckets (bootstrapped: versioned), seed objects, the two roles and an operator who may
    assume them, the template's bucket policy; then enforcement on, and the roles assumed."""
    cfg = AwsConfig(endpoint_url=url)
    async with open_clients(cfg) as admin:
        for bucket in (FLAT, MIXED):
            await bootstrap(admin, bucket=bucket, table=f"AEGIS-{bucket}")
            store = ObjectStore(admin, bucket)
            for i, key in enumerate(FLAT_KEYS):
                await store.put_bytes(
                    key,
                    json.dumps({"n": i}).encode(),
                    metadata={"received_at": f"2026-11-30T0{i}:00:00.000Z"},
                )
            policy = substituted(render.load_document(render.BUCKET_POLICY), bucket)
            await admin.s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        await ObjectStore(admin, MIXED).put_bytes(LATEST, b'{"latest":true}')
    async with open_client("iam", cfg) as iam:
        operator = "aegis-migration-operator"
        await iam.create_user(UserName=operator)
        arn = f"arn:aws:iam::{ACCOUNT}:user/{operator}"
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"AWS": arn}, "Action": "sts:AssumeRole"}
            ],
        }
        roles = {
            f"{PREFIX}-storage-tools-task": render.load_policy("storage-tools"),
            f"{PREFIX}-raw-break-glass": render.load_document(render.BREAK_GLASS),
        }
        for role, policy in roles.items():
            await iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))
            for bucket in (FLAT, MIXED):  # the shipped policy, once per test bucket
                await iam.put_role_policy(
                    RoleName=role,
                    PolicyName=bucket,
                    PolicyDocument=json.dumps(substituted(policy, bucket)),
                )
        may_assume = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}],
        }
        await iam.put_user_policy(
            UserName=operator, PolicyName="assume", PolicyDocument=json.dumps(may_assume)
        )
        key = (await iam.create_access_key(UserName=operator))["AccessKey"]
    async with httpx.AsyncClient() as http:
        (await http.post(f"{url}/moto-api/reset-auth", content=b"0")).raise_for_status()
    sessions = [await _assume(url, key, role) for role in roles]
    return Emulator(url, *sessions)


async def _assume(url: str, key: dict[str, Any], role: str) -> Session:
    async with get_session().create_client(
        "sts",
        region_name=REGION,
        endpoint_url=url,
        aws_access_key_id=key["AccessKeyId"],
        aws_secret_access_key=key["SecretAccessKey"],
    ) as sts:
        creds = (
            await sts.assume_role(
                RoleArn=f"arn:aws:iam::{ACCOUNT}:role/{role}", RoleSessionName="migrate-test"
            )
        )["Credentials"]
    return Session(creds["AccessKeyId"], creds["SecretAccessKey"], creds["SessionToken"])


async def _s3_call(emulator: Emulator, session: Session, method: str, **kwargs: Any) -> Any:
    async with get_session().create_client(
        "s3",
        region_name=REGION,
        endpoint_url=emulator.url,
        aws_access_key_id=session.key,
        aws_secret_access_key=session.secret,
        aws_session_token=session.token,
    ) as s3:
        return await getattr(s3, method)(**kwargs)


def versions(emulator: Emulator, bucket: str) -> dict[tuple[str, str], bool]:
    """(key, version id) -> is a delete marker, listed as the storage-tools role."""
    resp = asyncio.run(
        _s3_call(emulator, emulator.storage_tools, "list_object_versions", Bucket=bucket)
    )
    found = {(v["Key"], v["VersionId"]): False for v in resp.get("Versions", [])}
    return found | {(m["Key"], m["VersionId"]): True for m in resp.get("DeleteMarkers", [])}


@pytest.fixture
def as_storage_tools(
    emulator: Emulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Emulator:
    """`aegis` in this process runs with the storage-tools role's session."""
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", emulator.url)
    monkeypatch.setenv("AEGIS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", emulator.storage_tools.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", emulator.storage_tools.secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", emulator.storage_tools.token)
    return emulator


def aegis(*args: str) -> Any:
    return invoke(*args, catch_exceptions=False)


def test_flat_raw_cannot_delete_its_sources_and_keep_sources_hands_them_over(
    as_storage_tools: Emulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    emulator = as_storage_tools
    monkeypatch.setenv("AEGIS_BUCKET", FLAT)
    before = versions(emulator, FLAT)

    planned = aegis("migrate", "plan", "--preset", "aegis-legacy", "--no-progress")
    assert planned.exit_code == 0, planned.output
    assert "flat-raw     deletes: NO: the storage-tools role may not delete its sources" in (
        planned.stdout
    )
    assert "latest       deletes: yes" in planned.stdout
    assert "the versions of 3 moved keys would stay" in planned.stdout  # raw/: no purge either

    refused = aegis("migrate", "run", "--preset", "aegis-legacy", "--no-progress")
    assert refused.exit_code == 2, refused.output
    assert "flat-raw (3 objects)" in refused.stderr and "--keep-sources" in refused.stderr
    assert versions(emulator, FLAT) == before  # refused before any copy

    kept = aegis("migrate", "run", "--preset", "aegis-legacy", "--keep-sources", "--no-progress")
    assert kept.exit_code == 0, kept.output
    summary = json.loads(kept.stdout)
    assert (summary["copied"], summary["verified"], summary["deleted"]) == (3, 3, 0)
    assert summary["kept"] == 3 and summary["failed"] == 0
    assert summary["sealed"] == {"sealed": 1}
    after = versions(emulator, FLAT)
    assert not any(after.values())  # no delete marker: nothing deleted
    assert set(before) <= set(after)  # every version of every source still there
    assert {key for key, _ in set(after) - set(before)} == {dated(k) for k in FLAT_KEYS} | {SEAL}

    # the hand-over: the exact batches and commands, to be run as the break-glass role
    folder = Path(summary["handover"])
    assert folder.parent == tmp_path / "state"
    assert "sh " + str(folder / "commands.sh") in kept.stderr
    assert f"aws s3api delete-objects --bucket {FLAT} --delete file://{folder}" in kept.stderr
    assert (folder / "keys.txt").read_text().split() == FLAT_KEYS
    batch = json.loads((folder / "delete-0001.json").read_text())
    assert batch == {"Objects": [{"Key": k} for k in FLAT_KEYS], "Quiet": True}
    # what the storage-tools role cannot do, the break-glass role can
    with pytest.raises(Exception, match="AccessDenied"):
        asyncio.run(
            _s3_call(
                emulator, emulator.storage_tools, "delete_object", Bucket=FLAT, Key=FLAT_KEYS[0]
            )
        )
    done = asyncio.run(
        _s3_call(emulator, emulator.break_glass, "delete_objects", Bucket=FLAT, Delete=batch)
    )
    assert not done.get("Errors")
    current = {k for (k, _), marker in versions(emulator, FLAT).items() if not marker}
    assert {k for k in FLAT_KEYS if k in current} == set(FLAT_KEYS)  # as noncurrent versions
    listed = asyncio.run(_s3_call(emulator, emulator.storage_tools, "list_objects_v2", Bucket=FLAT))
    assert sorted(o["Key"] for o in listed["Contents"]) == sorted(
        [*(dated(k) for k in FLAT_KEYS), SEAL]
    )


def test_keep_sources_still_deletes_what_the_role_may_delete(
    as_storage_tools: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator = as_storage_tools
    monkeypatch.setenv("AEGIS_BUCKET", MIXED)
    result = aegis(
        "migrate",
        "run",
        "--preset",
        "aegis-legacy",
        "--keep-sources",
        "--purge-versions",
        "--no-progress",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["copied"], summary["deleted"], summary["kept"]) == (4, 1, 3)
    # latest/ moved, deleted and purged (the role may); the raw/ sources kept, every version
    assert summary["purged"] == {"keys": 1, "versions": 1, "bytes": 15, "markers": 1, "left": 0}
    after = versions(emulator, MIXED)
    assert not [key for key, _ in after if key == LATEST]
    assert not any(after.values())
    assert {key for key, _ in after} == {
        *FLAT_KEYS,
        *(dated(k) for k in FLAT_KEYS),
        SEAL,
        f"legacy/{LATEST}",
    }
