"""Response models of the read API (what its OpenAPI schema documents). Read-model items are
passed through as stored (``dict``): the dashboard shows them, it does not re-validate them."""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import BaseModel, Field

from aegis_contracts.audit import AuditEvent

Item = dict[str, Any]
Window = Literal["1h", "6h", "12h", "24h"]


class Problem(BaseModel):
    """The body of every 4xx answer of this API."""

    error: str
    message: str


class Invalid(BaseModel):
    """A body that is not JSON of the expected shape at all (FastAPI's own validation answer)."""

    detail: list[dict[str, Any]]


class FleetEntry(BaseModel):
    factory_id: str
    level: str | None = Field(description="NORMAL, WARNING or CRITICAL; null before any risk")
    score: float | None
    reasons: list[Item]
    last_factory_state_at: str | None
    age_s: float | None = Field(description="seconds since last_factory_state_at (freshness)")
    pipeline_status: str | None
    updated_at: str | None


class Fleet(BaseModel):
    generated_at: str
    factories: list[FleetEntry]


class Factory(BaseModel):
    factory_id: str
    latest: Item


class History(BaseModel):
    factory_id: str
    window: Window
    family: str = Field(description="the key family read: HISTORY#STATE# (1h) or GRAPH#5M#")
    items: list[Item]


class Cloud(BaseModel):
    latest: Item | None
    fast: list[Item] = Field(description="HISTORY#FAST# of the last 6 h, oldest first")
    slow: list[Item] = Field(description="HISTORY#SLOW# of the last 24 h, oldest first")


class Alerts(BaseModel):
    alerts: list[Item]


class ImageLink(BaseModel):
    s3_key: str
    url: str = Field(description="presigned GET URL, valid for expires_in_s seconds")
    expires_in_s: int
    size_bytes: int | None = None
    captured_at: str | None = None
    camera_id: str | None = None
    content_type: str | None = None


class LatestImage(BaseModel):
    factory_id: str
    image: ImageLink | None


class DayImages(BaseModel):
    factory_id: str
    day: date
    images: list[ImageLink]


class ReportEntry(BaseModel):
    target: str
    artifacts: list[str]


class Reports(BaseModel):
    day: date
    reports: list[ReportEntry]


class AuditDay(BaseModel):
    day: date
    total: int = Field(description="events of that UTC day; the newest 1000 are listed")
    events: list[AuditEvent]
