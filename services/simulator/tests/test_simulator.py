"""``aegis simulate`` and the simulator service against real Mosquitto and the S3 emulator."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiomqtt
import pytest

from aegis_contracts.ids import SourceType, parse_topic
from aegis_contracts.payloads import ImageSnapshotMessage, parse_device_message
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.cli import run_aegis
from aegis_devstack.testing.storage import Foundation
from aegis_simulator.app import SimulatorSettings, serve
from aegis_simulator.domain import PNG_SIGNATURE

pytestmark = pytest.mark.integration

QUIET_S = 0.75  # no message for this long after the run ended: everything has arrived


@dataclass
class Received:
    topic: str
    payload: bytes


def _env(mqtt_url: str, aws_endpoint: str, foundation: Foundation) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")}
    env.update(
        AEGIS_MQTT_URL=mqtt_url,
        AEGIS_AWS_ENDPOINT_URL=aws_endpoint,
        AEGIS_BUCKET=foundation.bucket,
        AEGIS_TABLE=foundation.table,
        AEGIS_LOG_FORMAT="json",
    )
    return env


async def _simulate_and_collect(
    args: list[str], factory: str, env: dict[str, str], mqtt_url: str
) -> tuple[int, str, str, list[Received]]:
    url = urlsplit(mqtt_url)
    received: list[Received] = []
    async with aiomqtt.Client(
        url.hostname or "127.0.0.1", url.port or 1883, protocol=aiomqtt.ProtocolVersion.V5
    ) as sub:
        await sub.subscribe(f"aegis/{factory}/#", qos=1)
        messages = sub.messages

        async def collect() -> None:
            async for message in messages:
                assert isinstance(message.payload, bytes)
                received.append(Received(str(message.topic), message.payload))

        collector = asyncio.create_task(collect())
        try:
            code, out, err = await run_aegis(env, "simulate", "--factories", factory, *args)
            count = -1
            while count != len(received):  # until quiet
                count = len(received)
                await asyncio.sleep(QUIET_S)
        finally:
            collector.cancel()
            await asyncio.gather(collector, return_exceptions=True)
    return code, out, err, received


async def test_simulate_publishes_valid_messages_and_uploads_images(
    mqtt_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    factory = f"f-{unique_id}"
    code, out, err, received = await _simulate_and_collect(
        ["--duration", "4", "--rate", "4", "--seed", "3"],
        factory,
        _env(mqtt_url, aws_endpoint, foundation),
        mqtt_url,
    )
    assert code == 0, err
    assert "total" in out and "image_snapshot" in out
    sources = Counter(parse_topic(r.topic)[1] for r in received)
    assert set(sources) == set(SourceType), sources
    assert sources[SourceType.FACTORY_STATE] >= 5
    images = 0
    for r in received:
        topic_factory, source = parse_topic(r.topic)
        assert topic_factory == factory
        message = parse_device_message(source, r.payload, topic_factory_id=factory)
        if isinstance(message, ImageSnapshotMessage):
            body = await foundation.store.get_bytes(message.s3_key)
            assert body.startswith(PNG_SIGNATURE) and len(body) == message.size_bytes
            head = await foundation.store.head(message.s3_key)
            assert head is not None and head["ContentType"] == "image/png"
            images += 1
    assert images >= 1
    ids = [
        parse_device_message(
            parse_topic(r.topic)[1], r.payload, topic_factory_id=factory
        ).message_id
        for r in received
    ]
    assert len(ids) == len(set(ids))


async def test_simulate_duplicate_delivers_the_same_bytes_twice(
    mqtt_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    factory = f"f-{unique_id}"
    code, out, err, received = await _simulate_and_collect(
        ["--duration", "3", "--rate", "4", "--no-images", "--scenario", "duplicate", "--qos", "1"],
        factory,
        _env(mqtt_url, aws_endpoint, foundation),
        mqtt_url,
    )
    assert code == 0, err
    assert "of which duplicate" in out
    payloads = Counter(r.payload for r in received)
    assert payloads and all(n == 2 for n in payloads.values())


async def test_simulate_against_an_unreachable_broker_exits_2(
    aws_endpoint: str, foundation: Foundation
) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    env = _env(url, aws_endpoint, foundation)
    code, _, err = await run_aegis(env, "simulate", "--duration", "2")
    assert code == 2
    assert url in err


async def test_service_publishes_until_stopped_and_reports_ready(
    mqtt_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    factory = f"f-{unique_id}"
    settings = SimulatorSettings(
        mqtt_url=mqtt_url,
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        simulator_factories=factory,
        simulator_scenarios="off",
        health_port=0,
    )
    url = urlsplit(mqtt_url)
    stop = asyncio.Event()
    async with aiomqtt.Client(
        url.hostname or "127.0.0.1", url.port or 1883, protocol=aiomqtt.ProtocolVersion.V5
    ) as sub:
        await sub.subscribe(f"aegis/{factory}/#", qos=1)
        service = asyncio.create_task(serve(settings, stop))
        seen: set[str] = set()
        try:
            async with asyncio.timeout(15):
                async for message in sub.messages:
                    seen.add(str(message.topic).rsplit("/", 1)[1])
                    if seen == {s.value for s in SourceType}:
                        break
        finally:
            stop.set()
            await asyncio.wait_for(service, timeout=15)
    assert seen == {s.value for s in SourceType}


async def test_health_endpoint_of_the_service(
    mqtt_url: str, aws_endpoint: str, foundation: Foundation, unique_id: str
) -> None:
    port = free_port()
    settings = SimulatorSettings(
        mqtt_url=mqtt_url,
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        simulator_factories=f"f-{unique_id}",
        simulator_scenarios="off",
        simulator_images=False,
        health_port=port,
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(settings, stop))
    try:
        async with asyncio.timeout(10):
            while True:
                status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz")
                if status == 200:
                    break
                await asyncio.sleep(0.1)
        assert json.loads(body)["checks"] == {"mqtt": True}
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=15)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read()
    except OSError:
        return 0, b""
