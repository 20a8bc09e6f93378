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

    # which collectors this process runs: both by default; one each for separate deployments
    collector_tiers: Annotated[list[Tier], NoDecode] = Field(default=["fast", "slow"], min_length=1)
    collector_fast_interval_s: float = Field(default=60.0, gt=0)
    collector_slow_interval_s: float = Field(default=300.0, gt=0)
    # a check that takes longer counts as failed (CHECK_FAILED) instead of holding up the tick
    collector_check_timeout_s: float = Field(default=10.0, gt=0)

    # MQTT $SYS: the broker publishes every sys_interval (Mosquitto's default 10 s); silent for
    # three of them is MQTT_SYS_SILENT
    mqtt_sys_interval_s: float = Field(default=10.0, gt=0)

    # JetStream
    consumer_lag_warning: int = Field(default=1000, ge=0)
    consumer_lag_critical: int = Field(default=10_000, ge=0)
    expected_consumers: CommaList = Field(
        default=["AEGIS_RAW/processor", "AEGIS_EVENTS/alert-dispatcher"]
    )
    dead_letter_filter: str = "aegis.dlq.>"

    # heartbeats: services that must have a live replica (any other service seen is checked too)
    expected_services: CommaList = Field(
        default=[
            "ingest",
            "processor",
            "aggregator",
            "cloud-collector",
            "alert-dispatcher",
            "reporter",
        ]
    )
    heartbeat_missed: float = Field(default=3.0, gt=0)

    # storage canary and freshness
    storage_slow_ms: float = Field(default=500.0, gt=0)
    ingest_lag_warning_s: float = Field(default=10.0, gt=0)
    pipeline_stalled_after_s: float = Field(default=300.0, gt=0)

    # slow collector
    objects_hour_grace_s: float = Field(default=300.0, ge=0)
    graph_check_enabled: bool = True
    # None: on when talking to real AWS (no AEGIS_AWS_ENDPOINT_URL), off against an emulator
    cloudwatch_enabled: bool | None = None
    cloudwatch_errors_critical: float = Field(default=100.0, gt=0)

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
