"""Fixtures shared by the integration tests of this folder."""

from __future__ import annotations

import datetime as dt
import functools
import ipaddress
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aegis_contracts import keys
from aegis_contracts.items import AlertState
from aegis_devstack.testing import netlab
from aegis_devstack.testing.storage import Foundation
from aegis_ingest.settings import IngestSettings
from aegis_processor.app import ProcessorApp, create_app
from aegis_processor.settings import ProcessorSettings

RunProcessor = Callable[..., AbstractAsyncContextManager[ProcessorApp]]
FireAlert = Callable[..., AlertState]
MakeCerts = Callable[[Path], None]


# The certificates are valid from a fixed day long past to RFC 5280's "no expiration date", not
# around Python's now: Mosquitto, nats-server and OpenSSL in every client check them against the
# machine's clock, which `make test-at` does not move, so a validity made from a moved now would
# be "not yet valid" (or expired) to them.
CERT_NOT_VALID_BEFORE = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
CERT_NOT_VALID_AFTER = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)


def make_ca_and_server_cert(folder: Path) -> None:
    """ca.crt, and server.crt/server.key for 127.0.0.1 and localhost, signed by that CA, valid
    on any clock of the machine and of the tests."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "aegis test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_NOT_VALID_BEFORE)
        .not_valid_after(CERT_NOT_VALID_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                key_encipherment=False, data_encipherment=False, key_agreement=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(CERT_NOT_VALID_BEFORE)
        .not_valid_after(CERT_NOT_VALID_AFTER)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.crt").write_bytes(ca.public_bytes(pem))
    (folder / "server.crt").write_bytes(cert.public_bytes(pem))
    (folder / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


@pytest.fixture(scope="session")
def make_certs() -> MakeCerts:
    """``make_certs(folder)``: a throwaway CA (ca.crt) and a server certificate it signed for
    127.0.0.1 and localhost (server.crt, server.key), written into ``folder``."""
    return make_ca_and_server_cert


@pytest.fixture
def fire_alert() -> FireAlert:
    """``fire_alert(scope, firing=, version=, ttl=)``: a CRITICAL FIRE_DETECTED alert state of a
    factory's state stream, as the dispatcher writes it."""

    def make(scope: str, *, firing: bool, version: int, ttl: int) -> AlertState:
        return AlertState(
            pk=keys.alert_pk(scope),
            sk=keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE"),
            scope=scope,
            severity="CRITICAL",
            reason="FIRE_DETECTED",
            status="STATE",
            firing=firing,
            version=version,
            ttl=ttl,
        )

    return make


@pytest.fixture
def ingest_settings(
    foundation: Foundation, aws_endpoint: str, mqtt_url: str, nats_url: str, unique_id: str
) -> IngestSettings:
    """The real ingest's settings for this test: its own bucket, service name (dead letters on
    ``aegis.dlq.ingest-{id}.*``), client id and share group, on the session's servers."""
    return IngestSettings(
        service=f"ingest-{unique_id}",
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        mqtt_url=mqtt_url,
        nats_url=nats_url,
        mqtt_client_id=f"ingest-{unique_id}",
        mqtt_share_group=f"g-{unique_id}",
        # short-lived sessions: a test's session must not queue the machine's traffic for an hour
        mqtt_session_expiry_s=60,
        mqtt_reconnect_min_s=0.05,
        mqtt_reconnect_max_s=0.5,
        ingest_retry_attempts=2,
        ingest_retry_first_delay_s=0.05,
        ingest_retry_max_delay_s=0.1,
        ingest_shutdown_grace_s=5,
        health_port=0,
    )


@pytest.fixture
def run_processor(
    foundation: Any, aws_endpoint: str, nats_url: str, unique_id: str
) -> RunProcessor:
    """``async with run_processor(subject, **settings) as app``: the real processor on this test's
    bucket and table, its own durable consumer filtered to ``subject`` (deleted afterwards), the
    1-minute refresh off unless asked for."""

    @asynccontextmanager
    async def run(subject: str, **overrides: Any) -> AsyncIterator[ProcessorApp]:
        settings = ProcessorSettings(
            aws_endpoint_url=aws_endpoint,
            bucket=foundation.bucket,
            table=foundation.table,
            nats_url=nats_url,
            service=f"processor-{unique_id}",
            durable=f"processor-{unique_id}",
            subject=subject,
            processor_fetch_timeout_s=0.3,
            **{"refresh_enabled": False, **overrides},
        )
        app = create_app(settings)
        await app.start()
        try:
            yield app
        finally:
            await app.stop()
            nc = await nats.connect(nats_url)
            try:
                await nc.jetstream().delete_consumer("AEGIS_RAW", settings.durable)
            except nats.js.errors.NotFoundError:
                pass
            finally:
                await nc.close()

    return run


# asked once per process: making a network to find out costs a fraction of a second
_network_unavailable = functools.cache(netlab.unavailable)


@pytest.fixture
def network() -> Iterator[netlab.Network]:
    """A private network of the test's own (network namespaces on a bridge, this process
    joined to it), deleted with everything on it when the test ends, however it ends; the test
    is skipped, saying why, where network namespaces cannot be made (not root, no iproute2)."""
    reason = _network_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with netlab.open_network() as network:
        network.join()
        yield network
