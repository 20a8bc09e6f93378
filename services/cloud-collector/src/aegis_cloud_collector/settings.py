"""Cloud-collector settings: the shared AEGIS ones plus intervals, thresholds and what is expected
to exist. Lists are comma-separated in the environment (``AEGIS_EXPECTED_SERVICES=ingest,processor``)."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from aegis_runtime.settings import AegisSettings

Tier = Literal["fast", "slow"]
CommaList = Annotated[list[str], NoDecode]


class CollectorSettings(AegisSettings):
    service: str = "cloud-collector"

    collector_tiers: Annotated[list[Tier], NoDecode] = Field(
        default=["fast", "slow"],
        min_length=1,
        description="The collectors this process runs, comma-separated: both by default, one "
        "each for separate deployments.",
    )
    collector_fast_interval_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between fast collector runs, each window claimed once across the "
        "replicas (`CLAIM#cloud-fast`).",
    )
    collector_slow_interval_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds between slow collector runs (`CLAIM#cloud-slow`).",
    )
    collector_check_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a check may take; a slower one counts as failed (CHECK_FAILED) "
        "instead of holding up the run.",
    )

    mqtt_sys_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="The broker's `sys_interval`, seconds (Mosquitto's default: 10): no `$SYS` "
        "message for three of them is MQTT_SYS_SILENT.",
    )

    # JetStream
    consumer_lag_warning: int = Field(
        default=1000,
        ge=0,
        description="Messages a durable consumer may have pending before CONSUMER_LAG is a "
        "WARNING.",
    )
    consumer_lag_critical: int = Field(
        default=10_000,
        ge=0,
        description="Pending messages from which CONSUMER_LAG is CRITICAL; at least "
        "`AEGIS_CONSUMER_LAG_WARNING`.",
    )
    expected_consumers: CommaList = Field(
        default=["AEGIS_RAW/processor", "AEGIS_EVENTS/alert-dispatcher"],
        description="Durable consumers that must exist, comma-separated `STREAM/durable` "
        "(CONSUMER_MISSING).",
    )
    dead_letter_filter: str = Field(
        default="aegis.dlq.>", description="The dead-letter subjects counted (DEAD_LETTERS)."
    )

    expected_services: CommaList = Field(
        default=[
            "ingest",
            "processor",
            "aggregator",
            "cloud-collector",
            "alert-dispatcher",
            "reporter",
        ],
        description="Services that must have a live replica, comma-separated (SERVICE_DOWN); any "
        "other service seen sending heartbeats is checked too.",
    )
    heartbeat_missed: float = Field(
        default=3.0,
        gt=0,
        description="Heartbeat intervals (`AEGIS_HEARTBEAT_INTERVAL_S`) without a heartbeat after "
        "which a replica counts as gone.",
    )

    # storage canary and freshness
    storage_slow_ms: float = Field(
        default=500.0,
        gt=0,
        description="Milliseconds a storage canary may take before STORAGE_SLOW.",
    )
    ingest_lag_warning_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between ingest receiving a factory's last state and the read model "
        "holding it beyond which that factory is INGEST_LAG (a WARNING).",
    )
    pipeline_stalled_after_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds: when every factory's last state is older, nothing is getting "
        "through (PIPELINE_STALLED, CRITICAL).",
    )

    # slow collector
    objects_hour_grace_s: float = Field(
        default=300.0,
        ge=0,
        description="Seconds after an hour ends (late writes) from which its object count no "
        "longer changes and is kept instead of listed again.",
    )
    graph_check_enabled: bool = Field(
        default=True,
        description="Check that the aggregator writes every graph window (GRAPH_BEHIND).",
    )
    cloudwatch_enabled: bool | None = Field(
        default=None,
        description="Read DynamoDB's ThrottledRequests and SystemErrors from CloudWatch (over 5 "
        "minutes). Unset: on against real AWS (no `AEGIS_AWS_ENDPOINT_URL`), off against an "
        "emulator.",
    )
    cloudwatch_errors_critical: float = Field(
        default=100.0,
        gt=0,
        description="DynamoDB system errors in 5 minutes above which DYNAMODB_SYSTEM_ERRORS is "
        "CRITICAL (any is a WARNING).",
    )

    @field_validator("collector_tiers", "expected_consumers", "expected_services", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("expected_consumers")
    @classmethod
    def _stream_slash_durable(cls, value: list[str]) -> list[str]:
        for entry in value:
            stream, _, durable = entry.partition("/")
            if not stream or not durable:
                raise ValueError(f"AEGIS_EXPECTED_CONSUMERS: {entry!r} is not STREAM/durable")
        return value

    @model_validator(mode="after")
    def _lag_ordered(self) -> Self:
        if self.consumer_lag_critical < self.consumer_lag_warning:
            raise ValueError("AEGIS_CONSUMER_LAG_CRITICAL must be >= AEGIS_CONSUMER_LAG_WARNING")
        return self

    @property
    def cloudwatch(self) -> bool:
        if self.cloudwatch_enabled is None:
            return self.aws_endpoint_url is None
        return self.cloudwatch_enabled
