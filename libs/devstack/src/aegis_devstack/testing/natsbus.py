"""pytest plugin: a real nats-server with every NATS identity of :mod:`aegis_contracts.bus`
(its authorization block, as a deployment writes it), and brokers connected as one of them.

Fixtures: ``bus`` (per module: the server, and the settings each identity gets), ``connect`` (per
test: ``await connect(identity)``, a broker; the admin has created the streams first, as
``aegis streams`` does). :func:`refused` and :func:`refused_publish` check a refusal; a refused
publish waits out its acknowledgement, so a test gathers its refusals to wait once.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from faststream.nats import NatsBroker

from aegis_cli.natsauth import server_authorization
from aegis_contracts.bus import ADMIN, IDENTITIES
from aegis_devstack.localservers import (
    NATS_SERVER,
    ManagedServer,
    free_port,
    port_open,
    start_managed_server,
)
from aegis_runtime.bus import PublishFailed, create_broker, ensure_streams, publish
from aegis_runtime.settings import AegisSettings

__all__ = [
    "PASSWORDS",
    "TEST_BCRYPT_COST",
    "Bus",
    "Connect",
    "bus",
    "connect",
    "refused",
    "refused_publish",
]

# one password per identity, and the admin's
PASSWORDS = {name: f"{name}-pw" for name in (ADMIN, *IDENTITIES)}
# bcrypt's least cost for the test servers' hashes: a server lives for a module or a test, and
# it checks a hash again at every connection (at the deployed cost, ~0.1 s of CPU each, and
# ~1.5 s to hash every identity's password when a server is made)
TEST_BCRYPT_COST = 4
Connect = Callable[[str], Awaitable[NatsBroker]]


@dataclass
class Bus:
    """A nats-server whose config holds natsauth's authorization block (every identity)."""

    server: ManagedServer
    url: str
    folder: Path

    def identity(self, user: str) -> dict[str, Any]:
        """The NATS settings a deployment gives the process of identity ``user``."""
        return {
            "nats_url": self.url,
            "nats_user": user,
            "nats_password": PASSWORDS[user],
            "nats_manage_streams": user == ADMIN,
        }

    def settings(self, user: str, **extra: Any) -> AegisSettings:
        return AegisSettings(**self.identity(user), **extra)


def start_bus(folder: Path, extra_config: str = "", scheme: str = "nats") -> Bus:
    """nats-server on a free port of 127.0.0.1 with JetStream in ``folder``, every identity, and
    ``extra_config`` (e.g. a ``tls`` block)."""
    binary = shutil.which("nats-server") or NATS_SERVER
    port = free_port()
    config = folder / "nats.conf"
    config.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f"jetstream {{ store_dir: {json.dumps(str(folder / 'js'))} }}\n"
        + extra_config
        + server_authorization(PASSWORDS, cost=TEST_BCRYPT_COST)
    )
    url = f"{scheme}://127.0.0.1:{port}"
    server = start_managed_server(
        url,
        [binary, "-c", str(config)],
        folder / "nats.log",
        ready=lambda _url: port_open("127.0.0.1", port),
    )
    return Bus(server, url, folder)


@pytest.fixture(scope="module")
def bus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    started = start_bus(tmp_path_factory.mktemp("nats"))
    try:
        yield started
    finally:
        started.server.stop()


@pytest.fixture
async def connect(bus: Bus) -> AsyncIterator[Connect]:
    brokers: list[NatsBroker] = []

    async def as_identity(user: str) -> NatsBroker:
        broker = create_broker(bus.settings(user), name=f"test-{user}")
        await broker.connect()
        brokers.append(broker)
        return broker

    admin = await as_identity(ADMIN)
    await ensure_streams(admin, manage=True)  # only the admin manages streams
    yield as_identity
    for broker in brokers:
        await broker.stop()


async def refused(
    call: Awaitable[object], error: type[BaseException], match: str | None = None
) -> None:
    """``call`` fails with ``error``, its message matching ``match``."""
    with pytest.raises(error, match=match):
        await call


async def refused_publish(broker: NatsBroker, subject: str) -> None:
    """A publish the server must refuse (the stream never stores it): a failure once its
    acknowledgement is a second late."""
    await refused(
        publish(broker, subject, b"{}", msg_id=f"forged:{subject}", ack_timeout=1), PublishFailed
    )
