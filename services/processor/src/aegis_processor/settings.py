"""Processor settings: the shared AEGIS ones plus the consumer, rules and refresh knobs."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from aegis_runtime.settings import AegisSettings


class ProcessorSettings(AegisSettings):
    """``AEGIS_*`` variables. The staleness thresholds default to the rules file's (60 s / 300 s);
    setting them here overrides the file (tests make them short)."""

    service: str = "processor"
    rules_file: Path | None = None  # None: the packaged rules.toml
    durable: str = Field(default="processor", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    # the consumer's filter on AEGIS_RAW: all raw events, or a shard (e.g. aegis.raw.factory-a.>)
    subject: str = Field(default="aegis.raw.>", pattern=r"^aegis\.raw\.[A-Za-z0-9_.*>-]+$")
    batch_size: int = Field(default=32, ge=1, le=1024)
    fetch_timeout_s: float = Field(default=5.0, gt=0)
    ack_wait_s: float = Field(default=30.0, gt=0)
    max_deliver: int = Field(default=8, ge=1)
    retry_first_delay_s: float = Field(default=1.0, gt=0)
    retry_max_delay_s: float = Field(default=60.0, gt=0)
    # how long "this day's report does not exist" is believed before S3 is asked again
    report_check_cache_s: float = Field(default=60.0, ge=0)

    refresh_enabled: bool = True
    refresh_interval_s: float = Field(default=60.0, gt=0)
    # how many missed windows a replica claims and runs after downtime (older ones are skipped)
    refresh_catchup_windows: int = Field(default=10, ge=0, le=1440)
    # factories refreshed at once in a tick (enough in flight that the storage is never idle)
    refresh_concurrency: int = Field(default=32, ge=1, le=256)
    stale_after_s: float | None = Field(default=None, gt=0)
    offline_after_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Self:
        if (
            self.stale_after_s is not None
            and self.offline_after_s is not None
            and self.offline_after_s <= self.stale_after_s
        ):
            raise ValueError("AEGIS_OFFLINE_AFTER_S must be greater than AEGIS_STALE_AFTER_S")
        return self
