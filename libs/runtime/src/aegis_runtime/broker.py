"""FastStream NATS JetStream wiring shared by every service: the broker factory, streams, durable pull
consumers, de-duplicated publishing, dead letters, and the broker middleware that turns a handler's
outcome into ack, nack-with-delay or dead-letter-then-ack.

Outcome of one JetStream message (``MessageOutcomes``, installed by :func:`create_broker`):
- the handler returns: ack (FastStream's own acknowledgement);
- it raises :class:`Poison`, a ``ContractError`` or a validation error: dead-letter, then ack;
- it raises anything else: nack with an exponential delay, until the consumer's ``max_deliver``-th
  delivery, which is dead-lettered (``retries_exhausted``) then acked. Never a silent drop, never an
  endless loop. An exception with a ``retry_after_s`` (the handler knows a retry succeeds by then,
  e.g. once another handler's lease is over) holds the last delivery back until then, so the
  retries are not spent before it could succeed.

Errors:
    BrokerError              base of this module's errors
    ├── BrokerUnavailable    a command's first connection found no NATS server in time
    ├── PublishFailed        JetStream did not confirm a publish (timeout, no stream, API error)
    └── StreamSetupFailed    a stream could not be created or updated (subject overlap, storage change)
    Poison                   raised by a handler: the message can never succeed; dead-letter ``reason``
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from contextvars import ContextVar
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import structlog
from fast_depends.exceptions import ValidationError as DependsValidationError
from faststream import AckPolicy, BaseMiddleware
from faststream.exceptions import AckMessage, HandlerException, NackMessage, RejectMessage
from faststream.nats import AckPolicy as ConsumerAckPolicy
from faststream.nats import (
    ConsumerConfig,
    DiscardPolicy,
    JStream,
    NatsBroker,
    PubAck,
    PullSub,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.security import NatsSecurity, NatsUserPassword

from aegis_contracts import msgids
from aegis_contracts.archive import raw_event_msg_id
from aegis_contracts.backoff import exponential_s, spread_s
from aegis_contracts.errors import ContractError
from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import (
    STREAMS,
    StreamSpec,
    dead_letter_subject,
    raw_subject,
    subject_matches,
)
from aegis_contracts.times import utc_now
from aegis_runtime import natsio, tracing
from aegis_runtime.logging import bind_message
from aegis_runtime.metrics import Metrics
from aegis_runtime.redact import redact_url
from aegis_runtime.settings import RAW_MAX_PER_FACTORY, AegisSettings

if TYPE_CHECKING:
    from faststream import ContextRepo
    from faststream.nats.broker.registrator import NatsRegistrator
    from faststream.nats.subscriber.usecases import PullStreamSubscriber

    from aegis_runtime.natsio import Client, Msg, Server

MSG_ID_HEADER = "Nats-Msg-Id"
_DETAIL_LIMIT = 2000
# how long a stream's creation waits for a forming cluster to have nodes for its replicas
PLACEMENT_WAIT_S = 30.0

log = structlog.get_logger(__name__)
# the stdlib logger under ``log``: its level is checked before a per-message line is built
_stdlog = logging.getLogger(__name__)


class BrokerError(Exception):
    """Base of this module's errors."""


class PublishFailed(BrokerError):
    """JetStream did not confirm the publish; the message may or may not be stored. Retry."""


class StreamFull(PublishFailed):
    """JetStream refused to store the message: its stream, or its subject, is at a limit whose
    discard policy is "new" (the raw stream's per-factory bound). Retrying will not help until
    the consumers catch up."""


class StreamSetupFailed(BrokerError):
    """A stream could not be created or brought to its contract configuration."""


class Poison(Exception):
    """Raise from a handler when the message can never succeed: it is dead-lettered, then acked."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = _reason_token(reason)
        self.detail = detail or reason


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Redelivery delays: ``first_delay * 2**(delivery-1)`` seconds, at most ``max_delay``.

    ``max_deliver`` caps deliveries for a consumer that does not set its own ``max_deliver``.
    """

    first_delay: float = 1.0
    max_delay: float = 60.0
    max_deliver: int = 5

    def delay(self, delivery: int) -> float:
        return exponential_s(delivery, first=self.first_delay, cap=self.max_delay)


