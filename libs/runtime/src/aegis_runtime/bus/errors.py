"""The bus's errors, and the retry policy of a failed message.

BrokerError              base of the bus's errors
├── BrokerUnavailable    a command's first connection found no NATS server in time
├── PublishFailed        JetStream did not confirm a publish (timeout, no stream, API error)
│   └── StreamFull       JetStream refused to store it at a discard-new limit
└── StreamSetupFailed    a stream could not be created or updated (subject overlap, storage change)
Poison                   raised by a handler: the message can never succeed; dead-letter ``reason``
"""

from __future__ import annotations

from dataclasses import dataclass

from aegis_contracts.backoff import exponential_s


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
        self.reason = reason_token(reason)
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


def reason_token(reason: str) -> str:
    """``reason`` as a dead-letter subject token: ASCII letters, digits, ``_`` and ``-``, at most
    64 characters."""
    token = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in reason)
    return token[:64] or "unknown"


class BrokerUnavailable(BrokerError):
    """A command's first connection found no NATS server within ``nats_connect_timeout_s``."""
