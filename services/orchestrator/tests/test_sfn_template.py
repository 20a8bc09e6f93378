"""``aegis jobs export-sfn``: the CloudFormation template that runs the jobs on Step Functions.

cfn-lint accepts it (JSON and YAML), each machine's definition is the job's ``export_asl`` with
the function's ARN in every Task, literal ``${...}`` text of a job reaches the machine as written,
the orchestrator may start exactly those machines and describe their executions; and the template
deploys on the emulator (moto_server's CloudFormation), where the function, the machines and the
policy on the orchestrator's role are found.
"""

from __future__ import annotations

import asyncio
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_contracts.times import utc_now
from aegis_orchestration.asl import export_asl
from aegis_orchestration.model import Job
from aegis_orchestration.store import JobStore
from aegis_orchestration.yamlio import load_jobs
from aegis_orchestrator import sfn_template
from aegis_orchestrator.sfn_template import SfnTemplateError, render
from aegis_storage.clients import AwsConfig, open_client

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "deploy" / "jobs" / "examples.yaml"
REGION = "ap-south-1"
FAKE_ARN = "arn:aws:lambda:ap-south-1:123456789012:function:fake"
runner = CliRunner()

# literal ${...} in what the definition carries (the name in its Comment, the globals of its
# Init state) and in a param the task function reads: none of it is a placeholder
LITERAL = """\
jobs:
  - id: literal-text
    job_name: "Tell ${AEGIS_JOB_TOKEN} about ${AWS::Region} and ${!Literal}"
    trigger_type: Schedule
    trigger_cron: "23 * * * *"
    global_params:
      token: "${AEGIS_JOB_TOKEN}"
      account: "${AWS::AccountId}"
      bang: "${!Literal}"
      dollars: "$${x} $ { $"
    steps:
      - {id: call, step_type: TASK, step_sub_type: HTTP_WEBHOOK, is_start_point: true,
         timeout_s: 300.5}
    params:
      - {id: url, step_id: call, param_key: url, source_type: ENVIRONMENT,
         param_value: 'https://hooks.example.com/${AEGIS_JOB_TOKEN}'}
"""

INEXPORTABLE = """\
jobs:
  - id: any-semantics
    job_name: a CHOICE on Array(...)
    trigger_type: Schedule
    trigger_cron: "27 * * * *"
    steps:
      - {id: look, step_type: TASK, step_sub_type: READ_MODEL_QUERY, is_start_point: true, seq: 1}
      - {id: pick, step_type: FLOW, step_sub_type: CHOICE, seq: 2}
      - {id: hot, flow_step_id: pick, step_type: DUMMY,
         condition_expr: 'StringEQ(Array([$.steps.look.items], [@.level]), "CRITICAL")'}
  - id: too-slow
    job_name: a step longer than a Lambda runs
    trigger_type: Schedule
    trigger_cron: "29 * * * *"
    steps:
      - {id: slow, step_type: TASK, step_sub_type: HTTP_WEBHOOK, is_start_point: true,
         timeout_s: 1200}
"""


def jobs() -> list[Job]:
    return load_jobs(EXAMPLES.read_text()) + load_jobs(LITERAL)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return render(jobs())


def resolve(value: Any, arn: str = FAKE_ARN) -> Any:
    """The ``Fn::Join`` of a DefinitionString with the function's ARN in place (what CloudFormation
    hands Step Functions)."""
    if isinstance(value, dict) and "Fn::Join" in value:
        sep, parts = value["Fn::Join"]
        return sep.join(resolve(p, arn) for p in parts)
    if value == {"Fn::GetAtt": [sfn_template.FUNCTION, "Arn"]}:
        return arn
    assert isinstance(value, str), value
    return value


def strings(value: Any) -> Iterator[tuple[str, str]]:
    """(the intrinsic it is under, string) for every string of a template."""

    def walk(v: Any, under: str) -> Iterator[tuple[str, str]]:
        if isinstance(v, dict):
            for k, x in v.items():
                yield from walk(x, k if k.startswith("Fn::") else under)
        elif isinstance(v, list):
            for x in v:
                yield from walk(x, under)
        elif isinstance(v, str):
            yield under, v

    return walk(value, "")


