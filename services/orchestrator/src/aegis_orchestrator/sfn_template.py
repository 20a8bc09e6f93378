"""``export-sfn``: the jobs as a CloudFormation template that runs them on AWS Step Functions.

The template holds:

- the task function (``aegis_orchestrator.sfn_task.handler``, Python 3.13, code from the S3
  object ``CodeBucket``/``CodeKey`` that ``make lambda`` builds), with the orchestrator's settings
  as environment variables (read-model table, region, NATS, Slack, the job egress allow-list and
  one ``AEGIS_JOB_*`` variable per name the jobs' ENVIRONMENT params read), in a VPC when
  ``SubnetIds`` is given, its timeout covering the longest TASK step of the jobs;
- its role: its own log group, ``dynamodb:GetItem``/``Query`` on the table, ``s3:GetObject``
  under ``orchestration/`` of the data bucket (triggers passed by reference), and the VPC
  network interfaces only in a VPC;
- one ``AWS::StepFunctions::StateMachine`` per job, named ``{StateMachinePrefix}{job_id}``, whose
  definition is :func:`aegis_orchestration.asl.export_asl` with the function's ARN in each Task's
  ``Resource``, and the role they run as (``lambda:InvokeFunction`` on the function and its
  versions);
- a managed policy on the orchestrator's role (``OrchestratorRoleName``) allowing
  ``states:StartExecution`` on exactly those machines and ``states:DescribeExecution`` on their
  executions (how each one ended).

The definition is a ``DefinitionString`` built with ``Fn::Join`` (the ASL text split where the
function's ARN goes, joined with ``Fn::GetAtt``), without ``DefinitionSubstitutions``: neither
CloudFormation nor Step Functions then reads ``${...}`` in it, so a job's literal text such as an
ENVIRONMENT param's ``${AEGIS_JOB_TOKEN}`` reaches the machine exactly as written.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from aegis_contracts import keys
from aegis_orchestration.asl import AslExportError, export_asl
from aegis_orchestration.model import Job, StepType
from aegis_orchestration.params import ENV_PREFIX, environment_names

HANDLER = "aegis_orchestrator.sfn_task.handler"
RUNTIME = "python3.13"
DEFAULT_FUNCTION_NAME = "aegis-orchestrator-task"
DEFAULT_STATE_MACHINE_PREFIX = "aegis-job-"
DEFAULT_ORCHESTRATOR_ROLE = "aegis-orchestrator-task"  # deploy/infra/foundation.yaml's role
DEFAULT_TABLE = "AEGIS-DynamoDB-FactoryStatus"
DEFAULT_BUCKET = "aegis-bucket-data"
DEFAULT_CODE_KEY = "aegis/aegis-orchestrator-task.zip"
DEFAULT_MEMORY_MB = 512
# the function runs one step per invocation; its own work around the step (read the job,
# resolve the params, connect) gets this much on top of the step's timeout
TIMEOUT_MARGIN_S = 30
MIN_TIMEOUT_S = 60
LAMBDA_MAX_TIMEOUT_S = 900
STATE_MACHINE_NAME_MAX = 80
JOB_ID_MAX = 48  # aegis_orchestration.model.ID_PATTERN
# CloudFormation's 500 resources, less the function, roles, log group and policy
MAX_JOBS = 490
FUNCTION = "TaskFunction"
FUNCTION_ROLE = "TaskFunctionRole"
LOG_GROUP = "TaskFunctionLogGroup"
MACHINE_ROLE = "StateMachineRole"
TRIGGER_POLICY = "StartExecutionPolicy"
IN_VPC = "InVpc"
_NOT_A_NAME = re.compile(r"[^A-Za-z0-9]+")
_ARN_MARK = "@@aegis-task-function-arn@@"
_NO_VALUE = {"Ref": "AWS::NoValue"}


class SfnTemplateError(ValueError):
    """Jobs that cannot run on Step Functions, each with its reason."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{job_id}: {reason}" for job_id, reason in problems))


@dataclass(frozen=True)
class _Machine:
    job: Job
    logical: str
    definition: dict[str, Any]


