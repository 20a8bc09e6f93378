"""The emulator's condition evaluator against IAM's documented semantics: what it answers decides
whether the bucket-policy and key-family tests can fail, so each rule is pinned here."""

from __future__ import annotations

import json

import pytest

from aegis_devstack import motopolicy
from aegis_devstack.motopolicy import (
    UnknownOperator,
    bucket_policy_denies,
    condition_holds,
    dynamodb_context,
    principal_arn,
    s3_context,
)

ROLE = "arn:aws:iam::123456789012:role/aegis-raw-break-glass"


@pytest.mark.parametrize(
    ("operator", "wanted", "present", "holds"),
    [
        ("StringEquals", "a", ["a"], True),
        ("StringEquals", ["a", "b"], ["b"], True),
        ("StringEquals", "a", ["A"], False),
        ("StringEqualsIgnoreCase", "a", ["A"], True),
        ("StringNotEquals", "a", ["b"], True),
        ("StringNotEquals", ["a", "b"], ["b"], False),
        ("StringLike", "FACTORY#*", ["FACTORY#f-1"], True),
        ("StringLike", "FACTORY#*", ["ALERT#f-1"], False),
        ("StringLike", "f-?", ["f-12"], False),
        ("StringLike", "a.c", ["abc"], False),  # only * and ? are wildcards
        ("StringNotLike", ["x*", "y*"], ["z"], True),
        ("StringNotLike", ["x*", "y*"], ["y1"], False),
        ("ArnLike", "arn:aws:iam::*:role/aegis-*", [ROLE], True),
        ("ArnLike", "arn:aws:iam::*:user/*", [ROLE], False),
        ("ArnNotLike", ROLE, ["arn:aws:iam::123456789012:user/ops"], True),
        ("ArnNotLike", ROLE, [ROLE], False),
        ("ArnEquals", ROLE, [ROLE], True),
        ("Bool", "true", ["true"], True),
        ("Bool", "false", ["true"], False),
    ],
)
def test_single_valued_operators(operator, wanted, present, holds):
    assert condition_holds(operator, "k", wanted, {"k": present}) is holds


def test_a_missing_key_fails_every_operator_but_null_if_exists_and_for_all_values():
    for operator in ("StringEquals", "StringNotEquals", "StringLike", "ArnNotLike", "Bool"):
        assert not condition_holds(operator, "k", "v", {}), operator
    assert condition_holds("StringEqualsIfExists", "k", "v", {})
    assert not condition_holds("StringEqualsIfExists", "k", "v", {"k": ["w"]})
    assert condition_holds("ForAllValues:StringLike", "k", "v*", {})  # vacuous, as on AWS
    assert not condition_holds("ForAnyValue:StringLike", "k", "v*", {})


def test_null_asks_whether_the_key_is_there():
    assert condition_holds("Null", "s3:if-none-match", "true", {})
    assert not condition_holds("Null", "s3:if-none-match", "true", {"s3:if-none-match": ["*"]})
    assert condition_holds("Null", "s3:if-none-match", "false", {"s3:if-none-match": ["*"]})
    assert condition_holds("Null", "s3:if-none-match", True, {})  # JSON true as well


def test_set_operators_over_multivalued_keys():
    keys = {"dynamodb:LeadingKeys": ["FACTORY#a", "ALERT#a"]}
    assert not condition_holds("ForAllValues:StringLike", "dynamodb:LeadingKeys", "FACTORY#*", keys)
    assert condition_holds(
        "ForAllValues:StringLike", "dynamodb:LeadingKeys", ["FACTORY#*", "ALERT#*"], keys
    )
    assert condition_holds("ForAnyValue:StringLike", "dynamodb:LeadingKeys", "ALERT#*", keys)
    # a multivalued key without a set qualifier matches nothing
    assert not condition_holds("StringLike", "dynamodb:LeadingKeys", "*", keys)


def test_an_unknown_operator_is_an_error_not_a_pass():
    with pytest.raises(UnknownOperator):
        condition_holds("NumericLessThan", "k", "3", {"k": ["1"]})


def test_an_assumed_role_is_its_role():
    session = "arn:aws:sts::123456789012:assumed-role/aegis-raw-break-glass/incident-42"
    assert principal_arn(session) == ROLE
    assert (
        principal_arn("arn:aws:iam::123456789012:user/ops") == "arn:aws:iam::123456789012:user/ops"
    )


def test_request_context_of_s3_and_dynamodb():
    assert s3_context({"If-None-Match": "*"}) == {"s3:if-none-match": ["*"]}
    assert s3_context({"if-none-match": "*"}) == {"s3:if-none-match": ["*"]}
    assert s3_context({}) == {}
    put = {"TableName": "t", "Item": {"pk": {"S": "FACTORY#a"}, "sk": {"S": "LATEST"}}}
    assert dynamodb_context(put, "pk")["dynamodb:LeadingKeys"] == ["FACTORY#a"]
    batch = {
        "RequestItems": {
            "t": [
                {"PutRequest": {"Item": {"pk": {"S": "A#1"}, "sk": {"S": "x"}}}},
                {"DeleteRequest": {"Key": {"pk": {"S": "B#2"}, "sk": {"S": "y"}}}},
            ]
        }
    }
    assert dynamodb_context(batch, "pk", "t")["dynamodb:LeadingKeys"] == ["A#1", "B#2"]
    query = {
        "KeyConditionExpression": "#p = :p AND begins_with(sk, :s)",
        "ExpressionAttributeNames": {"#p": "pk"},
        "ExpressionAttributeValues": {":p": {"S": "JOB#registry"}, ":s": {"S": "JOB#"}},
        "ProjectionExpression": "sk, firing",
        "Select": "SPECIFIC_ATTRIBUTES",
    }
    context = dynamodb_context(query, "pk")
    assert context["dynamodb:LeadingKeys"] == ["JOB#registry"]
    assert context["dynamodb:Attributes"] == ["firing", "pk", "sk"]
    assert context["dynamodb:Select"] == ["SPECIFIC_ATTRIBUTES"]


def test_a_bucket_policy_deny_applies_by_action_resource_principal_and_condition():
    policy = json.dumps(
        {
            "Statement": [
                {
                    "Sid": "NoPlainRawPuts",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:PutObject",
                    "Resource": "arn:aws:s3:::b/raw/*",
                    "Condition": {
                        "Null": {"s3:if-none-match": "true"},
                        "ArnNotLike": {"aws:PrincipalArn": ROLE},
                    },
                },
                {"Effect": "Allow", "Principal": "*", "Action": "s3:*", "Resource": "*"},
            ]
        }
    )
    user = {"aws:PrincipalArn": ["arn:aws:iam::123456789012:user/ops"]}

    def denies(context: dict[str, list[str]], action: str = "s3:PutObject", key: str = "raw/x"):
        token = motopolicy.CURRENT.set(context)
        try:
            return bucket_policy_denies(policy, action, f"arn:aws:s3:::b/{key}")
        finally:
            motopolicy.CURRENT.reset(token)

    assert denies(user) == "NoPlainRawPuts"
    assert denies({**user, "s3:if-none-match": ["*"]}) is None
    assert denies({"aws:PrincipalArn": [ROLE]}) is None
    assert denies(user, key="processed/x") is None
    assert denies(user, action="s3:GetObject") is None
    assert bucket_policy_denies(None, "s3:PutObject", "arn:aws:s3:::b/raw/x") is None
