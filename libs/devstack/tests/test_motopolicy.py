"""The emulator's condition evaluator against IAM's documented semantics: what it answers decides
whether the bucket-policy and key-family tests can fail, so each rule is pinned here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from aegis_devstack import motopolicy
from aegis_devstack.motopolicy import (
    UnknownOperator,
    UnsupportedPolicy,
    bucket_policy_denies,
    condition_holds,
    dynamodb_context,
    expression_names,
    principal_arn,
    s3_context,
    validate_policy,
)
from aegis_devstack.testing.infra import load_render, resolve

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


def test_a_missing_key_fails_positive_operators_and_holds_for_negated_ones():
    # "Condition operators": absent key, condition false; but true when the operator requires
    # that the key is not matched; ...IfExists holds; ForAllValues holds, ForAnyValue fails
    for operator in ("StringEquals", "StringLike", "ArnLike", "ArnEquals", "Bool"):
        assert not condition_holds(operator, "k", "v", {}), operator
    for operator in ("StringNotEquals", "StringNotLike", "ArnNotLike", "ArnNotEquals"):
        assert condition_holds(operator, "k", "v", {}), operator
    assert condition_holds("StringEqualsIfExists", "k", "v", {})
    assert not condition_holds("StringEqualsIfExists", "k", "v", {"k": ["w"]})
    assert condition_holds("ForAllValues:StringLike", "k", "v*", {})  # vacuous, as on AWS
    assert not condition_holds("ForAnyValue:StringLike", "k", "v*", {})
    assert not condition_holds("ForAnyValue:StringNotLike", "k", "v*", {})


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
    # a plain operator on a multivalued key has no documented result: refused, not guessed
    with pytest.raises(UnsupportedPolicy):
        condition_holds("StringLike", "dynamodb:LeadingKeys", "*", keys)


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


# -- dynamodb:Attributes: every name a request names -------------------------------------------


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("SET payload = :v", {"payload"}),
        ("SET #p = :v, fleet_pk = if_not_exists(fleet_pk, :d)", {"payload", "fleet_pk"}),
        ("REMOVE a.b[0].c, #p ADD n :one DELETE s :x", {"a", "payload", "n", "s"}),
        (
            "attribute_exists(pk) AND NOT contains(#p, :v) OR size(tags) > :n",
            {"pk", "payload", "tags"},
        ),
        ("sk BETWEEN :a AND :b AND kind IN (:x, :y)", {"sk", "kind"}),
        ("pk, sk, firing", {"pk", "sk", "firing"}),
        ("#missing = :v", {"#missing"}),  # an undefined alias stays as spelled: refused by lists
        ("set lower = :v", {"lower"}),  # keywords in any case
    ],
)
def test_expression_names_are_the_first_element_of_every_path(expression, names):
    assert expression_names(expression, {"#p": "payload"}) == names


def test_attributes_come_from_every_expression_legacy_parameter_and_key():
    update = {
        "Key": {"pk": {"S": "FACTORY#a"}, "sk": {"S": "LATEST"}},
        "UpdateExpression": "SET payload = :v",
        "ConditionExpression": "attribute_exists(firing)",
        "ExpressionAttributeValues": {":v": {"S": "x"}},
    }
    context = dynamodb_context(update, "pk", action="dynamodb:UpdateItem")
    assert context["dynamodb:Attributes"] == ["firing", "payload", "pk", "sk"]
    assert context["dynamodb:ReturnValues"] == ["NONE"]  # "always has a value"
    legacy = {
        "Key": {"pk": {"S": "FACTORY#a"}, "sk": {"S": "LATEST"}},
        "AttributeUpdates": {"payload": {"Action": "DELETE"}},
        "Expected": {"firing": {"Exists": False}},
    }
    assert dynamodb_context(legacy, "pk")["dynamodb:Attributes"] == [
        "firing",
        "payload",
        "pk",
        "sk",
    ]
    batch = {
        "RequestItems": {
            "t": {
                "Keys": [{"pk": {"S": "ALERT#a"}, "sk": {"S": "x"}}],
                "ProjectionExpression": "#p",
                "ExpressionAttributeNames": {"#p": "payload"},
            }
        }
    }
    assert dynamodb_context(batch, "pk", "t")["dynamodb:Attributes"] == ["payload", "pk", "sk"]


def test_select_is_there_for_every_query_and_scan():
    scan = {"TableName": "t", "ProjectionExpression": "pk"}
    assert dynamodb_context(scan, "pk", action="dynamodb:Scan")["dynamodb:Select"] == [
        "ALL_ATTRIBUTES"
    ]
    on_index = {"TableName": "t", "IndexName": "fleet"}
    assert dynamodb_context(on_index, "pk", action="dynamodb:Scan")["dynamodb:Select"] == [
        "ALL_PROJECTED_ATTRIBUTES"
    ]
    chosen = {**scan, "Select": "SPECIFIC_ATTRIBUTES"}
    assert dynamodb_context(chosen, "pk", action="dynamodb:Scan")["dynamodb:Select"] == [
        "SPECIFIC_ATTRIBUTES"
    ]
    assert "dynamodb:Select" not in dynamodb_context({"Key": {}}, "pk", action="dynamodb:GetItem")
    # a Scan names no partition: it has no dynamodb:LeadingKeys
    assert "dynamodb:LeadingKeys" not in dynamodb_context(scan, "pk", action="dynamodb:Scan")


def test_a_legacy_key_condition_names_the_queried_partition():
    query = {
        "KeyConditions": {
            "pk": {"AttributeValueList": [{"S": "JOB#x"}], "ComparisonOperator": "EQ"}
        }
    }
    assert dynamodb_context(query, "pk")["dynamodb:LeadingKeys"] == ["JOB#x"]


# -- refused at load ---------------------------------------------------------------------------


def _allow(condition: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    statement = {"Effect": "Allow", "Action": "s3:*", "Resource": "*", **extra}
    return {**statement, "Condition": condition} if condition else statement


def _assume(principal: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": "sts:AssumeRole", "Principal": principal}


@pytest.mark.parametrize(
    ("kind", "statement", "named"),
    [
        ("identity", _allow(Extra=1), "Extra"),
        ("identity", {"Effect": "Allow", "Action": "s3:*"}, "no Resource"),
        ("identity", _allow(Principal="*"), "Principal"),
        ("identity", _allow({"StringEquals": {"aws:SourceIp": "x"}}), "aws:SourceIp"),
        ("identity", _allow({"Bool": {"aws:MultiFactorAuthPresent": "true"}}), "MultiFactor"),
        ("identity", _allow({"StringEqualz": {"s3:if-match": "x"}}), "StringEqualz"),
        ("identity", _allow({"NullIfExists": {"s3:if-match": "true"}}), "NullIfExists"),
        ("trust", _assume({"Federated": "x"}), "Federated"),
        ("trust", _assume({"AWS": "arn:aws:iam::123456789012:user/*"}), "wildcards"),
        ("bucket", {**_allow(Principal={"AWS": "123456789012"}), "Effect": "Deny"}, "account"),
    ],
)
def test_validate_policy_names_what_it_refuses(kind, statement, named):
    with pytest.raises(UnsupportedPolicy, match=re.escape(named)):
        validate_policy({"Version": "2012-10-17", "Statement": [statement]}, kind)


def test_a_key_of_a_service_the_emulator_does_not_run_passes_only_on_that_services_actions():
    bedrock_only = {
        "Effect": "Allow",
        "Action": "bedrock:InvokeModel",
        "Resource": "*",
        "Condition": {"ArnLike": {"bedrock:InferenceProfileArn": "arn:aws:bedrock:*"}},
    }
    validate_policy({"Version": "2012-10-17", "Statement": [bedrock_only]}, "identity")
    mixed = {**bedrock_only, "Action": ["bedrock:InvokeModel", "s3:GetObject"]}
    with pytest.raises(UnsupportedPolicy, match="puts no 'bedrock:InferenceProfileArn'"):
        validate_policy({"Version": "2012-10-17", "Statement": [mixed]}, "identity")


INFRA = Path(__file__).resolve().parents[3] / "deploy" / "infra"
ACCOUNT = "123456789012"
PARAMETERS = {
    "AWS::Partition": "aws",
    "AWS::Region": "ap-south-1",
    "AWS::AccountId": ACCOUNT,
    "BucketName": "aegis-bucket-data",
    "TableName": "AEGIS-DynamoDB-FactoryStatus",
    "NamePrefix": "aegis",
    "BreakGlassPrincipal": f"arn:aws:iam::{ACCOUNT}:user/ops",
    "EcsClusterArn": f"arn:aws:ecs:ap-south-1:{ACCOUNT}:cluster/aegis",
}


def _template_policies(render: Any, given: bool) -> list[tuple[str, str, Any]]:
    found = []
    template = render.render()
    for name, resource in template["Resources"].items():
        properties, kind = resource.get("Properties", {}), resource["Type"]
        if kind == "AWS::IAM::ManagedPolicy":
            found.append((name, "identity", properties["PolicyDocument"]))
        elif kind == "AWS::S3::BucketPolicy":
            found.append((name, "bucket", properties["PolicyDocument"]))
        elif kind == "AWS::IAM::Role":
            found.append((name, "trust", properties["AssumeRolePolicyDocument"]))
            found += [
                (name, "identity", p["PolicyDocument"]) for p in properties.get("Policies", [])
            ]
    conditions = dict.fromkeys(template.get("Conditions", {}), given)  # all on, or all off
    # what Fn::GetAtt gives for the roles the documents name (the roles' passed to a task)
    arns = {
        f"{name}.Arn": f"arn:aws:iam::{ACCOUNT}:role/{name}"
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::IAM::Role"
    }
    values = {**PARAMETERS, **arns}
    return [(n, k, resolve(render, doc, values, conditions)) for n, k, doc in found]


def test_every_committed_policy_and_every_policy_the_template_renders_passes_the_validator():
    render = load_render(INFRA)
    documents: list[tuple[str, str, Any]] = [
        (name, "identity", render.load_policy(name)) for name in render.policy_names()
    ]
    documents.append(("bucket-policy.json", "bucket", render.load_document(render.BUCKET_POLICY)))
    documents.append(("break-glass.json", "identity", render.load_document(render.BREAK_GLASS)))
    documents = [(n, k, render.substitute(d, PARAMETERS)) for n, k, d in documents]
    documents += _template_policies(render, True) + _template_policies(render, False)
    assert len(documents) > 30  # the services' policies, roles, trusts and the bucket's
    refused = {}
    for name, kind, document in documents:
        try:
            validate_policy(document, kind)  # type: ignore[arg-type]
        except UnsupportedPolicy as err:
            refused[name] = str(err)
    assert refused == {}
