"""Half-open connections: the path between ingest and Mosquitto, or between ingest and NATS,
drops every packet without a FIN or an RST (a link cut on a network of the test's own,
:mod:`aegis_devstack.testing.netlab`), so neither end is told. Ingest must notice by its own
keepalive (MQTT) or pings (NATS) within what its settings allow, and lose nothing: every
message the device published before, during and after the cut is archived (raw object and raw
event) exactly once.

Mosquitto and NATS run each on a host of their own; the device publishes from Mosquitto's host
(so a cut of that host's link separates ingest from the broker, not the device from it); ingest
runs in this process, joined to the network, with the S3 emulator on this machine's loopback.
The keepalive and the pings are set short, as a test may: the bounds are read from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import nats
import nats.js.errors
import pytest

from aegis_contracts.events import RawArchived
from aegis_contracts.keys import raw_prefix
from aegis_contracts.times import utc_now
from aegis_devstack.localservers import ManagedServer, start_private_mosquitto, start_private_nats
from aegis_devstack.testing.devices import factory_state_message
from aegis_devstack.testing.natscluster import nats_server_binary
from aegis_devstack.testing.netlab import Host, Network
from aegis_devstack.testing.waiting import eventually
from aegis_ingest.app import IngestApp, create_app
from aegis_ingest.settings import IngestSettings
from aegis_runtime import natsio

if TYPE_CHECKING:
    from aegis_devstack.testing.storage import Foundation

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.skipif(
        nats_server_binary() is None
        or not (shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")),
        reason="nats-server and mosquitto are needed (apt install nats-server mosquitto)",
    ),
]

RAW_STREAM = "AEGIS_RAW"
# messages the device publishes before the cut, during it, and after the heal
BATCH = 5
# what the device runs on the broker's host: publish each payload of stdin (a JSON list) at
# QoS 1, each waiting for the broker's PUBACK; exit 0 once the broker has taken them all
DEVICE = """
import asyncio, json, sys
import aiomqtt

