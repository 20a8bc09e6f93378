"""Alerts end to end: a device message with a fire detection goes MQTT -> ingest -> processor ->
state_snapshot -> alert-dispatcher -> a local HTTP server standing in for Slack, as real processes."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta

import pytest

from aegis_contracts.ids import topic_for
from aegis_contracts.times import format_ts
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import FakeWebhook

from .conftest import Pipeline, publish_all

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def state(factory: str, seq: int, at: datetime, *, fire: bool) -> bytes:
    return json.dumps(
        {
            "message_id": f"{factory}-alert-{seq:05d}",
            "factory_id": factory,
            "device_id": "edge-1",
            "emitted_at": format_ts(at),
            "schema_version": "1.0",
            "sensors": {"temperature_c": 24.0, "co_ppm": 3.0},
            "ai": {
                "model_version": "yolo-1",
                "detections": [{"label": "fire", "confidence": 0.93, "camera_id": "cam-1"}]
                if fire
                else [],
            },
        }
    ).encode()


async def test_a_fire_reaches_slack_once_within_2_s_and_recovery_sends_one_resolved(
    pipeline: Pipeline, webhook: FakeWebhook, now: datetime
) -> None:
    pipeline.extra_env = {
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url,
        "AEGIS_DASHBOARD_URL": "http://dashboard.example",
    }
    for service in ("ingest", "processor", "alert-dispatcher"):
        pipeline.start(service)
    await pipeline.ready("ingest", "processor", "alert-dispatcher")
    factory = pipeline.factories(1)[0]
    topic = topic_for(factory, "factory_state")

    # warm-up: a calm message, all the way to LATEST (connections open, consumers bound)
    await publish_all(pipeline.mqtt.url, [(topic, state(factory, 0, now, fire=False))])

    async def latest_seen() -> bool:
        return await pipeline.readmodel.get_latest(factory) is not None

    await eventually(latest_seen, within=30, what="the warm-up message in LATEST")

    published = time.monotonic()
    await publish_all(
        pipeline.mqtt.url, [(topic, state(factory, 1, now + timedelta(seconds=1), fire=True))]
    )
    try:
        await eventually(lambda: len(webhook.delivered) >= 1, within=10, what="the fire alert")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pipeline.log_tails()}") from None
    latency = webhook.requests[0].at - published
    assert latency < 2.0, f"the fire alert took {latency:.2f} s from the MQTT publish"
    first = webhook.delivered[0]
    assert (
        "CRITICAL" in first["text"]
        and factory in first["text"]
        and "FIRE_DETECTED" in first["text"]
    )
    assert (
        first["blocks"][3]["elements"][-1]["url"] == f"http://dashboard.example/factories/{factory}"
    )

    # 20 more fire snapshots inside the cooldown send nothing
    more = [
        (topic, state(factory, 1 + i, now + timedelta(seconds=1 + i), fire=True))
        for i in range(1, 21)
    ]
    await publish_all(pipeline.mqtt.url, more)

    async def all_handled() -> bool:
        latest = await pipeline.readmodel.get_latest(factory)
        return bool(latest) and latest["factory_state"]["meta"]["message_id"].endswith("00021")

    await eventually(all_handled, within=30, what="the 20 fire messages in LATEST")
    # the recovery: one RESOLVED (and the dispatcher has seen every snapshot before it)
    await publish_all(
        pipeline.mqtt.url, [(topic, state(factory, 30, now + timedelta(seconds=30), fire=False))]
    )
    try:
        await eventually(
            lambda: len(webhook.delivered) >= 2, within=15, what="the RESOLVED message"
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{pipeline.log_tails()}") from None
    texts = [body["text"] for body in webhook.delivered]
    assert len(texts) == 2 and "RESOLVED" in texts[1], texts
    assert all(r.status == 200 for r in webhook.requests)
