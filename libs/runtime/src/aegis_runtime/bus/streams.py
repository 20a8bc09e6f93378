"""The JetStream streams of the contract (created, kept at their configuration) and the durable
pull consumers services read them with."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import TYPE_CHECKING, Any, Literal

import structlog
from faststream import AckPolicy
from faststream.nats import AckPolicy as ConsumerAckPolicy
from faststream.nats import (
    ConsumerConfig,
    DiscardPolicy,
    JStream,
    NatsBroker,
    PullSub,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from faststream.nats.subscriber.usecases import PullStreamSubscriber

from aegis_contracts.backoff import exponential_s
from aegis_contracts.subjects import STREAMS, StreamSpec
from aegis_runtime import natsio
from aegis_runtime.bus.connect import inbox_prefix, log_bus_identity
from aegis_runtime.bus.errors import StreamSetupFailed
from aegis_runtime.settings import RAW_MAX_PER_FACTORY, AegisSettings

if TYPE_CHECKING:
    from faststream.nats.broker.registrator import NatsRegistrator


# how long a stream's creation waits for a forming cluster to have nodes for its replicas
PLACEMENT_WAIT_S = 30.0
log = structlog.get_logger(__name__)


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
    subscriber = router.subscriber(
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
    _paced_from_the_first_fetch(subscriber)
    return subscriber


def _paced_from_the_first_fetch(subscriber: PullStreamSubscriber) -> None:
    """Pace ``subscriber``'s fetches (:func:`aegis_runtime.natsio.pace_fetches`) as soon as
    FastStream has made its subscription. FastStream makes it and starts the pull loop in one
    step of the broker's start; the loop's first fetch runs at the next turn of the event loop,
    so the subscription is wrapped before any fetch."""
    create = subscriber._create_subscription

    async def create_then_pace() -> None:
        await create()
        if subscriber.subscription is not None:
            natsio.pace_fetches(subscriber.subscription)

    subscriber._create_subscription = create_then_pace  # type: ignore[method-assign]


async def stop_consuming(broker: NatsBroker) -> None:
    """Stop the broker's consumers and keep its connection: what they started can still publish.
    The broker's own ``stop`` closes the connection later.

    A pull consumer first finishes the fetch it is waiting on and handles what that fetch
    brought (:func:`_finish_fetching`); only then is it stopped (in-flight messages finish within
    the graceful timeout or are cancelled). Stopped in the middle of a fetch, it would drop the
    messages the server had already delivered to it, unacknowledged: those would wait out their
    ack wait (minutes, for the alert dispatcher) before anyone saw them again."""

    async def stop(subscriber: Any) -> None:
        if isinstance(subscriber, PullStreamSubscriber) and subscriber.running:
            await _finish_fetching(subscriber)
        await subscriber.stop()

    await asyncio.gather(*(stop(s) for s in broker.subscribers))


async def _finish_fetching(subscriber: PullStreamSubscriber) -> None:
    """Let ``subscriber``'s pull loop finish the fetch in progress and handle its messages, then
    hold the loop at its next fetch: it asks the server for nothing more. Messages already in the
    subscription's buffer (delivered after a fetch returned) are handed to the loop first
    (:func:`aegis_runtime.natsio.take_buffered`). Bounded by the fetch's timeout and the
    broker's graceful timeout; after that the subscriber is stopped as it stands."""
    subscription = subscriber.subscription
    if subscription is None or not any(not t.done() for t in subscriber.tasks):
        return
    held = asyncio.Event()

    async def from_buffer_then_hold(*_args: Any, **_kwargs: Any) -> list[Any]:
        if buffered := natsio.take_buffered(subscription):
            return buffered
        held.set()
        await asyncio.Event().wait()  # until the subscriber's stop cancels the loop
        return []

    subscription.fetch = from_buffer_then_hold  # type: ignore[method-assign]
    timeout = (subscriber.pull_sub.timeout or 0.0) + _graceful_timeout(subscriber)
    try:
        await asyncio.wait_for(held.wait(), timeout=timeout)
    except TimeoutError:
        log.warning(
            "consumer_stop_waited",
            durable=getattr(subscriber.config, "durable_name", None),
            waited_s=timeout,
        )


def _graceful_timeout(subscriber: PullStreamSubscriber) -> float:
    configured = getattr(subscriber._outer_config, "graceful_timeout", None)
    return float(configured) if isinstance(configured, int | float) else 20.0