# --------------------------------------------------------------------------------------------------
# Broker


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
    subscribe to (aegis_cli.natsauth); TLS when the settings ask for it; and the pings that
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


class BrokerUnavailable(BrokerError):
    """A command's first connection found no NATS server within ``nats_connect_timeout_s``."""


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
            "deployments set AEGIS_NATS_USER and AEGIS_NATS_PASSWORD (aegis_cli.natsauth)",
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


# --------------------------------------------------------------------------------------------------
# Streams and consumers


def jstream(spec: StreamSpec) -> JStream:
    """The FastStream stream object for ``spec``. ``declare=False``: :func:`ensure_streams` owns
    stream configuration, so a subscriber never edits a stream as a side effect of starting."""
    return JStream(
        spec.name,
        subjects=list(spec.subjects),
        max_age=spec.max_age_seconds,
        duplicate_window=spec.duplicate_window_seconds,
        storage=StorageType.FILE,
        declare=False,
    )


_UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What the deployment adds to the streams' contract (``AEGIS_NATS_STREAM_*``)."""

    replicas: int = 1
    max_bytes: Mapping[str, int] = dataclass_field(default_factory=dict)
    raw_max_per_factory: int = RAW_MAX_PER_FACTORY

    @classmethod
    def of(cls, settings: AegisSettings) -> StreamLimits:
        return cls(
            replicas=settings.nats_stream_replicas,
            max_bytes=dict(settings.nats_stream_max_bytes),
            raw_max_per_factory=settings.nats_raw_max_per_factory,
        )


def _stream_config(spec: StreamSpec, limits: StreamLimits) -> StreamConfig:
    per_subject = limits.raw_max_per_factory if spec.bounded_per_subject else _UNLIMITED
    bounded = per_subject != _UNLIMITED
    return StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        # the raw stream refuses a factory's next event when that factory's backlog is full (its
        # message is dead-lettered, its raw object kept); the others drop their oldest
        discard=DiscardPolicy.NEW if bounded else DiscardPolicy.OLD,
        discard_new_per_subject=bounded,
        max_msgs_per_subject=per_subject,
        max_bytes=limits.max_bytes.get(spec.name, _UNLIMITED),
        max_age=float(spec.max_age_seconds),
        duplicate_window=float(spec.duplicate_window_seconds),
        storage=StorageType.FILE,
        num_replicas=limits.replicas,
    )


def _more(current: float | None, wanted: float | None, unlimited: float) -> float:
    """The larger of two limits, where ``unlimited`` (0 for ages, -1 for counts) is largest."""
    a = unlimited if current is None else current
    b = unlimited if wanted is None else wanted
    if unlimited in (a, b):
        return unlimited
    return max(a, b)


def _kept_raised(current: StreamConfig, wanted: StreamConfig) -> StreamConfig:
    """``wanted``, except where the running stream already holds more (replicas, max age, max
    bytes): a service start never lowers what an operator raised by hand."""
    return dataclasses.replace(
        wanted,
        num_replicas=max(current.num_replicas or 1, wanted.num_replicas or 1),
        max_age=_more(current.max_age, wanted.max_age, 0),
        max_bytes=int(_more(current.max_bytes, wanted.max_bytes, _UNLIMITED)),
    )


def _same_config(current: StreamConfig, wanted: StreamConfig) -> bool:
    return (
        sorted(current.subjects or ()) == sorted(wanted.subjects or ())
        and round(current.max_age or 0) == round(wanted.max_age or 0)
        and round(current.duplicate_window or 0) == round(wanted.duplicate_window or 0)
        and current.storage == wanted.storage
        and (current.num_replicas or 1) == (wanted.num_replicas or 1)
        and (current.max_bytes or _UNLIMITED) == (wanted.max_bytes or _UNLIMITED)
        and (current.max_msgs_per_subject or _UNLIMITED)
        == (wanted.max_msgs_per_subject or _UNLIMITED)
        and current.discard == wanted.discard
        and bool(current.discard_new_per_subject) == bool(wanted.discard_new_per_subject)
    )