def lint(text: str) -> list[str]:
    from cfnlint.api import ManualArgs, lint  # noqa: PLC0415

    return [str(m) for m in lint(text, config=ManualArgs(regions=[REGION]))]


# -- the template -------------------------------------------------------------------------------


def test_cfn_lint_accepts_the_template_as_json_and_as_yaml(template: dict[str, Any]) -> None:
    assert lint(json.dumps(template, indent=2)) == []
    assert lint(yaml.safe_dump(template, sort_keys=False, width=100)) == []
    # the same linter does see a misspelt property of this template
    broken = json.dumps(template).replace('"MemorySize": {', '"MemorySise": {')
    assert any("MemorySise" in m for m in lint(broken))


def test_each_machine_is_its_jobs_asl_with_the_functions_arn(template: dict[str, Any]) -> None:
    by_id = {j.id: j for j in jobs()}
    found = {}
    for _logical, machine in sfn_template.machines(template):
        props = machine["Properties"]
        job_id = props["StateMachineName"]["Fn::Join"][1][1]
        assert props["StateMachineName"]["Fn::Join"][1][0] == {"Ref": "StateMachinePrefix"}
        assert "DefinitionSubstitutions" not in props and "Definition" not in props
        definition = json.loads(resolve(props["DefinitionString"]))
        assert definition == export_asl(by_id[job_id], function_arn=FAKE_ARN)
        tasks = [s for s in definition["States"].values() if s["Type"] == "Task"]
        assert tasks and all(s["Resource"] == FAKE_ARN for s in tasks)
        found[job_id] = definition
    assert sorted(found) == sorted(by_id)


def test_literal_placeholder_text_is_neither_substituted_nor_a_template_error(
    template: dict[str, Any],
) -> None:
    [(_logical, machine)] = [
        m for m in sfn_template.machines(template) if "literal-text" in json.dumps(m[1])
    ]
    definition = json.loads(resolve(machine["Properties"]["DefinitionString"]))
    assert definition["Comment"] == (
        "AEGIS job literal-text: Tell ${AEGIS_JOB_TOKEN} about ${AWS::Region} and ${!Literal}"
    )
    assert definition["States"]["Init"]["Parameters"]["globals"] == {
        "token": "${AEGIS_JOB_TOKEN}",
        "account": "${AWS::AccountId}",
        "bang": "${!Literal}",
        "dollars": "$${x} $ { $",
    }
    # no string outside an Fn::Sub holds "${" (nothing for CloudFormation, Step Functions or a
    # linter to read as a placeholder), and the template has no DefinitionSubstitutions at all
    assert [s for under, s in strings(template) if "${" in s and under != "Fn::Sub"] == []
    assert "DefinitionSubstitutions" not in json.dumps(template)
    # the ENVIRONMENT param's variable is the function's, from a NoEcho parameter
    assert template["Parameters"]["JobToken"]["NoEcho"] is True
    variables = template["Resources"]["TaskFunction"]["Properties"]["Environment"]["Variables"]
    assert variables["AEGIS_JOB_TOKEN"] == {
        "Fn::If": ["JobTokenGiven", {"Ref": "JobToken"}, {"Ref": "AWS::NoValue"}]
    }
    assert {"AEGIS_JOB_MAINTENANCE_URL", "AEGIS_JOB_SAFETY_SLACK_URL"} <= set(variables)


