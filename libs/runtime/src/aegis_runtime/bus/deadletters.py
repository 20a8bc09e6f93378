"""Dead letters: the envelope on ``aegis.dlq.{service}.{reason}`` that keeps a message that can
never succeed, enough to understand and replay it, and which errors make one."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Literal

import pydantic
from fast_depends.exceptions import ValidationError as DependsValidationError
from faststream.nats import NatsBroker

from aegis_contracts import msgids
from aegis_contracts.errors import ContractError
from aegis_contracts.subjects import dead_letter_subject
from aegis_contracts.times import utc_now
from aegis_runtime.bus.errors import Poison, reason_token
from aegis_runtime.bus.publish import publish

_DETAIL_LIMIT = 2000


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
    reason = reason_token(reason)
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


def poison_reason(exc: BaseException) -> str | None:
    """The dead-letter reason when ``exc`` says the message itself is bad; None when a retry may help."""
    if isinstance(exc, Poison):
        return exc.reason
    if isinstance(exc, ContractError):
        return reason_token(exc.code)
    if isinstance(exc, pydantic.ValidationError | DependsValidationError):
        return "invalid_payload"
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return "invalid_payload"
    return None
