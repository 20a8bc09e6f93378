"""deploy/ecs task definitions, checked without AWS.

Each file is the input of `aws ecs register-task-definition --cli-input-json` once its
placeholders are substituted (README, "Deployment"). It is validated against the
RegisterTaskDefinition input shape of botocore's own ECS service model (schema validation, no
AWS call and no mock), then against the invariants the Kubernetes manifests also keep.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from string import Template
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import yaml
from botocore.session import get_session
from botocore.validate import ParamValidator

from aegis_contracts.bus import IDENTITIES
from aegis_devstack.testing.workspace import Workspace
from aegis_runtime.settings import AegisSettings

ROOT = Path(__file__).resolve().parents[2]
ECS = ROOT / "deploy" / "ecs"
WORKSPACE = Workspace(ROOT)
# the placeholders an operator substitutes (envsubst), with values that look like theirs
PLACEHOLDERS = {
    "AWS_ACCOUNT_ID": "210987654321",
    "AWS_REGION": "ap-south-1",
    "IMAGE_TAG": "0.1.0",
    "AEGIS_MQTT_URL": "mqtt://mqtt.aegis.example.com:1883",
    "AEGIS_NATS_HOST": "nats.aegis.internal",
}
# Fargate task sizes: cpu units -> the memory (MiB) allowed with it
FARGATE_MEMORY = {
    256: {512, 1024, 2048},
    512: set(range(1024, 4096 + 1, 1024)),
    1024: set(range(2048, 8192 + 1, 1024)),
    2048: set(range(4096, 16384 + 1, 1024)),
    4096: set(range(8192, 30720 + 1, 1024)),
}
AEGIS_USER = "10001:10001"
SECRET_ARN = re.compile(
    r"arn:aws:(secretsmanager:ap-south-1:\d{12}:secret:[A-Za-z0-9/_+=.@-]+(:[a-z-]*:[a-z]*:[a-z]*)?"
    r"|ssm:ap-south-1:\d{12}:parameter/[A-Za-z0-9/_.-]+)"
)
SECRET_NAMES = re.compile(r"PASSWORD|TOKENS|WEBHOOK|SECRET|USERNAME")
K8S_SETTINGS = ROOT / "deploy" / "k8s" / "base" / "settings.env"
Task = dict[str, Any]


def input_shape() -> Any:
    model = get_session().get_service_model("ecs")
    return model.operation_model("RegisterTaskDefinition").input_shape


def substituted(path: Path) -> Task:
    text = path.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))
    assert used <= set(PLACEHOLDERS), (
        f"{path.name}: unknown placeholders {used - set(PLACEHOLDERS)}"
    )
    assert "$" not in re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}", "", text), f"{path.name}: stray $"
    return cast("Task", json.loads(Template(text).substitute(PLACEHOLDERS)))


def validation_errors(task: Task) -> str:
    report = ParamValidator().validate(task, input_shape())
    return str(report.generate_report()) if report.has_errors() else ""


def tasks() -> dict[str, Task]:
    return {path.stem: substituted(path) for path in sorted(ECS.glob("*.json"))}


def container_of(name: str, task: Task) -> dict[str, Any]:
    (container,) = task["containerDefinitions"]
    assert container["name"] == name
    return cast("dict[str, Any]", container)


def env_file_keys(path: Path) -> set[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return {line.partition("=")[0] for line in lines if line and not line.startswith("#")}


def test_a_task_definition_for_every_deployed_service() -> None:
    # the simulator plays factories: a demo, never deployed where real ones publish
    expected = set(WORKSPACE.deployables) - {"simulator"}
    assert set(tasks()) == expected


@pytest.mark.parametrize("path", sorted(ECS.glob("*.json")), ids=lambda p: p.stem)
def test_task_definition_matches_the_register_task_definition_shape(path: Path) -> None:
    errors = validation_errors(substituted(path))
    assert not errors, errors


def test_the_shape_check_refuses_bad_input() -> None:
    task = tasks()["processor"]
    misspelt = {**task, "familly": task["family"]}
    assert "familly" in validation_errors(misspelt)
    wrong_type = json.loads(json.dumps(task))
    wrong_type["containerDefinitions"][0]["healthCheck"]["retries"] = "three"
    assert "retries" in validation_errors(wrong_type)
    missing = {key: value for key, value in task.items() if key != "containerDefinitions"}
    assert "containerDefinitions" in validation_errors(missing)


def test_an_unknown_placeholder_is_refused(tmp_path: Path) -> None:
    text = (ECS / "processor.json").read_text(encoding="utf-8")
    (tmp_path / "typo.json").write_text(text.replace("IMAGE_TAG", "IMAGE_TAGG"), encoding="utf-8")
    with pytest.raises(AssertionError, match="unknown placeholders"):
        substituted(tmp_path / "typo.json")
    (tmp_path / "bare.json").write_text(text.replace("${IMAGE_TAG}", "$IMAGE_TAG"), "utf-8")
    with pytest.raises(AssertionError, match="stray"):
        substituted(tmp_path / "bare.json")


@pytest.mark.parametrize("name", sorted(set(WORKSPACE.deployables) - {"simulator"}))
def test_task_runs_its_image_and_command_locked_down_with_logs_and_a_health_check(
    name: str,
) -> None:
    task = tasks()[name]
    deployable = WORKSPACE.deployables[name]
    container = container_of(name, task)
    assert task["family"] == f"aegis-{name}"
    assert container["image"].rsplit("/", 1)[1] == f"{deployable.package}:0.1.0"
    assert container["command"] == [deployable.script]
    assert container["essential"] is True
    assert container["user"] == AEGIS_USER, "non-root, the image's uid"
    assert container["readonlyRootFilesystem"] is True
    assert {"sourceVolume": "tmp", "containerPath": "/tmp", "readOnly": False} in container[
        "mountPoints"
    ]
    assert container["linuxParameters"]["capabilities"]["drop"] == ["ALL"]
    # Fargate, with a size Fargate offers
    assert task["requiresCompatibilities"] == ["FARGATE"] and task["networkMode"] == "awsvpc"
    assert int(task["memory"]) in FARGATE_MEMORY[int(task["cpu"])], (task["cpu"], task["memory"])
    # logs
    logs = container["logConfiguration"]
    assert logs["logDriver"] == "awslogs"
    assert logs["options"]["awslogs-group"] == f"/aegis/{name}"
    assert logs["options"]["awslogs-region"] == PLACEHOLDERS["AWS_REGION"]
    assert logs["options"]["awslogs-stream-prefix"]
    # the health check asks /healthz (is the process alive) on the port the container opens:
    # ECS replaces a task whose check fails, and /readyz fails during a NATS or S3 blip, when
    # restarting every task would only make things worse (readiness is for load balancers)
    check = container["healthCheck"]["command"]
    assert check[0] == "CMD"
    (url,) = re.findall(r"http://127\.0\.0\.1:(\d+)(/\w+)", " ".join(check))
    ports = {m["containerPort"] for m in container["portMappings"]}
    assert url == (str(deployable.health_port), "/healthz") and deployable.health_port in ports


def test_each_service_has_its_own_task_and_execution_roles() -> None:
    roles: list[str] = []
    for name, task in tasks().items():
        account = PLACEHOLDERS["AWS_ACCOUNT_ID"]
        assert task["taskRoleArn"] == f"arn:aws:iam::{account}:role/aegis-{name}-task"
        assert task["executionRoleArn"] == f"arn:aws:iam::{account}:role/aegis-{name}-execution"
        roles += [task["taskRoleArn"], task["executionRoleArn"]]
    assert len(roles) == len(set(roles))


def test_settings_are_the_platform_settings_and_secrets_come_from_secret_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = env_file_keys(K8S_SETTINGS)
    for name, task in tasks().items():
        container = container_of(name, task)
        environment = {item["name"]: item["value"] for item in container["environment"]}
        assert shared <= set(environment), f"{name}: lacks {shared - set(environment)}"
        assert "AEGIS_AWS_ENDPOINT_URL" not in environment, "real S3/DynamoDB"
        assert not [key for key in environment if key.startswith("AWS_")], "the task role"
        assert not [key for key in environment if SECRET_NAMES.search(key)], name
        for secret in container.get("secrets", []):
            assert SECRET_ARN.fullmatch(secret["valueFrom"]), secret["valueFrom"]
        names = [secret["name"] for secret in container.get("secrets", [])]
        assert len(names) == len(set(names))
        for key in [key for key in os.environ if key.startswith("AEGIS_")]:
            monkeypatch.delenv(key)
        for key, value in environment.items():
            monkeypatch.setenv(key, value)
        settings = AegisSettings()
        assert settings.region == PLACEHOLDERS["AWS_REGION"]
        assert (settings.health_host, settings.health_port) == ("0.0.0.0", 8081)


def test_only_the_services_that_need_a_secret_get_it() -> None:
    nats = {"AEGIS_NATS_PASSWORD", "AEGIS_NATS_TLS_CA_PEM"}  # every service's (its identity)
    granted = {
        name: {secret["name"] for secret in container_of(name, task).get("secrets", [])} - nats
        for name, task in tasks().items()
    }
    assert granted["ingest"] == {"AEGIS_MQTT_USERNAME", "AEGIS_MQTT_PASSWORD"}
    assert granted["cloud-collector"] == {"AEGIS_MQTT_USERNAME", "AEGIS_MQTT_PASSWORD"}
    assert granted["alert-dispatcher"] == granted["orchestrator"] == {"AEGIS_SLACK_WEBHOOK_URL"}
    assert granted["dashboard-api"] == {"AEGIS_DASHBOARD_TOKENS", "AEGIS_SLACK_SIGNING_SECRET"}
    assert not granted["processor"] | granted["aggregator"] | granted["reporter"]


def test_each_task_role_is_made_by_the_infrastructure_template_with_its_services_policy() -> None:
    template = yaml.safe_load((ROOT / "deploy" / "infra" / "foundation.yaml").read_text())
    made: dict[str, str] = {}  # role name (NamePrefix aegis) -> the policy file it carries
    policies = {
        logical: resource["Properties"]["ManagedPolicyName"]["Fn::Sub"]
        for logical, resource in template["Resources"].items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy"
    }
    for resource in template["Resources"].values():
        if resource["Type"] == "AWS::IAM::Role":
            role = resource["Properties"]["RoleName"]["Fn::Sub"].replace("${NamePrefix}", "aegis")
            if not role.endswith("-task"):
                continue  # execution roles, the raw break-glass role
            (policy,) = resource["Properties"]["ManagedPolicyArns"]
            made[role] = policies[policy["Ref"]].replace("${NamePrefix}", "aegis")
    for name, task in tasks().items():
        role = task["taskRoleArn"].rsplit("/", 1)[1]
        assert made.get(role) == f"aegis-{name}", (name, role)
        assert (ROOT / "deploy" / "infra" / "policies" / f"{name}.json").is_file()


def test_every_task_is_its_own_nats_identity_over_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity of aegis_contracts.bus named after the service, its own password from
    Secrets Manager, the CA from an SSM parameter, a tls:// URL, and no stream management."""
    account = PLACEHOLDERS["AWS_ACCOUNT_ID"]
    for name, task in tasks().items():
        container = container_of(name, task)
        environment = {item["name"]: item["value"] for item in container["environment"]}
        secrets = {item["name"]: item["valueFrom"] for item in container["secrets"]}
        assert environment["AEGIS_NATS_USER"] == name and name in IDENTITIES, name
        assert secrets["AEGIS_NATS_PASSWORD"] == (
            f"arn:aws:secretsmanager:ap-south-1:{account}:secret:aegis/nats/{name}:password::"
        )
        assert secrets["AEGIS_NATS_TLS_CA_PEM"] == (
            f"arn:aws:ssm:ap-south-1:{account}:parameter/aegis/nats/ca"
        )
        for key in [key for key in os.environ if key.startswith("AEGIS_")]:
            monkeypatch.delenv(key)
        for key, value in environment.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AEGIS_NATS_TLS_CA_PEM", "-----BEGIN CERTIFICATE-----")
        settings = AegisSettings()
        assert settings.nats_user == name and settings.nats_manage_streams is False
        assert [urlsplit(u).scheme for u in settings.nats_servers()] == ["tls"], name
        assert settings.nats_tls


