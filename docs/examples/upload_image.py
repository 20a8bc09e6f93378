"""Upload one camera image to AEGIS and announce it (pip install aiomqtt httpx; Python 3.11+).

MQTT_URL=mqtts://broker.example:8883 MQTT_USERNAME=factory-a MQTT_PASSWORD=... \
    python upload_image.py snapshot.jpg

1. subscribe to the answers (aegis/{factory}/upload_url/+), 2. ask for an upload
(aegis/{factory}/upload_request), 3. POST the image with the answer's form fields,
4. publish the image_snapshot message naming the key the answer gave.
"""

import asyncio
import json
import mimetypes
import os
import ssl
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import aiomqtt
import httpx


async def main(name: str, image: bytes) -> None:
    url, factory = urlsplit(os.environ["MQTT_URL"]), os.environ.get("FACTORY_ID", "factory-a")
    user = os.environ.get("MQTT_USERNAME")  # the broker binds the client id to it
    camera = os.environ.get("CAMERA_ID", "cam-01")
    captured = datetime.now(UTC)
    request_id = uuid.uuid4().hex  # names the reply topic; keep it when retrying this request
    request = {
        "request_id": request_id,
        "filename": f"{camera}-{captured:%Y%m%dT%H%M%S%f}{Path(name).suffix}",
        "captured_at": captured.isoformat(timespec="milliseconds"),
        "content_type": mimetypes.guess_type(name)[0] or "image/jpeg",
        "size_bytes": len(image),
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
        # subscribe first: an answer published before the subscription is not kept for us
        await client.subscribe(f"aegis/{factory}/upload_url/{request_id}", qos=1)
        await client.publish(f"aegis/{factory}/upload_request", json.dumps(request), qos=1)
        async with asyncio.timeout(30):
            message = await anext(aiter(client.messages))
        answer = json.loads(message.payload)  # type: ignore[arg-type]
        if answer["status"] != "granted":
            sys.exit(f"upload refused: {answer['reason']}: {answer['detail']}")

        # the form fields as given, then the file (last); S3 answers 204 No Content
        async with httpx.AsyncClient(timeout=60) as http:
            response = await http.post(
                answer["url"], data=answer["fields"], files={"file": (name, image)}
            )
        if response.status_code != 204:
            sys.exit(f"upload failed: {response.status_code} {response.text}")

        snapshot = {
            "message_id": uuid.uuid4().hex,
            "factory_id": factory,
            "device_id": os.environ.get("DEVICE_ID", "edge-01"),
            "emitted_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "schema_version": "1.0",
            "camera_id": camera,
            "filename": request["filename"],
            "content_type": request["content_type"],
            "size_bytes": len(image),
            "captured_at": request["captured_at"],
            "s3_key": answer["key"],
        }
        await client.publish(f"aegis/{factory}/image_snapshot", json.dumps(snapshot), qos=1)


path = Path(sys.argv[1])
asyncio.run(main(path.name, path.read_bytes()))
