"""TLS between the services and NATS, on a real nats-server that requires it (a CA and a server
certificate made here, the identities of ``aegis_contracts.bus``): a service with the CA
(``AEGIS_NATS_TLS_CA_FILE``, a ``tls://`` URL) connects and publishes; a client that does not
trust the server's CA, and a plaintext client, are refused."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from nats.aio.client import Client as NATS

from aegis_contracts.subjects import raw_subject
from aegis_devstack.testing.natsbus import PASSWORDS, Bus, start_bus
from aegis_runtime.bus import connect_options, create_broker, ensure_streams, publish

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def tls_bus(
    tmp_path_factory: pytest.TempPathFactory, make_certs: Callable[[Path], None]
) -> Iterator[Bus]:
    folder = tmp_path_factory.mktemp("nats-tls")
    make_certs(folder)
    tls = (
        "tls {\n"
        f"  cert_file: {json.dumps(str(folder / 'server.crt'))}\n"
        f"  key_file: {json.dumps(str(folder / 'server.key'))}\n"
        "  timeout: 2\n"
        "}\n"
    )
    started = start_bus(folder, tls, scheme="tls")
    try:
        yield started
    finally:
        started.server.stop()


async def test_a_service_with_the_ca_connects_over_tls_under_its_identity(tls_bus: Bus) -> None:
    ca = tls_bus.folder / "ca.crt"
    admin = create_broker(tls_bus.settings("admin", nats_tls_ca_file=ca), name="test-admin")
    ingest = create_broker(tls_bus.settings("ingest", nats_tls_ca_file=ca), name="test-ingest")
    try:
        await ensure_streams(admin, manage=True)
        assert set((await ensure_streams(ingest, manage=False)).values()) == {"unchanged"}
        subject = raw_subject("factory-tls", "factory_state")
        assert await publish(ingest, subject, b"{}", msg_id="tls-1") is False
        js = admin.config.connection_state.stream
        assert (await js.get_last_msg("AEGIS_RAW", subject)).data == b"{}"
    finally:
        await ingest.stop()
        await admin.stop()
    # a plain nats-py client (the dashboard's feed, `aegis jobs`) takes the same options
    client = NATS()
    await client.connect(**connect_options(tls_bus.settings("processor", nats_tls_ca_file=ca)))
    try:
        assert client.is_connected and client.connected_url is not None
        assert client.connected_url.scheme == "tls"
    finally:
        await client.close()


async def test_a_client_that_does_not_trust_the_servers_ca_is_refused(tls_bus: Bus) -> None:
    # tls:// without AEGIS_NATS_TLS_CA_FILE: the system's trust store, which lacks this CA
    settings = tls_bus.settings("ingest")
    assert settings.nats_tls
    client = NATS()
    with pytest.raises(ssl.SSLCertVerificationError):
        await client.connect(**connect_options(settings), allow_reconnect=False, connect_timeout=2)
    assert not client.is_connected
    # nats-py's close waits forever on a transport whose handshake failed
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(client.close(), 1)


async def test_a_plaintext_client_is_refused(tls_bus: Bus) -> None:
    """Speaking the NATS protocol without TLS (right identity, right password): the server says
    TLS is required and never answers the PING."""
    url = urlsplit(tls_bus.url)
    assert url.hostname is not None and url.port is not None
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        info = await asyncio.wait_for(reader.readline(), 5)
        assert json.loads(info.removeprefix(b"INFO "))["tls_required"] is True
        connect = {"user": "ingest", "pass": PASSWORDS["ingest"], "verbose": False}
        writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 5)
        assert b"PONG" not in answer
        assert b"TLS Required" in answer or answer == b"", answer
    finally:
        writer.close()
        await writer.wait_closed()