def render(
    jobs: Iterable[Job],
    *,
    function_name: str = DEFAULT_FUNCTION_NAME,
    state_machine_prefix: str = DEFAULT_STATE_MACHINE_PREFIX,
    orchestrator_role: str = DEFAULT_ORCHESTRATOR_ROLE,
    table: str = DEFAULT_TABLE,
    bucket: str = DEFAULT_BUCKET,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> dict[str, Any]:
    """The CloudFormation template (a JSON-able dict) running ``jobs`` on Step Functions; the
    keyword arguments are its parameters' defaults. :class:`SfnTemplateError` names every job
    that cannot run there (what ASL cannot express, a step longer than a Lambda may run)."""
    jobs = sorted(jobs, key=lambda j: j.id)
    problems: list[tuple[str, str]] = []
    machines: list[_Machine] = []
    if not jobs:
        problems.append(("-", "no jobs to export"))
    if len(jobs) > MAX_JOBS:
        problems.append(("-", f"{len(jobs)} jobs: one template holds at most {MAX_JOBS}"))
    if len({j.id for j in jobs}) != len(jobs):
        problems.append(("-", "a job id is given twice"))
    used: set[str] = {FUNCTION, FUNCTION_ROLE, LOG_GROUP, MACHINE_ROLE, TRIGGER_POLICY}
    for job in jobs:
        reason = _too_long(job)
        try:
            definition = export_asl(job, function_arn=_ARN_MARK)
        except AslExportError as err:
            reason = str(err)
        if reason:
            problems.append((job.id, reason))
            continue
        logical = _unique("Job" + _camel(job.id), used)
        machines.append(_Machine(job, logical, definition))
    if problems:
        raise SfnTemplateError(problems)
    env_vars = _job_variables(jobs)
    taken: set[str] = set()
    env_params = {
        name: _unique("Job" + _camel(name[len(ENV_PREFIX) :]), taken) for name in env_vars
    }
    longest_id = max(len(j.id) for j in jobs)
    parameters = _parameters(
        function_name=function_name,
        state_machine_prefix=state_machine_prefix,
        prefix_max=STATE_MACHINE_NAME_MAX - longest_id,
        orchestrator_role=orchestrator_role,
        table=table,
        bucket=bucket,
        memory_mb=memory_mb,
    )
    for name, param in env_params.items():
        parameters[param] = {
            "Type": "String",
            "Default": "",
            "NoEcho": True,
            "Description": f"{name}, read by the jobs' ENVIRONMENT params (a webhook URL, a "
            "token); empty: not set",
        }
    conditions: dict[str, Any] = {IN_VPC: _given("SubnetIds", listed=True)}
    for param in ("NatsUrl", "NatsUser", "NatsPassword", "NatsTlsCaPem", "SlackWebhookUrl"):
        conditions[f"{param}Given"] = _given(param)
    for param in env_params.values():
        conditions[f"{param}Given"] = _given(param)
    resources: dict[str, Any] = {
        LOG_GROUP: {
            "Type": "AWS::Logs::LogGroup",
            "Properties": {
                "LogGroupName": {"Fn::Sub": "/aws/lambda/${FunctionName}"},
                "RetentionInDays": 30,
            },
        },
        FUNCTION_ROLE: _function_role(),
        FUNCTION: _function(jobs, env_params),
        MACHINE_ROLE: _machine_role(),
    }
    for m in machines:
        resources[m.logical] = {
            "Type": "AWS::StepFunctions::StateMachine",
            "Properties": {
                "StateMachineName": {"Fn::Join": ["", [{"Ref": "StateMachinePrefix"}, m.job.id]]},
                "StateMachineType": "STANDARD",
                "RoleArn": {"Fn::GetAtt": [MACHINE_ROLE, "Arn"]},
                "DefinitionString": definition_string(m.definition),
                "Tags": [{"Key": "aegis:job", "Value": m.job.id}],
            },
        }
    machine_arns = [{"Ref": m.logical} for m in machines]
    execution_arns = [
        {
            "Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}"
            f":execution:${{StateMachinePrefix}}{m.job.id}:*"
        }
        for m in machines
    ]
    resources[TRIGGER_POLICY] = {
        "Type": "AWS::IAM::ManagedPolicy",
        "Properties": {
            "Description": "AEGIS orchestrator: start the jobs' Step Functions executions and "
            "see how they ended",
            "Roles": [{"Ref": "OrchestratorRoleName"}],
            "PolicyDocument": {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Sid": "StartTheJobsExecutions",
                        "Effect": "Allow",
                        "Action": "states:StartExecution",
                        "Resource": machine_arns,
                    },
                    {
                        "Sid": "SeeHowTheyEnded",
                        "Effect": "Allow",
                        "Action": "states:DescribeExecution",
                        "Resource": execution_arns,
                    },
                ],
            },
        },
    }
    template = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Description": f"AEGIS jobs on Step Functions: {len(machines)} state machine(s) and "
        "their task function (aegis jobs export-sfn)",
        "Parameters": parameters,
        "Conditions": conditions,
        "Resources": resources,
        "Outputs": {
            "TaskFunctionArn": {
                "Description": "The task function the state machines' Task states call",
                "Value": {"Fn::GetAtt": [FUNCTION, "Arn"]},
            },
            "StateMachineArnPrefix": {
                "Description": "AEGIS_ORCHESTRATOR_STATE_MACHINE_ARN_PREFIX of the orchestrator",
                "Value": {
                    "Fn::Sub": "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}"
                    ":stateMachine:${StateMachinePrefix}"
                },
            },
            "StartExecutionPolicyArn": {
                "Description": "The policy attached to OrchestratorRoleName",
                "Value": {"Ref": TRIGGER_POLICY},
            },
        },
    }
    # a tree without shared nodes: YAML would write those as aliases, which CloudFormation refuses
    rendered: dict[str, Any] = json.loads(json.dumps(template))
    return rendered


