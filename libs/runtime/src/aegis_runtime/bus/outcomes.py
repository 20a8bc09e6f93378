"""What becomes of one JetStream message (:class:`MessageOutcomes`, installed by
:func:`~aegis_runtime.bus.connect.create_broker`):

- the handler returns: ack (FastStream's own acknowledgement);
- it raises :class:`~aegis_runtime.bus.errors.Poison`, a ``ContractError`` or a validation
  error: dead-letter, then ack;
- it raises anything else: nack with an exponential delay, until the consumer's
  ``max_deliver``-th delivery, which is dead-lettered (``retries_exhausted``) then acked. Never a
  silent drop, never an endless loop. An exception with a ``retry_after_s`` (the handler knows a
  retry succeeds by then, e.g. once another handler's lease is over) holds the last delivery
  back until then, so the retries are not spent before it could succeed.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog
from faststream import BaseMiddleware
from faststream.exceptions import AckMessage, HandlerException, NackMessage, RejectMessage
from faststream.nats import NatsBroker

from aegis_runtime import natsio
from aegis_runtime.bus.deadletters import dead_letter, poison_reason
from aegis_runtime.bus.errors import PublishFailed, RetryPolicy
from aegis_runtime.bus.publish import MSG_ID_HEADER
from aegis_runtime.logging import bind_message
from aegis_runtime.metrics import Metrics

if TYPE_CHECKING:
    from faststream import ContextRepo

    from aegis_runtime.natsio import Msg

log = structlog.get_logger(__name__)
# the stdlib logger under ``log``: its level is checked before a per-message line is built
_stdlog = logging.getLogger(__name__)


_delivery: ContextVar[int] = ContextVar("aegis_delivery", default=1)
_subject: ContextVar[str] = ContextVar("aegis_subject", default="")
_message: ContextVar[str] = ContextVar("aegis_message", default="")


def delivery() -> int:
    """Which delivery of the JetStream message being handled this is (1: the first), as the
    :class:`MessageOutcomes` middleware found it. Handlers read it here rather than declaring a
    ``msg: NatsMessage`` parameter: FastStream resolves such a context parameter by running a
    synchronous function in a worker thread, a thread hand-off for every message."""
    return _delivery.get()


def current_subject() -> str:
    """The subject of the JetStream message being handled (empty outside a handler); read it here
    for the same reason as :func:`delivery`."""
    return _subject.get()


def current_message() -> str:
    """``{stream}:{sequence}`` of the JetStream message being handled (empty outside a handler):
    the same for every delivery of that message, different for another message with the same
    body. Read it here for the same reason as :func:`delivery`."""
    return _message.get()


class MessageOutcomes:
    """Broker middleware factory: per JetStream message, bind log context (service, message_id,
    subject, delivery), count it in the metrics, write one summary line, and settle failures:
    poison -> dead-letter + ack; other errors -> nack with delay, dead-letter on the last delivery.
    Handlers may still settle a message themselves (``NackMessage``, ``AckMessage``, ...)."""

    def __init__(
        self,
        *,
        service: str,
        broker: NatsBroker,
        metrics: Metrics | None,
        retry: RetryPolicy,
    ) -> None:
        self.service = service
        self.broker = broker
        self.metrics = metrics
        self.retry = retry

    def __call__(self, msg: Any, /, *, context: ContextRepo) -> _MessageOutcome:
        return _MessageOutcome(msg, context=context, outcomes=self)


class _MessageOutcome(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: ContextRepo, outcomes: MessageOutcomes) -> None:
        super().__init__(msg, context=context)
        self.outcomes = outcomes
        self.raw: Msg | None = natsio.jetstream_delivery(msg)
        self.scope = ExitStack()
        self.started = 0.0
        self.message_id = ""
        self.delivery = 0
        self.consumer = ""

    async def on_receive(self) -> None:
        raw = self.raw
        if raw is None:  # core NATS or batch subscriber: not ours to settle
            return
        meta = raw.metadata
        self.delivery = meta.num_delivered or 1
        headers = raw.headers or {}
        self.message_id = headers.get(MSG_ID_HEADER) or f"{meta.stream}:{meta.sequence.stream}"
        _delivery.set(self.delivery)
        self.scope.callback(_delivery.set, 1)
        _subject.set(raw.subject)
        self.scope.callback(_subject.set, "")
        _message.set(f"{meta.stream}:{meta.sequence.stream}")
        self.scope.callback(_message.set, "")
        self.scope.enter_context(
            bind_message(
                service=self.outcomes.service,
                message_id=self.message_id,
                subject=raw.subject,
                delivery=self.delivery,
            )
        )
        self.consumer = meta.consumer or "ephemeral"
        if self.outcomes.metrics is not None:
            self.outcomes.metrics.inflight.labels(consumer=self.consumer).inc()
        self.started = time.perf_counter()

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        raw = self.raw
        if raw is None:
            return False
        outcome, handled, level, fields = "ok", False, logging.INFO, {}
        try:
            if exc_val is None:
                pass
            elif isinstance(exc_val, HandlerException):  # the handler settled it explicitly
                outcome = _explicit_outcome(exc_val)
            elif not isinstance(exc_val, Exception):  # cancellation, exit: not a message failure
                outcome = "interrupted"
            elif raw.is_acked:
                outcome, level = "failed_after_settle", logging.ERROR
                fields = {"error": repr(exc_val)}
            else:
                outcome, level, fields = await self._settle_failure(raw, exc_val)
                handled = True
        finally:
            self._finish(outcome, level, fields, exc_val if level >= logging.ERROR else None)
        return handled

    async def _settle_failure(self, raw: Msg, exc: Exception) -> tuple[str, int, dict[str, Any]]:
        retry = self.outcomes.retry
        reason = poison_reason(exc)
        max_deliver = self._max_deliver()
        error = f"{type(exc).__name__}: {exc}"
        if reason is None and self.delivery < max_deliver:
            delay = retry.delay(self.delivery)
            if self.delivery + 1 >= max_deliver:  # the next delivery is the last one
                delay = max(delay, float(getattr(exc, "retry_after_s", 0.0)))
            await _settle(raw.nak(delay=delay))
            return "retried", logging.WARNING, {"error": error, "retry_in_s": delay}
        reason = reason or "retries_exhausted"
        detail = error
        if reason == "retries_exhausted":
            detail = f"{error} (delivery {self.delivery} of {max_deliver})"
        try:
            await dead_letter(
                self.outcomes.broker,
                service=self.outcomes.service,
                reason=reason,
                payload=raw.data,
                detail=detail,
                subject=raw.subject,
                headers=raw.headers,
                message_id=self.message_id,
                deliveries=self.delivery,
            )
        except PublishFailed as dlq_err:
            # Keep the message rather than lose it; the next delivery tries the dead letter again.
            # (On the max_deliver-th delivery NATS will not redeliver: it stays in the stream,
            # with this ERROR line and the server's MAX_DELIVERIES advisory, for replay.)
            delay = retry.delay(self.delivery)
            await _settle(raw.nak(delay=delay))
            return "retried", logging.ERROR, {"error": error, "dead_letter_error": repr(dlq_err)}
        await _settle(raw.ack())
        if self.outcomes.metrics is not None:
            self.outcomes.metrics.dead_letters_total.labels(reason=reason).inc()
        return "dead_lettered", logging.ERROR, {"error": error, "reason": reason}

    def _max_deliver(self) -> int:
        # The subscriber's consumer config (FastStream puts the subscriber in context as "handler_").
        subscriber = self.context.get_local("handler_")
        configured = getattr(getattr(subscriber, "config", None), "max_deliver", None)
        if isinstance(configured, int) and configured > 0:
            return configured
        return self.outcomes.retry.max_deliver

    def _finish(
        self, outcome: str, level: int, fields: dict[str, Any], exc: BaseException | None
    ) -> None:
        elapsed = time.perf_counter() - self.started
        metrics = self.outcomes.metrics
        if metrics is not None:
            metrics.inflight.labels(consumer=self.consumer).dec()
            metrics.messages_total.labels(consumer=self.consumer, outcome=outcome).inc()
            metrics.handler_seconds.labels(consumer=self.consumer).observe(elapsed)
        try:
            if _stdlog.isEnabledFor(level):
                log.log(
                    level,
                    "message_handled",
                    outcome=outcome,
                    duration_ms=round(elapsed * 1000, 3),
                    exc_info=exc,
                    **fields,
                )
        finally:
            self.scope.close()


def _explicit_outcome(exc: HandlerException) -> str:
    if isinstance(exc, AckMessage):
        return "ok"
    if isinstance(exc, NackMessage):
        return "retried"
    if isinstance(exc, RejectMessage):
        return "rejected"
    return "skipped"


async def _settle(ack: Any) -> None:
    # A lost ack/nak only means an earlier redelivery (after ack_wait); never fail the consumer.
    try:
        await ack
    except natsio.Error as err:
        log.warning("message_settle_failed", error=repr(err))