def template_resources() -> dict[str, Any]:
    template = yaml.safe_load((ROOT / "deploy" / "infra" / "foundation.yaml").read_text())
    return cast("dict[str, Any]", template["Resources"])


def _arn_matches(pattern: str, arn: str) -> bool:
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), arn) is not None


def test_what_a_task_definition_names_the_template_creates() -> None:
    """Every role, secret, log group and image repository a task names exists once the template
    is deployed (the secrets' values are an operator's documented step): ECS could not start a
    task whose execution role is missing, that may not read its secrets, whose log group does
    not exist, or whose image has nowhere to be pushed."""
    resources = template_resources()
    roles = {
        r["Properties"]["RoleName"]["Fn::Sub"].replace("${NamePrefix}", "aegis"): r["Properties"]
        for r in resources.values()
        if r["Type"] == "AWS::IAM::Role"
    }
    groups = {
        r["Properties"]["LogGroupName"]
        for r in resources.values()
        if r["Type"] == "AWS::Logs::LogGroup"
    }
    repositories = {
        r["Properties"]["RepositoryName"]
        for r in resources.values()
        if r["Type"] == "AWS::ECR::Repository"
    }
    pseudo = {
        "AWS::Partition": "aws",
        "AWS::Region": "ap-south-1",
        "AWS::AccountId": "210987654321",
    }
    for name, task in tasks().items():
        for field in ("taskRoleArn", "executionRoleArn"):
            assert task[field].rsplit("/", 1)[1] in roles, f"{name}: {field} not in the template"
        execution = roles[task["executionRoleArn"].rsplit("/", 1)[1]]
        managed = json.dumps(execution["ManagedPolicyArns"])
        assert "AmazonECSTaskExecutionRolePolicy" in managed, f"{name}: image pull and logs"
        granted: dict[str, list[str]] = {}
        for policy in execution.get("Policies", []):
            for statement in policy["PolicyDocument"]["Statement"]:
                for resource in statement["Resource"]:
                    arn = resource["Fn::Sub"] if isinstance(resource, dict) else resource
                    for key, value in pseudo.items():
                        arn = arn.replace("${" + key + "}", value)
                    granted.setdefault(statement["Action"], []).append(arn)
        container = container_of(name, task)
        for secret in container.get("secrets", []):
            arn = secret["valueFrom"]
            action = "ssm:GetParameters" if ":ssm:" in arn else "secretsmanager:GetSecretValue"
            # the stored secret's ARN: its name, a random suffix; a JSON key is not part of it
            stored = ":".join(arn.split(":")[:7]) + ("-AbCdEf" if ":secretsmanager:" in arn else "")
            assert any(_arn_matches(p, stored) for p in granted.get(action, [])), (name, arn)
        group = container["logConfiguration"]["options"]["awslogs-group"]
        assert group in groups, f"{name}: log group {group} is not made by the template"
        # the image: a repository of the template, the tag the operator's IMAGE_TAG
        registry, _, image = container["image"].partition("/")
        repository, _, tag = image.partition(":")
        region, account = pseudo["AWS::Region"], pseudo["AWS::AccountId"]
        assert registry == f"{account}.dkr.ecr.{region}.amazonaws.com", name
        assert repository in repositories and tag == PLACEHOLDERS["IMAGE_TAG"], name
        # and nothing more: exactly the secrets its own task names (two JSON keys of one secret
        # are one grant)
        named = {":".join(x["valueFrom"].split(":")[:7]) for x in container.get("secrets", [])}
        assert sum(len(v) for v in granted.values()) == len(named), name


