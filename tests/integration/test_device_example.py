"""The device integration guide's example client (docs/examples/publish.py) publishes, on a real
Mosquitto, a message the platform accepts."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import aiomqtt
import pytest

from aegis_contracts.payloads import FactoryStateMessage, parse_device_message

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
