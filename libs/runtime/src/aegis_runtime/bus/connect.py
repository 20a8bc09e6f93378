"""Connections to NATS: the service broker (reconnecting forever, every message settled by
:class:`~aegis_runtime.bus.outcomes.MessageOutcomes`), a one-shot command's broker, and the
options every connection of a process takes from its settings."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from faststream.nats import NatsBroker
from faststream.nats.security import NatsSecurity, NatsUserPassword

from aegis_contracts.backoff import spread_s
from aegis_runtime import natsio, tracing
from aegis_runtime.bus.errors import BrokerUnavailable, RetryPolicy
from aegis_runtime.bus.outcomes import MessageOutcomes
from aegis_runtime.metrics import Metrics
from aegis_runtime.redact import redact_url
from aegis_runtime.settings import AegisSettings

if TYPE_CHECKING:
    from aegis_runtime.natsio import Client, Server

log = structlog.get_logger(__name__)


def create_broker(
    settings: AegisSettings,
    *,
    name: str,
    metrics: Metrics | None = None,
    retry: RetryPolicy | None = None,
    graceful_timeout: float = 20.0,
    closed: Callable[[], Awaitable[None]] | None = None,
) -> NatsBroker:
    """A NatsBroker for service ``name`` that reconnects forever and settles every message.

    Forever, as long as the server lets it: nats-py gives the connection up for good when the
    server refuses it (``-ERR 'Authorization Violation'``: a password rotated or an identity
    removed, a config reload); ``closed`` is called then (and on a close of our own).

    ``settings.nats_url`` may list several servers separated by commas. FastStream's own per-message
    lines ("Received", "Processed") go to the stdlib logger ``faststream.aegis`` at DEBUG; the
    :class:`MessageOutcomes` middleware writes one INFO summary line per message instead.
    FastStream sends a ``correlation_id`` header only when a publish gives one.
    """
    options = connect_options(settings)
    security, plain = _secured(options)
    broker = _Broker(
        natsio.unanswered_limit(options),
        name=f"aegis-{name}",  # shown by NATS monitoring (connz)
        security=security,
        **plain,
        allow_reconnect=True,
        max_reconnect_attempts=-1,  # forever: a service without its queue is not ready, not dead
        reconnect_time_wait=1,  # spacing of the initial connection attempts
        reconnect_to_server_handler=_reconnect_with_backoff,
        logger=logging.getLogger("faststream.aegis"),
        log_level=logging.DEBUG,
        graceful_timeout=graceful_timeout,
        id_generator=_no_correlation_id,
        closed_cb=closed,
    )
    provider = tracing.provider_for(settings)
    if provider is not None:  # outermost: the consumer span covers the whole handling
        # imported only when tracing is on, as the SDK is (aegis_runtime.tracing)
        from faststream.nats.opentelemetry import NatsTelemetryMiddleware  # noqa: PLC0415

        broker.add_middleware(
            NatsTelemetryMiddleware(tracer_provider=provider, include_messages_counters=False)
        )
    broker.add_middleware(
        MessageOutcomes(service=name, broker=broker, metrics=metrics, retry=retry or RetryPolicy())
    )
    return broker


class _Broker(NatsBroker):
    """A NatsBroker whose every connection, the first and each reconnection, is given up by the
    operating system once its server leaves data unacknowledged for ``unanswered_s``, as long
    as the connection's pings may go unanswered (:func:`natsio.give_up_unacknowledged`): after
    a partition it reconnects to another server in seconds, not minutes."""

    def __init__(self, unanswered_s: float, **options: Any) -> None:
        super().__init__(**options, reconnected_cb=self._reconnected)
        self._unanswered_s = unanswered_s

    async def _connect(self) -> Client:
        connection = await super()._connect()
        natsio.give_up_unacknowledged(connection, self._unanswered_s)
        return connection

    async def _reconnected(self) -> None:
        if self._connection is not None:
            natsio.give_up_unacknowledged(self._connection, self._unanswered_s)


def _secured(options: dict[str, Any]) -> tuple[NatsSecurity | None, dict[str, Any]]:
    """:func:`connect_options` as FastStream takes them: identity and TLS as its security."""
    options = dict(options)
    tls = options.pop("tls", None)
    user, password = options.pop("user", None), options.pop("password", None)
    security: NatsSecurity | None = None
    if user is not None:
        security = NatsUserPassword(username=user, password=password or "", ssl_context=tls)
    elif tls is not None:
        security = NatsSecurity(ssl_context=tls)
    return security, options


def _no_correlation_id() -> str:
    # FastStream's id_generator: the correlation id of a publish that gives none. Empty: no
    # ``correlation_id`` header, so a message carries the headers AEGIS gave it and no others.
    return ""


async def command_broker(settings: AegisSettings, *, name: str, **options: Any) -> NatsBroker:
    """A connected broker for a one-shot command (``aegis jobs``, ``aegis alerts resend``): the
    identity, inbox and TLS of ``settings``, nats-py's connection defaults unless ``options``
    (NatsBroker's connection arguments) say otherwise, and no consumers. Its first connection is
    bounded as :func:`connect_broker`'s. Close it with :func:`aegis_runtime.natsio.close`
    (flushed, then closed: not FastStream's ``stop``, which drains)."""
    connection = connect_options(settings)
    security, plain = _secured(connection)
    broker = _Broker(
        natsio.unanswered_limit({**connection, **options}),
        name=f"aegis-{name}",
        security=security,
        **{**plain, **options},
        logger=logging.getLogger("faststream.aegis"),
        log_level=logging.DEBUG,
        id_generator=_no_correlation_id,
    )
    await connect_broker(broker, settings)
    return broker


def connect_options(settings: AegisSettings) -> dict[str, Any]:
    """What every NATS connection of a process takes from its settings (FastStream's broker and
    plain nats-py clients alike): the servers with this process's identity; replies (JetStream
    acks, API answers) under an inbox of that identity only, which no other identity may
    subscribe to (aegis_contracts.bus); TLS when the settings ask for it; and the pings that
    find a connection whose server went silent (no FIN, no RST: a partition, a dead link),
    which the operating system would take many minutes to give up on."""
    options: dict[str, Any] = {
        "servers": settings.nats_servers(),
        "inbox_prefix": inbox_prefix(settings.nats_user),
        "ping_interval": settings.nats_ping_interval_s,
        "max_outstanding_pings": settings.nats_max_outstanding_pings,
    }
    if settings.nats_user is not None:
        # an option, not user info in the URLs: nats-py sends it to every server it reconnects
        # to, those a cluster advertised included (a URL's user info stays with that URL)
        options["user"] = settings.nats_user
        options["password"] = (
            settings.nats_password.get_secret_value() if settings.nats_password else ""
        )
    tls = settings.nats_tls_context()
    if tls is not None:
        options["tls"] = tls
    return options


def _unavailable(settings: AegisSettings) -> BrokerUnavailable:
    servers = ", ".join(redact_url(url) for url in settings.nats_servers())
    return BrokerUnavailable(
        f"NATS not reachable at {servers} within {settings.nats_connect_timeout_s:g} s "
        "(AEGIS_NATS_CONNECT_TIMEOUT_S)"
    )


async def connect_broker(broker: NatsBroker, settings: AegisSettings) -> None:
    """The first connection of a command's broker, bounded: :class:`BrokerUnavailable` (naming
    the URL) when no server answers within ``AEGIS_NATS_CONNECT_TIMEOUT_S``. A service's broker
    connects without a bound instead (it is not ready until NATS answers)."""
    try:
        await asyncio.wait_for(broker.connect(), settings.nats_connect_timeout_s)
    except TimeoutError:
        raise _unavailable(settings) from None


def log_bus_identity(settings: AegisSettings) -> None:
    """Say once at start which identity this process has on NATS, and when it has none: a
    server without identities (``make run``, compose) lets anything that reaches it publish any
    event and purge any stream."""
    if settings.nats_user is None:
        log.warning(
            "nats_without_identity",
            hint="the bus is open to anything that reaches it: for local development only; "
            "deployments set AEGIS_NATS_USER and AEGIS_NATS_PASSWORD (aegis_contracts.bus)",
        )
    else:
        log.info("nats_identity", user=settings.nats_user, tls=settings.nats_tls)


def _reconnect_with_backoff(
    servers: list[Server], _info: dict[str, Any]
) -> tuple[Server | None, float]:
    # Least-tried server first; 0.25 s doubling to 10 s, with jitter so N replicas do not stampede.
    server = min(servers, key=lambda s: s.reconnects)
    return server, spread_s(server.reconnects + 1, first=0.25, cap=10.0)


def nats_ready(broker: NatsBroker, wait: float = 1.0) -> Callable[[], Awaitable[bool]]:
    """A readiness check for ``HealthServer.add_check``: the connection to NATS is up."""

    async def check() -> bool:
        return await broker.ping(wait)

    return check


def inbox_prefix(user: str | None) -> str:
    """``_INBOX`` without an identity; ``_INBOX_{user}`` with one (aegis_contracts.bus lets
    each identity subscribe to its own inbox only)."""
    return "_INBOX" if user is None else f"_INBOX_{user}"
