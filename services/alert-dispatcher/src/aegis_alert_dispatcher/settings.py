"""Alert dispatcher settings: the shared AEGIS ones plus triggers, cooldowns and webhook retries."""

from __future__ import annotations

from pydantic import Field

from aegis_alert_dispatcher.dispatcher import DEFAULT_TRIGGERS
from aegis_runtime.settings import AegisSettings


class DispatcherSettings(AegisSettings):
    """``AEGIS_*`` variables (the webhook is ``AEGIS_SLACK_WEBHOOK_URL``; unset: alerts are only
    logged)."""

    service: str = "alert-dispatcher"
    alert_durable: str = Field(default="alert-dispatcher", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # S3 key prefixes whose ObjectCreated events are read; ``*`` matches one path segment
    alert_trigger_prefixes: list[str] = Field(default_factory=lambda: list(DEFAULT_TRIGGERS))
    alert_cooldown_critical_s: float = Field(default=300.0, ge=0)
    alert_cooldown_warning_s: float = Field(default=900.0, ge=0)
    alert_cloud_warning_observations: int = Field(default=3, ge=1, le=100)
    slack_max_attempts: int = Field(default=5, ge=1, le=20)
    slack_first_delay_s: float = Field(default=0.5, ge=0)
    slack_max_delay_s: float = Field(default=30.0, ge=0)
    slack_timeout_s: float = Field(default=10.0, gt=0)
    batch_size: int = Field(default=16, ge=1, le=256)
    fetch_timeout_s: float = Field(default=1.0, gt=0)
    ack_wait_s: float = Field(default=300.0, gt=0)
    max_deliver: int = Field(default=5, ge=1)