async def ensure_streams(
    broker: NatsBroker,
    specs: Iterable[StreamSpec] = STREAMS,
    *,
    limits: StreamLimits | None = None,
    manage: bool = True,
) -> dict[str, Literal["created", "updated", "unchanged", "differs"]]:
    """Create or update each stream to its contract (file storage, max age, duplicate window)
    and the deployment's ``limits``; what an operator raised by hand is kept.

    Idempotent and safe from N replicas at once: creating an identical stream twice is a no-op on
    the server, and a replica that loses the creation race updates instead. Connects if needed.
    ``manage=False`` (an identity that may not manage streams): only check that each stream
    exists (:class:`StreamSetupFailed` if not) and say when one differs from the contract.
    """
    await broker.connect()
    outcome: dict[str, Literal["created", "updated", "unchanged", "differs"]] = {}
    for spec in specs:
        wanted = _stream_config(spec, limits or StreamLimits())
        if manage:
            outcome[spec.name] = await _ensure_stream(broker, wanted)
        else:
            outcome[spec.name] = await _check_stream(broker, wanted)
    log.info("streams_ensured", streams=outcome, managed=manage)
    return outcome


async def ensure_deployed_streams(
    broker: NatsBroker, settings: AegisSettings, specs: Iterable[StreamSpec] = STREAMS
) -> dict[str, Literal["created", "updated", "unchanged", "differs"]]:
    """:func:`ensure_streams` as the deployment's settings say: their limits, and managed or only
    checked (``AEGIS_NATS_MANAGE_STREAMS``). What every service and CLI calls at start."""
    log_bus_identity(settings)
    return await ensure_streams(
        broker, specs, limits=StreamLimits.of(settings), manage=settings.nats_manage_streams
    )


async def _check_stream(
    broker: NatsBroker, wanted: StreamConfig
) -> Literal["unchanged", "differs"]:
    name = wanted.name or ""
    try:
        current = await natsio.stream_config(broker, name)
    except natsio.Error as err:
        raise StreamSetupFailed(f"stream {name}: {err}") from err
    if current is None:
        raise StreamSetupFailed(
            f"stream {name} is missing; `aegis bootstrap` (the admin identity) creates it"
        )
    if _same_config(current, _kept_raised(current, wanted)):
        return "unchanged"
    log.warning("stream_differs", stream=name, hint="`aegis bootstrap` brings it to the contract")
    return "differs"


def inbox_prefix(user: str | None) -> str:
    """``_INBOX`` without an identity; ``_INBOX_{user}`` with one (aegis_cli.natsauth lets
    each identity subscribe to its own inbox only)."""
    return "_INBOX" if user is None else f"_INBOX_{user}"


async def _ensure_stream(
    broker: NatsBroker, wanted: StreamConfig
) -> Literal["created", "updated", "unchanged"]:
    """Create or update the stream. A cluster that is still forming (or has a node down) cannot
    place its replicas yet: asked again with back-off for :data:`PLACEMENT_WAIT_S`, then
    refused."""
    deadline = time.monotonic() + PLACEMENT_WAIT_S
    attempt = 0
    while True:
        try:
            return await _ensure_stream_once(broker, wanted)
        except StreamSetupFailed as err:
            attempt += 1
            wait = exponential_s(attempt, first=0.25, cap=2.0)
            if not natsio.no_placement(err.__cause__) or time.monotonic() + wait > deadline:
                raise
            log.warning(
                "stream_placement_waiting",
                stream=wanted.name,
                replicas=wanted.num_replicas,
                attempt=attempt,
            )
            await asyncio.sleep(wait)


