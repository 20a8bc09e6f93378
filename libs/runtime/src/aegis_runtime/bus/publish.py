"""Publishing to JetStream: de-duplicated by ``Nats-Msg-Id``, confirmed by the server."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pydantic
from faststream.nats import NatsBroker, PubAck

from aegis_contracts.archive import raw_event_msg_id
from aegis_contracts.events import RawArchived
from aegis_contracts.subjects import STREAMS, StreamSpec, raw_subject, subject_matches
from aegis_runtime import natsio
from aegis_runtime.bus.errors import PublishFailed, StreamFull

MSG_ID_HEADER = "Nats-Msg-Id"


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
    :class:`PublishFailed` if any was not confirmed (the others may well be stored), naming the
    subject of the first the server refused, if any; :class:`StreamFull` when that refusal was
    a stream's limit.

    The asynchronous JetStream publish (:func:`aegis_runtime.natsio.publish_async`), which
    FastStream does not model: its acks, matched by one reply subscription, cost less than a
    request per message."""
    pending: list[asyncio.Future[PubAck]] = []
    try:
        outgoing = []
        for message in messages:
            data, sent_headers = _outgoing(message, headers, correlation_id)
            target = stream or stream_for(message.subject).name
            outgoing.append((message.subject, data, target, sent_headers))
        pending = await natsio.publish_async(broker, outgoing)
        acks = await asyncio.wait_for(asyncio.gather(*pending), ack_timeout)
    except (natsio.Error, TimeoutError) as err:
        refused = [
            message.subject
            for message, future in zip(messages, pending, strict=False)
            if future.done() and not future.cancelled() and future.exception() is not None
        ]  # each exception seen: none is left "never retrieved"
        for future in pending:
            future.cancel()
        natsio.forget_unanswered(broker)
        named = refused or [m.subject for m in messages[:1]]
        raise _publish_failure(named[0] if named else "", err) from err
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
    subject, with the raw key as Nats-Msg-Id and the device's message id as ``correlation_id``
    (the processor's consumer takes it as the message's id, in its logs too; without one,
    FastStream would draw a random id for every message it consumes). Returns True if
    JetStream called it a duplicate."""
    return await publish(
        broker,
        raw_subject(event.factory_id, event.source_type),
        event,
        msg_id=raw_event_msg_id(event),
        correlation_id=event.message_id,
        ack_timeout=ack_timeout,
    )