# -- scheduled tasks (deploy/ecs/scheduled: run by EventBridge Scheduler, not as services) -------

SCHEDULED = ECS / "scheduled"


def scheduled_tasks() -> dict[str, Task]:
    return {path.stem: substituted(path) for path in sorted(SCHEDULED.glob("*.json"))}


def test_the_daily_raw_seal_is_the_one_scheduled_task_and_matches_the_register_shape() -> None:
    tasks_ = scheduled_tasks()
    assert set(tasks_) == {"seal-raw"}
    for name, task in tasks_.items():
        errors = validation_errors(task)
        assert not errors, f"{name}: {errors}"


def test_the_seal_task_runs_aegis_seal_raw_of_the_storage_tools_image_locked_down() -> None:
    """As the Kubernetes CronJob: `aegis seal raw` of the storage-tools image under its role
    (the policy the CronJob's IRSA role carries), its own execution role and log group; S3 only:
    no port, no health check (a run ends), no secret, no NATS identity."""
    task = scheduled_tasks()["seal-raw"]
    container = container_of("seal-raw", task)
    account = PLACEHOLDERS["AWS_ACCOUNT_ID"]
    assert task["family"] == "aegis-seal-raw"
    assert container["command"] == ["aegis", "seal", "raw"]
    assert "seal" in WORKSPACE.aegis_commands("aegis-storage-tools")
    assert container["image"].rsplit("/", 1)[1] == "aegis-storage-tools:0.1.0"
    assert task["taskRoleArn"] == f"arn:aws:iam::{account}:role/aegis-storage-tools-task"
    assert task["executionRoleArn"] == f"arn:aws:iam::{account}:role/aegis-seal-raw-execution"
    assert container["user"] == AEGIS_USER and container["readonlyRootFilesystem"] is True
    assert container["linuxParameters"]["capabilities"]["drop"] == ["ALL"]
    assert {"sourceVolume": "tmp", "containerPath": "/tmp", "readOnly": False} in container[
        "mountPoints"
    ]
    assert int(task["memory"]) in FARGATE_MEMORY[int(task["cpu"])]
    assert container["logConfiguration"]["options"]["awslogs-group"] == "/aegis/seal-raw"
    assert "portMappings" not in container and "healthCheck" not in container
    assert "secrets" not in container
    environment = {item["name"]: item["value"] for item in container["environment"]}
    assert environment["AEGIS_REGION"] == PLACEHOLDERS["AWS_REGION"]
    assert environment["AEGIS_BUCKET"] == "aegis-bucket-data"
    assert not [key for key in environment if "NATS" in key or key.startswith("AWS_")]
    assert "AEGIS_AWS_ENDPOINT_URL" not in environment