def definition_string(definition: dict[str, Any]) -> dict[str, Any]:
    """``Fn::Join`` of the ASL text around each Task's ``Resource`` (the function's ARN).

    No string of it holds ``${``: the text is also cut between ``$`` and ``{`` (the join puts
    them together again), so nothing reads a job's literal ``${...}`` as a placeholder, not even
    a linter."""
    text = json.dumps(definition, separators=(",", ":"), ensure_ascii=False)
    parts: list[Any] = []
    for i, piece in enumerate(text.split(_ARN_MARK)):
        if i:
            parts.append({"Fn::GetAtt": [FUNCTION, "Arn"]})
        cut = piece.split("${")
        parts += [
            ("{" if j else "") + c + ("$" if j < len(cut) - 1 else "") for j, c in enumerate(cut)
        ]
    return {"Fn::Join": ["", parts]}


def task_timeout_s(jobs: Iterable[Job]) -> int:
    """The function's timeout: the longest TASK step of ``jobs`` plus a margin."""
    longest = max((_step_timeout(j) for j in jobs), default=0)
    return max(MIN_TIMEOUT_S, longest + TIMEOUT_MARGIN_S)


def _step_timeout(job: Job) -> int:
    return max(
        (math.ceil(s.timeout_s) for s in job.steps if s.step_type is StepType.TASK), default=0
    )


def _too_long(job: Job) -> str | None:
    longest = LAMBDA_MAX_TIMEOUT_S - TIMEOUT_MARGIN_S
    for step in job.steps:
        if step.step_type is StepType.TASK and math.ceil(step.timeout_s) > longest:
            return (
                f"step {step.id} has timeout_s {step.timeout_s:g}: a step on Step Functions "
                f"may take at most {longest} s (a Lambda runs {LAMBDA_MAX_TIMEOUT_S} s at most)"
            )
    return None


def _job_variables(jobs: Iterable[Job]) -> list[str]:
    """The ``AEGIS_JOB_*`` variables the jobs' ENVIRONMENT params read."""
    names = {name for job in jobs for name in environment_names(job.params)}
    return sorted(name for name in names if name.startswith(ENV_PREFIX))


def _camel(text: str) -> str:
    return "".join(part[:1].upper() + part[1:].lower() for part in _NOT_A_NAME.split(text))


def _unique(name: str, used: set[str]) -> str:
    candidate, n = name, 2
    while candidate in used:
        candidate, n = f"{name}{n}", n + 1
    used.add(candidate)
    return candidate


