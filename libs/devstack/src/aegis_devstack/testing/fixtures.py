"""pytest plugin: session fixtures with the URLs of real Mosquitto, NATS JetStream and AWS emulator.

Each URL comes from, in order: its ``AEGIS_TEST_*`` variable (the server is started when it is the
local default and down); a container when a Docker engine answers; else a private instance of the
machine's own server on a free port with a temporary data folder, started for the session (so the
tests never leave queued sessions, streams or durable consumers in the servers `make run` uses);
else the machine's server on its default port, started when down. Nothing is set in os.environ.

Fixtures: ``aws_endpoint``, ``mqtt_url``, ``nats_url`` (session), ``unique_id`` (per test),
``private_nats`` / ``private_mosquitto`` (per test: a server the test may stop and restart), and
``private_emulator`` (per module: a moto_server whose request counts and registrations are the
module's alone), ``network`` (per test: a private network of network namespaces) and
``fire_alert`` (a builder of a factory's CRITICAL fire alert state, as the dispatcher writes it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from aegis_contracts import keys
from aegis_contracts.items import AlertState
from aegis_devstack.localservers import (
    DEFAULT_MQTT_URL,
    DEFAULT_NATS_URL,
    LocalServerError,
    ManagedServer,
    docker_available,
    ensure_mosquitto,
    ensure_moto_server,
    ensure_nats,
    free_port,
    jetstream_account_info,
    start_moto_server,
    start_private_mosquitto,
    start_private_nats,
)
from aegis_devstack.testing import netlab

if TYPE_CHECKING:
    from testcontainers.community.localstack import LocalStackContainer
    from testcontainers.community.mqtt import MosquittoContainer
    from testcontainers.community.nats import NatsContainer
    from testcontainers.core.container import DockerContainer

__all__ = [
    "aws_endpoint",
    "fire_alert",
    "mqtt_url",
    "nats_url",
    "network",
    "private_emulator",
    "private_mosquitto",
    "private_nats",
    "unique_id",
]

LOCALSTACK_IMAGE = "localstack/localstack:4.14.0"  # the last tag that runs without an auth token
LOCALSTACK_SERVICES = ("s3", "dynamodb", "cloudwatch", "iam", "sts", "cloudformation")
MOSQUITTO_IMAGE = "eclipse-mosquitto:2.1"
NATS_IMAGE = "nats:2.10"
REGION = "ap-south-1"

# ``fire_alert(scope, firing=, version=, ttl=)``
FireAlert = Callable[..., AlertState]

_Container = TypeVar("_Container", bound="DockerContainer")


@pytest.fixture(scope="session")
def aws_endpoint() -> Iterator[str]:
    """HTTP endpoint of an S3/DynamoDB/CloudWatch emulator (LocalStack or moto_server)."""
    if url := os.environ.get("AEGIS_TEST_AWS_ENDPOINT"):
        server = ensure_moto_server(url)  # reuses whatever answers there
    elif docker_available():
        yield from _container_url(_localstack, lambda c: c.get_url())
        return
    else:
        server = start_moto_server("127.0.0.1", free_port())
    try:
        yield server.url
    finally:
        server.close()  # a no-op for a server this session did not start


@pytest.fixture(scope="session")
def mqtt_url() -> Iterator[str]:
    """``mqtt://host:port`` of a broker that accepts anonymous MQTT v5 clients."""
    if url := os.environ.get("AEGIS_TEST_MQTT_URL"):
        ensure_mosquitto(url)
        yield url
    elif docker_available():
        yield from _container_url(_mosquitto, _mosquitto_url)
    else:
        yield from _private_or_shared(start_private_mosquitto, ensure_mosquitto, DEFAULT_MQTT_URL)


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """``nats://host:port`` of a NATS server with JetStream enabled."""
    if url := os.environ.get("AEGIS_TEST_NATS_URL"):
        ensure_nats(url)
        yield url
    elif docker_available():
        yield from _container_url(_nats, _checked_nats_url)
    else:
        yield from _private_or_shared(start_private_nats, ensure_nats, DEFAULT_NATS_URL)


