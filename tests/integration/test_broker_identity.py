"""MQTT device identity on a real Mosquitto started with deploy/mosquitto/mosquitto.prod.conf
(paths and port moved into a temp folder, TLS with a CA made here): credentials and ACL written
by ``aegis devices``, ingest connecting through its own settings (AEGIS_MQTT_USERNAME/PASSWORD,
AEGIS_MQTT_CA_FILE, mqtts://)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiomqtt
import pytest

from aegis_cli.devices import Role
from aegis_devstack.testing.broker import Broker, connects, identity_broker, received_until
from aegis_ingest.mqtt import create_client
from aegis_ingest.settings import IngestSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROD_CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.prod.conf"


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, make_certs: Callable[[Path], None]
) -> Iterator[Broker]:
    identities = {
        "factory-a": Role.FACTORY,
        "factory-b": Role.FACTORY,
        "aegis-ingest": Role.INGEST,
    }
    with identity_broker(
        tmp_path_factory.mktemp("broker"), PROD_CONF, make_certs, identities
    ) as broker:
        yield broker


@pytest.fixture
async def ingest(broker: Broker) -> AsyncIterator[aiomqtt.Client]:
    """ingest's own MQTT client, configured the way a deployment configures it."""
    settings = IngestSettings(
        mqtt_url=broker.service_url,
        mqtt_username="aegis-ingest",
        mqtt_password=broker.passwords["aegis-ingest"],
        mqtt_ca_file=broker.ca_file,
        mqtt_client_id=f"aegis-ingest-{os.urandom(3).hex()}",
        # a group of its own: a previous test's session would otherwise take a share of the messages
        mqtt_share_group=f"ingest-{os.urandom(3).hex()}",
        mqtt_session_expiry_s=1,
    )
    assert settings.mqtt_endpoint()[1] == broker.service_port
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(create_client(settings))
        await client.subscribe(settings.subscription, qos=1)
        yield client


async def test_a_factory_publishes_only_under_its_own_id(broker, ingest):
    await broker.publish_as("factory-a", "aegis/factory-a/factory_state", b"a-own")
    await broker.publish_as("factory-a", "aegis/factory-b/factory_state", b"a-as-b")
    await broker.publish_as("factory-a", "aegis/factory-a/x/y", b"a-deeper")
    # factory-b's own message comes after the spoofs were answered: all of them were handled
    await broker.publish_as("factory-b", "aegis/factory-b/infra_state", b"b-own")
    got = await received_until(ingest, b"b-own")
    assert got == [
        ("aegis/factory-a/factory_state", b"a-own"),
        ("aegis/factory-b/infra_state", b"b-own"),
    ]


async def test_ingest_publishes_no_telemetry(broker, ingest):
    await broker.publish_as("aegis-ingest", "aegis/factory-a/factory_state", b"from-ingest")
    await broker.publish_as("factory-a", "aegis/factory-a/factory_state", b"marker-1")
    assert await received_until(ingest, b"marker-1") == [
        ("aegis/factory-a/factory_state", b"marker-1")
    ]


async def test_only_the_factory_reads_its_upload_answers_and_only_ingest_writes_them(broker):
    a_answers = "aegis/factory-a/upload_url/req-00000001"
    async with (
        broker.client("factory-a") as owner,
        broker.client("factory-b") as other,
    ):
        await owner.subscribe("aegis/factory-a/upload_url/+", qos=1)
        # another factory subscribing to them, by name and by wildcard, gets none of them (the
        # broker checks the read ACL on every message it would deliver)
        await other.subscribe("aegis/factory-a/upload_url/+", qos=1)
        await other.subscribe("aegis/+/upload_url/+", qos=1)
        await other.subscribe("aegis/factory-b/upload_url/+", qos=1)  # its own
        # only ingest's answer arrives: a factory cannot forge one, to itself or to another
        # (on the connections above: a device's client id is its name, a second one takes over)
        for forger, payload in ((other, b"forged-by-b"), (owner, b"forged-by-a")):
            with contextlib.suppress(aiomqtt.MqttCodeError):  # PUBACK 0x87
                await forger.publish(a_answers, payload, qos=1)
        await broker.publish_as("aegis-ingest", a_answers, b"answer-for-a")
        assert await received_until(owner, b"answer-for-a") == [(a_answers, b"answer-for-a")]
        # and factory-b saw none of it: its next message is its own answer
        b_answers = "aegis/factory-b/upload_url/req-00000002"
        await broker.publish_as("aegis-ingest", b_answers, b"answer-for-b")
        assert await received_until(other, b"answer-for-b") == [(b_answers, b"answer-for-b")]


