"""deploy/infra/s3-events.yaml: cfn-lint accepts it, and on the emulator it makes the queue (with
its dead-letter queue), lets the bucket send to it, and gives the orchestrator's role exactly the
rights the bridge uses on exactly that queue; the bucket's notifications then reach it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from aegis_storage.clients import AwsConfig, open_client

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "infra" / "s3-events.yaml"
REGION = "ap-south-1"


def test_cfn_lint_accepts_the_template() -> None:
    from cfnlint.api import ManualArgs, lint_file  # noqa: PLC0415

    found = lint_file(TEMPLATE, config=ManualArgs(regions=[REGION]))
    assert [str(m) for m in found] == []


def _document(doc: Any) -> dict[str, Any]:
    return json.loads(unquote(doc)) if isinstance(doc, str) else dict(doc)


async def test_the_template_deploys_and_the_bucket_notifies_its_queue(
    aws_endpoint: str, unique_id: str
) -> None:
    cfg = AwsConfig(endpoint_url=aws_endpoint)
    prefix, bucket = unique_id, f"aegis-events-{unique_id}"
    role = f"{prefix}-orchestrator-task"
    async with (
        open_client("cloudformation", cfg) as cfn,
        open_client("iam", cfg) as iam,
        open_client("sqs", cfg) as sqs,
        open_client("s3", cfg) as s3,
    ):
        await iam.create_role(RoleName=role, AssumeRolePolicyDocument="{}")
        await s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
        )
        stack = f"aegis-s3-events-{unique_id}"
        await cfn.create_stack(
            StackName=stack,
            TemplateBody=TEMPLATE.read_text(),
            Parameters=[
                {"ParameterKey": "BucketName", "ParameterValue": bucket},
                {"ParameterKey": "NamePrefix", "ParameterValue": prefix},
                {"ParameterKey": "OrchestratorRoleName", "ParameterValue": role},
            ],
            Capabilities=["CAPABILITY_NAMED_IAM"],
        )
        described = (await cfn.describe_stacks(StackName=stack))["Stacks"][0]
        assert described["StackStatus"] == "CREATE_COMPLETE", described
        outputs = {o["OutputKey"]: o["OutputValue"] for o in described["Outputs"]}
        queue = outputs["QueueUrl"]
        assert queue.endswith(f"/{prefix}-s3-events")

        attributes = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"]))[
            "Attributes"
        ]
        assert attributes["QueueArn"] == outputs["QueueArn"]
        redrive = json.loads(attributes["RedrivePolicy"])
        assert redrive["deadLetterTargetArn"].endswith(f":{prefix}-s3-events-dlq")
        assert int(redrive["maxReceiveCount"]) == 5
        # moto's CloudFormation has no AWS::SQS::QueuePolicy: the policy is read from the
        # template and put on the queue as SQS would
        template = yaml.safe_load(TEMPLATE.read_text().replace("!", ""))
        statements = template["Resources"]["S3EventsQueuePolicy"]["Properties"]["PolicyDocument"][
            "Statement"
        ]
        senders = {
            s["Principal"]["Service"] for s in statements if s["Action"] == "sqs:SendMessage"
        }
        assert senders == {"s3.amazonaws.com", "events.amazonaws.com"}
        source = statements[0]["Condition"]["ArnLike"]["aws:SourceArn"]["Fn::Sub"]
        assert source == "arn:${AWS::Partition}:s3:::${BucketName}"

        [attached] = (await iam.list_attached_role_policies(RoleName=role))["AttachedPolicies"]
        policy = (await iam.get_policy(PolicyArn=attached["PolicyArn"]))["Policy"]
        version = await iam.get_policy_version(
            PolicyArn=attached["PolicyArn"], VersionId=policy["DefaultVersionId"]
        )
        [statement] = _document(version["PolicyVersion"]["Document"])["Statement"]
        assert statement["Resource"] == outputs["QueueArn"]
        assert sorted(statement["Action"]) == [
            "sqs:ChangeMessageVisibility",
            "sqs:DeleteMessage",
            "sqs:GetQueueAttributes",
            "sqs:ReceiveMessage",
        ]

        # the notifications the docs configure reach the queue
        await s3.put_bucket_notification_configuration(
            Bucket=bucket,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": outputs["QueueArn"],
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {
                            "Key": {"FilterRules": [{"Name": "prefix", "Value": "image_snapshot/"}]}
                        },
                    }
                ]
            },
        )
        await s3.put_object(Bucket=bucket, Key="image_snapshot/factory_id=f/x.png", Body=b"x")
        await s3.put_object(Bucket=bucket, Key="processed/f/factory_state/x.json", Body=b"{}")
        bodies = []
        for _ in range(5):
            answer = await sqs.receive_message(
                QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
            )
            bodies += [m["Body"] for m in answer.get("Messages", [])]
        keys = [
            r["s3"]["object"]["key"]
            for b in bodies
            if "Records" in (doc := json.loads(b))
            for r in doc["Records"]
        ]
        assert [unquote(k) for k in keys] == ["image_snapshot/factory_id=f/x.png"]
        await cfn.delete_stack(StackName=stack)
