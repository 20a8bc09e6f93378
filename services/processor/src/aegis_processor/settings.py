"""Processor settings: the shared AEGIS ones plus the consumer, rules and refresh knobs."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import AliasChoices, Field, model_validator

from aegis_contracts.bus import consumer
from aegis_runtime.settings import AegisSettings


class ProcessorSettings(AegisSettings):
    """``AEGIS_*`` variables. The staleness thresholds default to the rules file's; setting them
    here overrides the file (tests make them short)."""

    service: str = "processor"
    rules_file: Path | None = Field(
        default=None,
        description="The risk rules (sensor and AI-label thresholds, infrastructure, "
        "staleness), a TOML file. Unset: the packaged `rules.toml`.",
    )
    durable: str = Field(
        default=consumer("processor").name,
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="The JetStream durable consumer on AEGIS_RAW its replicas share.",
    )
    subject: str = Field(
        default=consumer("processor").subject,
        pattern=r"^aegis\.raw\.[A-Za-z0-9_.*>-]+$",
        description="The consumer's filter on AEGIS_RAW: all raw events, or a shard (e.g. "
        "`aegis.raw.factory-a.>`).",
    )
    processor_batch_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        validation_alias=AliasChoices("AEGIS_PROCESSOR_BATCH_SIZE", "AEGIS_BATCH_SIZE"),
        description="Raw events each replica fetches from its consumer at a time.",
    )
    processor_fetch_timeout_s: float = Field(
        default=1.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_PROCESSOR_FETCH_TIMEOUT_S", "AEGIS_FETCH_TIMEOUT_S"),
        description="Seconds one fetch waits for raw events (also how quickly a replica notices "
        "a stop).",
    )
    processor_ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_PROCESSOR_ACK_WAIT_S", "AEGIS_ACK_WAIT_S"),
        description="Seconds a raw event may stay unacknowledged (its replica died) before "
        "JetStream delivers it again.",
    )
    processor_max_deliver: int = Field(
        default=8,
        ge=1,
        validation_alias=AliasChoices("AEGIS_PROCESSOR_MAX_DELIVER", "AEGIS_MAX_DELIVER"),
        description="Deliveries of one raw event in all; after the last it is dead-lettered "
        "(`retries_exhausted`).",
    )
    retry_first_delay_s: float = Field(
        default=1.0,
        gt=0,
        description="Seconds before a raw event that failed for a transient reason is delivered "
        "again (doubling after each delivery).",
    )
    retry_max_delay_s: float = Field(
        default=60.0,
        gt=0,
        description="The longest wait before a raw event is delivered again, seconds.",
    )
    report_check_cache_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds S3's answer that a day has no report yet is believed before S3 is "
        "asked again (an event of a day already reported is flagged late).",
    )

    refresh_enabled: bool = Field(
        default=True,
        description="The refresh: every factory's pipeline status and staleness risk, once per "
        "window across the replicas.",
    )
    refresh_interval_s: float = Field(
        default=60.0, gt=0, description="The refresh window, seconds."
    )
    refresh_catchup_windows: int = Field(
        default=10,
        ge=0,
        le=1440,
        description="Missed refresh windows a replica claims and runs after downtime (older "
        "ones are skipped).",
    )
    refresh_concurrency: int = Field(
        default=32,
        ge=1,
        le=256,
        description="Factories one refresh handles at once (enough in flight that the storage "
        "is never idle).",
    )
    stale_after_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds without a factory_state before a factory is STALE_DATA. Unset: the "
        "rules file's (60).",
    )
    offline_after_s: float | None = Field(
        default=None,
        gt=0,
        description="Seconds without a factory_state before a factory is FACTORY_OFFLINE; more "
        "than `AEGIS_STALE_AFTER_S`. Unset: the rules file's (300).",
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Self:
        if (
            self.stale_after_s is not None
            and self.offline_after_s is not None
            and self.offline_after_s <= self.stale_after_s
        ):
            raise ValueError("AEGIS_OFFLINE_AFTER_S must be greater than AEGIS_STALE_AFTER_S")
        return self
