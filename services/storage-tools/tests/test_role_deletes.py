"""The table of what the storage-tools role may delete (``rules.ROLE_REFUSED``) against the shipped
policy documents: the role's identity policy and the bucket policy under deploy/infra, evaluated
for the role's ARN with the emulator's IAM evaluator (``aegis_devstack.motopolicy``: conditions,
wildcards, explicit denies). Changing the policies without the table, or the table without the
policies, fails here; the IAM-enforced runs are in test_migrate_policy.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from aegis_devstack import motopolicy
from aegis_devstack.testing.infra import load_render
from aegis_storage_tools.rules import (
    DELETE_OBJECT,
    DELETE_OBJECT_VERSION,
    PRESETS,
    ROLE_REFUSED,
    Deletes,
    Rule,
    role_may,
    source_deletes,
)

ROOT = Path(__file__).resolve().parents[3]
INFRA = ROOT / "deploy" / "infra"
ACCOUNT, PREFIX, BUCKET = "123456789012", "aegis", "aegis-bucket-data"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/{PREFIX}-storage-tools-task"
VALUES = {
    "AWS::Partition": "aws",
    "AWS::Region": "ap-south-1",
    "AWS::AccountId": ACCOUNT,
    "BucketName": BUCKET,
    "TableName": "AEGIS-DynamoDB-FactoryStatus",
    "NamePrefix": PREFIX,
}


render = load_render(INFRA)
IDENTITY: dict[str, Any] = render.substitute(render.load_policy("storage-tools"), VALUES)
BUCKET_POLICY = json.dumps(render.substitute(render.load_document(render.BUCKET_POLICY), VALUES))


def shipped_policies_allow(action: str, resource: str) -> bool:
    """The role's request as AWS decides it: an explicit Deny anywhere refuses, else the identity
    policy must allow (the bucket policy ships denials only)."""
    token = motopolicy.CURRENT.set({"aws:PrincipalArn": [ROLE_ARN]})
    try:
        applying = [
            s for s in IDENTITY["Statement"] if motopolicy.statement_applies(s, action, resource)
        ]
        if any(s["Effect"] == "Deny" for s in applying):
            return False
        if not any(s["Effect"] == "Allow" for s in applying):
            return False
        return motopolicy.bucket_policy_denies(BUCKET_POLICY, action, resource) is None
    finally:
        motopolicy.CURRENT.reset(token)


def object_arn(key: str) -> str:
    return f"arn:aws:s3:::{BUCKET}/{key}"


PRESET_RULES: list[Rule] = [r for make in PRESETS.values() for r in make().rules]


def sample_keys() -> list[str]:
    """Keys under every preset's sources and targets, and both sides of every refused prefix."""
    keys = {f"{r.source}f/x/m.json" for r in PRESET_RULES}
    keys |= {f"{r.target}f/x/m.json" for r in PRESET_RULES}
    for prefixes in ROLE_REFUSED.values():
        for prefix in prefixes:
            keys |= {
                f"{prefix}a.json",
                f"{prefix}f/source/yyyy=2026/mm=11/dd=30/m.json",
                f"{prefix.rstrip('/')}-old/a.json",  # beside it, not under it
                f"legacy/{prefix}a.json",  # holding it, not starting with it
            }
    return sorted(keys)


@pytest.mark.parametrize("action", [DELETE_OBJECT, DELETE_OBJECT_VERSION])
@pytest.mark.parametrize("key", sample_keys())
def test_the_table_says_what_the_shipped_policies_decide(action: str, key: str) -> None:
    assert role_may(action, key) == shipped_policies_allow(action, object_arn(key))


@pytest.mark.parametrize("rule", PRESET_RULES, ids=lambda r: r.name)
def test_each_preset_rule_is_judged_as_the_policies_judge_its_sources(rule: Rule) -> None:
    for action in (DELETE_OBJECT, DELETE_OBJECT_VERSION):
        allowed = shipped_policies_allow(action, object_arn(f"{rule.source}f/x/m.json"))
        assert source_deletes(rule, action) == (Deletes.YES if allowed else Deletes.NO)
    # the flat raw layout moves raw/ keys within raw/: the one preset rule that cannot delete
    assert (source_deletes(rule) is Deletes.NO) == (rule.name == "flat-raw")


def test_the_role_may_list_versions_and_the_break_glass_role_is_the_one_exempt() -> None:
    # a purge lists the versions of the bucket (ListObjectVersions is s3:ListBucketVersions)
    assert shipped_policies_allow("s3:ListBucketVersions", f"arn:aws:s3:::{BUCKET}")
    token = motopolicy.CURRENT.set(
        {"aws:PrincipalArn": [f"arn:aws:iam::{ACCOUNT}:role/{PREFIX}-raw-break-glass"]}
    )
    try:
        assert (
            motopolicy.bucket_policy_denies(BUCKET_POLICY, DELETE_OBJECT, object_arn("raw/a"))
            is None
        )
    finally:
        motopolicy.CURRENT.reset(token)
