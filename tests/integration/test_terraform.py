"""deploy/terraform: the Terraform module declares what deploy/infra/foundation.yaml declares
(bucket, lifecycle rules, public access block, bucket policy, table, every role and policy,
repositories, log groups, and given a cluster the scheduled tasks' schedules), compared resource
by resource for the same inputs; the comparison sees a change on either side; and, where a
terraform binary and the AWS provider are on the machine, the module validates, applies on
moto_server, equals what ``aegis bootstrap`` creates and plans no change after its apply, and
given a cluster plans the template's schedule and scheduler role (not applied: see the test).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from aegis_devstack.localservers import ManagedServer, free_port, start_moto_server
from aegis_devstack.motoserver import UNDELIVERED
from aegis_devstack.testing.infra import cfn_lifecycle_rule, load_render, resolve
from aegis_devstack.testing.terraform import Scope, Unsupported, load_module
from aegis_storage.bootstrap import (
    LIFECYCLE_RULES,
    describe_foundation,
    expected_foundation,
    normalize_rules,
)
from aegis_storage.clients import AwsConfig, open_client, open_clients

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "deploy" / "infra"
TERRAFORM = ROOT / "deploy" / "terraform"
REGION = "ap-south-1"
ACCOUNT = "123456789012"  # moto's account

render = load_render(INFRA)

# the module's variables and the template's parameters, one to one
PARAMETERS = {
    "bucket_name": "BucketName",
    "table_name": "TableName",
    "name_prefix": "NamePrefix",
    "break_glass_principal": "BreakGlassPrincipal",
    "object_lock_mode": "ObjectLockMode",
    "object_lock_days": "ObjectLockDays",
    "access_log_bucket_name": "AccessLogBucketName",
    "ecs_cluster_arn": "EcsClusterArn",
    "scheduled_task_subnets": "ScheduledTaskSubnets",
    "scheduled_task_security_groups": "ScheduledTaskSecurityGroups",
}
# every option on, every name its own (a placeholder replaced by the wrong input shows)
ALL_ON = {
    "bucket_name": "acme-telemetry",
    "table_name": "Acme-ReadModel",
    "name_prefix": "acme",
    "break_glass_principal": "arn:aws-cn:iam::210987654321:role/incident-lead",
    "object_lock_mode": "GOVERNANCE",
    "object_lock_days": 30,
    "access_log_bucket_name": "acme-access-logs",
    "ecs_cluster_arn": "arn:aws-cn:ecs:cn-north-1:210987654321:cluster/acme",
    "scheduled_task_subnets": ["subnet-0b2", "subnet-0a1"],
    "scheduled_task_security_groups": ["sg-0c3"],
}
ENVIRONMENT = {"partition": "aws-cn", "region": "cn-north-1", "account_id": "210987654321"}
# not evaluated by the reader: the execution roles' secrets (their statements are compared on the
# emulator, where Terraform itself evaluates them)
NOT_READ = {"task_secrets", "execution_statements"}


def _pab(config: dict[str, Any]) -> dict[str, bool]:
    return {
        "BlockPublicAcls": config["BlockPublicAcls"],
        "IgnorePublicAcls": config["IgnorePublicAcls"],
        "BlockPublicPolicy": config["BlockPublicPolicy"],
        "RestrictPublicBuckets": config["RestrictPublicBuckets"],
    }


# -- the template, resolved for some inputs ----------------------------------------------------


def cloudformation_model(
    template: dict[str, Any],
    inputs: dict[str, Any],
    environment: dict[str, str] = ENVIRONMENT,
    *,
    execution_secrets: bool = False,
) -> dict[str, Any]:
    """What the template makes for ``inputs`` (the module's variable names) in ``environment``,
    as a comparable dict; the execution roles' inline policies only with ``execution_secrets``
    (see NOT_READ)."""
    defaults = {k: _parameter(v, v["Default"]) for k, v in template["Parameters"].items()}
    params: dict[str, Any] = {**defaults, **{PARAMETERS[k]: v for k, v in inputs.items()}}
    partition, account = environment["partition"], environment["account_id"]
    params |= {
        "AWS::Partition": partition,
        "AWS::Region": environment["region"],
        "AWS::AccountId": account,
        "AWS::NoValue": NO_VALUE,
    }
    params = {k: str(v) if isinstance(v, int) else v for k, v in params.items()}
    resources = template["Resources"]
    params["DataBucket"] = params["BucketName"]  # a Ref to a bucket is its name
    for logical, res in resources.items():
        if res["Type"] == "AWS::IAM::ManagedPolicy":  # a Ref to a managed policy is its ARN
            name = resolve(render, res["Properties"]["ManagedPolicyName"], params, {})
            params[logical] = f"arn:{partition}:iam::{account}:policy/{name}"
        elif res["Type"] == "AWS::IAM::Role":  # and a role's Arn attribute
            name = resolve(render, res["Properties"]["RoleName"], params, {})
            params[f"{logical}.Arn"] = f"arn:{partition}:iam::{account}:role/{name}"
    conditions = {
        "BreakGlassPrincipalGiven": params["BreakGlassPrincipal"] != "",
        "ObjectLockOn": params["ObjectLockMode"] != "NONE",
        "AccessLogsOn": params["AccessLogBucketName"] != "",
        "SchedulesOn": params["EcsClusterArn"] != "",
    }
    model: dict[str, Any] = {
        "defaults": {k: str(defaults[v]) for k, v in PARAMETERS.items()},
        "policies": {},
        "roles": {},
        "repositories": {},
        "log_groups": {},
        "schedules": {},
    }
    for res in resources.values():
        if "Condition" in res and not conditions[res["Condition"]]:
            continue  # not made for these inputs
        props = _without_no_value(resolve(render, res["Properties"], params, conditions))
        kind = res["Type"]
        if kind == "AWS::S3::Bucket":
            lock = props.get("ObjectLockConfiguration")
            logging = props.get("LoggingConfiguration")
            model["bucket"] = {
                "name": props["BucketName"],
                "versioning": props["VersioningConfiguration"]["Status"],
                "lifecycle": normalize_rules(
                    [cfn_lifecycle_rule(r) for r in props["LifecycleConfiguration"]["Rules"]]
                ),
                "public_access_block": _pab(props["PublicAccessBlockConfiguration"]),
                "logging": logging
                and {
                    "target": logging["DestinationBucketName"],
                    "prefix": logging["LogFilePrefix"],
                },
                "object_lock": bool(props.get("ObjectLockEnabled")),
                "object_lock_retention": lock
                and {
                    "mode": lock["Rule"]["DefaultRetention"]["Mode"],
                    "days": int(lock["Rule"]["DefaultRetention"]["Days"]),
                },
            }
        elif kind == "AWS::S3::BucketPolicy":
            model["bucket_policy"] = {
                "bucket": props["Bucket"],
                "document": props["PolicyDocument"],
            }
        elif kind == "AWS::DynamoDB::Table":
            stream = props["StreamSpecification"]
            model["table"] = {
                "name": props["TableName"],
                "billing": props["BillingMode"],
                "key_schema": sorted(
                    (k["AttributeName"], k["KeyType"]) for k in props["KeySchema"]
                ),
                "attributes": sorted(
                    (a["AttributeName"], a["AttributeType"]) for a in props["AttributeDefinitions"]
                ),
                "indexes": {
                    i["IndexName"]: {
                        "key_schema": [(k["AttributeName"], k["KeyType"]) for k in i["KeySchema"]],
                        "projection": i["Projection"]["ProjectionType"],
                    }
                    for i in props["GlobalSecondaryIndexes"]
                },
                "ttl": {
                    "attribute": props["TimeToLiveSpecification"]["AttributeName"],
                    "enabled": props["TimeToLiveSpecification"]["Enabled"],
                },
                "pitr": props["PointInTimeRecoverySpecification"]["PointInTimeRecoveryEnabled"],
                "stream": stream["StreamViewType"],
            }
        elif kind == "AWS::IAM::ManagedPolicy":
            model["policies"][props["ManagedPolicyName"]] = {
                "description": props["Description"],
                "document": props["PolicyDocument"],
            }
        elif kind == "AWS::IAM::Role":
            execution = props["RoleName"].endswith("-execution") and not execution_secrets
            model["roles"][props["RoleName"]] = {
                "description": props.get("Description"),
                "max_session": props.get("MaxSessionDuration"),
                "trust": props["AssumeRolePolicyDocument"],
                "managed": sorted(props.get("ManagedPolicyArns", [])),
                "inline": None
                if execution
                else {p["PolicyName"]: p["PolicyDocument"] for p in props.get("Policies", [])},
            }
        elif kind == "AWS::ECR::Repository":
            model["repositories"][props["RepositoryName"]] = {
                "mutability": props["ImageTagMutability"],
                "scan_on_push": props["ImageScanningConfiguration"]["ScanOnPush"],
            }
        elif kind == "AWS::Logs::LogGroup":
            model["log_groups"][props["LogGroupName"]] = props["RetentionInDays"]
        elif kind == "AWS::Scheduler::Schedule":
            name = props.pop("Name")
            model["schedules"][name] = _schedule(props)
        else:
            raise AssertionError(f"the comparison does not know {kind}")
    return model


NO_VALUE = "<AWS::NoValue>"


def _parameter(spec: dict[str, Any], value: Any) -> Any:
    """A parameter's value as a Ref gives it: a CommaDelimitedList's a list ("" none)."""
    if spec["Type"] == "CommaDelimitedList" and isinstance(value, str):
        return [item for item in value.split(",") if item]
    return value


def _schedule(spec: dict[str, Any]) -> dict[str, Any]:
    """An EventBridge Scheduler schedule's properties in CloudFormation's spelling (the API names
    the network ``awsvpcConfiguration``), its subnets and security groups sorted (sets to AWS)."""
    spec = copy.deepcopy(spec)
    network = spec.get("Target", {}).get("EcsParameters", {}).get("NetworkConfiguration")
    if network is not None:
        if "awsvpcConfiguration" in network:
            network["AwsvpcConfiguration"] = network.pop("awsvpcConfiguration")
        vpc = network["AwsvpcConfiguration"]
        for key in ("Subnets", "SecurityGroups"):
            if key in vpc:
                vpc[key] = sorted(vpc[key])
    return spec


def _cfn_spelling(value: Any) -> Any:
    """A Terraform resource's arguments in CloudFormation's spelling: names in PascalCase, a
    block (a list of one object) the object."""
    if isinstance(value, dict):
        return {_pascal(k): _cfn_spelling(v) for k, v in value.items()}
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        return _cfn_spelling(value[0])
    if isinstance(value, list):
        return [_cfn_spelling(v) for v in value]
    return value


def _pascal(name: str) -> str:
    return "".join(word.capitalize() for word in name.split("_"))


def _tf_schedule(arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An aws_scheduler_schedule's name and its arguments as :func:`_schedule` gives the
    template's properties (the network's public IP a boolean there)."""
    spec = _cfn_spelling(arguments)
    ecs = spec["Target"]["EcsParameters"]
    vpc = ecs.pop("NetworkConfiguration")
    vpc["AssignPublicIp"] = "ENABLED" if vpc.get("AssignPublicIp") else "DISABLED"
    ecs["NetworkConfiguration"] = {"AwsvpcConfiguration": vpc}
    return spec.pop("Name"), _schedule(spec)


def _within(actual: Any, shape: Any) -> Any:
    """``actual`` with only the keys ``shape`` has, at every level: of what Terraform or AWS
    reports, what the template declares (not the defaults and attributes they add)."""
    if isinstance(actual, dict) and isinstance(shape, dict):
        return {k: _within(v, shape[k]) for k, v in actual.items() if k in shape}
    return actual


def _without_no_value(value: Any) -> Any:
    """``value`` without the properties that resolved to AWS::NoValue (left out, as in AWS)."""
    if isinstance(value, dict):
        return {k: _without_no_value(v) for k, v in value.items() if v != NO_VALUE}
    if isinstance(value, list):
        return [_without_no_value(v) for v in value]
    return value


# -- the module, evaluated for the same inputs -------------------------------------------------

# a pair of a replace chain: the placeholder and the expression that replaces it
PLACEHOLDER = re.compile(r', "\$\$\{([^}]+)\}", ([\w.\[\]]+)\)')


def _locals(module: dict[str, Any], scope: Scope, *, final: bool) -> None:
    """Every local the reader evaluates (NOT_READ aside), in the order their references allow;
    those naming resources only once ``final`` (after the resources they name are made)."""
    known: dict[str, Any] = scope.values.setdefault("local", {})
    pending = {
        name: raw
        for name, raw in module["locals"].items()
        if name not in known and name not in NOT_READ
    }
    while pending:
        progressed = False
        for name, raw in list(pending.items()):
            try:
                known[name] = scope.value(raw)
            except Unsupported:
                continue
            del pending[name]
            progressed = True
        if not progressed:
            if final:
                raise Unsupported(f"locals this reader cannot evaluate: {sorted(pending)}")
            return


def _for_each(body: dict[str, Any], scope: Scope) -> list[tuple[str, Any]]:
    """The instances of a resource: (key, value) per for_each element, or one ("", None) per
    count, or one."""
    if "for_each" in body:
        found = scope.value(body["for_each"])
        return list(found.items()) if isinstance(found, dict) else [(k, k) for k in found]
    count = scope.value(body.get("count", 1))
    return [("", None)] * count


def terraform_model(module: dict[str, Any], inputs: dict[str, Any]) -> dict[str, Any]:
    """What the module makes for ``inputs`` in the shape of :func:`cloudformation_model`."""
    variables = {
        name: Scope({}).value(body["default"]) for name, body in module["variable"].items()
    }
    partition, account = ENVIRONMENT["partition"], ENVIRONMENT["account_id"]
    scope = Scope(
        {
            "var": {**variables, **inputs},
            "path": {"module": str(TERRAFORM)},
            "data": {
                "aws_partition": {"current": {"partition": partition}},
                "aws_region": {"current": {"name": ENVIRONMENT["region"]}},
                "aws_caller_identity": {"current": {"account_id": account}},
            },
        }
    )
    _locals(module, scope, final=False)
    res = module["resource"]
    made: dict[str, dict[str, dict[str, Any]]] = {}
    scope.values.update(made)

    def instances(rtype: str, name: str) -> list[tuple[Scope, dict[str, Any]]]:
        body = res[rtype][name]
        return [(scope.with_each(k, v), body) for k, v in _for_each(body, scope)]

    def one(rtype: str, name: str) -> tuple[Scope, dict[str, Any]] | None:
        found = instances(rtype, name)
        assert len(found) <= 1, (rtype, name)
        return found[0] if found else None

    bucket_scope, bucket = one("aws_s3_bucket", "data") or (scope, {})
    bucket_name = bucket_scope.value(bucket["bucket"])
    scope.values["aws_s3_bucket"] = {"data": {"id": bucket_name}}

    def of_bucket(rtype: str) -> tuple[Scope, dict[str, Any]] | None:
        found = one(rtype, "data")
        if found is not None:
            assert found[0].value(found[1]["bucket"]) == bucket_name, rtype
        return found

    versioning = of_bucket("aws_s3_bucket_versioning")
    lifecycle = of_bucket("aws_s3_bucket_lifecycle_configuration")
    pab = of_bucket("aws_s3_bucket_public_access_block")
    policy = of_bucket("aws_s3_bucket_policy")
    logging = of_bucket("aws_s3_bucket_logging")
    lock = of_bucket("aws_s3_bucket_object_lock_configuration")
    assert versioning and lifecycle and pab and policy
    pab_values = pab[0].value(pab[1])
    retention = lock and lock[0].value(lock[1]["rule"])[0]["default_retention"][0]
    model: dict[str, Any] = {
        "defaults": {k: str(v) for k, v in variables.items()},
        "bucket": {
            "name": bucket_name,
            "versioning": versioning[0].value(versioning[1]["versioning_configuration"])[0][
                "status"
            ],
            "lifecycle": normalize_rules(
                [_tf_rule(r) for r in lifecycle[0].value(lifecycle[1]["rule"])]
            ),
            "public_access_block": _pab(
                {
                    "BlockPublicAcls": pab_values["block_public_acls"],
                    "IgnorePublicAcls": pab_values["ignore_public_acls"],
                    "BlockPublicPolicy": pab_values["block_public_policy"],
                    "RestrictPublicBuckets": pab_values["restrict_public_buckets"],
                }
            ),
            "logging": logging
            and {
                "target": logging[0].value(logging[1]["target_bucket"]),
                "prefix": logging[0].value(logging[1]["target_prefix"]),
            },
            "object_lock": bucket_scope.value(bucket.get("object_lock_enabled", False)),
            "object_lock_retention": retention
            and {"mode": retention["mode"], "days": int(retention["days"])},
        },
        "bucket_policy": {
            "bucket": bucket_name,
            "document": json.loads(policy[0].value(policy[1]["policy"])),
        },
    }
    table_scope, table = one("aws_dynamodb_table", "read_model") or (scope, {})
    t = table_scope.value(table)
    keys = [(t["hash_key"], "HASH"), *([(t["range_key"], "RANGE")] if "range_key" in t else [])]
    model["table"] = {
        "name": t["name"],
        "billing": t["billing_mode"],
        "key_schema": sorted(keys),
        "attributes": sorted((a["name"], a["type"]) for a in t["attribute"]),
        "indexes": {
            i["name"]: {
                "key_schema": [(i["hash_key"], "HASH"), (i["range_key"], "RANGE")],
                "projection": i["projection_type"],
            }
            for i in t["global_secondary_index"]
        },
        "ttl": {"attribute": t["ttl"][0]["attribute_name"], "enabled": t["ttl"][0]["enabled"]},
        "pitr": t["point_in_time_recovery"][0]["enabled"],
        "stream": t["stream_view_type"] if t["stream_enabled"] else None,
    }

    policies: dict[str, dict[str, Any]] = {}
    for each, body in instances("aws_iam_policy", "service"):
        name = each.value(body["name"])
        arn = f"arn:{partition}:iam::{account}:policy/{name}"
        made.setdefault("aws_iam_policy", {}).setdefault("service", {})[
            each.values["each"]["key"]
        ] = {"arn": arn}
        policies[name] = {
            "description": each.value(body["description"]),
            "document": json.loads(each.value(body["policy"])),
        }
    model["policies"] = policies
    roles: dict[str, dict[str, Any]] = {}
    for rname in res["aws_iam_role"]:
        for each, body in instances("aws_iam_role", rname):
            name = each.value(body["name"])
            key = each.values["each"]["key"]
            made.setdefault("aws_iam_role", {}).setdefault(rname, {})
            attributes = {
                "name": name,
                "id": name,
                "arn": f"arn:{partition}:iam::{account}:role/{name}",
            }
            made["aws_iam_role"][rname][key] = attributes
            if not key:
                made["aws_iam_role"][rname] = attributes
            roles[name] = {
                "description": each.value(body["description"]) if "description" in body else None,
                "max_session": each.value(body["max_session_duration"])
                if "max_session_duration" in body
                else None,
                "trust": json.loads(each.value(body["assume_role_policy"])),
                "managed": [],
                "inline": {},
            }
    scope.values.update(made)
    _locals(module, scope, final=True)  # the scheduler policies name the roles' ARNs
    for aname in res["aws_iam_role_policy_attachment"]:
        for each, body in instances("aws_iam_role_policy_attachment", aname):
            roles[each.value(body["role"])]["managed"].append(each.value(body["policy_arn"]))
    for pname, body in res["aws_iam_role_policy"].items():
        if "aws_iam_role.execution[" in body["role"]:
            continue  # for_each over local.execution_statements (NOT_READ)
        for each, _ in instances("aws_iam_role_policy", pname):
            roles[each.value(body["role"])]["inline"][each.value(body["name"])] = json.loads(
                each.value(body["policy"])
            )
    for name, role in roles.items():
        role["managed"].sort()
        if name.endswith("-execution"):
            role["inline"] = None
    model["roles"] = roles
    model["repositories"] = {}
    for each, body in instances("aws_ecr_repository", "image"):
        model["repositories"][each.value(body["name"])] = {
            "mutability": each.value(body["image_tag_mutability"]),
            "scan_on_push": each.value(body["image_scanning_configuration"])[0]["scan_on_push"],
        }
    model["log_groups"] = {
        each.value(body["name"]): each.value(body["retention_in_days"])
        for each, body in instances("aws_cloudwatch_log_group", "service")
    }
    model["schedules"] = dict(
        # every argument, so one the template lacks shows (the preconditions are Terraform's)
        _tf_schedule(
            each.value({k: v for k, v in body.items() if k not in ("for_each", "lifecycle")})
        )
        for each, body in instances("aws_scheduler_schedule", "task")
    )
    return model


def _tf_rule(rule: dict[str, Any]) -> dict[str, Any]:
    """A lifecycle rule block in the S3 API's spelling."""
    api: dict[str, Any] = {
        "ID": rule["id"],
        "Status": rule["status"],
        "Filter": {"Prefix": (rule.get("filter") or [{}])[0].get("prefix", "")},
    }
    if "transition" in rule:
        api["Transitions"] = [
            {"Days": t["days"], "StorageClass": t["storage_class"]} for t in rule["transition"]
        ]
    if "expiration" in rule:
        api["Expiration"] = {"Days": rule["expiration"][0]["days"]}
    if "noncurrent_version_expiration" in rule:
        days = rule["noncurrent_version_expiration"][0]["noncurrent_days"]
        api["NoncurrentVersionExpiration"] = {"NoncurrentDays": days}
    if "abort_incomplete_multipart_upload" in rule:
        days = rule["abort_incomplete_multipart_upload"][0]["days_after_initiation"]
        api["AbortIncompleteMultipartUpload"] = {"DaysAfterInitiation": days}
    return api


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """Where two models differ, as paths (``roles.aegis-ingest-task.trust``)."""
    if isinstance(left, dict) and isinstance(right, dict):
        found: list[str] = []
        for key in sorted(set(left) | set(right), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in left or key not in right:
                found.append(f"{where} ({'only in terraform' if key in left else 'missing'})")
            else:
                found += differences(left[key], right[key], where)
        return found
    return [] if left == right else [path]


def template() -> dict[str, Any]:
    """The CloudFormation template, a copy of its own for each caller (some change it)."""
    return copy.deepcopy(_template())


@functools.cache
def _template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((INFRA / "foundation.yaml").read_text())
    return loaded


def module_text() -> dict[str, str]:
    return {p.name: p.read_text() for p in TERRAFORM.glob("*.tf")}


# -- the comparison ----------------------------------------------------------------------------


@pytest.mark.parametrize("inputs", [{}, ALL_ON], ids=["defaults", "every-option-on"])
def test_the_module_declares_what_the_template_declares_resource_by_resource(inputs):
    tf = terraform_model(load_module(TERRAFORM), inputs)
    cfn = cloudformation_model(template(), inputs)
    assert differences(tf, cfn) == []
    # the comparison covered every kind of thing the template makes, with real content
    services = render.policy_names()
    prefix = inputs.get("name_prefix", "aegis")
    assert {f"{prefix}-{s}" for s in services} == set(tf["policies"])
    assert {f"{prefix}-{s}-task" for s in services} <= set(tf["roles"])
    assert tf["roles"][f"{prefix}-raw-break-glass"]["inline"]["raw-break-glass"]["Statement"]
    assert tf["table"]["indexes"]["fleet"]["projection"] == "KEYS_ONLY"
    assert len(tf["bucket"]["lifecycle"]) == len(LIFECYCLE_RULES)
    assert bool(tf["bucket"]["logging"]) == bool(inputs)
    principal = tf["roles"][f"{prefix}-raw-break-glass"]["trust"]["Statement"][0]["Principal"]
    assert principal["AWS"] == inputs.get(
        "break_glass_principal", f"arn:{ENVIRONMENT['partition']}:iam::210987654321:root"
    )
    # each scheduled task's execution role and log group always; its schedule and scheduler
    # role only given a cluster
    assert f"{prefix}-seal-raw-execution" in tf["roles"] and "/aegis/seal-raw" in tf["log_groups"]
    on = "ecs_cluster_arn" in inputs
    assert (f"{prefix}-seal-raw-scheduler" in tf["roles"]) == on
    assert set(tf["schedules"]) == ({f"{prefix}-seal-raw"} if on else set())
    if on:
        schedule = tf["schedules"][f"{prefix}-seal-raw"]
        assert schedule["ScheduleExpression"] == "cron(30 2 * * ? *)"
        vpc = schedule["Target"]["EcsParameters"]["NetworkConfiguration"]["AwsvpcConfiguration"]
        assert vpc["Subnets"] == sorted(inputs["scheduled_task_subnets"])
        run, passing = tf["roles"][f"{prefix}-seal-raw-scheduler"]["inline"]["run-seal-raw"][
            "Statement"
        ]
        assert run["Condition"]["ArnEquals"]["ecs:cluster"] == inputs["ecs_cluster_arn"]
        assert passing["Resource"] == [
            f"arn:aws-cn:iam::210987654321:role/{prefix}-{role}"
            for role in ("storage-tools-task", "seal-raw-execution")
        ]


def test_every_placeholder_of_the_policy_files_is_replaced_by_the_module():
    used = set()
    for path in [
        *INFRA.glob("policies/*.json"),
        INFRA / "bucket-policy.json",
        INFRA / "break-glass.json",
        INFRA / "scheduler-policy.json",
    ]:
        used |= set(re.findall(r"\$\{([^}]+)\}", path.read_text()))
    # every document's chain, and the scheduler policy's own (its task's family and roles)
    module = load_module(TERRAFORM)
    chains = module["locals"]["documents"] + module["locals"]["scheduler_policies"]
    assert used == {name for name, _ in PLACEHOLDER.findall(chains)}
    tf = terraform_model(load_module(TERRAFORM), ALL_ON)
    assert tf["schedules"] and f"{ALL_ON['name_prefix']}-seal-raw-scheduler" in tf["roles"]
    assert "${" not in json.dumps([tf["policies"], tf["bucket_policy"], tf["roles"]])


TERRAFORM_CHANGES = [
    ("dynamodb.tf", 'projection_type = "KEYS_ONLY"', 'projection_type = "ALL"', "table.indexes"),
    ("dynamodb.tf", 'attribute_name = "ttl"', 'attribute_name = "expires_at"', "table.ttl"),
    ("dynamodb.tf", '"NEW_AND_OLD_IMAGES"', '"NEW_IMAGE"', "table.stream"),
    ("s3.tf", "days          = 90", "days          = 30", "bucket.lifecycle"),
    ("s3.tf", "restrict_public_buckets = true", "restrict_public_buckets = false", "bucket.public"),
    (
        "main.tf",
        '"$${BucketName}", var.bucket_name)',
        '"$${BucketName}", var.table_name)',
        ("policies.acme-ingest.document", "policies.", "bucket_policy.document", "roles."),
    ),
    ("iam.tf", '${each.key}-task"', '${each.key}-runner"', ("roles.acme-ingest-task", "roles.")),
    (
        "iam.tf",
        '"aws:MultiFactorAuthPresent" = "true"',
        '"aws:MultiFactorAuthPresent" = "false"',
        "roles.acme-raw-break-glass.trust",
    ),
    (
        "ecs.tf",
        'image_tag_mutability = "IMMUTABLE"',
        'image_tag_mutability = "MUTABLE"',
        "repositories",
    ),
    (
        "scheduled.tf",
        "maximum_retry_attempts       = 3",
        "maximum_retry_attempts       = 185",
        "schedules.acme-seal-raw.Target.RetryPolicy.MaximumRetryAttempts",
    ),
    (
        "scheduled.tf",
        "assign_public_ip = false",
        "assign_public_ip = true",
        "schedules.acme-seal-raw.Target.EcsParameters.NetworkConfiguration",
    ),
    (
        "scheduled.tf",
        '"aws:SourceAccount" = local.account_id',
        '"aws:SourceAccount" = "*"',
        "roles.acme-seal-raw-scheduler.trust",
    ),
    (
        "main.tf",
        '"$${EcsClusterArn}", var.ecs_cluster_arn)',
        '"$${EcsClusterArn}", var.bucket_name)',
        "roles.acme-seal-raw-scheduler.inline.run-seal-raw",
    ),
]


@pytest.mark.parametrize(("file", "old", "new", "where"), TERRAFORM_CHANGES)
def test_a_change_to_the_module_alone_is_a_difference(file, old, new, where):
    text = module_text()
    assert old in text[file]
    text[file] = text[file].replace(old, new, 1)
    found = differences(
        terraform_model(load_module(TERRAFORM, text=text), ALL_ON),
        cloudformation_model(template(), ALL_ON),
    )
    # the difference is where the change is, and nowhere else
    first = where if isinstance(where, str) else where[0]
    assert any(f.startswith(first) for f in found), found
    assert all(f.startswith(where) for f in found), found


def _drop_last_ingest_statement(t: dict[str, Any]) -> None:
    t["Resources"]["IngestPolicy"]["Properties"]["PolicyDocument"]["Statement"].pop()


def _ttl(t: dict[str, Any]) -> None:
    t["Resources"]["ReadModelTable"]["Properties"]["TimeToLiveSpecification"]["AttributeName"] = "x"


def _noncurrent(t: dict[str, Any]) -> None:
    rules = t["Resources"]["DataBucket"]["Properties"]["LifecycleConfiguration"]["Rules"]
    rules[0]["NoncurrentVersionExpiration"]["NoncurrentDays"] = 30


def _tls_only_allows(t: dict[str, Any]) -> None:
    doc = t["Resources"]["DataBucketPolicy"]["Properties"]["PolicyDocument"]
    doc["Statement"][-1]["Effect"] = "Allow"


def _log_retention(t: dict[str, Any]) -> None:
    t["Resources"]["IngestLogGroup"]["Properties"]["RetentionInDays"] = 90


def _schedule_in_seoul(t: dict[str, Any]) -> None:
    t["Resources"]["SealRawSchedule"]["Properties"]["ScheduleExpressionTimezone"] = "Asia/Seoul"


def _two_seal_tasks(t: dict[str, Any]) -> None:
    t["Resources"]["SealRawSchedule"]["Properties"]["Target"]["EcsParameters"]["TaskCount"] = 2


def _scheduler_passes_any_role(t: dict[str, Any]) -> None:
    (policy,) = t["Resources"]["SealRawSchedulerRole"]["Properties"]["Policies"]
    policy["PolicyDocument"]["Statement"][1]["Resource"] = "*"


TEMPLATE_CHANGES = [
    (_drop_last_ingest_statement, "policies.acme-ingest.document"),
    (_ttl, "table.ttl"),
    (_noncurrent, "bucket.lifecycle"),
    (_tls_only_allows, "bucket_policy.document"),
    (_log_retention, "log_groups./aegis/ingest"),
    (_schedule_in_seoul, "schedules.acme-seal-raw.ScheduleExpressionTimezone"),
    (_two_seal_tasks, "schedules.acme-seal-raw.Target.EcsParameters.TaskCount"),
    (_scheduler_passes_any_role, "roles.acme-seal-raw-scheduler.inline.run-seal-raw"),
]


@pytest.mark.parametrize(
    ("change", "where"), TEMPLATE_CHANGES, ids=[c.__name__ for c, _ in TEMPLATE_CHANGES]
)
def test_a_change_to_the_template_alone_is_a_difference(change, where):
    changed = copy.deepcopy(template())
    change(changed)
    found = differences(
        terraform_model(load_module(TERRAFORM), ALL_ON), cloudformation_model(changed, ALL_ON)
    )
    assert found and all(f.startswith(where) for f in found), found


# -- terraform itself --------------------------------------------------------------------------

# where `terraform init` finds the AWS provider without a registry (a filesystem mirror:
# registry.terraform.io/hashicorp/aws/VERSION/OS_ARCH/terraform-provider-aws_*)
PLUGIN_DIR = Path(os.environ.get("AEGIS_TERRAFORM_PLUGIN_DIR", "/opt/tf-plugins"))


class Terraform:
    """terraform in a root module of its own (``root``) that calls a module by a relative path,
    as a checkout of this repository is used."""

    def __init__(self, binary: str, scratch: Path) -> None:
        self.binary, self.root = binary, scratch / "root"
        self.root.mkdir()
        (scratch / "none.tfrc").write_text("")
        # more for a failure's report (what the endpoint it talks to logged)
        self.explain: Callable[[], str] = lambda: ""
        self.env = os.environ | {
            "TF_DATA_DIR": str(scratch / "data"),
            "TF_IN_AUTOMATION": "1",
            "TF_INPUT": "0",
            "CHECKPOINT_DISABLE": "1",  # no version check over the network
            "TF_CLI_CONFIG_FILE": str(scratch / "none.tfrc"),
            # Go collects garbage less often, for ~40 MB more of each AWS provider's ~600 MB:
            # the provider builds its schema at every start, and the apply and validate tests
            # took ~25% less CPU with it (94 -> 70 s, the mean of two runs each)
            "GOGC": "400",
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.binary, *args, "-no-color"],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"terraform {' '.join(args)}: {done.stdout}\n{done.stderr}{self.explain()}"
            )
        return done

    def init(self, source: Path, provider: str, inputs: dict[str, Any] | None = None) -> None:
        """A root module with ``provider`` that calls ``source`` with ``inputs``, initialized
        from the plugin directory (no registry)."""
        shutil.rmtree(self.env["TF_DATA_DIR"], ignore_errors=True)
        arguments = "".join(f"  {k} = {json.dumps(v)}\n" for k, v in (inputs or {}).items())
        (self.root / "main.tf").write_text(
            f'{provider}\nmodule "aegis" {{\n  source = "{os.path.relpath(source, self.root)}"\n'
            f'{arguments}}}\noutput "aegis" {{\n  value = module.aegis\n}}\n'
        )
        self("init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}")


@pytest.fixture
def terraform(tmp_path: Path) -> Terraform:
    """Skips where no terraform or AWS provider is on the machine (neither comes from a
    registry this project reaches)."""
    binary = shutil.which("terraform")
    if binary is None:
        pytest.skip("no terraform binary on this machine")
    if not list(PLUGIN_DIR.glob("registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws*")):
        pytest.skip(f"no hashicorp/aws provider under {PLUGIN_DIR} (AEGIS_TERRAFORM_PLUGIN_DIR)")
    return Terraform(binary, tmp_path)


async def test_terraform_validates_the_module_and_refuses_a_broken_copy(terraform, tmp_path):
    provider = 'provider "aws" {\n  region = "ap-south-1"\n}'
    # a copy with a misspelt argument, validated in a root module of its own beside the module's
    copy_root = tmp_path / "copy" / "deploy"
    for part in ("terraform", "infra", "ecs", "k8s"):
        shutil.copytree(ROOT / "deploy" / part, copy_root / part)
    table = copy_root / "terraform" / "dynamodb.tf"
    table.write_text(table.read_text().replace("projection_type", "projection_typ"))
    (tmp_path / "of-the-copy").mkdir()
    other = Terraform(terraform.binary, tmp_path / "of-the-copy")

    def validated(tf: Terraform, source: Path) -> dict[str, Any]:
        tf.init(source, provider)
        return json.loads(tf("validate", "-json", check=False).stdout)

    valid, broken = await asyncio.gather(
        asyncio.to_thread(validated, terraform, TERRAFORM),
        asyncio.to_thread(validated, other, copy_root / "terraform"),
    )
    assert valid["valid"] and valid["warning_count"] == 0, valid
    assert terraform("fmt", "-check", "-recursive", str(TERRAFORM)).returncode == 0
    assert not broken["valid"]
    assert any(
        "projection_typ" in d["summary"] + d.get("detail", "") for d in broken["diagnostics"]
    )


@pytest.fixture
def managed_policies_emulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ManagedServer]:
    """A moto_server of this test's own that knows AWS's managed policies (the execution roles
    attach AmazonECSTaskExecutionRolePolicy)."""
    monkeypatch.setenv("MOTO_IAM_LOAD_MANAGED_POLICIES", "true")
    server = start_moto_server("127.0.0.1", free_port(), log_file=tmp_path / "moto.log")
    try:
        yield server
    finally:
        server.stop()


