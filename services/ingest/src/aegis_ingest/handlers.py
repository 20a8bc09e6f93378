"""The glue for one MQTT message: decide (domain.admit), archive to raw/, publish RawArchived or a
dead letter, retry transient failures, and say whether the message may be acknowledged.

Outcomes (``messages_total{outcome}``): ``archived`` and ``duplicate`` (raw object stored and event
confirmed), ``dead_lettered`` (poison: dead letter confirmed), all three acknowledged to the broker;
``deferred``: a storage or NATS failure outlasted the retry budget (or the service is stopping), the
message stays unacknowledged and the broker redelivers it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import structlog
from faststream.nats import NatsBroker

from aegis_ingest.domain import Archive, Reject, admit, conflict, queue_full
from aegis_ingest.settings import IngestSettings
from aegis_runtime.broker import BrokerError, StreamFull, dead_letter, publish_raw_archived
from aegis_runtime.logging import bind_message
from aegis_runtime.metrics import Metrics
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.s3 import ObjectStore, PutOutcome

log = structlog.get_logger("aegis_ingest")
# the stdlib logger under ``log``: its level is checked before a per-message line is built
_stdlog = logging.getLogger("aegis_ingest")

_TOPIC_LOG_LIMIT = 200
# the consumer label of ingest's handler metrics: its MQTT subscription
CONSUMER = "mqtt"


class Outcome(StrEnum):
    ARCHIVED = "archived"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    DEFERRED = "deferred"

    @property
    def acknowledge(self) -> bool:
        return self is not Outcome.DEFERRED


@dataclass(frozen=True, slots=True)
class Inbound:
    """One MQTT message as ingest sees it."""

    topic: str
    payload: bytes
    qos: int
    received_at: datetime


# worth another attempt: the object store or JetStream did not answer or refused for now
_TRANSIENT: tuple[type[BaseException], ...] = (StorageError, BrokerError, TimeoutError, OSError)


# outcomes whose summary line is INFO (the others warn, and count dead letters)
_ACKED_QUIETLY = frozenset({Outcome.ARCHIVED, Outcome.DUPLICATE})


class _Stopping(Exception):
    """The service is stopping while a message waits to be retried."""


class IngestHandler:
    def __init__(
        self,
        *,
        settings: IngestSettings,
        store: ObjectStore,
        broker: NatsBroker,
        metrics: Metrics,
        stopping: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.broker = broker
        self.metrics = metrics
        self.stopping = stopping or asyncio.Event()

    async def handle(self, message: Inbound) -> Outcome:
        """Archive or dead-letter ``message``; never raises (a bug is logged and deferred)."""
        started = time.perf_counter()
        decision = admit(
            message.topic,
            message.payload,
            message.received_at,
            message.qos,
            bucket=self.store.bucket,
            inline_max_bytes=self.settings.payload_inline_max_bytes,
            dead_letter_prefix_bytes=self.settings.dead_letter_prefix_bytes,
        )
        with bind_message(
            service=self.settings.service,
            factory_id=decision.factory_id,
            message_id=decision.message_id,
        ):
            self.metrics.inflight.labels(consumer=CONSUMER).inc()
            attempts = 0
            rejected: Reject | None = None
            error: str | None = None
            try:
                while True:
                    attempts += 1
                    try:
                        outcome, rejected = await self._apply(decision, message)
                        break
                    except _TRANSIENT as err:
                        error = f"{type(err).__name__}: {err}"
                        if attempts >= self.settings.ingest_retry_attempts:
                            outcome = Outcome.DEFERRED
                            break
                        await self._backoff(attempts)
            except _Stopping:
                outcome = Outcome.DEFERRED
            except Exception as err:  # a bug: keep the message for redelivery, and say so loudly
                outcome, error = Outcome.DEFERRED, f"{type(err).__name__}: {err}"
                log.exception("message_failed", topic=message.topic[:_TOPIC_LOG_LIMIT])
            finally:
                self.metrics.inflight.labels(consumer=CONSUMER).dec()
            elapsed = time.perf_counter() - started
            self._record(
                message=message,
                decision=decision,
                outcome=outcome,
                rejected=rejected,
                error=error,
                attempts=attempts,
                elapsed=elapsed,
            )
            return outcome

    async def _apply(
        self, decision: Archive | Reject, message: Inbound
    ) -> tuple[Outcome, Reject | None]:
        """One attempt; idempotent, so a retry or a broker redelivery repeats it harmlessly."""
        if isinstance(decision, Archive):
            try:
                put = await self.store.put_immutable(
                    decision.key, message.payload, metadata=decision.metadata
                )
            except Conflict as err:
                decision = conflict(decision, message.payload, str(err))
            else:
                # also after DUPLICATE: the first delivery may have died between the put and here;
                # JetStream drops the second event by its msg_id inside the duplicate window.
                try:
                    await publish_raw_archived(
                        self.broker,
                        decision.event,
                        ack_timeout=self.settings.nats_ack_timeout_s,
                    )
                except StreamFull as err:
                    # this factory's backlog is at its bound: waiting would hold an MQTT slot
                    # (and with enough of them every factory) for as long as it lasts
                    decision = queue_full(decision, str(err))
                else:
                    if put.outcome is PutOutcome.DUPLICATE:
                        return Outcome.DUPLICATE, None
                    return Outcome.ARCHIVED, None
        await dead_letter(
            self.broker,
            service=self.settings.service,
            reason=decision.reason,
            payload=decision.payload,
            detail=decision.detail,
            subject=message.topic,
            message_id=decision.message_id,
            received_at=message.received_at,
        )
        return Outcome.DEAD_LETTERED, decision

    async def _backoff(self, attempt: int) -> None:
        s = self.settings
        delay = min(s.ingest_retry_max_delay_s, s.ingest_retry_first_delay_s * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)  # noqa: S311 (jitter, not cryptography)
        try:
            await asyncio.wait_for(self.stopping.wait(), delay)
        except TimeoutError:
            return
        raise _Stopping

    def _record(
        self,
        *,
        message: Inbound,
        decision: Archive | Reject,
        outcome: Outcome,
        rejected: Reject | None,
        error: str | None,
        attempts: int,
        elapsed: float,
    ) -> None:
        self.metrics.messages_total.labels(consumer=CONSUMER, outcome=outcome.value).inc()
        self.metrics.handler_seconds.labels(consumer=CONSUMER).observe(elapsed)
        if outcome in _ACKED_QUIETLY and not _stdlog.isEnabledFor(logging.INFO):
            return  # the summary line would be dropped: do not build it
        fields = {
            "outcome": outcome.value,
            "duration_ms": round(elapsed * 1000, 3),
            "size_bytes": len(message.payload),
            "qos": message.qos,
        }
        if attempts > 1:
            fields["attempts"] = attempts
        if outcome is Outcome.DEFERRED:
            log.warning(
                "message_deferred", topic=message.topic[:_TOPIC_LOG_LIMIT], error=error, **fields
            )
        elif outcome is Outcome.DEAD_LETTERED:
            assert rejected is not None
            self.metrics.dead_letters_total.labels(reason=rejected.reason).inc()
            log.warning(
                "message_rejected",
                reason=rejected.reason,
                detail=rejected.detail[:500],
                topic=message.topic[:_TOPIC_LOG_LIMIT],
                **fields,
            )
        else:
            assert isinstance(decision, Archive)
            log.info(
                "raw_archived", key=decision.key, derived_id=decision.message_id_derived, **fields
            )
