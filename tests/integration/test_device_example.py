"""The device integration guide's example clients, on a real Mosquitto: docs/examples/publish.py
publishes a message the platform accepts; docs/examples/upload_image.py uploads an image through
a real ingest and announces it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiomqtt
import nats
import pytest

from aegis_contracts.payloads import (
    FactoryStateMessage,
    ImageSnapshotMessage,
    parse_device_message,
)
from aegis_devstack.testing.serving import serving
from aegis_ingest.app import create_app

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "publish.py"


async def test_the_example_client_publishes_an_accepted_reading(mqtt_url: str, unique_id: str):
    url = urlsplit(mqtt_url)
    topic = f"aegis/{unique_id}/factory_state"
    async with aiomqtt.Client(
        url.hostname or "127.0.0.1", url.port or 1883, identifier=f"sub-{unique_id}"
    ) as subscriber:
        await subscriber.subscribe(topic, qos=1)
        env = {**os.environ, "MQTT_URL": mqtt_url, "FACTORY_ID": unique_id}
        env.pop("MQTT_USERNAME", None)
        process = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), env=env)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        async with asyncio.timeout(10):
            message = await anext(subscriber.messages)
    assert str(message.topic) == topic and message.qos == 1
    payload = message.payload
    assert isinstance(payload, bytes)
    parsed = parse_device_message("factory_state", payload, topic_factory_id=unique_id)
    assert isinstance(parsed, FactoryStateMessage) and parsed.sensors["co_ppm"] == 3


UPLOAD_EXAMPLE = EXAMPLE.with_name("upload_image.py")
PNG = b"\x89PNG\r\n\x1a\n" + b"example" * 100


async def test_the_upload_example_stores_the_image_and_announces_its_key(
    mqtt_url, nats_url, ingest_settings, foundation, unique_id, tmp_path
):
    """docs/examples/upload_image.py against a real ingest: it asks for an upload, POSTs the
    image to the emulator and publishes an image_snapshot message the processor accepts."""
    image = tmp_path / "snapshot.png"
    image.write_bytes(PNG)
    url = urlsplit(mqtt_url)
    topic = f"aegis/{unique_id}/image_snapshot"
    app = create_app(ingest_settings)
    async with (
        serving(app, app.subscribed),
        aiomqtt.Client(
            url.hostname or "127.0.0.1", url.port or 1883, identifier=f"sub-{unique_id}"
        ) as subscriber,
    ):
        await subscriber.subscribe(topic, qos=1)
        env = {**os.environ, "MQTT_URL": mqtt_url, "FACTORY_ID": unique_id}
        env.pop("MQTT_USERNAME", None)
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(UPLOAD_EXAMPLE), str(image), env=env
        )
        assert await asyncio.wait_for(process.wait(), 60) == 0
        async with asyncio.timeout(10):
            message = await anext(subscriber.messages)
    assert isinstance(message.payload, bytes)
    parsed = parse_device_message("image_snapshot", message.payload, topic_factory_id=unique_id)
    assert isinstance(parsed, ImageSnapshotMessage)
    stored = await foundation.store.get_object(parsed.s3_key)
    assert (stored.body, stored.content_type) == (PNG, "image/png")
    assert parsed.size_bytes == len(PNG)
    nc = await nats.connect(nats_url)  # the raw event of the snapshot: this test's own
    try:
        await nc.jetstream().purge_stream("AEGIS_RAW", subject=f"aegis.raw.{unique_id}.>")
    finally:
        await nc.close()