async def test_a_factory_cannot_read_other_factories(broker, ingest):
    async with broker.client("factory-b") as spy:
        await spy.subscribe("aegis/#", qos=1)
        await broker.publish_as("factory-a", "aegis/factory-a/factory_state", b"secret-a")
        await received_until(ingest, b"secret-a")
        # the spy's subscription was refused: its own next message is not delivered to it either
        await spy.publish("aegis/factory-b/factory_state", b"spy-own", qos=1)
        await received_until(ingest, b"spy-own")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await anext(aiter(spy.messages))


@pytest.mark.parametrize(
    ("name", "password"),
    [
        ("factory-x", "whatever"),  # unknown client
        ("factory-a", "wrong-password"),
        (None, None),  # anonymous
        ("factory-a", ""),
    ],
)
async def test_unknown_clients_and_wrong_passwords_cannot_connect(broker, name, password):
    assert not await connects(broker.client(name, password))
    assert await connects(broker.client("factory-a"))


async def test_plain_mqtt_is_refused_on_the_tls_listener(broker):
    client = aiomqtt.Client(
        "127.0.0.1",
        broker.port,
        username="factory-a",
        password=broker.passwords["factory-a"],
        timeout=1,  # the TLS listener never answers a plain CONNECT: this is how long we wait
    )
    assert not await connects(client)


# paho drops the socket of a failed TLS handshake without closing it; collected here, not later
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_broker_presenting_an_unknown_certificate_is_refused(broker):
    assert not await connects(broker.client("factory-a", tls_context=ssl.create_default_context()))
    gc.collect()


async def test_a_revoked_device_cannot_connect_after_the_broker_reloads(broker):
    name = "factory-revoked"
    broker.passwords[name] = broker.registry.add(name, Role.FACTORY)
    broker.reload()
    await _until_login(broker, name, succeeds=True)
    async with broker.client(name) as connected:
        broker.registry.revoke(name)
        broker.reload()
        # the reload re-checks connected clients too: the open connection is cut
        with pytest.raises(aiomqtt.MqttError):
            async with asyncio.timeout(10):
                await anext(aiter(connected.messages))
    await _until_login(broker, name, succeeds=False)
    assert name not in {d.name for d in broker.registry.devices()}
    async with broker.client("factory-a"):  # the others are unaffected
        pass


async def _until_login(broker: Broker, name: str, *, succeeds: bool) -> None:
    """Wait (bounded) until the reloaded broker answers ``name``'s login the expected way."""
    deadline = time.monotonic() + 10
    while True:
        if await connects(broker.client(name)) == succeeds:
            return
        assert time.monotonic() < deadline, (
            f"login of {name} still {'fails' if succeeds else 'works'}"
        )
        await asyncio.sleep(0.1)


async def test_a_device_cannot_take_over_the_ingest_session_by_its_client_id(broker):
    """A compromised gateway connects with ingest's client id, again and again: on the devices'
    listener its id is its own name, so ingest's connection is never kicked."""
    victim_id = f"aegis-ingest-{os.urandom(3).hex()}"
    async with broker.client("aegis-ingest", identifier=victim_id) as ingest:
        await ingest.subscribe("aegis/+/+", qos=1)
        for _ in range(3):
            async with broker.client("factory-a", identifier=victim_id) as attacker:
                await attacker.publish("aegis/factory-a/factory_state", b"takeover", qos=1)
        # ingest is still connected and still receives (a kicked client would raise here)
        await broker.publish_as("factory-b", "aegis/factory-b/factory_state", b"after-takeover")
        got = await received_until(ingest, b"after-takeover")
        assert got[-1] == ("aegis/factory-b/factory_state", b"after-takeover")


async def test_each_kind_of_identity_logs_in_only_on_its_own_listener(broker):
    # a device's credentials do not open the services' listener, nor a service's the devices'
    assert not await connects(broker.client("factory-a", port=broker.service_port))
    assert not await connects(broker.client("aegis-ingest", port=broker.port))
    assert await connects(broker.client("factory-a"))
    assert await connects(broker.client("aegis-ingest"))
