"""Read-model TTLs, with the names and defaults of the legacy data pipeline's Terraform variables."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class TtlSettings(BaseModel):
    model_config = ConfigDict(frozen=True)

    history_ttl_hours: float = Field(default=2, gt=0)
    graph_bucket_ttl_hours: float = Field(default=48, gt=0)
    cloud_fast_history_ttl_hours: float = Field(default=6, gt=0)
    cloud_slow_history_ttl_hours: float = Field(default=24, gt=0)
    alert_state_ttl_seconds: int = Field(default=604_800, gt=0)

    def history_expiry(self, now: datetime) -> int:
        return expires_at(now, self.history_ttl_hours * 3600)

    def graph_expiry(self, now: datetime) -> int:
        return expires_at(now, self.graph_bucket_ttl_hours * 3600)

    def cloud_fast_expiry(self, now: datetime) -> int:
        return expires_at(now, self.cloud_fast_history_ttl_hours * 3600)

    def cloud_slow_expiry(self, now: datetime) -> int:
        return expires_at(now, self.cloud_slow_history_ttl_hours * 3600)

    def alert_expiry(self, now: datetime) -> int:
        return expires_at(now, self.alert_state_ttl_seconds)


def expires_at(now: datetime, seconds: float) -> int:
    """Epoch seconds for DynamoDB's ``ttl`` attribute."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return int(now.timestamp() + seconds)