def test_the_orchestrator_may_start_the_machines_and_describe_their_executions_only(
    template: dict[str, Any],
) -> None:
    resources = template["Resources"]
    policy = resources["StartExecutionPolicy"]["Properties"]
    assert policy["Roles"] == [{"Ref": "OrchestratorRoleName"}]
    start, describe = policy["PolicyDocument"]["Statement"]
    assert start["Effect"] == describe["Effect"] == "Allow"
    assert start["Action"] == "states:StartExecution"
    machines = sorted(logical for logical, _ in sfn_template.machines(template))
    assert sorted(r["Ref"] for r in start["Resource"]) == machines
    assert len(machines) == len(jobs())
    # how each execution ended: DescribeExecution on the executions of exactly those machines
    assert describe["Action"] == "states:DescribeExecution"
    prefix = "arn:${AWS::Partition}:states:${AWS::Region}:${AWS::AccountId}:execution:"
    assert sorted(r["Fn::Sub"] for r in describe["Resource"]) == sorted(
        f"{prefix}${{StateMachinePrefix}}{job.id}:*" for job in jobs()
    )
    # and the machines may call the function and its versions, nothing else
    [invoke] = resources["StateMachineRole"]["Properties"]["Policies"][0]["PolicyDocument"][
        "Statement"
    ]
    arn = {"Fn::GetAtt": ["TaskFunction", "Arn"]}
    assert invoke["Action"] == "lambda:InvokeFunction"
    assert invoke["Resource"] == [arn, {"Fn::Join": ["", [arn, ":*"]]}]


def test_the_functions_timeout_covers_every_task_step(template: dict[str, Any]) -> None:
    timeout = template["Resources"]["TaskFunction"]["Properties"]["Timeout"]
    steps = [s.timeout_s for j in jobs() for s in j.steps if s.step_type.value == "TASK"]
    assert max(steps) == 300.5
    assert timeout >= 301 + sfn_template.TIMEOUT_MARGIN_S
    assert timeout <= sfn_template.LAMBDA_MAX_TIMEOUT_S
    for _logical, machine in sfn_template.machines(template):
        definition = json.loads(resolve(machine["Properties"]["DefinitionString"]))
        for state in definition["States"].values():
            assert state.get("TimeoutSeconds", 0) < timeout


