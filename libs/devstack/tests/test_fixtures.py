"""The plugin's fixtures hand out URLs that real clients can use."""

from __future__ import annotations

import asyncio
import re
from urllib.parse import urlsplit

import aiomqtt
import nats
import pytest
from aiobotocore.session import get_session

pytestmark = pytest.mark.integration


def test_unique_id_fits_factory_ids_buckets_and_streams(unique_id: str) -> None:
    assert re.fullmatch(r"t-[0-9a-f]{8}", unique_id)
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", unique_id)  # the MQTT contract's factory_id


async def test_aws_endpoint_serves_s3_and_dynamodb(aws_endpoint: str, unique_id: str) -> None:
    assert aws_endpoint.startswith("http")
    session = get_session()
    bucket = f"aegis-{unique_id}"
    async with session.create_client(
        "s3",
        region_name="ap-south-1",
        endpoint_url=aws_endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as s3:
        await s3.create_bucket(
            Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
        )
        await s3.put_object(Bucket=bucket, Key="raw/probe.json", Body=b"{}")
        got = await s3.get_object(Bucket=bucket, Key="raw/probe.json")
        async with got["Body"] as body:
            assert await body.read() == b"{}"
    async with session.create_client(
        "dynamodb",
        region_name="ap-south-1",
        endpoint_url=aws_endpoint,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as dynamodb:
        assert "TableNames" in await dynamodb.list_tables()


async def test_mqtt_url_carries_a_v5_round_trip(mqtt_url: str, unique_id: str) -> None:
    parts = urlsplit(mqtt_url)
    assert parts.scheme == "mqtt"
    assert parts.hostname
    assert parts.port
    topic = f"aegis/{unique_id}/factory_state"
    async with aiomqtt.Client(
        parts.hostname, parts.port, identifier=unique_id, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        await client.subscribe(topic, qos=1)
        await client.publish(topic, b'{"probe": true}', qos=1)
        async with asyncio.timeout(5):
            message = await anext(aiter(client.messages))
    assert str(message.topic) == topic
    assert message.payload == b'{"probe": true}'


async def test_nats_url_has_jetstream(nats_url: str, unique_id: str) -> None:
    client = await nats.connect(nats_url, connect_timeout=2, max_reconnect_attempts=0)
    try:
        jsm = client.jsm()
        info = await jsm.account_info()
        assert info.limits is not None
        stream = f"AEGIS_TEST_{unique_id}"
        await jsm.add_stream(name=stream, subjects=[f"{unique_id}.>"])
        try:
            ack = await client.jetstream().publish(f"{unique_id}.probe", b"x")
            assert ack.stream == stream
            assert ack.seq == 1
        finally:
            await jsm.delete_stream(stream)
    finally:
        await client.close()
