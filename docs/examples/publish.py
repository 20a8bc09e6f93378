"""Publish one factory_state reading to AEGIS (pip install aiomqtt; Python 3.11+).

MQTT_URL=mqtts://broker.example:8883 MQTT_USERNAME=factory-a MQTT_PASSWORD=... python publish.py
"""

import asyncio
import json
import os
import ssl
import uuid
from datetime import UTC, datetime
from urllib.parse import urlsplit

import aiomqtt


async def main() -> None:
    url, factory = urlsplit(os.environ["MQTT_URL"]), os.environ.get("FACTORY_ID", "factory-a")
    user = os.environ.get("MQTT_USERNAME")  # the broker binds the client id to it
    payload = {
        "message_id": uuid.uuid4().hex,  # keep it when retrying the same reading
        "factory_id": factory,
        "device_id": os.environ.get("DEVICE_ID", "edge-01"),
        "emitted_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "schema_version": "1.0",
        "sensors": {"temperature_c": 24.5, "co_ppm": 3},
    }
    tls = ssl.create_default_context() if url.scheme == "mqtts" else None
    async with aiomqtt.Client(
        url.hostname or "localhost",
        url.port or (8883 if tls else 1883),
        identifier=user,
        username=user,
        password=os.environ.get("MQTT_PASSWORD"),
        tls_context=tls,
        protocol=aiomqtt.ProtocolVersion.V5,
    ) as client:
        await client.publish(f"aegis/{factory}/factory_state", json.dumps(payload), qos=1)


asyncio.run(main())
