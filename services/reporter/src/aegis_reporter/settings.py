"""Reporter settings: the shared AEGIS ones plus the schedule, reading and generator knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aegis_runtime.settings import AegisSettings
from aegis_storage.clients import AwsConfig


class ReporterSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "reporter"
    # the previous KST day is reported this many minutes after KST midnight
    report_run_at_minutes: int = Field(default=30, ge=0, le=1439)
    # days looked back over after downtime (the newest due day included)
    report_catchup_days: int = Field(default=7, ge=1, le=90)
    # an unfinished day claim (its replica died) is taken over after this long
    report_claim_lease_s: float = Field(default=1800.0, gt=0)
    # the longest wait between two checks for due days
    report_poll_s: float = Field(default=300.0, gt=0)
    # objects read at once
    report_concurrency: int = Field(default=32, ge=1, le=256)
    # a longer silence between factory_state records is a gap (stale); past offline_s, offline
    report_gap_s: float = Field(default=60.0, gt=0)
    report_offline_s: float = Field(default=300.0, gt=0)
    # the expected factory_state interval; unset: the day's median interval
    report_cadence_s: float | None = Field(default=None, gt=0)
    # relative accuracy of the p95 sketches
    report_sketch_alpha: float = Field(default=0.005, gt=0, lt=0.1)
    report_generator: Literal["template", "bedrock"] = "template"
    report_bedrock_model_id: str = "anthropic.claude-3-haiku-20240307-v1:0"
    # unset: Bedrock's own endpoint for the region (the S3/DynamoDB emulator does not serve it)
    report_bedrock_endpoint_url: str | None = None

    def bedrock_aws(self) -> AwsConfig:
        return AwsConfig(
            region=self.region,
            endpoint_url=self.report_bedrock_endpoint_url,
            max_attempts=2,
            connect_timeout=5.0,
            read_timeout=120.0,
        )