def server_errors(log: Path) -> str:
    """What an emulator logged past its start: the requests it answered with a server error,
    or applied without delivering their answer; the AWS provider sends both again (so a failed
    create's "already exists" may follow one)."""
    said = log.read_text(errors="replace")
    return (
        f"\n--- the emulator's server errors and undelivered answers:\n{said[-8000:]}"
        if re.search(rf'" 5\d\d |Traceback|{UNDELIVERED}', said)
        else ""
    )


def _doc(value: Any) -> Any:
    return json.loads(unquote(value)) if isinstance(value, str) else value


# what GetSchedule answers beside a schedule's properties: its identity and dates
SCHEDULE_STATE = {"Arn", "Name", "GroupName", "CreationDate", "LastModificationDate"}


async def deployed_model(endpoint: str, prefix: str) -> dict[str, Any]:
    """The IAM, bucket policy, repositories, log groups and schedules on the emulator, in the
    shape of :func:`cloudformation_model`."""
    cfg = AwsConfig(endpoint_url=endpoint)
    model: dict[str, Any] = {
        "policies": {},
        "roles": {},
        "repositories": {},
        "log_groups": {},
        "schedules": {},
    }
    async with open_client("iam", cfg) as iam:
        for policy in (await iam.list_policies(Scope="Local"))["Policies"]:
            if policy["PolicyName"].startswith(f"{prefix}-"):
                arn = policy["Arn"]
                described = (await iam.get_policy(PolicyArn=arn))["Policy"]
                version = await iam.get_policy_version(
                    PolicyArn=arn, VersionId=described["DefaultVersionId"]
                )
                model["policies"][policy["PolicyName"]] = {
                    "description": described.get("Description"),
                    "document": _doc(version["PolicyVersion"]["Document"]),
                }
        for role in (await iam.list_roles())["Roles"]:
            name = role["RoleName"]
            if not name.startswith(f"{prefix}-"):
                continue
            got = (await iam.get_role(RoleName=name))["Role"]
            attached = await iam.list_attached_role_policies(RoleName=name)
            inline = {}
            for pname in (await iam.list_role_policies(RoleName=name))["PolicyNames"]:
                found = await iam.get_role_policy(RoleName=name, PolicyName=pname)
                inline[pname] = _doc(found["PolicyDocument"])
            model["roles"][name] = {
                "description": got.get("Description") or None,
                "max_session": got.get("MaxSessionDuration"),
                "trust": _doc(got["AssumeRolePolicyDocument"]),
                "managed": sorted(p["PolicyArn"] for p in attached["AttachedPolicies"]),
                "inline": inline,
            }
    async with open_client("ecr", cfg) as ecr:
        for repo in (await ecr.describe_repositories())["repositories"]:
            model["repositories"][repo["repositoryName"]] = {
                "mutability": repo["imageTagMutability"],
                "scan_on_push": repo["imageScanningConfiguration"]["scanOnPush"],
            }
    async with open_client("logs", cfg) as logs:
        for group in (await logs.describe_log_groups(logGroupNamePrefix="/aegis/"))["logGroups"]:
            model["log_groups"][group["logGroupName"]] = group.get("retentionInDays")
    async with open_client("scheduler", cfg) as scheduler:
        for listed in (await scheduler.list_schedules(NamePrefix=f"{prefix}-"))["Schedules"]:
            found = await scheduler.get_schedule(Name=listed["Name"])
            spec = {
                k: v
                for k, v in found.items()
                if k not in SCHEDULE_STATE and k != "ResponseMetadata" and v is not None
            }
            model["schedules"][found["Name"]] = _schedule(spec)
    return model


