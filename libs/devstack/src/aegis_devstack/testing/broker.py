"""A real Mosquitto with identities: the production config (``deploy/mosquitto/mosquitto.prod.conf``)
moved into a test's folder and onto free ports, TLS with a CA the test makes, and the password
and ACL files written by ``aegis devices`` (:class:`aegis_cli.devices.DeviceRegistry`), so a test
sees what the broker's ACL lets each identity do."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiomqtt

from aegis_cli.devices import SERVICE_PREFIX, DeviceRegistry, Role
from aegis_devstack.localservers import ManagedServer, free_port, port_open, start_managed_server

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
PERSIST_PLUGIN = "global_plugin /usr/lib/mosquitto_persist_sqlite.so\nplugin_opt_flush_period 1\n"


def prod_config(text: str, folder: Path, device_port: int, service_port: int) -> str:
    """The production config ``text``, moved into ``folder`` and onto the two ports. The one
    other change: a machine whose Mosquitto is 2.0 has no persist-sqlite plugin, so the sessions
    use the built-in persistence file there (identity and ACL are the same)."""
    for original, moved in (
        ("/mosquitto/config/", f"{folder}/"),
        ("/mosquitto/certs/", f"{folder}/"),
        ("/mosquitto/data/", f"{folder}/data/"),
        ("\nlistener 8883\n", f"\nlistener {device_port} 127.0.0.1\n"),
        ("\nlistener 8884\n", f"\nlistener {service_port} 127.0.0.1\n"),
    ):
        if original not in text:
            raise ValueError(f"the production config no longer has {original.strip()!r}")
        text = text.replace(original, moved)
    if PERSIST_PLUGIN not in text:
        raise ValueError("the production config no longer loads the persist-sqlite plugin")
    if not Path(PERSIST_PLUGIN.split()[1]).is_file():
        text = text.replace(PERSIST_PLUGIN, "persistence true\n")
    # run as root (CI containers) it would switch to the mosquitto user, who cannot read tmp
    return text + "user root\n"


@dataclass
class Broker:
    server: ManagedServer
    port: int  # the devices' listener
    service_port: int  # the services' listener
    registry: DeviceRegistry
    ca_file: Path
    passwords: dict[str, str]

    @property
    def device_url(self) -> str:
        return f"mqtts://127.0.0.1:{self.port}"

    @property
    def service_url(self) -> str:
        return f"mqtts://127.0.0.1:{self.service_port}"

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
        service = name is not None and name.startswith(SERVICE_PREFIX)
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

    async def publish_as(self, name: str, topic: str, payload: bytes) -> None:
        """Publish once as ``name`` (QoS 1). A refused publish is not an error here: MQTT v5
        answers it with PUBACK 0x87, and what a test checks is delivery."""
        async with self.client(name) as client:
            with contextlib.suppress(aiomqtt.MqttCodeError):
                await client.publish(topic, payload, qos=1)

    def reload(self) -> None:
        assert self.server.process is not None
        self.server.process.send_signal(signal.SIGHUP)


@contextlib.contextmanager
def identity_broker(
    folder: Path,
    prod_conf: Path,
    make_certs: Callable[[Path], None],
    identities: Mapping[str, Role],
) -> Iterator[Broker]:
    """Mosquitto on ``prod_conf`` in ``folder`` (certificates by ``make_certs``: ca.crt,
    server.crt, server.key), each of ``identities`` added with its role; stopped on exit."""
    (folder / "data").mkdir(parents=True, exist_ok=True)
    make_certs(folder)
    registry = DeviceRegistry(folder / "passwd", folder / "acl")
    passwords = {name: registry.add(name, role) for name, role in identities.items()}
    port, service_port = free_port(), free_port()
    conf = folder / "mosquitto.conf"
    conf.write_text(prod_config(prod_conf.read_text(), folder, port, service_port))
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


async def received_until(client: aiomqtt.Client, marker: bytes) -> list[tuple[str, bytes]]:
    """Every message up to and including the one whose payload is ``marker`` (10 s at most)."""
    got: list[tuple[str, bytes]] = []
    async with asyncio.timeout(10):
        async for message in client.messages:
            payload = message.payload if isinstance(message.payload, bytes) else b""
            got.append((str(message.topic), payload))
            if payload == marker:
                return got
    raise AssertionError("the messages ended before the marker")