def _given(param: str, *, listed: bool = False) -> dict[str, Any]:
    value: Any = {"Fn::Join": ["", {"Ref": param}]} if listed else {"Ref": param}
    return {"Fn::Not": [{"Fn::Equals": [value, ""]}]}


def _if_given(param: str) -> dict[str, Any]:
    return {"Fn::If": [f"{param}Given", {"Ref": param}, _NO_VALUE]}


def _parameters(
    *,
    function_name: str,
    state_machine_prefix: str,
    prefix_max: int,
    orchestrator_role: str,
    table: str,
    bucket: str,
    memory_mb: int,
) -> dict[str, Any]:
    optional = {"Type": "String", "Default": ""}
    return {
        "CodeBucket": {
            "Type": "String",
            "MinLength": 3,
            "Description": "S3 bucket holding the task function's zip (make lambda), in the "
            "stack's region",
        },
        "CodeKey": {
            "Type": "String",
            "Default": DEFAULT_CODE_KEY,
            "MinLength": 1,
            "Description": "Key of the zip in CodeBucket: a new key for each build, so an "
            "update deploys it",
        },
        "FunctionName": {
            "Type": "String",
            "Default": function_name,
            "AllowedPattern": "^[A-Za-z0-9_-]{1,64}$",
            "Description": "The task function's name",
        },
        "MemorySize": {
            "Type": "Number",
            "Default": memory_mb,
            "MinValue": 128,
            "MaxValue": 10240,
            "Description": "The task function's memory, MB",
        },
        "StateMachinePrefix": {
            "Type": "String",
            "Default": state_machine_prefix,
            "AllowedPattern": f"^[A-Za-z0-9_-]{{0,{prefix_max}}}$",
            "Description": "State machine names: {StateMachinePrefix}{job id}",
        },
        "OrchestratorRoleName": {
            "Type": "String",
            "Default": orchestrator_role,
            "Description": "The orchestrator's IAM role (foundation: {NamePrefix}-orchestrator-"
            "task), given StartExecution on the machines and DescribeExecution on their "
            "executions",
        },
        "TableName": {
            "Type": "String",
            "Default": table,
            "Description": "The read-model table (AEGIS_TABLE)",
        },
        "BucketName": {
            "Type": "String",
            "Default": bucket,
            "MinLength": 3,
            "Description": "The data bucket (AEGIS_BUCKET), where triggers too large for Step "
            "Functions wait under orchestration/",
        },
        "NatsUrl": {
            **optional,
            "Description": "AEGIS_NATS_URL for PUBLISH_EVENT steps (the function must then run "
            "in a VPC that reaches the cluster); empty: not set",
        },
        "NatsUser": {**optional, "Description": "AEGIS_NATS_USER; empty: not set"},
        "NatsPassword": {
            **optional,
            "NoEcho": True,
            "Description": "AEGIS_NATS_PASSWORD; empty: not set",
        },
        "NatsTlsCaPem": {
            **optional,
            "Description": "AEGIS_NATS_TLS_CA_PEM, the CA of the NATS servers as PEM text; "
            "empty: not set",
        },
        "EgressAllow": {
            **optional,
            "Description": "AEGIS_JOB_EGRESS_ALLOW: host names and networks, comma-separated, "
            "that job HTTP steps may call over http and at non-public addresses",
        },
        "SlackWebhookUrl": {
            **optional,
            "NoEcho": True,
            "Description": "AEGIS_SLACK_WEBHOOK_URL of the jobs' Slack steps; empty: not set",
        },
        "SubnetIds": {
            "Type": "CommaDelimitedList",
            "Default": "",
            "Description": "Subnets of the function (comma-separated); empty: not in a VPC",
        },
        "SecurityGroupIds": {
            "Type": "CommaDelimitedList",
            "Default": "",
            "Description": "Security groups of the function, with SubnetIds",
        },
    }