def test_the_function_and_its_role(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    fn = resources["TaskFunction"]["Properties"]
    assert (fn["Runtime"], fn["Handler"]) == ("python3.13", "aegis_orchestrator.sfn_task.handler")
    assert fn["Code"] == {"S3Bucket": {"Ref": "CodeBucket"}, "S3Key": {"Ref": "CodeKey"}}
    assert fn["VpcConfig"]["Fn::If"][0] == "InVpc"
    assert template["Parameters"]["SlackWebhookUrl"]["NoEcho"] is True
    role = resources["TaskFunctionRole"]["Properties"]
    statements = role["Policies"][0]["PolicyDocument"]["Statement"]
    actions = sorted(a for st in statements for a in _listed(st["Action"]))
    assert actions == [
        "dynamodb:GetItem",
        "dynamodb:Query",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        "s3:GetObject",
    ]
    # S3: the triggers passed by reference, nothing else of the bucket
    [s3] = [st for st in statements if st["Action"] == "s3:GetObject"]
    assert s3["Resource"] == {"Fn::Sub": "arn:${AWS::Partition}:s3:::${BucketName}/orchestration/*"}
    assert fn["Environment"]["Variables"]["AEGIS_BUCKET"] == {"Ref": "BucketName"}
    assert role["ManagedPolicyArns"]["Fn::If"][0] == "InVpc"  # ENIs only in a VPC
    assert set(template["Outputs"]) >= {"TaskFunctionArn", "StateMachineArnPrefix"}


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_a_job_that_cannot_run_there_is_refused_with_its_reason() -> None:
    with pytest.raises(SfnTemplateError) as caught:
        render(jobs() + load_jobs(INEXPORTABLE))
    problems = dict(caught.value.problems)
    assert sorted(problems) == ["any-semantics", "too-slow"]
    assert "Array(...)" in problems["any-semantics"]
    assert "timeout_s 1200" in problems["too-slow"]


# -- the command ---------------------------------------------------------------------------------


@pytest.mark.integration
async def test_the_command_exports_the_registered_jobs(
    foundation: Any, aws_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", aws_endpoint)
    monkeypatch.setenv("AEGIS_TABLE", foundation.table)
    store = JobStore(foundation.readmodel, utc_now)
    for job in jobs():
        await store.register(job)
    await store.update("alert-audit", is_active=False)

    def invoke(*args: str) -> Any:
        return asyncio.to_thread(runner.invoke, app, ["jobs", *args])

    out = tmp_path / "sfn.yaml"
    result = await invoke("export-sfn", "--out", str(out))
    assert result.exit_code == 0, result.output
    names = [
        m["Properties"]["StateMachineName"]
        for _, m in sfn_template.machines(yaml.safe_load(out.read_text()))
    ]
    assert sorted(n["Fn::Join"][1][1] for n in names) == [
        "daily-report-check",
        "gas-leak-escalation",
        "literal-text",
        "sign-in-lockout",
    ]
    one = await invoke("export-sfn", "literal-text")
    assert one.exit_code == 0, one.output
    assert [lg for lg, _ in sfn_template.machines(json.loads(one.stdout))] == ["JobLiteralText"]
    missing = await invoke("export-sfn", "no-such-job")
    assert missing.exit_code == 2

    for job in load_jobs(INEXPORTABLE):
        await store.register(job)
    refused = await invoke("export-sfn", "--out", str(tmp_path / "no.json"))
    assert refused.exit_code == 1
    assert "any-semantics: " in refused.stderr and "too-slow: step slow" in refused.stderr
    assert not (tmp_path / "no.json").exists()


# -- on the emulator ----------------------------------------------------------------------------


@pytest.mark.integration
async def test_the_template_deploys_on_the_emulator(
    aws_endpoint: str, unique_id: str, template: dict[str, Any]
) -> None:
    cfg = AwsConfig(endpoint_url=aws_endpoint)
    bucket, role, stack = f"aegis-code-{unique_id}", f"orch-{unique_id}", f"aegis-sfn-{unique_id}"
    function, prefix = f"task-{unique_id}", f"{unique_id}-"
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("aegis_orchestrator/sfn_task.py", "def handler(event, context): ...\n")
    async with (
        open_client("s3", cfg) as s3,
        open_client("iam", cfg) as iam,
        open_client("cloudformation", cfg) as cfn,
        open_client("stepfunctions", cfg) as sfn,
        open_client("lambda", cfg) as lam,
    ):
        await s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        await s3.put_object(Bucket=bucket, Key="task.zip", Body=code.getvalue())
        trust = {"Version": "2012-10-17", "Statement": []}
        await iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))
        parameters = {
            "CodeBucket": bucket,
            "CodeKey": "task.zip",
            "FunctionName": function,
            "StateMachinePrefix": prefix,
            "OrchestratorRoleName": role,
            "JobToken": "s3cret-token",
        }
        await cfn.create_stack(
            StackName=stack,
            TemplateBody=json.dumps(template),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM"],
        )
        described = (await cfn.describe_stacks(StackName=stack))["Stacks"][0]
        assert described["StackStatus"] == "CREATE_COMPLETE", described
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]}

        config = (await lam.get_function(FunctionName=function))["Configuration"]
        assert outputs["TaskFunctionArn"] == config["FunctionArn"]
        assert (config["Runtime"], config["Handler"]) == (
            "python3.13",
            "aegis_orchestrator.sfn_task.handler",
        )
        variables = config["Environment"]["Variables"]
        assert variables["AEGIS_JOB_TOKEN"] == "s3cret-token"
        assert "AEGIS_NATS_URL" not in variables and "AEGIS_SLACK_WEBHOOK_URL" not in variables

        arn_prefix = outputs["StateMachineArnPrefix"]
        assert arn_prefix == f"arn:aws:states:{REGION}:123456789012:stateMachine:{prefix}"
        arns = []
        for job in jobs():
            arn = arn_prefix + job.id
            machine = await sfn.describe_state_machine(stateMachineArn=arn)
            definition = json.loads(machine["definition"])
            assert definition == export_asl(job, function_arn=config["FunctionArn"])
            arns.append(arn)
        literal = json.loads(
            (await sfn.describe_state_machine(stateMachineArn=arn_prefix + "literal-text"))[
                "definition"
            ]
        )
        assert literal["States"]["Init"]["Parameters"]["globals"]["token"] == "${AEGIS_JOB_TOKEN}"

        [attached] = (await iam.list_attached_role_policies(RoleName=role))["AttachedPolicies"]
        assert attached["PolicyArn"] == outputs["StartExecutionPolicyArn"]
        policy = (await iam.get_policy(PolicyArn=attached["PolicyArn"]))["Policy"]
        version = await iam.get_policy_version(
            PolicyArn=attached["PolicyArn"], VersionId=policy["DefaultVersionId"]
        )
        document = version["PolicyVersion"]["Document"]
        if isinstance(document, str):
            document = json.loads(document)
        start, describe = document["Statement"]
        assert sorted(start["Resource"]) == sorted(arns)
        assert start["Action"] == "states:StartExecution"
        assert describe["Action"] == "states:DescribeExecution"
        assert sorted(describe["Resource"]) == sorted(
            arn.replace(":stateMachine:", ":execution:") + ":*" for arn in arns
        )

        await cfn.delete_stack(StackName=stack)
        await s3.delete_object(Bucket=bucket, Key="task.zip")
        await s3.delete_bucket(Bucket=bucket)


