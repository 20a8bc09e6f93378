"""What a JetStream stream holds, read without a consumer: the messages stored on a subject, and
the dead letters of a service and reason (a handful each: a test's own subjects)."""

from __future__ import annotations

from typing import Any

from aegis_contracts.subjects import dead_letter_subject
from aegis_runtime.bus import DeadLetter
from aegis_runtime.natsio import JetStreamContext, NotFound

DLQ_STREAM = "AEGIS_DLQ"


async def messages_on(js: JetStreamContext, stream: str, subject: str) -> list[Any]:
    """Every stored message on ``subject`` of ``stream``, oldest first."""
    found: list[Any] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except NotFound:
            return found
        found.append(msg)
        seq = (msg.seq or seq) + 1


async def dead_letters(js: JetStreamContext, service: str, reason: str) -> list[DeadLetter]:
    """The dead letters ``service`` stored with ``reason``."""
    raw = await messages_on(js, DLQ_STREAM, dead_letter_subject(service, reason))
    return [DeadLetter.model_validate_json(m.data) for m in raw]
