"""A gateway's image upload end to end, on the production broker config (identities and ACL
from ``aegis devices``, TLS), the S3 emulator, NATS JetStream, the real ingest and the real
processor: the gateway asks for an upload on its own topic, reads the presigned POST on its reply
topic, uploads, publishes the image's metadata, and the processor files it. Another factory's
identity cannot read that reply, and the POST it carries writes nothing under its own prefix.
A refused request is answered with its reason, dead-lettered and counted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import aiomqtt
import nats
import pytest
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import TypeAdapter

from aegis_cli.devices import Role
from aegis_contracts.keys import image_snapshot_key, processed_prefix
from aegis_contracts.subjects import DEAD_LETTER
from aegis_contracts.times import parse_iso
from aegis_contracts.uploads import (
    UPLOAD_TYPE_NOT_ALLOWED,
    UploadAnswer,
    UploadGranted,
    UploadRefused,
)
from aegis_devstack.testing.broker import Broker, identity_broker
from aegis_devstack.testing.emulator import post_form
from aegis_devstack.testing.serving import serving
from aegis_devstack.testing.streams import dead_letters
from aegis_devstack.testing.waiting import eventually
from aegis_ingest.app import IngestApp, create_app
from aegis_ingest.settings import IngestSettings

if TYPE_CHECKING:
    from aegis_devstack.testing.storage import Foundation

pytestmark = pytest.mark.integration

PROD_CONF = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "mosquitto.prod.conf"
# the broker's identities are the module's: factory ids of its own
A, B = f"up-a-{os.urandom(3).hex()}", f"up-b-{os.urandom(3).hex()}"
INGEST = "aegis-ingest"
IMAGE = b"\x89PNG\r\n\x1a\n" + b"snapshot" * 64
CAPTURED = "2026-11-30T03:15:00.000Z"
ANSWERS = TypeAdapter(UploadAnswer)


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, make_certs: Callable[[Path], None]
) -> Iterator[Broker]:
    identities = {A: Role.FACTORY, B: Role.FACTORY, INGEST: Role.INGEST}
    with identity_broker(tmp_path_factory.mktemp("broker"), PROD_CONF, make_certs, identities) as b:
        yield b


@pytest.fixture
async def ingest(
    broker: Broker, foundation: Foundation, aws_endpoint: str, nats_url: str, unique_id: str
) -> AsyncIterator[IngestApp]:
    """The real ingest on the services' listener, as its own identity, until the test ends."""
    settings = IngestSettings(
        service=f"ingest-{unique_id}",
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        nats_url=nats_url,
        mqtt_url=broker.service_url,
        mqtt_username=INGEST,
        mqtt_password=broker.passwords[INGEST],
        mqtt_ca_file=broker.ca_file,
        mqtt_client_id=f"aegis-ingest-{unique_id}",
        mqtt_share_group=f"g-{unique_id}",
        mqtt_session_expiry_s=5,
        ingest_upload_content_types=["image/png", "image/jpeg"],
        ingest_upload_max_bytes=64 * 1024,
        health_port=0,
    )
    app = create_app(settings)
    async with serving(app, app.subscribed):
        yield app


