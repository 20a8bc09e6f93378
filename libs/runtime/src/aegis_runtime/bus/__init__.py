"""The bus: NATS JetStream as every AEGIS service uses it, through FastStream.

- :mod:`~aegis_runtime.bus.connect`: the broker of a service or a command, connection options;
- :mod:`~aegis_runtime.bus.streams`: the contract's streams, durable pull consumers;
- :mod:`~aegis_runtime.bus.publish`: de-duplicated, confirmed publishing;
- :mod:`~aegis_runtime.bus.deadletters`: the dead-letter envelope and what makes one;
- :mod:`~aegis_runtime.bus.outcomes`: what becomes of a message (ack, delayed nack, dead letter);
- :mod:`~aegis_runtime.bus.errors`: the errors, and the retry policy.

Import from ``aegis_runtime.bus``; the modules are its rooms.
"""

from __future__ import annotations

from aegis_runtime.bus.connect import (
    command_broker,
    connect_broker,
    connect_options,
    create_broker,
    inbox_prefix,
    log_bus_identity,
    nats_ready,
)
from aegis_runtime.bus.deadletters import DeadLetter, dead_letter, poison_reason
from aegis_runtime.bus.errors import (
    BrokerError,
    BrokerUnavailable,
    Poison,
    PublishFailed,
    RetryPolicy,
    StreamFull,
    StreamSetupFailed,
    reason_token,
)
from aegis_runtime.bus.outcomes import MessageOutcomes, current_message, current_subject, delivery
from aegis_runtime.bus.publish import (
    MSG_ID_HEADER,
    Outgoing,
    publish,
    publish_many,
    publish_raw_archived,
    stream_for,
)
from aegis_runtime.bus.streams import (
    StreamLimits,
    durable_pull,
    ensure_deployed_streams,
    ensure_streams,
    jstream,
    stop_consuming,
)

__all__ = [
    "MSG_ID_HEADER",
    "BrokerError",
    "BrokerUnavailable",
    "DeadLetter",
    "MessageOutcomes",
    "Outgoing",
    "Poison",
    "PublishFailed",
    "RetryPolicy",
    "StreamFull",
    "StreamLimits",
    "StreamSetupFailed",
    "command_broker",
    "connect_broker",
    "connect_options",
    "create_broker",
    "current_message",
    "current_subject",
    "dead_letter",
    "delivery",
    "durable_pull",
    "ensure_deployed_streams",
    "ensure_streams",
    "inbox_prefix",
    "jstream",
    "log_bus_identity",
    "nats_ready",
    "poison_reason",
    "publish",
    "publish_many",
    "publish_raw_archived",
    "reason_token",
    "stop_consuming",
    "stream_for",
]
