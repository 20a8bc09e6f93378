"""The glue for one MQTT message: decide (domain.admit), archive to raw/, publish RawArchived or a
dead letter, retry transient failures, and say whether the message may be acknowledged. A
gateway's upload request (``aegis/{factory}/upload_request``) is answered instead: a presigned
POST for its image, or a refusal (also dead-lettered), on its reply topic.

Outcomes (``messages_total{outcome}``): ``archived`` and ``duplicate`` (raw object stored and event
confirmed), ``upload_granted`` (the answer with the presigned POST published to the broker),
``dead_lettered`` (poison, or a refused upload request: dead letter confirmed), all acknowledged
to the broker; ``deferred``: a storage, NATS or broker failure outlasted the retry budget (or the
service is stopping), the message stays unacknowledged and the broker redelivers it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import aiomqtt
import structlog
from faststream.nats import NatsBroker

from aegis_contracts.backoff import spread_s
from aegis_contracts.times import format_ts
from aegis_contracts.uploads import UploadGranted, upload_request_factory
from aegis_ingest.domain import (
    Archive,
    Reject,
    UploadPlan,
    UploadRefusal,
    admit,
    conflict,
    gateway_url,
    plan_upload,
    queue_full,
)
from aegis_ingest.settings import IngestSettings
from aegis_runtime.bus import BrokerError, StreamFull, dead_letter, publish_raw_archived
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

# publishes ``payload`` on ``topic`` at QoS 1 on the session the message came from
Reply = Callable[[str, bytes], Awaitable[Any]]


class Outcome(StrEnum):
    ARCHIVED = "archived"
    DUPLICATE = "duplicate"
    UPLOAD_GRANTED = "upload_granted"
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
_ACKED_QUIETLY = frozenset({Outcome.ARCHIVED, Outcome.DUPLICATE, Outcome.UPLOAD_GRANTED})


class _Stopping(Exception):
    """The service is stopping while a message waits to be retried."""


class _ReplyLost(Exception):
    """The answer to an upload request could not be published: the session is gone (the broker
    delivers the request again on the next one)."""


async def _no_reply(topic: str, payload: bytes) -> None:
    raise _ReplyLost("no MQTT session to answer on")


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

    async def handle(self, message: Inbound, reply: Reply = _no_reply) -> Outcome:
        """Archive or dead-letter ``message``, or answer it on ``reply`` when it is a gateway's
        upload request; never raises (a bug is logged and deferred)."""
        started = time.perf_counter()
        factory_id = upload_request_factory(message.topic)
        if factory_id is not None:
            return await self._handle_upload(message, factory_id, reply, started)
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
            return await self._settle(
                message,
                lambda: self._apply(decision, message),
                started=started,
                summary=("raw_archived", _archived_fields(decision)),
            )

    async def _handle_upload(
        self, message: Inbound, factory_id: str, reply: Reply, started: float
    ) -> Outcome:
        s = self.settings
        decision = plan_upload(
            factory_id,
            message.payload,
            content_types=s.ingest_upload_content_types,
            max_bytes=s.ingest_upload_max_bytes,
        )
        fields: dict[str, Any] = {}
        with bind_message(service=s.service, factory_id=factory_id, message_id=decision.request_id):

            async def attempt() -> tuple[Outcome, Reject | None]:
                if isinstance(decision, UploadRefusal):
                    return await self._refuse_upload(decision, message, reply)
                fields.update(await self._grant_upload(decision, reply))
                return Outcome.UPLOAD_GRANTED, None

            return await self._settle(
                message, attempt, started=started, summary=("upload_url_issued", fields)
            )

    async def _grant_upload(self, plan: UploadPlan, reply: Reply) -> dict[str, Any]:
        """Presign the POST and publish it on the reply topic; the summary line's fields."""
        s, request = self.settings, plan.request
        post = await self.store.presign_upload(
            plan.key,
            content_type=request.content_type,
            size_bytes=request.size_bytes,
            expires_in_s=s.ingest_upload_url_ttl_s,
        )
        answer = UploadGranted(
            request_id=request.request_id,
            key=plan.key,
            url=gateway_url(post.url, s.ingest_upload_endpoint_url),
            fields=post.fields,
            content_type=request.content_type,
            size_bytes=request.size_bytes,
            expires_at=post.expires_at,
        )
        await self._reply(reply, plan.reply_topic, answer.model_dump_json().encode())
        return {
            "key": plan.key,
            "content_type": request.content_type,
            "image_bytes": request.size_bytes,
            "expires_at": format_ts(post.expires_at),
        }

    async def _refuse_upload(
        self, refusal: UploadRefusal, message: Inbound, reply: Reply
    ) -> tuple[Outcome, Reject]:
        """Dead-letter the request, then say why on its reply topic (a retry after a failed
        answer repeats the dead letter, which JetStream drops as a duplicate)."""
        await self._dead_letter(refusal.reject, message)
        if refusal.reply_topic is not None and refusal.answer is not None:
            await self._reply(reply, refusal.reply_topic, refusal.answer.model_dump_json().encode())
        return Outcome.DEAD_LETTERED, refusal.reject

    @staticmethod
    async def _reply(reply: Reply, topic: str, payload: bytes) -> None:
        try:
            await reply(topic, payload)
        except aiomqtt.MqttError as err:
            raise _ReplyLost(f"answer on {topic}: {err}") from err

    async def _settle(
        self,
        message: Inbound,
        attempt: Callable[[], Awaitable[tuple[Outcome, Reject | None]]],
        *,
        started: float,
        summary: tuple[str, dict[str, Any]],
    ) -> Outcome:
        """Run ``attempt`` until it settles, retrying transient failures within the budget,
        then count the message and write its summary line (``summary``: a success's event and
        fields, which ``attempt`` may fill in)."""
        self.metrics.inflight.labels(consumer=CONSUMER).inc()
        attempts = 0
        rejected: Reject | None = None
        error: str | None = None
        try:
            while True:
                attempts += 1
                try:
                    outcome, rejected = await attempt()
                    break
                except _TRANSIENT as err:
                    error = f"{type(err).__name__}: {err}"
                    if attempts >= self.settings.ingest_retry_attempts:
                        outcome = Outcome.DEFERRED
                        break
                    await self._backoff(attempts)
        except _ReplyLost as err:  # no retry on a session that is gone: the broker redelivers
            outcome, error = Outcome.DEFERRED, str(err)
        except _Stopping:
            outcome = Outcome.DEFERRED
        except Exception as err:  # a bug: keep the message for redelivery, and say so loudly
            outcome, error = Outcome.DEFERRED, f"{type(err).__name__}: {err}"
            log.exception("message_failed", topic=message.topic[:_TOPIC_LOG_LIMIT])
        finally:
            self.metrics.inflight.labels(consumer=CONSUMER).dec()
        self._record(
            message,
            outcome,
            rejected=rejected,
            error=error,
            attempts=attempts,
            elapsed=time.perf_counter() - started,
            summary=summary,
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
        await self._dead_letter(decision, message)
        return Outcome.DEAD_LETTERED, decision

    async def _dead_letter(self, reject: Reject, message: Inbound) -> None:
        await dead_letter(
            self.broker,
            service=self.settings.service,
            reason=reject.reason,
            payload=reject.payload,
            detail=reject.detail,
            subject=message.topic,
            message_id=reject.message_id,
            received_at=message.received_at,
        )

    async def _backoff(self, attempt: int) -> None:
        s = self.settings
        delay = spread_s(
            attempt, first=s.ingest_retry_first_delay_s, cap=s.ingest_retry_max_delay_s
        )
        try:
            await asyncio.wait_for(self.stopping.wait(), delay)
        except TimeoutError:
            return
        raise _Stopping

    def _record(
        self,
        message: Inbound,
        outcome: Outcome,
        *,
        rejected: Reject | None,
        error: str | None,
        attempts: int,
        elapsed: float,
        summary: tuple[str, dict[str, Any]],
    ) -> None:
        """Count the message and write its one summary line (``summary``: the event and fields
        of a success)."""
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
            event, success = summary
            log.info(event, **success, **fields)


def _archived_fields(decision: Archive | Reject) -> dict[str, Any]:
    """The fields of a ``raw_archived`` line (a decision that archives)."""
    if not isinstance(decision, Archive):
        return {}
    return {"key": decision.key, "derived_id": decision.message_id_derived}
