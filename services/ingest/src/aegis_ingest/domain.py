"""What ingest does with one MQTT message, decided without I/O. The decisions live in
:mod:`aegis_contracts.archive` so that ``aegis replay`` rebuilds the very same event; this module
names them for ingest."""

from aegis_contracts.archive import (
    DEFAULT_DEAD_LETTER_PREFIX_BYTES,
    DEFAULT_INLINE_MAX_BYTES,
    INVALID_TOPIC,
    MESSAGE_ID_CONFLICT,
    PAYLOAD_TOO_LARGE,
    QUEUE_FULL,
    Archive,
    Decision,
    Reject,
    admit,
    conflict,
    queue_full,
)

__all__ = [
    "DEFAULT_DEAD_LETTER_PREFIX_BYTES",
    "DEFAULT_INLINE_MAX_BYTES",
    "INVALID_TOPIC",
    "MESSAGE_ID_CONFLICT",
    "PAYLOAD_TOO_LARGE",
    "QUEUE_FULL",
    "Archive",
    "Decision",
    "Reject",
    "admit",
    "conflict",
    "queue_full",
]