@pytest.fixture
async def js(nats_url: str, unique_id: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(nats_url)
    try:
        yield nc.jetstream()
    finally:
        with contextlib.suppress(NotFoundError):
            await nc.jetstream().purge_stream(
                "AEGIS_DLQ", subject=f"{DEAD_LETTER}.ingest-{unique_id}.>"
            )
        await nc.close()


def request(request_id: str, *, content_type: str = "image/png", size: int = len(IMAGE)) -> bytes:
    return json.dumps(
        {
            "request_id": request_id,
            "filename": f"cam-01-{request_id}.png",
            "captured_at": CAPTURED,
            "content_type": content_type,
            "size_bytes": size,
        }
    ).encode()


async def answer_of(client: aiomqtt.Client) -> tuple[str, UploadGranted | UploadRefused]:
    async with asyncio.timeout(10):
        message = await anext(aiter(client.messages))
    assert isinstance(message.payload, bytes)
    return str(message.topic), ANSWERS.validate_json(message.payload)


async def test_a_gateway_uploads_an_image_the_processor_files_and_no_other_factory_can_use(
    broker, ingest, foundation, run_processor
):
    async with (
        run_processor(f"aegis.raw.{A}.>"),
        broker.client(A) as gateway,
        broker.client(B) as other,
    ):
        await gateway.subscribe(f"aegis/{A}/upload_url/+", qos=1)
        # B listens for A's answers, by name and by wildcard, and for its own
        await other.subscribe(f"aegis/{A}/upload_url/+", qos=1)
        await other.subscribe("aegis/+/upload_url/+", qos=1)
        await other.subscribe(f"aegis/{B}/upload_url/+", qos=1)

        await gateway.publish(f"aegis/{A}/upload_request", request("req-a-000001"), qos=1)
        topic, granted = await answer_of(gateway)
        assert topic == f"aegis/{A}/upload_url/req-a-000001"
        assert isinstance(granted, UploadGranted)
        key = image_snapshot_key(A, parse_iso(CAPTURED), "cam-01-req-a-000001.png")
        assert (granted.key, granted.fields["key"]) == (key, key)
        assert granted.content_type == "image/png" and granted.size_bytes == len(IMAGE)

        # B holds A's answer (as if it had leaked) and tries it on its own prefix: refused
        own_key = key.replace(f"factory_id={A}/", f"factory_id={B}/")
        status, text = await post_form(granted.url, {**granted.fields, "key": own_key}, IMAGE)
        assert status == 403 and "Policy Condition failed" in text
        assert not await foundation.store.exists(own_key)

        # the gateway uploads, then publishes the image's metadata as it always did
        assert (await post_form(granted.url, granted.fields, IMAGE))[0] == 204
        snapshot = {
            "message_id": "img-req-a-000001",
            "factory_id": A,
            "device_id": "edge-01",
            "emitted_at": CAPTURED,
            "schema_version": "1.0",
            "camera_id": "cam-01",
            "filename": "cam-01-req-a-000001.png",
            "content_type": granted.content_type,
            "size_bytes": granted.size_bytes,
            "captured_at": CAPTURED,
            "s3_key": granted.key,
        }
        await gateway.publish(f"aegis/{A}/image_snapshot", json.dumps(snapshot), qos=1)

        async def filed() -> bool:
            latest = await foundation.readmodel.get_latest(A)
            image = (latest or {}).get("latest_image_snapshot") or {}
            return image.get("s3_key") == key

        await eventually(filed, what="the processor filed the image in LATEST")
        processed = await foundation.store.list_keys(processed_prefix(A, "image_snapshot"))
        assert len(processed) == 1
        stored = await foundation.store.get_object(key)
        assert (stored.body, stored.content_type) == (IMAGE, "image/png")

        # B saw none of A's answers: the next it gets is the answer to its own request
        await other.publish(f"aegis/{B}/upload_request", request("req-b-000001"), qos=1)
        topic, own = await answer_of(other)
        assert topic == f"aegis/{B}/upload_url/req-b-000001" and isinstance(own, UploadGranted)
        assert own.key.startswith(f"image_snapshot/factory_id={B}/")
    assert ingest.metrics.total("messages_total", consumer="mqtt", outcome="upload_granted") == 2


async def test_a_refused_request_is_answered_with_its_reason_dead_lettered_and_counted(
    broker, ingest, js
):
    async with broker.client(A) as gateway:
        await gateway.subscribe(f"aegis/{A}/upload_url/+", qos=1)
        await gateway.publish(
            f"aegis/{A}/upload_request", request("req-a-gif-01", content_type="image/gif"), qos=1
        )
        topic, refused = await answer_of(gateway)
    assert topic == f"aegis/{A}/upload_url/req-a-gif-01"
    assert isinstance(refused, UploadRefused)
    assert refused.reason == UPLOAD_TYPE_NOT_ALLOWED and "image/gif" in refused.detail
    service = ingest.settings.service
    [letter] = await dead_letters(js, service, UPLOAD_TYPE_NOT_ALLOWED)
    assert letter.subject == f"aegis/{A}/upload_request" and letter.detail == refused.detail
    assert ingest.metrics.total("dead_letters_total", reason=UPLOAD_TYPE_NOT_ALLOWED) == 1