@pytest.mark.slow
@pytest.mark.timeout(900)  # the provider waits about a minute for the lifecycle rules to settle
async def test_the_module_applies_on_the_emulator_as_the_template_and_bootstrap_say(
    terraform, managed_policies_emulator, unique_id, tmp_path
):
    endpoint = managed_policies_emulator.url
    assert managed_policies_emulator.log_file is not None
    terraform.explain = functools.partial(server_errors, managed_policies_emulator.log_file)
    inputs = {
        "bucket_name": f"aegis-tf-{unique_id}",
        "table_name": f"AEGIS-tf-{unique_id}",
        "name_prefix": unique_id,
    }
    services = ("s3", "dynamodb", "iam", "sts", "ecr", "cloudwatchlogs", "scheduler")
    endpoints = "\n".join(f'    {s} = "{endpoint}"' for s in services)
    provider = f"""provider "aws" {{
  region                      = "{REGION}"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_requesting_account_id  = true
  s3_use_path_style           = true
  endpoints {{
{endpoints}
  }}
}}"""
    terraform.init(TERRAFORM, provider)
    main = terraform.root / "main.tf"
    called = main.read_text()
    assignments = "".join(f"  {k} = {json.dumps(v)}\n" for k, v in inputs.items())
    main.write_text(called.replace("  source = ", assignments + "  source = ", 1))
    scheduled = {
        **inputs,
        "ecs_cluster_arn": f"arn:aws:ecs:{REGION}:{ACCOUNT}:cluster/aegis",
        "scheduled_task_subnets": ["subnet-0b2", "subnet-0a1"],
        "scheduled_task_security_groups": ["sg-0c3"],
    }

    async def refused_with_the_reason() -> None:
        """A cluster without subnets, or an ARN that names no cluster, is refused with the
        reason (a plan of another root module: nothing of the apply's is read or changed)."""
        (tmp_path / "refusals").mkdir()
        other = Terraform(terraform.binary, tmp_path / "refusals")
        refused = {
            "give the subnets the scheduled tasks run in": {
                **scheduled,
                "scheduled_task_subnets": [],
            },
            "must be empty or an ECS cluster's ARN": {**scheduled, "ecs_cluster_arn": "aegis"},
        }
        for reason, given in refused.items():
            await asyncio.to_thread(other.init, TERRAFORM, provider, given)
            done = await asyncio.to_thread(other, "plan", "-refresh=false", check=False)
            assert done.returncode == 1 and reason in " ".join(done.stderr.split()), done.stderr

    # the refusals are checked while the apply runs: most of the apply is the provider waiting
    # for the lifecycle rules to settle (10 s, then ten reads 5 s apart)
    await asyncio.gather(
        asyncio.to_thread(terraform, "apply", "-auto-approve"), refused_with_the_reason()
    )

    # the bucket and the table are what `aegis bootstrap` makes (versioning, lifecycle, public
    # access block, keys, index, TTL, PITR, stream: the provider calls each API, so the emulator
    # holds them all)
    bucket, table = inputs["bucket_name"], inputs["table_name"]
    async with open_clients(AwsConfig(endpoint_url=endpoint)) as clients:
        found = await describe_foundation(clients, bucket=bucket, table=table)
        assert found == expected_foundation(bucket=bucket, table=table, region=REGION)
        policy = await clients.s3.get_bucket_policy(Bucket=bucket)
    moto = {"partition": "aws", "region": REGION, "account_id": ACCOUNT}
    expected = cloudformation_model(template(), inputs, moto, execution_secrets=True)
    assert json.loads(policy["Policy"]) == expected["bucket_policy"]["document"]
    # every role and policy (execution roles' secrets included), repository, log group and
    # schedule (none without a cluster)
    deployed = await deployed_model(endpoint, unique_id)
    for role in expected["roles"].values():
        role["max_session"] = role["max_session"] or 3600  # what IAM gives a role by default
    wanted = {
        k: expected[k] for k in ("policies", "roles", "repositories", "log_groups", "schedules")
    }
    assert "/aegis/seal-raw" in wanted["log_groups"] and wanted["schedules"] == {}
    assert differences(deployed, wanted) == []
    outputs = json.loads(terraform("output", "-json").stdout)["aegis"]["value"]
    assert set(outputs["policy_arns"]) == set(render.policy_names())
    assert outputs["table_stream_arn"].startswith(
        f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table}/stream/"
    )
    # Given a cluster, Terraform plans the schedule and its scheduler role and nothing else, with
    # the template's values, and applies them (the emulator stores the role: its statements are
    # ones it never decides a request by, see aegis_devstack.motopolicy.NOT_EMULATED_SERVICES).
    # The plan reads every resource made above first: that it leaves each of them as it is shows
    # that what the module declares is what was made (a cluster changes none of them).
    assignments = "".join(f"  {k} = {json.dumps(v)}\n" for k, v in scheduled.items())
    main.write_text(called.replace("  source = ", assignments + "  source = ", 1))
    await asyncio.to_thread(terraform, "plan", "-out=scheduled.plan")
    planned = json.loads(terraform("show", "-json", "scheduled.plan").stdout)
    changes = {c["address"]: c["change"] for c in planned["resource_changes"]}
    changes = {a: c for a, c in changes.items() if c["actions"] != ["no-op"]}
    assert sorted(changes) == [
        'module.aegis.aws_iam_role.scheduler["seal-raw"]',
        'module.aegis.aws_iam_role_policy.scheduler["seal-raw"]',
        'module.aegis.aws_scheduler_schedule.task["seal-raw"]',
    ]
    assert all(c["actions"] == ["create"] for c in changes.values())
    expected = cloudformation_model(template(), scheduled, moto)
    role = changes['module.aegis.aws_iam_role.scheduler["seal-raw"]']["after"]
    policy = changes['module.aegis.aws_iam_role_policy.scheduler["seal-raw"]']["after"]
    assert {
        "description": role["description"],
        "max_session": None,  # neither side sets it
        "trust": json.loads(role["assume_role_policy"]),
        "managed": [],
        "inline": {policy["name"]: json.loads(policy["policy"])},
    } == expected["roles"][role["name"]]
    # the schedule (its role's ARN is known once the role is made, as the template's GetAtt)
    schedule = changes['module.aegis.aws_scheduler_schedule.task["seal-raw"]']
    assert schedule["after_unknown"]["target"][0]["role_arn"] is True
    name, spec = _tf_schedule(schedule["after"])
    want = copy.deepcopy(expected["schedules"][name])
    assert want["Target"].pop("RoleArn") == f"arn:aws:iam::{ACCOUNT}:role/{role['name']}"
    assert differences(_within(spec, want), want) == []
    await asyncio.to_thread(terraform, "apply", "-auto-approve", "scheduled.plan")
    # and a plan of what it made (read back with what they depend on) changes nothing: what the
    # module declares is what was made (the rest was read by the plan above, and left as it was)
    made = [f"-target={address}" for address in changes]
    again = await asyncio.to_thread(terraform, "plan", "-detailed-exitcode", *made, check=False)
    assert again.returncode == 0, again.stdout