def test_the_seal_schedule_runs_that_task_daily_at_the_cronjobs_time_with_least_privilege() -> None:
    """The template's AWS::Scheduler::Schedule starts the task definition's family (its newest
    revision) on the operator's cluster at the CronJob's time, and the role it takes may do that
    and pass the task's two roles to ECS tasks, nothing else; the roles, the log group and the
    image repository the task names are the template's too."""
    resources = template_resources()
    task = scheduled_tasks()["seal-raw"]
    schedule = resources["SealRawSchedule"]
    role = resources["SealRawSchedulerRole"]
    assert schedule["Condition"] == role["Condition"] == "SchedulesOn"
    props = schedule["Properties"]
    manifests = yaml.safe_load_all((ROOT / "deploy/k8s/base/seal-raw.yaml").read_text())
    (cron,) = [m for m in manifests if m["kind"] == "CronJob"]
    minute, hour, *_ = cron["spec"]["schedule"].split()
    assert props["ScheduleExpression"] == f"cron({minute} {hour} * * ? *)"
    assert props["ScheduleExpressionTimezone"] == cron["spec"]["timeZone"] == "Etc/UTC"
    assert props["State"] == "ENABLED" and props["FlexibleTimeWindow"] == {"Mode": "OFF"}
    target = props["Target"]
    family = (
        "arn:${AWS::Partition}:ecs:${AWS::Region}:${AWS::AccountId}:task-definition/"
        + task["family"]
    )
    ecs = target["EcsParameters"]
    assert ecs["TaskDefinitionArn"] == {"Fn::Sub": family}
    assert (ecs["LaunchType"], ecs["TaskCount"]) == ("FARGATE", 1)
    assert ecs["NetworkConfiguration"]["AwsvpcConfiguration"]["AssignPublicIp"] == "DISABLED"
    assert target["Arn"] == {"Ref": "EcsClusterArn"}
    assert target["RoleArn"] == {"Fn::GetAtt": ["SealRawSchedulerRole", "Arn"]}

    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    assert "ManagedPolicyArns" not in role["Properties"]
    (policy,) = role["Properties"]["Policies"]
    run, passing = policy["PolicyDocument"]["Statement"]
    assert (run["Effect"], run["Action"]) == ("Allow", "ecs:RunTask")
    assert run["Resource"] == [{"Fn::Sub": family}, {"Fn::Sub": family + ":*"}]
    assert run["Condition"] == {"ArnEquals": {"ecs:cluster": {"Ref": "EcsClusterArn"}}}
    assert (passing["Effect"], passing["Action"]) == ("Allow", "iam:PassRole")
    assert passing["Condition"] == {
        "StringEquals": {"iam:PassedToService": "ecs-tasks.amazonaws.com"}
    }
    roles = {
        logical: r["Properties"]["RoleName"]["Fn::Sub"].replace("${NamePrefix}", "aegis")
        for logical, r in resources.items()
        if r["Type"] == "AWS::IAM::Role"
    }
    passed = {roles[ref["Fn::GetAtt"][0]] for ref in passing["Resource"]}
    named = {task[field].rsplit("/", 1)[1] for field in ("taskRoleArn", "executionRoleArn")}
    assert passed == named == {"aegis-storage-tools-task", "aegis-seal-raw-execution"}

    execution = resources["SealRawExecutionRole"]["Properties"]
    assert "Policies" not in execution, "no secrets to read"
    groups = {r["Properties"].get("LogGroupName") for r in resources.values()}
    assert "/aegis/seal-raw" in groups
    repositories = {r["Properties"].get("RepositoryName") for r in resources.values()}
    assert "aegis-storage-tools" in repositories