def _private_or_shared(
    start: Callable[[], ManagedServer], ensure: Callable[[str], object], default: str
) -> Iterator[str]:
    try:
        server = start()
    except LocalServerError:  # binary not installed: fall back to the machine's server
        ensure(default)
        yield default
        return
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
def private_nats() -> Iterator[ManagedServer]:
    """A NATS JetStream server of the test's own, which it may ``restart()``."""
    server = start_private_nats()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def private_emulator() -> Iterator[str]:
    """A moto_server of the module's own on a free port (its log in a folder removed with it):
    its URL."""
    with tempfile.TemporaryDirectory(prefix="aegis-moto-") as folder:
        server = start_moto_server("127.0.0.1", free_port(), log_file=Path(folder) / "moto.log")
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def own_emulator(tmp_path: Path) -> Iterator[ManagedServer]:
    """A moto_server of the test's own on a free port, its log at ``log_file`` in the test's
    folder: what it logged and the requests it counted are this test's alone."""
    server = start_moto_server("127.0.0.1", free_port(), log_file=tmp_path / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def private_mosquitto() -> Iterator[ManagedServer]:
    """A Mosquitto of the test's own, which it may ``restart()``."""
    server = start_private_mosquitto()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def unique_id() -> str:
    """A short random id (``t-3f9a1c2b``): valid as factory id, bucket suffix and stream suffix."""
    return f"t-{secrets.token_hex(4)}"


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


# -- containers (only where a Docker engine answers) -------------------------------------------


@contextlib.contextmanager
def _tolerate_testcontainers_deprecations() -> Iterator[None]:
    # testcontainers 4.15's community modules call waiting helpers that it deprecates itself
    # (at import and in start()); under filterwarnings=error those would fail the session.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def _container_url(
    build: Callable[[], _Container], url_of: Callable[[_Container], str]
) -> Iterator[str]:
    """Start the container, yield its URL for the session, then remove it."""
    with _tolerate_testcontainers_deprecations():
        container = build()
        try:
            container.start()
            url = url_of(container)
        except BaseException:
            container.stop()
            raise
    try:
        yield url
    finally:
        with _tolerate_testcontainers_deprecations():
            container.stop()


def _localstack() -> LocalStackContainer:
    from testcontainers.community.localstack import LocalStackContainer  # noqa: PLC0415

    image = os.environ.get("AEGIS_LOCALSTACK_IMAGE", LOCALSTACK_IMAGE)
    container = LocalStackContainer(image=image, region_name=REGION)
    container.with_services(*LOCALSTACK_SERVICES)
    if token := os.environ.get("LOCALSTACK_AUTH_TOKEN"):
        container.with_env("LOCALSTACK_AUTH_TOKEN", token)
    return container


def _mosquitto() -> MosquittoContainer:
    # Its default configuration: listener 1883, allow_anonymous true (MQTT v5 is built in).
    from testcontainers.community.mqtt import MosquittoContainer  # noqa: PLC0415

    return MosquittoContainer(image=os.environ.get("AEGIS_MOSQUITTO_IMAGE", MOSQUITTO_IMAGE))


def _mosquitto_url(container: MosquittoContainer) -> str:
    port = container.get_exposed_port(container.MQTT_PORT)
    return f"mqtt://{container.get_container_host_ip()}:{port}"


def _nats() -> NatsContainer:
    from testcontainers.community.nats import NatsContainer  # noqa: PLC0415

    image = os.environ.get("AEGIS_NATS_IMAGE", NATS_IMAGE)
    return NatsContainer(image=image, jetstream=True)


def _checked_nats_url(container: NatsContainer) -> str:
    url = container.nats_uri()
    jetstream_account_info(url)  # an image that ignored -js fails here, not in the first test
    return url
