"""Alert dispatcher settings: the shared AEGIS ones plus triggers, cooldowns and webhook retries."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from aegis_alert_dispatcher.dispatcher import DEFAULT_TRIGGERS
from aegis_runtime.settings import AegisSettings

DEFAULT_SEND_LEASE_S = 120.0


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
    # how long the handler that recorded a message may take to post and confirm it; after that
    # another handler completes it (a dead replica does not keep it). Less than ack_wait_s, so a
    # redelivery of the same event always finds the earlier delivery over. Unset: 120 s, or 80 %
    # of ack_wait_s when that is shorter.
    alert_send_lease_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _lease_within_ack_wait(self) -> Self:
        if self.alert_send_lease_s is not None and self.alert_send_lease_s >= self.ack_wait_s:
            raise ValueError(
                f"AEGIS_ALERT_SEND_LEASE_S ({self.alert_send_lease_s}) must be less than "
                f"AEGIS_ACK_WAIT_S ({self.ack_wait_s})"
            )
        return self

    @property
    def send_lease_s(self) -> float:
        if self.alert_send_lease_s is not None:
            return self.alert_send_lease_s
        return min(DEFAULT_SEND_LEASE_S, 0.8 * self.ack_wait_s)
