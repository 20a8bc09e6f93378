"""S3 event notifications onto the bus: the message shapes S3 sends (directly, through SNS, from
EventBridge) read as AWS documents them, and, on real servers, a bucket whose notifications go to
an SQS queue: device image uploads and keys outside the layout are announced and fire Component
jobs, the platform's own families are left to their writers, a message that is no S3 event is
dead-lettered, and a message whose announcement failed (NATS down) is announced once NATS is back."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import nats
import pytest

from aegis_contracts import keys
from aegis_contracts.subjects import OBJECT_CREATED, dead_letter_subject
from aegis_devstack.localservers import ManagedServer
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_orchestration.model import Job
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.s3events import INVALID, Created, NotAnS3Event, family_of, parse_message
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_storage.clients import AwsConfig, open_client

T = "2026-12-01T10:20:30.123Z"
IMAGE = keys.image_snapshot_key("factory-a", datetime(2026, 12, 1, 10, tzinfo=UTC), "cam-1.png")


def s3_record(key: str, event: str = "ObjectCreated:Put") -> dict[str, Any]:
    """A record as S3 sends it (its key URL-encoded, spaces as +)."""
    return {
        "eventVersion": "2.1",
        "eventSource": "aws:s3",
        "awsRegion": "ap-south-1",
        "eventTime": T,
        "eventName": event,
        "s3": {
            "s3SchemaVersion": "1.0",
            "bucket": {"name": "aegis-data", "arn": "arn:aws:s3:::aegis-data"},
            "object": {
                "key": key.replace(" ", "+").replace("=", "%3D"),
                "size": 2048,
                "eTag": "0123456789abcdef0123456789abcdef",
                "sequencer": "0055AED6DCD90281E5",
            },
        },
    }


def test_a_notification_from_s3_sns_or_eventbridge_is_read_alike() -> None:
    expected = Created(
        "aegis-data",
        IMAGE,
        2048,
        "0123456789abcdef0123456789abcdef",
        "0055AED6DCD90281E5",
        datetime(2026, 12, 1, 10, 20, 30, 123000, tzinfo=UTC),
    )
    direct = json.dumps({"Records": [s3_record(IMAGE)]})
    assert parse_message(direct) == [expected]
    through_sns = json.dumps({"Type": "Notification", "MessageId": "m", "Message": direct})
    assert parse_message(through_sns) == [expected]
    eventbridge = {
        "version": "0",
        "detail-type": "Object Created",
        "source": "aws.s3",
        "time": T,
        "detail": {
            "bucket": {"name": "aegis-data"},
            "object": {
                "key": IMAGE,  # EventBridge does not encode keys
                "size": 2048,
                "etag": "0123456789abcdef0123456789abcdef",
                "sequencer": "0055AED6DCD90281E5",
            },
        },
    }
    assert parse_message(json.dumps(eventbridge)) == [expected]
    # other events carry nothing to announce
    assert parse_message(json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent"})) == []
    removed = {"Records": [s3_record(IMAGE, "ObjectRemoved:Delete")]}
    assert parse_message(json.dumps(removed)) == []
    assert parse_message(json.dumps({**eventbridge, "detail-type": "Object Deleted"})) == []


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"hello": "world"}', "neither"),
        (json.dumps({"Records": [{"eventSource": "aws:sqs"}]}), "aws:sqs"),
        (
            json.dumps({"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put"}]}),
            "s3",
        ),
    ],
)
def test_what_is_no_s3_event_is_refused_with_its_reason(body: str, reason: str) -> None:
    with pytest.raises(NotAnS3Event, match=reason):
        parse_message(body)


def test_the_platforms_own_families_are_left_to_their_writers() -> None:
    at = datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert family_of(IMAGE) == "image_upload"
    assert family_of("uploads/manual/cam 1.png") == "external"
    assert family_of(keys.state_snapshot_key("factory-a", at)) is None
    assert family_of(keys.processed_agg_key("factory-a", at)) is None
    assert family_of(keys.report_key(at.date(), "factory-a", "report.md")) is None
    assert family_of(keys.cloud_infra_key("fast", at)) is None


# -- on real servers ---------------------------------------------------------------------------


async def s3_events_queue(aws_endpoint: str, foundation: Foundation, name: str) -> str:
    """A queue the bucket's ObjectCreated notifications go to (and S3's test event)."""
    async with open_client("sqs", AwsConfig(endpoint_url=aws_endpoint)) as sqs:
        url = str(
            (await sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "2"}))[
                "QueueUrl"
            ]
        )
        attributes = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    await foundation.clients.s3.put_bucket_notification_configuration(
        Bucket=foundation.bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {"QueueArn": attributes["Attributes"]["QueueArn"], "Events": ["s3:ObjectCreated:*"]}
            ]
        },
    )
    return url


def outcomes(app: OrchestratorApp) -> dict[str, float]:
    return {
        s.labels["outcome"]: s.value
        for metric in app.s3_events.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }


def component_job(job_id: str, family: str) -> Job:
    return Job.model_validate(
        {
            "id": job_id,
            "job_name": job_id,
            "trigger_type": "Component",
            "object_id": family,
            "trigger_sub_type": "Insert",
            "steps": [{"id": "mark", "step_type": "DUMMY", "is_start_point": True}],
        }
    )


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_objects_only_s3_knows_of_are_announced_and_fire_component_jobs(
    aws_endpoint: str,
    nats_url: str,
    foundation: Foundation,
    unique_id: str,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    queue = await s3_events_queue(aws_endpoint, foundation, f"s3-events-{unique_id}")
    app = OrchestratorApp(
        make_settings(orchestrator_s3_events_queue_url=queue, orchestrator_s3_events_wait_s=1),
        environment={},
    )
    await app.start()
    nc = await nats.connect(nats_url)
    heard: list[tuple[str, dict[str, Any]]] = []

    async def record(msg: Any) -> None:
        heard.append((msg.subject, json.loads(msg.data)))

    try:
        assert app.store is not None
        uploads, external = f"img-{unique_id}"[:48], f"ext-{unique_id}"[:48]
        await app.store.register(component_job(uploads, "image_upload"))
        await app.store.register(component_job(external, "external"))
        await app.refresh()
        await nc.subscribe(f"{OBJECT_CREATED}.>", cb=record)
        await nc.subscribe(dead_letter_subject("orchestrator", INVALID), cb=record)
        await nc.flush()
        s3 = foundation.clients.s3
        elsewhere = f"uploads/{unique_id}/manual photo.png"
        at = datetime.now(UTC)
        for key in (IMAGE, elsewhere, keys.state_snapshot_key(unique_id, at)):
            await s3.put_object(Bucket=foundation.bucket, Key=key, Body=b"\x89PNG")
        async with open_client("sqs", AwsConfig(endpoint_url=aws_endpoint)) as sqs:
            await sqs.send_message(QueueUrl=queue, MessageBody='{"surprise": true}')

        def announced() -> list[str]:
            return sorted(body.get("key", "") for subject, body in heard if "created" in subject)

        await eventually(lambda: len(announced()) == 2, within=30, what="two objects announced")
        await eventually(
            lambda: any("dlq" in subject for subject, _ in heard), within=15, what="dead letter"
        )
        assert announced() == sorted([IMAGE, elsewhere])  # not the state snapshot
        subjects = {body.get("key"): subject for subject, body in heard if "created" in subject}
        assert subjects[IMAGE] == f"{OBJECT_CREATED}.image_upload"
        assert subjects[elsewhere] == f"{OBJECT_CREATED}.external"
        event = next(body for subject, body in heard if body.get("key") == elsewhere)
        assert event["bucket"] == foundation.bucket and event["producer"] == "s3"
        assert event["size_bytes"] == 4
        letter = next(body for subject, body in heard if "dlq" in subject)
        assert letter["payload"] == '{"surprise": true}' and "not an S3 event" in letter["detail"]

        for job_id, key in ((uploads, IMAGE), (external, elsewhere)):

            async def ran(job_id: str = job_id) -> bool:
                assert app.store is not None
                return len(await app.store.executions(job_id)) == 1

            await eventually(ran, within=20, what=f"{job_id} fired")
            [run] = await app.store.executions(job_id)
            assert run["input"]["key"] == key
        # everything handled is gone from the queue (the test event, the objects, the bad one)
        async with open_client("sqs", AwsConfig(endpoint_url=aws_endpoint)) as sqs:
            left = await sqs.get_queue_attributes(
                QueueUrl=queue,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )
        assert left["Attributes"] == {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0",
        }
        assert outcomes(app) == {"announced": 2, "announced_by_writer": 1, "invalid": 1}
    finally:
        await nc.close()
        await app.stop()


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_a_notification_held_while_nats_is_down_is_announced_once_it_is_back(
    aws_endpoint: str,
    foundation: Foundation,
    unique_id: str,
    private_nats: ManagedServer,
    make_settings: Callable[..., OrchestratorSettings],
) -> None:
    queue = await s3_events_queue(aws_endpoint, foundation, f"s3-outage-{unique_id}")
    app = OrchestratorApp(
        make_settings(
            nats_url=private_nats.url,
            orchestrator_s3_events_queue_url=queue,
            orchestrator_s3_events_wait_s=1,
        ),
        environment={},
    )
    await app.start()
    try:
        private_nats.stop()
        key = f"uploads/{unique_id}/during-outage.bin"
        await foundation.clients.s3.put_object(Bucket=foundation.bucket, Key=key, Body=b"x")

        async def queued() -> dict[str, str]:
            async with open_client("sqs", AwsConfig(endpoint_url=aws_endpoint)) as sqs:
                answer = await sqs.get_queue_attributes(
                    QueueUrl=queue,
                    AttributeNames=[
                        "ApproximateNumberOfMessages",
                        "ApproximateNumberOfMessagesNotVisible",
                    ],
                )
            return dict(answer["Attributes"])

        # the fault hit work outstanding: the bridge received the message and could not announce
        # it, so it stays in the queue (received, not deleted)
        await eventually(
            lambda: outcomes(app).get("failed", 0) >= 1, within=30, what="a failed announcement"
        )
        assert (await queued())["ApproximateNumberOfMessagesNotVisible"] != "0"
        # past its visibility timeout it is received again, NATS still down
        await eventually(
            lambda: outcomes(app).get("failed", 0) >= 2, within=30, what="a second failure"
        )
        private_nats.restart()
        nc = await nats.connect(private_nats.url)
        try:
            js = nc.jetstream()

            async def stored() -> bool:
                info = await js.stream_info("AEGIS_EVENTS", subjects_filter=f"{OBJECT_CREATED}.>")
                return (info.state.subjects or {}).get(f"{OBJECT_CREATED}.external", 0) >= 1

            await eventually(stored, within=30, what="the held notification announced")

            async def deleted() -> bool:
                return set((await queued()).values()) == {"0"}

            # deleted from the queue once announced: no delivery of it can follow
            await eventually(deleted, within=30, what="the notification deleted")
            info = await js.stream_info("AEGIS_EVENTS", subjects_filter=f"{OBJECT_CREATED}.>")
            assert (info.state.subjects or {})[f"{OBJECT_CREATED}.external"] == 1
        finally:
            await nc.close()
    finally:
        await app.stop()
