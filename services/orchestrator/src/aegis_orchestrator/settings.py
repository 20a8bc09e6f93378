"""Orchestrator settings: the shared AEGIS ones plus its consumers, schedules and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from aegis_runtime.settings import AegisSettings


class OrchestratorSettings(AegisSettings):
    """``AEGIS_*`` variables (``AEGIS_ORCHESTRATOR_JOBS_FILE`` etc.)."""

    service: str = "orchestrator"
    # durable consumers: one per trigger source, shared by the replicas
    orchestrator_durable: str = Field(default="orchestrator", pattern=r"^[A-Za-z0-9_-]{1,48}$")
    # jobs registered at start when absent (`make run`); empty: none
    orchestrator_jobs_file: str = "deploy/jobs/examples.yaml"
    # safety net beside the change events that refresh the in-memory jobs
    orchestrator_refresh_s: float = Field(default=60.0, gt=0)
    orchestrator_schedule_tick_s: float = Field(default=1.0, gt=0)
    # a run slot (overlap_allowed) is renewed by the execution's heartbeats and freed when it
    # ends or is found abandoned; this long it stays taken if its execution vanished without trace
    orchestrator_run_lease_s: float = Field(default=3600.0, gt=0)
    # a replica renews its lease on each execution it runs every third of this; another replica
    # resumes an execution whose lease ran out (looking every resume_scan_s)
    orchestrator_execution_lease_s: float = Field(default=30.0, gt=0)
    orchestrator_resume_scan_s: float = Field(default=5.0, gt=0)
    # on stop, executions get this long to end before they are handed over to other replicas
    orchestrator_drain_s: float = Field(default=5.0, ge=0)
    # how often a WAIT step looks at the clock
    orchestrator_wait_poll_s: float = Field(default=1.0, gt=0)
    # bounds of one execution (a job past one fails with the reason in its execution log)
    orchestrator_max_context_bytes: int = Field(default=1024 * 1024, ge=1024)
    orchestrator_max_steps: int = Field(default=1000, ge=1)
    # the execution log item (DynamoDB refuses items over 400 KB)
    orchestrator_max_item_bytes: int = Field(default=350 * 1024, ge=8 * 1024, le=390 * 1024)
    # execution inputs above this many bytes go to S3 by reference (claim check)
    orchestrator_inline_limit_bytes: int = Field(default=64 * 1024, ge=1024)
    # step values in the execution log above this go to S3 too (DynamoDB items stop at 400 KB)
    orchestrator_log_inline_bytes: int = Field(default=16 * 1024, ge=256)
    orchestrator_log_ttl_days: float = Field(default=30.0, gt=0)
    # `aegis` subcommands a RUN_COMMAND step may run
    orchestrator_commands: list[str] = Field(
        default_factory=lambda: ["aggregate", "report", "status"]
    )
    orchestrator_command_timeout_s: float = Field(default=600.0, gt=0)
    # where HTTP_WEBHOOK and SLACK_NOTIFY steps may go besides public https addresses: host names
    # and networks (comma separated) that may be called over plain http and at non-public
    # addresses (aegis_orchestrator.egress)
    job_egress_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # the most of an answer a job's HTTP step reads
    orchestrator_response_max_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    # tests and drills only: read the time from this file (an ISO-8601 instant) instead of the
    # system clock, so WAITs and leases pass when the file is rewritten
    orchestrator_clock_file: Path | None = None
    batch_size: int = Field(default=16, ge=1, le=256)
    fetch_timeout_s: float = Field(default=1.0, gt=0)
    ack_wait_s: float = Field(default=60.0, gt=0)
    max_deliver: int = Field(default=5, ge=1)

    @field_validator("job_egress_allow", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
