"""What ingest does with one MQTT message, decided without I/O: archive it (where, under which id,
with which metadata and event) or reject it (dead-letter reason, detail, the bytes to keep).

It lives in the contracts because two writers must agree on it byte for byte: ingest, and
``aegis replay``, which feeds raw/ objects back as the very RawArchived event (and Nats-Msg-Id)
ingest published, from the bytes and the object metadata ingest stored.

The topic and the size are checked before anything is written; on a valid topic the
payload is archived as received, even when it is not JSON (the processor dead-letters it later).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from aegis_contracts.errors import ContractError
from aegis_contracts.events import RawArchived
from aegis_contracts.ids import (
    MAX_PAYLOAD_BYTES,
    SourceType,
    derive_message_id,
    message_id_or_derived,
    parse_topic,
)
from aegis_contracts.keys import factory as key_factory
from aegis_contracts.keys import raw_key
from aegis_contracts.times import format_ts, parse_ts

INVALID_TOPIC = "invalid_topic"
PAYLOAD_TOO_LARGE = "payload_too_large"
MESSAGE_ID_CONFLICT = "message_id_conflict"
QUEUE_FULL = "queue_full"

DEFAULT_INLINE_MAX_BYTES = 64 * 1024
DEFAULT_DEAD_LETTER_PREFIX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Archive:
    """Store ``payload`` at ``key`` (immutable) with ``metadata``, then publish ``event``."""

    key: str
    message_id: str
    message_id_derived: bool
    factory_id: str
    source_type: SourceType
    metadata: Mapping[str, str]
    event: RawArchived


@dataclass(frozen=True, slots=True)
class Reject:
    """Dead-letter ``payload`` (possibly a bounded prefix of the original) with ``reason``; write nothing."""

    reason: str
    detail: str
    payload: bytes
    message_id: str | None = None
    factory_id: str | None = None


Decision = Archive | Reject


def admit(
    topic: str,
    payload: bytes,
    received_at: datetime,
    qos: int,
    *,
    bucket: str,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
    dead_letter_prefix_bytes: int = DEFAULT_DEAD_LETTER_PREFIX_BYTES,
) -> Decision:
    """Classify one message received on ``topic`` at ``received_at`` (aware UTC)."""
    try:
        factory_id, source_type = parse_topic(topic)
        # a reserved name (cloud-infra) passes the id pattern but is no factory: refuse it here too
        factory_id = key_factory(factory_id)
    except ContractError as err:
        return Reject(INVALID_TOPIC, f"{err.code}: {err}", payload)

    size = len(payload)
    if size > MAX_PAYLOAD_BYTES:
        digest = hashlib.sha256(payload).hexdigest()
        return Reject(
            PAYLOAD_TOO_LARGE,
            f"payload is {size} bytes, the limit is {MAX_PAYLOAD_BYTES}; sha256 {digest}; "
            f"the dead letter keeps the first {min(size, dead_letter_prefix_bytes)} bytes",
            payload[:dead_letter_prefix_bytes],
            # a redelivery of the same payload dead-letters under the same id (JetStream de-dup)
            message_id=derive_message_id(topic, payload),
            factory_id=factory_id,
        )

    message_id, derived = message_id_or_derived(_peek_message_id(payload), topic, payload)
    key = raw_key(factory_id, source_type, received_at, message_id)
    metadata = {"topic": topic, "received_at": format_ts(received_at), "qos": str(qos)}
    event = RawArchived(
        message_id=message_id,
        message_id_derived=derived,
        factory_id=factory_id,
        source_type=source_type,
        topic=topic,
        bucket=bucket,
        key=key,
        received_at=received_at,
        size_bytes=size,
        qos=qos,
        payload_text=_inline_text(payload, inline_max_bytes),
    )
    return Archive(key, message_id, derived, factory_id, source_type, metadata, event)


def raw_event_msg_id(event: RawArchived) -> str:
    """The Nats-Msg-Id of a RawArchived event: the raw key, not the bare message_id, because
    de-duplication is per stream and two devices may both send "msg-00000001" in the window."""
    return event.key


def archived_again(
    key: str,
    payload: bytes,
    metadata: Mapping[str, str],
    *,
    bucket: str,
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES,
) -> Archive:
    """The decision ingest made for the raw object ``key``, rebuilt from its bytes and the metadata
    ingest stored with it (topic, received_at, qos). Raises :class:`ContractError` when the object
    is not something ingest archived there (no metadata, another key, a refused topic)."""
    try:
        topic, received_at, qos = (
            metadata["topic"],
            parse_ts(metadata["received_at"]),
            int(metadata["qos"]),
        )
    except (KeyError, ValueError) as err:
        raise ContractError(
            "not_ingested", f"{key} has no ingest metadata (topic, received_at, qos): {err}"
        ) from None
    decision = admit(
        topic, payload, received_at, qos, bucket=bucket, inline_max_bytes=inline_max_bytes
    )
    if not isinstance(decision, Archive):
        raise ContractError("not_ingested", f"{key}: ingest would refuse it ({decision.reason})")
    if decision.key != key:
        raise ContractError("not_ingested", f"{key}: ingest would archive it as {decision.key}")
    return decision


def conflict(archive: Archive, payload: bytes, detail: str) -> Reject:
    """The same message_id arrived with another body: raw/ keeps the first, the new one is dead-lettered.

    The dead letter's de-duplication id is derived from the message_id, so a third body for the same id
    within JetStream's duplicate window (2 min) is counted and logged but not stored again.
    """
    return Reject(
        MESSAGE_ID_CONFLICT,
        detail,
        payload,
        message_id=archive.message_id,
        factory_id=archive.factory_id,
    )


def queue_full(archive: Archive, detail: str) -> Reject:
    """The message is archived but the queue refused its event (its factory's backlog is at the
    raw stream's bound): the dead letter carries the event itself, and the raw object stays, so
    ``aegis replay`` (or republishing the event) queues it again once the backlog drains."""
    return Reject(
        QUEUE_FULL,
        f"{detail}; the raw object {archive.key} is kept: `aegis replay` queues it again",
        archive.event.model_dump_json().encode(),
        message_id=archive.message_id,
        factory_id=archive.factory_id,
    )


def _peek_message_id(payload: bytes) -> object:
    """The top-level ``message_id`` of a JSON object payload, else None (never raises)."""
    if payload.lstrip()[:1] != b"{":
        return None
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or absurdly nested
        return None
    return value.get("message_id") if isinstance(value, dict) else None


def _inline_text(payload: bytes, limit: int) -> str | None:
    if len(payload) > limit:
        return None
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