async def _ensure_stream_once(
    broker: NatsBroker, wanted: StreamConfig
) -> Literal["created", "updated", "unchanged"]:
    name = wanted.name or ""
    try:
        current = await natsio.stream_config(broker, name)
        if current is None:
            if await natsio.add_stream(broker, wanted):
                return "created"
            current = await natsio.stream_config(broker, name)  # another replica won the race
            if current is None:
                raise StreamSetupFailed(f"stream {name}: created elsewhere, then gone")
        wanted = _kept_raised(current, wanted)
        if _same_config(current, wanted):
            return "unchanged"
        await natsio.update_stream(broker, wanted)
    except natsio.Error as err:
        raise StreamSetupFailed(f"stream {name}: {err}") from err
    return "updated"


def durable_pull(
    router: NatsRegistrator,
    spec: StreamSpec,
    durable: str,
    *,
    subject: str | None = None,
    batch_size: int = 16,
    fetch_timeout: float = 5.0,
    ack_wait: float = 30.0,
    max_deliver: int = 5,
    max_ack_pending: int | None = None,
    user: str | None = None,
) -> PullStreamSubscriber:
    """Register a JetStream durable pull consumer on ``router`` (a NatsBroker or NatsRouter).
    ``user``: the process's NATS identity, whose inbox the fetches are answered in.

    Every replica that registers the same ``durable`` shares one consumer, so each message goes to
    one replica. Explicit ack: a message not settled within ``ack_wait`` seconds is redelivered, at
    most ``max_deliver`` times in all (the last delivery is dead-lettered by MessageOutcomes).
    Each replica fetches up to ``batch_size`` messages at a time and handles them concurrently.
    ``subject`` defaults to the stream's subject when it has exactly one. Use the result as the
    handler decorator: ``@durable_pull(router, RAW_STREAM, "processor")``.
    """
    if subject is None:
        if len(spec.subjects) != 1:
            raise ValueError(f"stream {spec.name} has several subjects: pass subject=")
        subject = spec.subjects[0]
    if max_deliver < 1:
        raise ValueError("max_deliver must be at least 1")
    config = ConsumerConfig(
        durable_name=durable,
        ack_policy=ConsumerAckPolicy.EXPLICIT,
        ack_wait=ack_wait,
        max_deliver=max_deliver,
        max_ack_pending=max_ack_pending,
    )
    return router.subscriber(
        subject,
        stream=jstream(spec),
        durable=durable,
        config=config,
        pull_sub=PullSub(batch_size=batch_size, timeout=fetch_timeout),
        # FastStream passes nats-py its own default ("_INBOX."), not the connection's prefix
        inbox_prefix=f"{inbox_prefix(user)}.".encode(),
        # Fallback only: MessageOutcomes settles failures itself; without it an error still nacks.
        ack_policy=AckPolicy.NACK_ON_ERROR,
    )


async def stop_consuming(broker: NatsBroker) -> None:
    """Stop the broker's consumers (in-flight messages finish within the graceful timeout or
    are cancelled) and keep its connection: what they started can still publish. The broker's
    own ``stop`` closes the connection later."""
    await asyncio.gather(*(subscriber.stop() for subscriber in broker.subscribers))


# --------------------------------------------------------------------------------------------------
# Publishing


def stream_for(subject: str, specs: Iterable[StreamSpec] = STREAMS) -> StreamSpec:
    """The stream whose subjects capture ``subject``."""
    if specs is STREAMS:
        return _contract_stream_for(subject)
    return _match_stream(subject, specs)


@functools.lru_cache(maxsize=4096)
def _contract_stream_for(subject: str) -> StreamSpec:
    # the contract's streams never change: a subject is matched once, not on every publish
    return _match_stream(subject, STREAMS)