def _environment(env_params: dict[str, str]) -> dict[str, Any]:
    variables: dict[str, Any] = {
        "AEGIS_TABLE": {"Ref": "TableName"},
        "AEGIS_BUCKET": {"Ref": "BucketName"},
        "AEGIS_REGION": {"Ref": "AWS::Region"},
        "AEGIS_JOB_EGRESS_ALLOW": {"Ref": "EgressAllow"},
        "AEGIS_LOG_FORMAT": "json",
        "AEGIS_NATS_URL": _if_given("NatsUrl"),
        "AEGIS_NATS_USER": _if_given("NatsUser"),
        "AEGIS_NATS_PASSWORD": _if_given("NatsPassword"),
        "AEGIS_NATS_TLS_CA_PEM": _if_given("NatsTlsCaPem"),
        "AEGIS_SLACK_WEBHOOK_URL": _if_given("SlackWebhookUrl"),
    }
    for name, param in env_params.items():
        variables[name] = _if_given(param)
    return {"Variables": variables}


def _function(jobs: list[Job], env_params: dict[str, str]) -> dict[str, Any]:
    return {
        "Type": "AWS::Lambda::Function",
        "DependsOn": [LOG_GROUP],
        "Properties": {
            "FunctionName": {"Ref": "FunctionName"},
            "Description": "AEGIS: one step of a job's Step Functions execution",
            "Runtime": RUNTIME,
            "Architectures": ["x86_64"],
            "Handler": HANDLER,
            "Code": {"S3Bucket": {"Ref": "CodeBucket"}, "S3Key": {"Ref": "CodeKey"}},
            "Role": {"Fn::GetAtt": [FUNCTION_ROLE, "Arn"]},
            "Timeout": task_timeout_s(jobs),
            "MemorySize": {"Ref": "MemorySize"},
            "Environment": _environment(env_params),
            "VpcConfig": {
                "Fn::If": [
                    IN_VPC,
                    {
                        "SubnetIds": {"Ref": "SubnetIds"},
                        "SecurityGroupIds": {"Ref": "SecurityGroupIds"},
                    },
                    _NO_VALUE,
                ]
            },
        },
    }


def _assume(service: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
        ],
    }


def _function_role() -> dict[str, Any]:
    table_arn = "arn:${AWS::Partition}:dynamodb:${AWS::Region}:${AWS::AccountId}:table/${TableName}"
    log_group = (
        "arn:${AWS::Partition}:logs:${AWS::Region}:${AWS::AccountId}"
        ":log-group:/aws/lambda/${FunctionName}:*"
    )
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ItsOwnLogGroup",
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": {"Fn::Sub": log_group},
            },
            {
                "Sid": "ReadTheJobsAndQueryTheReadModel",
                "Effect": "Allow",
                "Action": ["dynamodb:GetItem", "dynamodb:Query"],
                "Resource": {"Fn::Sub": table_arn},
            },
            {
                "Sid": "ReadTriggersPassedByReference",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": {
                    "Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/"
                    + keys.ORCHESTRATION_PREFIX
                    + "*"
                },
            },
        ],
    }
    vpc_access = (
        "arn:${AWS::Partition}:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
    )
    return {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "Description": "AEGIS task function: its log group, reads of the read model and of "
            "triggers passed by reference",
            "AssumeRolePolicyDocument": _assume("lambda.amazonaws.com"),
            "Policies": [{"PolicyName": "aegis-task", "PolicyDocument": document}],
            "ManagedPolicyArns": {"Fn::If": [IN_VPC, [{"Fn::Sub": vpc_access}], _NO_VALUE]},
        },
    }


def _machine_role() -> dict[str, Any]:
    function_arn = {"Fn::GetAtt": [FUNCTION, "Arn"]}
    document = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "InvokeTheTaskFunction",
                "Effect": "Allow",
                "Action": "lambda:InvokeFunction",
                "Resource": [function_arn, {"Fn::Join": ["", [function_arn, ":*"]]}],
            }
        ],
    }
    return {
        "Type": "AWS::IAM::Role",
        "Properties": {
            "Description": "AEGIS jobs' state machines: invoke the task function",
            "AssumeRolePolicyDocument": _assume("states.amazonaws.com"),
            "Policies": [{"PolicyName": "invoke-task-function", "PolicyDocument": document}],
        },
    }


def machines(template: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The state machines of a rendered template: (logical id, resource)."""
    for logical, resource in template["Resources"].items():
        if resource["Type"] == "AWS::StepFunctions::StateMachine":
            yield logical, resource