async def main() -> None:
    host, port, topic, identifier = sys.argv[1:5]
    async with aiomqtt.Client(
        host, int(port), identifier=identifier, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        for payload in json.loads(sys.stdin.read()):
            await client.publish(topic, payload.encode(), qos=1)

asyncio.run(main())
"""


@dataclass
class Site:
    """Mosquitto on one host, NATS on another, the device beside Mosquitto."""

    network: Network
    broker_host: Host
    bus_host: Host
    mosquitto: ManagedServer
    nats: ManagedServer


@pytest.fixture
def site(network: Network) -> Iterator[Site]:
    broker_host, bus_host = network.host("mqtt"), network.host("nats")
    mosquitto = start_private_mosquitto(host=broker_host.address, prefix=broker_host.prefix)
    try:
        bus = start_private_nats(host=bus_host.address, prefix=bus_host.prefix)
        try:
            yield Site(network, broker_host, bus_host, mosquitto, bus)
        finally:
            bus.close()
    finally:
        mosquitto.close()


@dataclass
class Device:
    site: Site
    factory: str
    identifier: str
    sent: int = 0

    async def publish(self, count: int) -> list[str]:
        """``count`` new messages, published from the broker's host; their message ids."""
        ids = [f"msg-{n:08d}" for n in range(self.sent, self.sent + count)]
        self.sent += count
        payloads = [factory_state_message(self.factory, i, utc_now()).decode() for i in ids]
        url = urlsplit(self.site.mosquitto.url)
        process = await asyncio.create_subprocess_exec(
            *self.site.broker_host.prefix,
            sys.executable,
            "-c",
            DEVICE,
            url.hostname or "",
            str(url.port),
            f"aegis/{self.factory}/factory_state",
            self.identifier,
            stdin=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, errors = await asyncio.wait_for(process.communicate(json.dumps(payloads).encode()), 30)
        assert process.returncode == 0, f"the device failed: {errors.decode()}"
        return ids


def ingest_settings(
    site: Site, foundation: Foundation, aws_endpoint: str, unique_id: str
) -> IngestSettings:
    """Ingest on the site, with the shortest keepalive its settings allow, pings every second,
    and quick reconnects (a test's, not production's)."""
    return IngestSettings(
        service=f"ingest-{unique_id}",
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        mqtt_url=site.mosquitto.url,
        nats_url=site.nats.url,
        mqtt_client_id=f"ingest-{unique_id}",
        mqtt_share_group=f"g-{unique_id}",
        mqtt_session_expiry_s=120,
        mqtt_keepalive_s=5,
        mqtt_reconnect_min_s=0.2,
        mqtt_reconnect_max_s=1.0,
        nats_ping_interval_s=1.0,
        nats_max_outstanding_pings=2,
        ingest_shutdown_grace_s=5,
    )


@contextlib.asynccontextmanager
async def serving(app: IngestApp) -> AsyncIterator[IngestApp]:
    """``app`` running until the block ends, subscribed when the block begins."""
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        await eventually(
            lambda: app.subscribed.is_set() or task.done(), within=20, what="ingest subscribed"
        )
        if task.done():
            task.result()  # what broke its start
        yield app
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def archived(site: Site, foundation: Foundation, factory: str) -> Counter[str]:
    """Each message id of ``factory`` in the raw stream, with how many times it is there; only
    those whose raw object is in the bucket too."""
    listed = await foundation.clients.s3.list_objects_v2(
        Bucket=foundation.bucket, Prefix=raw_prefix(factory)
    )
    objects = {item["Key"] for item in listed.get("Contents", [])}
    nc = await nats.connect(site.nats.url)
    try:
        js = nc.jetstream()
        found: Counter[str] = Counter()
        try:
            state = (await js.stream_info(RAW_STREAM)).state
        except nats.js.errors.NotFoundError:
            return found
        for seq in range(state.first_seq, state.last_seq + 1) if state.messages else ():
            event = RawArchived.model_validate_json((await js.get_msg(RAW_STREAM, seq)).data)
            if event.factory_id == factory and event.key in objects:
                found[event.message_id] += 1
        return found
    finally:
        await nc.close()


async def heal_and_archive(
    host: Host, device: Device, foundation: Foundation, sent: list[str]
) -> tuple[list[str], float]:
    """Heal ``host``'s link and publish another batch: every message the device sent, and the
    seconds from the heal until all of them were archived."""
    await asyncio.to_thread(device.site.network.heal, host)
    healed_at = time.monotonic()
    sent = sent + await device.publish(BATCH)
    await all_archived(device, foundation, sent, within=40)
    return sent, time.monotonic() - healed_at


async def all_archived(
    device: Device, foundation: Foundation, ids: list[str], within: float
) -> None:
    """Wait until every message of ``ids`` is archived."""

    async def done() -> bool:
        return set(ids) <= set(await archived(device.site, foundation, device.factory))

    await eventually(done, within=within, what=f"{len(ids)} messages archived")


async def detected(connected: Callable[[], bool], within: float) -> float:
    """Seconds until ``connected()`` turns false (polled every 50 ms), at most ``within``."""
    cut_at = time.monotonic()
    await eventually(lambda: not connected(), within=within, what="the cut noticed")
    return time.monotonic() - cut_at


async def test_ingest_notices_a_silent_mqtt_broker_by_its_keepalive_and_loses_nothing(
    site: Site, foundation: Foundation, aws_endpoint: str, unique_id: str
) -> None:
    settings = ingest_settings(site, foundation, aws_endpoint, unique_id)
    device = Device(site, f"f-{unique_id}", f"device-{unique_id}")
    async with serving(create_app(settings)) as app:
        before = await device.publish(BATCH)
        await all_archived(device, foundation, before, within=15)
        assert app.mqtt_connected
        await asyncio.to_thread(site.network.cut, site.broker_host)
        # the device goes on publishing to the broker, which queues for ingest's session
        during = await device.publish(BATCH)
        # paho sends a PINGREQ after a keepalive without traffic, gives the connection up when
        # another keepalive passes unanswered, and looks once a second
        bound = 2 * settings.mqtt_keepalive_s + 1.0
        detection_s = await detected(lambda: app.mqtt_connected, within=bound + 2.0)
        assert not set(during) & set(await archived(site, foundation, device.factory))
        sent, recovered_s = await heal_and_archive(
            site.broker_host, device, foundation, before + during
        )
    stored = await archived(site, foundation, device.factory)
    assert set(stored) == set(sent) and set(stored.values()) == {1}
    assert detection_s <= bound + 1.0
    print(  # the measured numbers, shown with -rP
        f"mqtt keepalive_s={settings.mqtt_keepalive_s} detected_s={detection_s:.2f} "
        f"bound_s={bound:.1f} archived_after_heal_s={recovered_s:.2f} sent={len(sent)} "
        f"stored_once={len(stored)}"
    )


async def test_ingest_notices_a_silent_nats_server_by_its_pings_and_loses_nothing(
    site: Site, foundation: Foundation, aws_endpoint: str, unique_id: str
) -> None:
    settings = ingest_settings(site, foundation, aws_endpoint, unique_id)
    device = Device(site, f"f-{unique_id}", f"device-{unique_id}")
    async with serving(create_app(settings)) as app:
        client = natsio.client(app.broker)
        # the service's connection pings as its settings say
        assert client.options["ping_interval"] == settings.nats_ping_interval_s
        assert client.options["max_outstanding_pings"] == settings.nats_max_outstanding_pings
        before = await device.publish(BATCH)
        await all_archived(device, foundation, before, within=15)
        assert client.is_connected
        await asyncio.to_thread(site.network.cut, site.bus_host)
        # ingest takes these from the broker, archives their raw objects, and cannot publish
        during = await device.publish(BATCH)
        await eventually(
            lambda: app.metrics.total("inflight", consumer="mqtt") == BATCH,
            what="the messages of the cut in ingest's hands",
        )
        # nats-py pings every interval and gives the connection up at the first ping past the
        # allowed number of unanswered ones
        bound = (settings.nats_max_outstanding_pings + 1) * settings.nats_ping_interval_s
        detection_s = await detected(lambda: client.is_connected, within=bound + 2.0)
        in_hands = app.metrics.total("inflight", consumer="mqtt")
        sent, recovered_s = await heal_and_archive(
            site.bus_host, device, foundation, before + during
        )
    stored = await archived(site, foundation, device.factory)
    assert set(stored) == set(sent) and set(stored.values()) == {1}
    assert in_hands == BATCH
    assert detection_s <= bound + 1.0
    print(  # the measured numbers, shown with -rP
        f"nats ping_interval_s={settings.nats_ping_interval_s} "
        f"max_outstanding_pings={settings.nats_max_outstanding_pings} "
        f"detected_s={detection_s:.2f} bound_s={bound:.1f} "
        f"archived_after_heal_s={recovered_s:.2f} sent={len(sent)} stored_once={len(stored)}"
    )
