"""MQTT device identity on a real Mosquitto started with deploy/mosquitto/mosquitto.prod.conf
(paths and port moved into a temp folder, TLS with a CA made here): credentials and ACL written
by ``aegis devices``, ingest connecting through its own settings (AEGIS_MQTT_USERNAME/PASSWORD,
AEGIS_MQTT_CA_FILE, mqtts://)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from aegis_cli.devices import DeviceRegistry, Role
from aegis_devstack.localservers import ManagedServer, free_port, port_open, start_managed_server
from aegis_ingest.mqtt import create_client
from aegis_ingest.settings import IngestSettings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROD_CONF = ROOT / "deploy" / "mosquitto" / "mosquitto.prod.conf"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


PERSIST_PLUGIN = "global_plugin /usr/lib/mosquitto_persist_sqlite.so\nplugin_opt_flush_period 1\n"


def test_config(folder: Path, device_port: int, service_port: int) -> str:
    """The production config, moved into ``folder`` and onto the two ports. The one other change:
    a machine whose Mosquitto is 2.0 has no persist-sqlite plugin, so the sessions use the
    built-in persistence file there (identity and ACL, what these tests check, are the same)."""
    text = PROD_CONF.read_text()
    for original, moved in (
        ("/mosquitto/config/", f"{folder}/"),
        ("/mosquitto/certs/", f"{folder}/"),
        ("/mosquitto/data/", f"{folder}/data/"),
        ("\nlistener 8883\n", f"\nlistener {device_port} 127.0.0.1\n"),
        ("\nlistener 8884\n", f"\nlistener {service_port} 127.0.0.1\n"),
    ):
        assert original in text, original
        text = text.replace(original, moved)
    assert PERSIST_PLUGIN in text
    if not Path(PERSIST_PLUGIN.split()[1]).is_file():
        text = text.replace(PERSIST_PLUGIN, "persistence true\n")
    # run as root (CI containers) it would switch to the mosquitto user, who cannot read tmp
    return text + "user root\n"


test_config.__test__ = False  # type: ignore[attr-defined]


@dataclass
class Broker:
    server: ManagedServer
    port: int  # the devices' listener
    service_port: int  # the services' listener
    registry: DeviceRegistry
    ca_file: Path
    passwords: dict[str, str]

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def client(
        self,
        name: str | None,
        password: str | None = None,
        *,
        port: int | None = None,
        identifier: str | None = None,
        **kw: object,
    ) -> aiomqtt.Client:
        """A client on the listener its kind uses (services: theirs; devices: theirs)."""
        if name is not None and password is None:
            password = self.passwords[name]
        service = name is not None and name.startswith("aegis-")
        return aiomqtt.Client(
            "127.0.0.1",
            port or (self.service_port if service else self.port),
            username=name,
            password=password,
            identifier=identifier or f"{name or 'anon'}-{os.urandom(3).hex()}",
            protocol=aiomqtt.ProtocolVersion.V5,
            timeout=5,
            tls_context=kw.pop("tls_context", self.tls()),  # type: ignore[arg-type]
        )

    def reload(self) -> None:
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGHUP)


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, make_certs: Callable[[Path], None]
) -> Iterator[Broker]:
    folder = tmp_path_factory.mktemp("broker")
    (folder / "data").mkdir()
    make_certs(folder)
    registry = DeviceRegistry(folder / "passwd", folder / "acl")
    passwords = {
        "factory-a": registry.add("factory-a", Role.FACTORY),
        "factory-b": registry.add("factory-b", Role.FACTORY),
        "aegis-ingest": registry.add("aegis-ingest", Role.INGEST),
    }
    port, service_port = free_port(), free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(test_config(folder, port, service_port))
    server = start_managed_server(
        f"mqtts://127.0.0.1:{port}",
        [MOSQUITTO, "-c", str(conf)],
        folder / "mosquitto.log",
        ready=lambda _url: port_open("127.0.0.1", port) and port_open("127.0.0.1", service_port),
    )
    try:
        yield Broker(server, port, service_port, registry, folder / "ca.crt", passwords)
    finally:
        server.stop()


@pytest.fixture
async def ingest(broker: Broker) -> AsyncIterator[aiomqtt.Client]:
    """ingest's own MQTT client, configured the way a deployment configures it."""
    settings = IngestSettings(
        mqtt_url=f"mqtts://127.0.0.1:{broker.service_port}",
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


async def received_until(client: aiomqtt.Client, marker: bytes) -> list[tuple[str, bytes]]:
    """Every message up to and including the one whose payload is ``marker``."""
    got: list[tuple[str, bytes]] = []
    async with asyncio.timeout(10):
        async for message in client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else b""
            got.append((str(message.topic), payload))
            if payload == marker:
                return got
    raise AssertionError("unreachable")


async def connects(client: aiomqtt.Client) -> bool:
    """Whether ``client`` gets in; a refused client's socket is closed here (aiomqtt leaves the
    paho socket of a refused CONNECT open, which pytest reports as an unclosed resource)."""
    try:
        async with client:
            return True
    except aiomqtt.MqttError:
        sock = client._client.socket()
        if sock is not None:
            sock.close()
        return False


async def publish(broker: Broker, name: str, topic: str, payload: bytes) -> None:
    async with broker.client(name) as client:
        # MQTT v5 answers a refused publish with PUBACK 0x87; what matters is delivery
        with contextlib.suppress(aiomqtt.MqttCodeError):
            await client.publish(topic, payload, qos=1)


async def test_a_factory_publishes_only_under_its_own_id(broker, ingest):
    await publish(broker, "factory-a", "aegis/factory-a/factory_state", b"a-own")
    await publish(broker, "factory-a", "aegis/factory-b/factory_state", b"a-as-b")
    await publish(broker, "factory-a", "aegis/factory-a/x/y", b"a-deeper")
    # factory-b's own message comes after the spoofs were answered: all of them were handled
    await publish(broker, "factory-b", "aegis/factory-b/infra_state", b"b-own")
    got = await received_until(ingest, b"b-own")
    assert got == [
        ("aegis/factory-a/factory_state", b"a-own"),
        ("aegis/factory-b/infra_state", b"b-own"),
    ]


async def test_ingest_subscribes_but_cannot_publish(broker, ingest):
    await publish(broker, "aegis-ingest", "aegis/factory-a/factory_state", b"from-ingest")
    await publish(broker, "factory-a", "aegis/factory-a/factory_state", b"marker-1")
    assert await received_until(ingest, b"marker-1") == [
        ("aegis/factory-a/factory_state", b"marker-1")
    ]


async def test_a_factory_cannot_read_other_factories(broker, ingest):
    async with broker.client("factory-b") as spy:
        await spy.subscribe("aegis/#", qos=1)
        await publish(broker, "factory-a", "aegis/factory-a/factory_state", b"secret-a")
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
        await publish(broker, "factory-b", "aegis/factory-b/factory_state", b"after-takeover")
        got = await received_until(ingest, b"after-takeover")
        assert got[-1] == ("aegis/factory-b/factory_state", b"after-takeover")


async def test_each_kind_of_identity_logs_in_only_on_its_own_listener(broker):
    # a device's credentials do not open the services' listener, nor a service's the devices'
    assert not await connects(broker.client("factory-a", port=broker.service_port))
    assert not await connects(broker.client("aegis-ingest", port=broker.port))
    assert await connects(broker.client("factory-a"))
    assert await connects(broker.client("aegis-ingest"))
