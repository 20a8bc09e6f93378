"""Events on the queue between services (:mod:`aegis_contracts.subjects` says where each goes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from aegis_contracts.ids import FactoryId, MessageId, SourceType
from aegis_contracts.state import Reason
from aegis_contracts.times import Timestamp


class _Event(BaseModel):
    # a field this version does not know is ignored, not refused: events only ever gain optional
    # fields, so during a rolling deploy an older consumer reads a newer producer's events (the
    # processor's ``alert`` on ObjectCreated, say) instead of dead-lettering them
    model_config = ConfigDict(extra="ignore", frozen=True)


class RawArchived(_Event):
    """ingest -> processor: a device message is in raw/ (``key``); its bytes are read from S3."""

    message_id: MessageId
    message_id_derived: bool = False
    factory_id: FactoryId
    source_type: SourceType
    topic: str
    bucket: str
    key: str
    received_at: Timestamp
    size_bytes: int = Field(ge=0)
    qos: int = Field(ge=0, le=2)
    # the payload itself when it is small UTF-8 text: the processor then checks it against the
    # SHA-256 S3 keeps for ``key`` (a HEAD, no body to download); otherwise None and the processor
    # reads ``key``
    payload_text: str | None = None
    # re-queued by ``aegis replay`` (not a device's new message): what the processor makes of it
    # is marked replayed, so alerts and workflow triggers leave it alone (``--notify``: False)
    replayed: bool = False


class AlertBasis(_Event):
    """What the alert decision reads from a state snapshot, carried on the snapshot's
    ObjectCreated by the processor, which has it in hand: the dispatcher then reads no object,
    and a snapshot with no reason whose state before had none either (routine traffic) costs it
    no request at all.

    ``previous_reasons`` are the reasons of the state this one replaced: empty for a factory's
    first state, None when the writer could not tell (a redelivery whose predecessor is no
    longer in the history), which the dispatcher handles as a change."""

    at: Timestamp
    reasons: list[Reason] = Field(default_factory=list)
    previous_reasons: list[Reason] | None = None

    @property
    def routine(self) -> bool:
        """No reason now and none before: nothing to fire, resolve or count."""
        return not self.reasons and self.previous_reasons == []


class ObjectCreated(_Event):
    """What S3 would send on ObjectCreated: the bucket and key, plus who wrote it."""

    bucket: str
    key: str
    size_bytes: int = Field(ge=0)
    etag: str | None = None
    producer: str
    created_at: Timestamp
    # written while processing a replayed message: alerts and triggers ignore it
    replayed: bool = False
    # a state snapshot's risk, when its writer has it (the processor); S3's own notifications and
    # the other writers leave it out and the dispatcher reads the object
    alert: AlertBasis | None = None


class ChangeEvent(_Event):
    """A read-model item changed (the table stream's shape: old and new images)."""

    table: str
    pk: str
    sk: str
    event_name: Literal["INSERT", "MODIFY", "REMOVE"]
    old_image: dict[str, Any] | None = None
    new_image: dict[str, Any] | None = None
    producer: str
    at: Timestamp
    # made by a replayed message: alerts and triggers ignore it
    replayed: bool = False
    # a REMOVE no writer made: DynamoDB deleted the item once its ``ttl`` passed, and the
    # orchestrator announced it from the table's stream (``producer`` is the orchestrator)
    expired: bool = False


class SystemEvent(_Event):
    """Alert sent, report generated, service up/down: the orchestrator's Automation triggers."""

    kind: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    producer: str
    at: Timestamp
    detail: dict[str, Any] = Field(default_factory=dict)


class Heartbeat(_Event):
    """``aegis.heartbeat.{service}.{instance}``: one replica is alive, and whether it is ready.

    Published every ``interval_s``; the fast cloud collector reads the last one of each subject.
    ``stopping`` is sent once on a clean shutdown so a stopped replica is not reported as lost."""

    service: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,63}$")
    instance: str = Field(pattern=r"^[A-Za-z0-9_-]{1,96}$")
    at: Timestamp
    started_at: Timestamp
    interval_s: float = Field(gt=0)
    ready: bool
    checks: dict[str, bool] = Field(default_factory=dict)
    stopping: bool = False
    version: str | None = None
