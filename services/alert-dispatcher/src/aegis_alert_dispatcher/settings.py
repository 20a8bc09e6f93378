"""Alert dispatcher settings: the shared AEGIS ones plus triggers, cooldowns and webhook retries."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import AliasChoices, Field, model_validator

from aegis_alert_dispatcher.dispatcher import DEFAULT_TRIGGERS
from aegis_contracts.bus import consumer
from aegis_runtime.settings import AegisSettings

DEFAULT_SEND_LEASE_S = 120.0


class DispatcherSettings(AegisSettings):
    """``AEGIS_*`` variables (the webhook is ``AEGIS_SLACK_WEBHOOK_URL``; unset: alerts are only
    logged)."""

    service: str = "alert-dispatcher"
    alert_durable: str = Field(
        default=consumer("alert-dispatcher").name,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="The JetStream durable consumer on AEGIS_EVENTS its replicas share.",
    )
    alert_trigger_prefixes: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TRIGGERS),
        description="S3 key prefixes whose ObjectCreated events are read, as a JSON list; `*` "
        "matches one path segment.",
    )
    alert_cooldown_critical_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds (snapshot time) between two messages for one CRITICAL alert key.",
    )
    alert_cooldown_warning_s: float = Field(
        default=900.0,
        ge=0,
        description="Seconds (snapshot time) between two messages for one WARNING alert key.",
    )
    alert_cloud_warning_observations: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive cloud-collector runs a cloud WARNING must be seen in before it "
        "is sent.",
    )
    alert_warning_for_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="Seconds (snapshot time) a factory's WARNING reason must be reported without "
        "a break before it is sent (0: at once). A CRITICAL is always sent at once.",
    )
    slack_max_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Attempts per Slack message (429 and 5xx are retried, with full jitter; "
        "Retry-After is honoured).",
    )
    slack_first_delay_s: float = Field(
        default=0.5, ge=0, description="Seconds before the first retry of a Slack message."
    )
    slack_max_delay_s: float = Field(
        default=30.0, ge=0, description="The longest wait between two Slack attempts, seconds."
    )
    slack_timeout_s: float = Field(
        default=10.0, gt=0, description="Seconds one call to the webhook may take."
    )
    alert_batch_size: int = Field(
        default=16,
        ge=1,
        le=256,
        validation_alias=AliasChoices("AEGIS_ALERT_BATCH_SIZE", "AEGIS_BATCH_SIZE"),
        description="Events each replica fetches from its consumer at a time.",
    )
    alert_fetch_timeout_s: float = Field(
        default=1.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_ALERT_FETCH_TIMEOUT_S", "AEGIS_FETCH_TIMEOUT_S"),
        description="Seconds one fetch waits for events (also how quickly a replica notices a "
        "stop).",
    )
    alert_ack_wait_s: float = Field(
        default=300.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_ALERT_ACK_WAIT_S", "AEGIS_ACK_WAIT_S"),
        description="Seconds an event may stay unacknowledged before JetStream delivers it again.",
    )
    alert_max_deliver: int = Field(
        default=5,
        ge=1,
        validation_alias=AliasChoices("AEGIS_ALERT_MAX_DELIVER", "AEGIS_MAX_DELIVER"),
        description="Deliveries of one event in all; after the last it is dead-lettered.",
    )
    alert_send_lease_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds a recorded Slack message is its handler's to post and confirm; "
        "after that another handler completes it (a dead replica does not keep it). Must be "
        "less than `AEGIS_ALERT_ACK_WAIT_S`, so that a redelivered event always finds the "
        "earlier delivery over. Unset: 120, or 80 % of `AEGIS_ALERT_ACK_WAIT_S` when that is "
        "shorter.",
    )

    escalation_file: Path | None = Field(
        default=None,
        description="The escalation policies (receivers, policies and their levels, routes), a "
        "TOML file; docs/alerting.md describes it. Unset: the packaged `escalation.toml` "
        "(Slack at once; a CRITICAL nobody acknowledges posted again after 5 minutes, then "
        "every 30).",
    )
    escalation_tick_s: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description="Seconds between two sweeps of the open incidents (escalations, reminders, "
        "fallback receivers, archiving): how late an escalation may be at most.",
    )
    incident_metrics_refresh_s: float = Field(
        default=30.0,
        ge=1,
        le=600,
        description="Seconds between two reads of the open incidents for /metrics "
        "(`aegis_incidents_open`); a scrape never reads the table.",
    )
    notification_lease_s: float = Field(
        default=30.0,
        ge=5,
        le=600,
        description="Seconds a replica holds an escalation or reminder it is sending; after "
        "that (its replica died) any replica sends it.",
    )

    @model_validator(mode="after")
    def _lease_within_ack_wait(self) -> Self:
        lease, ack_wait = self.alert_send_lease_s, self.alert_ack_wait_s
        if lease is not None and lease >= ack_wait:
            raise ValueError(
                f"AEGIS_ALERT_SEND_LEASE_S ({lease}) must be less than "
                f"AEGIS_ALERT_ACK_WAIT_S ({ack_wait})"
            )
        return self

    @property
    def send_lease_s(self) -> float:
        if self.alert_send_lease_s is not None:
            return self.alert_send_lease_s
        return min(DEFAULT_SEND_LEASE_S, 0.8 * self.alert_ack_wait_s)
