"""Fixtures shared by the integration tests of this folder."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import AsyncIterator, Callable
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

from aegis_processor.app import ProcessorApp, create_app
from aegis_processor.settings import ProcessorSettings

RunProcessor = Callable[..., AbstractAsyncContextManager[ProcessorApp]]
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
