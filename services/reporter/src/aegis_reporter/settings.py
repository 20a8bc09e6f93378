"""Reporter settings: the shared AEGIS ones plus the schedule, reading and generator knobs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from aegis_runtime.settings import AegisSettings
from aegis_storage.clients import AwsConfig


class ReporterSettings(AegisSettings):
    """``AEGIS_*`` variables."""

    service: str = "reporter"
    report_run_at_minutes: int = Field(
        default=30,
        ge=0,
        le=1439,
        description="Minutes after KST midnight at which the previous KST day is reported.",
    )
    report_catchup_days: int = Field(
        default=7,
        ge=1,
        le=90,
        description="Days looked back over for reports not yet written after downtime (the "
        "newest due day included).",
    )
    report_claim_lease_s: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds after which an unfinished day claim (its replica died) is taken "
        "over; the new run resumes from the hourly intermediates.",
    )
    report_poll_s: float = Field(
        default=300.0,
        gt=0,
        description="The longest wait between two checks for due days, seconds.",
    )
    report_concurrency: int = Field(
        default=32, ge=1, le=256, description="Objects read at once for a report."
    )
    report_gap_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds of silence between factory_state records that make a stale gap. "
        "The aggregator's windows fold with it too: set it the same for both, or the reporter "
        "reads the objects instead of the windows.",
    )
    report_offline_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds of silence between factory_state records that make an offline gap.",
    )
    report_cadence_s: float | None = Field(
        default=None,
        gt=0,
        description="The interval factory_state records are expected at, seconds. Unset: the "
        "day's median interval.",
    )
    report_sketch_alpha: float = Field(
        default=0.005,
        gt=0,
        lt=0.1,
        description="Relative accuracy of the p95 sketches. The aggregator's windows fold with it "
        "too: set it the same for both, or the reporter reads the objects instead of the "
        "windows.",
    )
    report_generator: Literal["template", "bedrock"] = Field(
        default="template",
        description="Who writes report.md: the `template`, or `bedrock` (Amazon Bedrock; the "
        "template when it fails).",
    )
    report_bedrock_model_id: str = Field(
        default="anthropic.claude-3-haiku-20240307-v1:0",
        description="The Bedrock model that writes the report.",
    )
    report_bedrock_endpoint_url: str | None = Field(
        default=None,
        description="The Bedrock endpoint. Unset: Bedrock's own endpoint for `AEGIS_REGION` "
        "(the S3 and DynamoDB emulator does not serve Bedrock).",
    )

    def bedrock_aws(self) -> AwsConfig:
        return AwsConfig(
            region=self.region,
            endpoint_url=self.report_bedrock_endpoint_url,
            max_attempts=2,
            connect_timeout=5.0,
            read_timeout=120.0,
        )