def _match_stream(subject: str, specs: Iterable[StreamSpec]) -> StreamSpec:
    for spec in specs:
        if any(subject_matches(subject, pattern) for pattern in spec.subjects):
            return spec
    raise ValueError(f"no AEGIS stream captures subject {subject!r}")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message for :func:`publish_many`: ``msg_id`` becomes its ``Nats-Msg-Id``."""

    subject: str
    payload: bytes | pydantic.BaseModel
    msg_id: str | None


async def publish(
    broker: NatsBroker,
    subject: str,
    payload: bytes | pydantic.BaseModel,
    *,
    msg_id: str | None,
    headers: Mapping[str, str] | None = None,
    stream: str | None = None,
    correlation_id: str | None = None,
    ack_timeout: float = 5.0,
) -> bool:
    """Publish to JetStream and wait for the server's ack; return True if it was a duplicate.

    ``msg_id`` becomes the ``Nats-Msg-Id`` header: the stream stores one message per id within its
    duplicate window and answers later ones with ``duplicate=True``. A pydantic model is sent as
    JSON (content-type application/json). ``stream`` defaults to the AEGIS stream of ``subject``;
    the server refuses the publish if the subject lands elsewhere. Raises :class:`PublishFailed`,
    or :class:`StreamFull` when the stream refused the message at one of its limits.

    FastStream's JetStream publish (``broker.publish`` with ``stream``): one request and its
    answer, so a refusal is an error, not a timeout. The body goes as encoded here (a model's
    ``model_dump_json``), with exactly these headers: FastStream adds its correlation id only
    when one is given (:func:`create_broker`), and an empty content-type for plain bytes.
    """
    data, sent_headers = _outgoing(Outgoing(subject, payload, msg_id), headers, correlation_id)
    try:
        ack = await broker.publish(
            data,
            subject,
            headers=sent_headers,
            correlation_id=correlation_id,
            stream=stream or stream_for(subject).name,
            timeout=ack_timeout,
        )
    except (natsio.Error, TimeoutError) as err:
        raise _publish_failure(subject, err) from err
    return bool(ack.duplicate)


def _publish_failure(subject: str, err: Exception) -> PublishFailed:
    refused = natsio.store_refused(err)
    if refused is not None:
        return StreamFull(f"{subject}: JetStream refused it: {refused}")
    return PublishFailed(f"publish to {subject} failed: {err!r}")


async def publish_many(
    broker: NatsBroker,
    messages: Sequence[Outgoing],
    *,
    headers: Mapping[str, str] | None = None,
    stream: str | None = None,
    correlation_id: str | None = None,
    ack_timeout: float = 5.0,
) -> list[bool]:
    """:func:`publish` for several messages at once: all are sent, then all acks awaited
    (``ack_timeout`` for the lot); True for each that was a duplicate. Raises
    :class:`PublishFailed` if any was not confirmed (the others may well be stored); a message
    the server refused shows as not confirmed in time (nats-py's asynchronous acks), so the
    streams these go to drop their oldest messages rather than refuse new ones.

    nats-py's asynchronous JetStream publish (:func:`aegis_runtime.natsio.publish_async`), which
    FastStream does not model: its acks, matched by one reply subscription, cost less than a
    request per message."""
    pending: list[asyncio.Future[PubAck]] = []
    subject = ""
    try:
        for message in messages:
            subject = message.subject
            data, sent_headers = _outgoing(message, headers, correlation_id)
            pending.append(
                await natsio.publish_async(
                    broker,
                    subject,
                    data,
                    stream=stream or stream_for(subject).name,
                    headers=sent_headers,
                )
            )
        acks = await asyncio.wait_for(asyncio.gather(*pending), ack_timeout)
    except (natsio.Error, TimeoutError) as err:
        for future in pending:
            if future.done() and not future.cancelled():
                future.exception()  # seen: not "never retrieved"
            future.cancel()
        raise _publish_failure(subject, err) from err
    return [bool(ack.duplicate) for ack in acks]


def _outgoing(
    message: Outgoing, headers: Mapping[str, str] | None, correlation_id: str | None
) -> tuple[bytes, dict[str, str]]:
    sent_headers = dict(headers or {})
    if message.msg_id is not None:
        sent_headers[MSG_ID_HEADER] = message.msg_id
    if correlation_id is not None:
        sent_headers["correlation_id"] = correlation_id
    if isinstance(message.payload, pydantic.BaseModel):
        sent_headers.setdefault("content-type", "application/json")
        return message.payload.model_dump_json().encode(), sent_headers
    return message.payload, sent_headers


async def publish_raw_archived(
    broker: NatsBroker, event: RawArchived, *, ack_timeout: float = 5.0
) -> bool:
    """Publish a RawArchived event the one way ingest and ``aegis replay`` both do: on its raw
    subject, with the raw key as Nats-Msg-Id. Returns True if JetStream called it a duplicate."""
    return await publish(
        broker,
        raw_subject(event.factory_id, event.source_type),
        event,
        msg_id=raw_event_msg_id(event),
        ack_timeout=ack_timeout,
    )


# --------------------------------------------------------------------------------------------------
# Dead letters


class DeadLetter(pydantic.BaseModel):
    """The envelope on ``aegis.dlq.{service}.{reason}``: enough to understand and replay a message."""

    # like every event: a field a newer version added is ignored, not refused
    model_config = pydantic.ConfigDict(frozen=True, extra="ignore")

    service: str
    reason: str
    detail: str
    received_at: datetime
    message_id: str | None = None
    subject: str | None = None
    headers: dict[str, str] = pydantic.Field(default_factory=dict)
    deliveries: int | None = None
    payload_encoding: Literal["utf-8", "base64"]
    payload: str

    @classmethod
    def wrap(
        cls,
        *,
        service: str,
        reason: str,
        payload: bytes,
        detail: str,
        received_at: datetime,
        message_id: str | None = None,
        subject: str | None = None,
        headers: Mapping[str, str] | None = None,
        deliveries: int | None = None,
    ) -> DeadLetter:
        try:
            text, encoding = payload.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(payload).decode("ascii"), "base64"
        return cls(
            service=service,
            reason=reason,
            detail=detail[:_DETAIL_LIMIT],
            received_at=received_at,
            message_id=message_id,
            subject=subject,
            headers=dict(headers or {}),
            deliveries=deliveries,
            payload_encoding=encoding,
            payload=text,
        )

    def payload_bytes(self) -> bytes:
        """The original payload, byte for byte."""
        if self.payload_encoding == "base64":
            return base64.b64decode(self.payload)
        return self.payload.encode("utf-8")


async def dead_letter(
    broker: NatsBroker,
    *,
    service: str,
    reason: str,
    payload: bytes,
    detail: str,
    subject: str | None = None,
    headers: Mapping[str, str] | None = None,
    message_id: str | None = None,
    deliveries: int | None = None,
    received_at: datetime | None = None,
) -> bool:
    """Publish a :class:`DeadLetter` to ``dead_letter_subject(service, reason)``; True if duplicate.

    Idempotent on redelivery: its ``Nats-Msg-Id`` is derived from ``message_id`` (else from a hash
    of the original subject and payload) and ``reason``. Raises :class:`PublishFailed`.
    """
    reason = _reason_token(reason)
    digest = _digest(subject, payload)
    original = message_id or digest
    envelope = DeadLetter.wrap(
        service=service,
        reason=reason,
        payload=payload,
        detail=detail,
        received_at=received_at or utc_now(),
        message_id=message_id,
        subject=subject,
        headers=headers,
        deliveries=deliveries,
    )
    return await publish(
        broker,
        dead_letter_subject(service, reason),
        envelope,
        msg_id=msgids.dead_letter(service, reason, original, digest),
    )


def _digest(subject: str | None, payload: bytes) -> str:
    h = hashlib.sha256((subject or "").encode())
    h.update(b"\0")
    h.update(payload)
    return h.hexdigest()[:32]


def _reason_token(reason: str) -> str:
    token = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in reason)
    return token[:64] or "unknown"


def poison_reason(exc: BaseException) -> str | None:
    """The dead-letter reason when ``exc`` says the message itself is bad; None when a retry may help."""
    if isinstance(exc, Poison):
        return exc.reason
    if isinstance(exc, ContractError):
        return _reason_token(exc.code)
    if isinstance(exc, pydantic.ValidationError | DependsValidationError):
        return "invalid_payload"
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return "invalid_payload"
    return None


# --------------------------------------------------------------------------------------------------
# Per-message outcome


_delivery: ContextVar[int] = ContextVar("aegis_delivery", default=1)
_subject: ContextVar[str] = ContextVar("aegis_subject", default="")
_message: ContextVar[str] = ContextVar("aegis_message", default="")


def delivery() -> int:
    """Which delivery of the JetStream message being handled this is (1: the first), as the
    :class:`MessageOutcomes` middleware found it. Handlers read it here rather than declaring a
    ``msg: NatsMessage`` parameter: FastStream resolves such a context parameter by running a
    synchronous function in a worker thread, a thread hand-off for every message."""
    return _delivery.get()


def current_subject() -> str:
    """The subject of the JetStream message being handled (empty outside a handler); read it here
    for the same reason as :func:`delivery`."""
    return _subject.get()


def current_message() -> str:
    """``{stream}:{sequence}`` of the JetStream message being handled (empty outside a handler):
    the same for every delivery of that message, different for another message with the same
    body. Read it here for the same reason as :func:`delivery`."""
    return _message.get()


class MessageOutcomes:
    """Broker middleware factory: per JetStream message, bind log context (service, message_id,
    subject, delivery), count it in the metrics, write one summary line, and settle failures:
    poison -> dead-letter + ack; other errors -> nack with delay, dead-letter on the last delivery.
    Handlers may still settle a message themselves (``NackMessage``, ``AckMessage``, ...)."""

    def __init__(
        self,
        *,
        service: str,
        broker: NatsBroker,
        metrics: Metrics | None,
        retry: RetryPolicy,
    ) -> None:
        self.service = service
        self.broker = broker
        self.metrics = metrics
        self.retry = retry

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _MessageOutcome:
        return _MessageOutcome(msg, context=context, outcomes=self)


class _MessageOutcome(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: ContextRepo, outcomes: MessageOutcomes) -> None:
        super().__init__(msg, context=context)
        self.outcomes = outcomes
        self.raw: Msg | None = natsio.jetstream_delivery(msg)
        self.scope = ExitStack()
        self.started = 0.0
        self.message_id = ""
        self.delivery = 0
        self.consumer = ""

    async def on_receive(self) -> None:
        raw = self.raw
        if raw is None:  # core NATS or batch subscriber: not ours to settle
            return
        meta = raw.metadata
        self.delivery = meta.num_delivered or 1
        headers = raw.headers or {}
        self.message_id = headers.get(MSG_ID_HEADER) or f"{meta.stream}:{meta.sequence.stream}"
        _delivery.set(self.delivery)
        self.scope.callback(_delivery.set, 1)
        _subject.set(raw.subject)
        self.scope.callback(_subject.set, "")
        _message.set(f"{meta.stream}:{meta.sequence.stream}")
        self.scope.callback(_message.set, "")
        self.scope.enter_context(
            bind_message(
                service=self.outcomes.service,
                message_id=self.message_id,
                subject=raw.subject,
                delivery=self.delivery,
            )
        )
        self.consumer = meta.consumer or "ephemeral"
        if self.outcomes.metrics is not None:
            self.outcomes.metrics.inflight.labels(consumer=self.consumer).inc()
        self.started = time.perf_counter()

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        raw = self.raw
        if raw is None:
            return False
        outcome, handled, level, fields = "ok", False, logging.INFO, {}
        try:
            if exc_val is None:
                pass
            elif isinstance(exc_val, HandlerException):  # the handler settled it explicitly
                outcome = _explicit_outcome(exc_val)
            elif not isinstance(exc_val, Exception):  # cancellation, exit: not a message failure
                outcome = "interrupted"
            elif raw.is_acked:
                outcome, level = "failed_after_settle", logging.ERROR
                fields = {"error": repr(exc_val)}
            else:
                outcome, level, fields = await self._settle_failure(raw, exc_val)
                handled = True
        finally:
            self._finish(outcome, level, fields, exc_val if level >= logging.ERROR else None)
        return handled

    async def _settle_failure(self, raw: Msg, exc: Exception) -> tuple[str, int, dict[str, Any]]:
        retry = self.outcomes.retry
        reason = poison_reason(exc)
        max_deliver = self._max_deliver()
        error = f"{type(exc).__name__}: {exc}"
        if reason is None and self.delivery < max_deliver:
            delay = retry.delay(self.delivery)
            if self.delivery + 1 >= max_deliver:  # the next delivery is the last one
                delay = max(delay, float(getattr(exc, "retry_after_s", 0.0)))
            await _settle(raw.nak(delay=delay))
            return "retried", logging.WARNING, {"error": error, "retry_in_s": delay}
        reason = reason or "retries_exhausted"
        detail = error
        if reason == "retries_exhausted":
            detail = f"{error} (delivery {self.delivery} of {max_deliver})"
        try:
            await dead_letter(
                self.outcomes.broker,
                service=self.outcomes.service,
                reason=reason,
                payload=raw.data,
                detail=detail,
                subject=raw.subject,
                headers=raw.headers,
                message_id=self.message_id,
                deliveries=self.delivery,
            )
        except PublishFailed as dlq_err:
            # Keep the message rather than lose it; the next delivery tries the dead letter again.
            # (On the max_deliver-th delivery NATS will not redeliver: it stays in the stream,
            # with this ERROR line and the server's MAX_DELIVERIES advisory, for replay.)
            delay = retry.delay(self.delivery)
            await _settle(raw.nak(delay=delay))
            return "retried", logging.ERROR, {"error": error, "dead_letter_error": repr(dlq_err)}
        await _settle(raw.ack())
        if self.outcomes.metrics is not None:
            self.outcomes.metrics.dead_letters_total.labels(reason=reason).inc()
        return "dead_lettered", logging.ERROR, {"error": error, "reason": reason}

    def _max_deliver(self) -> int:
        # The subscriber's consumer config (FastStream puts the subscriber in context as "handler_").
        subscriber = self.context.get_local("handler_")
        configured = getattr(getattr(subscriber, "config", None), "max_deliver", None)
        if isinstance(configured, int) and configured > 0:
            return configured
        return self.outcomes.retry.max_deliver

    def _finish(
        self, outcome: str, level: int, fields: dict[str, Any], exc: BaseException | None
    ) -> None:
        elapsed = time.perf_counter() - self.started
        metrics = self.outcomes.metrics
        if metrics is not None:
            metrics.inflight.labels(consumer=self.consumer).dec()
            metrics.messages_total.labels(consumer=self.consumer, outcome=outcome).inc()
            metrics.handler_seconds.labels(consumer=self.consumer).observe(elapsed)
        try:
            if _stdlog.isEnabledFor(level):
                log.log(
                    level,
                    "message_handled",
                    outcome=outcome,
                    duration_ms=round(elapsed * 1000, 3),
                    exc_info=exc,
                    **fields,
                )
        finally:
            self.scope.close()


def _explicit_outcome(exc: HandlerException) -> str:
    if isinstance(exc, AckMessage):
        return "ok"
    if isinstance(exc, NackMessage):
        return "retried"
    if isinstance(exc, RejectMessage):
        return "rejected"
    return "skipped"


async def _settle(ack: Any) -> None:
    # A lost ack/nak only means an earlier redelivery (after ack_wait); never fail the consumer.
    try:
        await ack
    except natsio.Error as err:
        log.warning("message_settle_failed", error=repr(err))
