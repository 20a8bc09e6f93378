"""S3 event notifications onto the bus: objects the platform did not write itself, announced as
``ObjectCreated`` so that they fire Component jobs.

The platform's writers announce what they write (``aegis.objects.created.{family}``); an object
that S3 alone knows of (a device's image upload, a console upload, another account's copy)
reaches the bus only through S3's notifications. With ``AEGIS_ORCHESTRATOR_S3_EVENTS_QUEUE_URL``
set, each orchestrator replica long-polls that SQS queue (SQS shares the messages among them)
and announces, per ``ObjectCreated:*`` record:

- a device image under ``image_snapshot/`` (a contract key) as family ``image_upload``;
- a key outside the contract's layout as family ``external``;
- nothing for keys of the families the platform announces itself (``processed/``,
  ``processed_agg/``, ``reports/``, the raw archive): they are announced once, by their writer.

The orchestrator's NATS identity may publish those two families only, so it cannot forge an
object of another family. The queue may be fed by S3 directly (``Records``), through an SNS topic
(the record wrapped in its ``Message``) or by an EventBridge rule (``detail-type: Object
Created``); S3's test event is dropped. ``Nats-Msg-Id`` is ``s3:{bucket}/{key}:{sequencer}``, so a
message SQS delivers again (a replica stopped before deleting it) is one event on the stream.

A message is deleted from the queue once everything in it is announced; when a publish fails it
stays and SQS delivers it again after its visibility timeout (the queue's redrive policy ends
that). A message that is no S3 notification is dead-lettered (``aegis.dlq.orchestrator.
s3_event_invalid``), counted and deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote_plus

import structlog

from aegis_contracts import msgids
from aegis_contracts.errors import ContractError
from aegis_contracts.events import ObjectCreated
from aegis_contracts.keys import KeyFamily, parse_key
from aegis_contracts.subjects import EXTERNAL_OBJECTS, IMAGE_UPLOADS, object_created_subject
from aegis_contracts.times import ensure_utc

if TYPE_CHECKING:
    from prometheus_client import Counter

log = structlog.get_logger(__name__)

PRODUCER = "s3"
INVALID = "s3_event_invalid"
# at most what one ReceiveMessage returns
BATCH = 10
# after a failed poll (SQS unreachable, access denied), the next one
RETRY_S = 5.0


class Publish(Protocol):
    def __call__(self, subject: str, event: ObjectCreated, *, msg_id: str) -> Awaitable[bool]: ...


class DeadLetter(Protocol):
    def __call__(self, body: bytes, detail: str, message_id: str) -> Awaitable[None]: ...


class NotAnS3Event(ValueError):
    """A queue message that is no S3 event notification."""


@dataclass(frozen=True, slots=True)
class Created:
    """One object S3 reported created."""

    bucket: str
    key: str
    size: int
    etag: str | None
    sequencer: str
    at: datetime


def family_of(key: str) -> str | None:
    """The family the bridge announces ``key`` under; None when its writer announces it (or it
    is the raw archive's)."""
    try:
        info = parse_key(key)
    except ContractError:
        return EXTERNAL_OBJECTS
    return IMAGE_UPLOADS if info.family is KeyFamily.IMAGE_SNAPSHOT else None


def parse_message(body: str) -> list[Created]:
    """The objects created that one queue message reports ([] for other events and S3's test
    event); :class:`NotAnS3Event` when it is none of the shapes S3 sends."""
    try:
        document = json.loads(body)
    except ValueError:
        raise NotAnS3Event("not JSON") from None
    if not isinstance(document, dict):
        raise NotAnS3Event("not a JSON object")
    if document.get("Type") == "Notification" and isinstance(document.get("Message"), str):
        return parse_message(document["Message"])  # through an SNS topic
    if document.get("Event") == "s3:TestEvent":
        return []
    try:
        if "Records" in document:
            return [c for r in document["Records"] if (c := _record(r)) is not None]
        if document.get("source") == "aws.s3" and "detail" in document:
            return _eventbridge(document)
    except (KeyError, TypeError, ValueError) as err:
        raise NotAnS3Event(f"an S3 event without {err}") from None
    raise NotAnS3Event("neither S3 records nor an EventBridge S3 event")


def _record(record: dict[str, Any]) -> Created | None:
    if record.get("eventSource") != "aws:s3":
        raise NotAnS3Event(f"a record from {record.get('eventSource')!r}")
    if not str(record["eventName"]).startswith("ObjectCreated:"):
        return None
    s3 = record["s3"]
    obj = s3["object"]
    return Created(
        bucket=str(s3["bucket"]["name"]),
        key=unquote_plus(str(obj["key"])),  # S3 URL-encodes keys in notifications
        size=int(obj.get("size", 0)),
        etag=str(obj["eTag"]) if obj.get("eTag") else None,
        sequencer=str(obj.get("sequencer", "")),
        at=ensure_utc(datetime.fromisoformat(str(record["eventTime"]).replace("Z", "+00:00"))),
    )


def _eventbridge(document: dict[str, Any]) -> list[Created]:
    if document.get("detail-type") != "Object Created":
        return []
    detail = document["detail"]
    obj = detail["object"]
    return [
        Created(
            bucket=str(detail["bucket"]["name"]),
            key=str(obj["key"]),  # EventBridge does not encode keys
            size=int(obj.get("size", 0)),
            etag=str(obj["etag"]) if obj.get("etag") else None,
            sequencer=str(obj.get("sequencer", "")),
            at=ensure_utc(datetime.fromisoformat(str(document["time"]).replace("Z", "+00:00"))),
        )
    ]


def msg_id(created: Created) -> str:
    return msgids.s3_notification(
        created.bucket, created.key, created.sequencer or created.etag or ""
    )


class Bridge:
    """Reads the queue and announces (see the module docstring)."""

    def __init__(
        self,
        sqs: Any,
        queue_url: str,
        *,
        publish: Publish,
        dead_letter: DeadLetter,
        counter: Counter,
        wait_s: int,
    ) -> None:
        self.sqs = sqs
        self.queue_url = queue_url
        self.publish = publish
        self.dead_letter = dead_letter
        self.counter = counter
        self.wait_s = wait_s

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop``; a stop ends a long poll at once (what it would have received
        stays in the queue), never the handling of messages received."""
        while not stop.is_set():
            receiving = asyncio.ensure_future(self._receive())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({receiving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not receiving.done():
                receiving.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await receiving
                return
            try:
                messages = receiving.result()
            except Exception:
                log.exception("s3_events_poll_failed", queue=self.queue_url)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)
                continue
            await self.handle(messages)

    async def poll(self) -> int:
        """One ReceiveMessage and what it brought; returns the objects announced."""
        return await self.handle(await self._receive())

    async def handle(self, messages: list[dict[str, Any]]) -> int:
        """Announce what ``messages`` report; a message whose announcement failed stays in the
        queue (SQS delivers it again). Returns the objects announced."""
        announced = 0
        for message in messages:
            try:
                announced += await self._message(message)
            except Exception:
                self.counter.labels(outcome="failed").inc()
                log.exception("s3_event_not_announced", message_id=message.get("MessageId"))
        return announced

    async def _receive(self) -> list[dict[str, Any]]:
        answer = await self.sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=BATCH, WaitTimeSeconds=self.wait_s
        )
        return list(answer.get("Messages", []))

    async def _message(self, message: dict[str, Any]) -> int:
        body = str(message.get("Body", ""))
        try:
            created = parse_message(body)
        except NotAnS3Event as err:
            self.counter.labels(outcome="invalid").inc()
            log.warning("s3_event_invalid", reason=str(err), message_id=message.get("MessageId"))
            await self.dead_letter(
                body.encode(),
                f"not an S3 event notification: {err}",
                str(message.get("MessageId", "")),
            )
            await self._delete(message)
            return 0
        announced = 0
        for item in created:
            family = family_of(item.key)
            if family is None:
                self.counter.labels(outcome="announced_by_writer").inc()
                continue
            event = ObjectCreated(
                bucket=item.bucket,
                key=item.key,
                size_bytes=item.size,
                etag=item.etag,
                producer=PRODUCER,
                created_at=item.at,
            )
            await self.publish(object_created_subject(family), event, msg_id=msg_id(item))
            self.counter.labels(outcome="announced").inc()
            announced += 1
        await self._delete(message)
        return announced

    async def _delete(self, message: dict[str, Any]) -> None:
        await self.sqs.delete_message(
            QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
        )
