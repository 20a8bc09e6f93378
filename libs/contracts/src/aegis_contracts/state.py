"""Normalized state: what the processor derives from device messages and the read model keeps.

These models are the bodies of processed/ objects and the field groups of FACTORY LATEST; the alert
dispatcher, aggregator, reporter and dashboard all read them.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from aegis_contracts.payloads import Detection, HostStats, NetworkStats
from aegis_contracts.times import TimeFlag, Timestamp


class Level(StrEnum):
    NORMAL = "NORMAL"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def worst(cls, *levels: Level) -> Level:
        return max(levels, key=lambda level: level.rank, default=cls.NORMAL)


_RANK = {Level.NORMAL: 0, Level.WARNING: 1, Level.CRITICAL: 2}


class _State(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Reason(_State):
    """One cause of a risk level: ``code`` is stable (``FIRE_DETECTED``, ``CO_HIGH``, …)."""

    code: str = Field(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")
    severity: Literal["WARNING", "CRITICAL"]
    detail: str = Field(max_length=512)
    value: float | None = None
    threshold: float | None = None
    source: str | None = Field(default=None, max_length=64)


class Risk(_State):
    score: float = Field(ge=0, le=100)
    level: Level
    reasons: list[Reason] = Field(default_factory=list)
    rules_version: str | None = None


class RecordMeta(_State):
    """Where a processed record came from, and how its time was decided."""

    message_id: str
    device_id: str
    emitted_at: Timestamp
    event_time: Timestamp
    received_at: Timestamp
    raw_key: str
    schema_version: str
    flags: list[TimeFlag] = Field(default_factory=list)


class FactoryState(_State):
    meta: RecordMeta
    sensors: dict[str, float] = Field(default_factory=dict)
    model_version: str | None = None
    detections: list[Detection] = Field(default_factory=list)


class InfraState(_State):
    meta: RecordMeta
    host: HostStats = Field(default_factory=HostStats)
    network: NetworkStats = Field(default_factory=NetworkStats)
    cameras: dict[str, Literal["online", "offline"]] = Field(default_factory=dict)
    pipeline: dict[str, Literal["ok", "degraded", "down"]] = Field(default_factory=dict)


class ImageSnapshotRef(_State):
    meta: RecordMeta
    camera_id: str
    filename: str
    content_type: str
    size_bytes: int
    captured_at: Timestamp
    s3_key: str


class RiskRecord(_State):
    """The processed/{f}/risk_score/ body: the risk of one factory_state message."""

    meta: RecordMeta
    risk: Risk


class PipelineState(StrEnum):
    OK = "OK"
    DEGRADED = "DEGRADED"
    STALE = "STALE"
    OFFLINE = "OFFLINE"
    NO_DATA = "NO_DATA"


class PipelineStatus(_State):
    """How fresh a factory's data is, recomputed by the 1-minute refresh."""

    status: PipelineState
    checked_at: Timestamp
    factory_state_age_s: float | None = None
    infra_state_age_s: float | None = None
    stages: dict[str, str] = Field(default_factory=dict)


def event_time_of(record: FactoryState | InfraState | ImageSnapshotRef | None) -> datetime | None:
    return None if record is None else record.meta.event_time
