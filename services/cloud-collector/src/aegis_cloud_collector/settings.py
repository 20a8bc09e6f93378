"""Cloud-collector settings: the shared AEGIS ones plus intervals, thresholds and what is expected
to exist. Lists are comma-separated in the environment (``AEGIS_EXPECTED_SERVICES=ingest,processor``)."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import NoDecode

from aegis_runtime.settings import AegisSettings, comma_list

Tier = Literal["fast", "slow"]
CommaList = Annotated[list[str], NoDecode]
CodeSeconds = Annotated[dict[str, float], NoDecode]

# how long each reason must last before it is reported, where it differs from AEGIS_CLOUD_FOR_S:
# a heartbeat is every 10 s and counts as missed after 30 s, so a replica restarted by its
# orchestrator is back well within a minute; $SYS comes every 10 s and is silent after 30 s, and a
# broker restart takes its clients a reconnect or two; DEAD_LETTERS counts letters new since the
# previous run (an event, not a state) and DYNAMODB_SYSTEM_ERRORS is already a 5-minute sum
FOR_BY_REASON: dict[str, float] = {
    "SERVICE_DOWN": 60,
    "SERVICE_NOT_READY": 60,
    "MQTT_SYS_SILENT": 90,
    "DEAD_LETTERS": 0,
    "DYNAMODB_SYSTEM_ERRORS": 0,
}
# how long a firing reason must pass before it is no longer reported, where it differs from
# AEGIS_CLOUD_CLEAR_S: new dead letters are reported in the run that saw them only
CLEAR_BY_REASON: dict[str, float] = {"DEAD_LETTERS": 0}


def _code_seconds(value: object, what: str) -> object:
    """``CODE=seconds,CODE=seconds`` or a JSON object (the environment's forms) to a dict."""
    if not isinstance(value, str):
        return value
    if value.strip().startswith("{"):
        return json.loads(value)
    found: dict[str, float] = {}
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        code, sep, seconds = part.partition("=")
        try:
            found[code.strip()] = float(seconds)
        except ValueError:
            sep = ""
        if not sep or not code.strip():
            raise ValueError(f"{what}: {part!r} is not CODE=seconds")
    return found


def _checked_seconds(value: dict[str, float], what: str) -> dict[str, float]:
    for code, seconds in value.items():
        if not re.fullmatch(r"[A-Z][A-Z0-9_]{0,63}", code) or seconds < 0:
            raise ValueError(f"{what}: {code}={seconds:g} is not a reason code and seconds >= 0")
    return value


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

    # alerting rules: how long a failure lasts before it is reported, and a recovery before not
    cloud_for_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds a check must fail, run after run, before its reason is reported "
        "(WARNING/CRITICAL); until then it is pending: shown in the snapshot, never alerted. "
        "Fast checks run every minute: 60 s fires at the second failing run in a row (a slow "
        "check's second run, five minutes after its first). Per reason: "
        "`AEGIS_CLOUD_FOR_BY_REASON`.",
    )
    cloud_for_by_reason: CodeSeconds = Field(
        default_factory=lambda: dict(FOR_BY_REASON),
        description="The `for` duration of particular reasons: a JSON object or comma-separated "
        "`CODE=seconds` (`SERVICE_DOWN=120,STORAGE_SLOW=300`); the codes given replace their "
        "defaults, the others keep them.",
    )
    cloud_clear_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds a firing check must pass, run after run, before its reason is no "
        "longer reported (120 s: from a fast check's third passing run, a slow one's second): "
        "a check that flaps keeps firing, and is alerted and resolved once. Per reason: "
        "`AEGIS_CLOUD_CLEAR_BY_REASON`.",
    )
    cloud_clear_by_reason: CodeSeconds = Field(
        default_factory=lambda: dict(CLEAR_BY_REASON),
        description="The clear duration of particular reasons: a JSON object or comma-separated "
        "`CODE=seconds`; the codes given replace their defaults, the others keep them.",
    )
    cloud_startup_grace_s: float = Field(
        default=120.0,
        ge=0,
        description="Seconds something that has just started counts as STARTING, not down: a "
        "service not seen since the collector started (and the broker's `$SYS` before its "
        "first message), a replica since its own start, the replacement of a replica that "
        "stopped cleanly since that stop. After it, the `for` duration of the failure counts.",
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

    _comma_list = field_validator(
        "collector_tiers", "expected_consumers", "expected_services", mode="before"
    )(comma_list)

    @field_validator("cloud_for_by_reason", "cloud_clear_by_reason", mode="before")
    @classmethod
    def _seconds_by_code(cls, value: object, info: ValidationInfo) -> object:
        return _code_seconds(value, f"AEGIS_{str(info.field_name).upper()}")

    @field_validator("cloud_for_by_reason")
    @classmethod
    def _for_defaults(cls, value: dict[str, float]) -> dict[str, float]:
        return _checked_seconds({**FOR_BY_REASON, **value}, "AEGIS_CLOUD_FOR_BY_REASON")

    @field_validator("cloud_clear_by_reason")
    @classmethod
    def _clear_defaults(cls, value: dict[str, float]) -> dict[str, float]:
        return _checked_seconds({**CLEAR_BY_REASON, **value}, "AEGIS_CLOUD_CLEAR_BY_REASON")

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