@pytest.mark.integration
async def test_in_a_vpc_the_function_gets_its_subnets_and_nats(
    aws_endpoint: str, unique_id: str
) -> None:
    """SubnetIds turns the VPC on. (moto's CloudFormation ignores a role's ManagedPolicyArns, so
    the VPC access policy is checked in the template only: test_the_function_and_its_role.)"""
    cfg = AwsConfig(endpoint_url=aws_endpoint)
    bucket, role, stack = f"aegis-code-{unique_id}", f"orch-{unique_id}", f"aegis-vpc-{unique_id}"
    code = io.BytesIO()
    with zipfile.ZipFile(code, "w") as z:
        z.writestr("aegis_orchestrator/sfn_task.py", "def handler(event, context): ...\n")
    async with (
        open_client("s3", cfg) as s3,
        open_client("iam", cfg) as iam,
        open_client("ec2", cfg) as ec2,
        open_client("cloudformation", cfg) as cfn,
        open_client("lambda", cfg) as lam,
    ):
        await s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        await s3.put_object(Bucket=bucket, Key="task.zip", Body=code.getvalue())
        trust = {"Version": "2012-10-17", "Statement": []}
        await iam.create_role(RoleName=role, AssumeRolePolicyDocument=json.dumps(trust))
        vpc = (await ec2.create_vpc(CidrBlock="10.9.0.0/16"))["Vpc"]["VpcId"]
        subnets = [
            (await ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.9.{i}.0/24"))["Subnet"]["SubnetId"]
            for i in (1, 2)
        ]
        group = (
            await ec2.create_security_group(GroupName=unique_id, Description="task", VpcId=vpc)
        )["GroupId"]
        parameters = {
            "CodeBucket": bucket,
            "CodeKey": "task.zip",
            "FunctionName": f"task-{unique_id}",
            "StateMachinePrefix": f"{unique_id}-",
            "OrchestratorRoleName": role,
            "SubnetIds": ",".join(subnets),
            "SecurityGroupIds": group,
            "NatsUrl": "nats://10.9.1.10:4222",
        }
        await cfn.create_stack(
            StackName=stack,
            TemplateBody=json.dumps(render(load_jobs(LITERAL))),
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM"],
        )
        described = (await cfn.describe_stacks(StackName=stack))["Stacks"][0]
        assert described["StackStatus"] == "CREATE_COMPLETE", described
        config = (await lam.get_function(FunctionName=f"task-{unique_id}"))["Configuration"]
        assert sorted(config["VpcConfig"]["SubnetIds"]) == sorted(subnets)
        assert config["VpcConfig"]["SecurityGroupIds"] == [group]
        assert config["Environment"]["Variables"]["AEGIS_NATS_URL"] == "nats://10.9.1.10:4222"
        assert "AEGIS_JOB_TOKEN" not in config["Environment"]["Variables"]  # not given: unset
        await cfn.delete_stack(StackName=stack)
        await s3.delete_object(Bucket=bucket, Key="task.zip")
        await s3.delete_bucket(Bucket=bucket)
