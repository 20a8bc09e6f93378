"""Orchestrator settings: the shared AEGIS ones plus its consumers, schedules and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from aegis_orchestration.tenants import FILE_DESCRIPTION
from aegis_runtime.settings import AegisSettings, comma_list


class OrchestratorSettings(AegisSettings):
    """``AEGIS_*`` variables (``AEGIS_ORCHESTRATOR_JOBS_FILE`` etc.)."""

    service: str = "orchestrator"
    orchestrator_durable: str = Field(
        default="orchestrator",
        pattern=r"^[A-Za-z0-9_-]{1,48}$",
        description="Prefix of its JetStream durable consumers, one per trigger source "
        "(`-changes`, `-objects`, `-events`, `-raw`), shared by the replicas.",
    )
    orchestrator_jobs_file: str = Field(
        default="deploy/jobs/examples.yaml",
        description="Jobs registered at start when absent (a YAML file). Empty: none.",
    )
    orchestrator_tenants_file: Path | None = Field(default=None, description=FILE_DESCRIPTION)
    orchestrator_refresh_s: float = Field(
        default=60.0,
        gt=0,
        description="Seconds between two reloads of every job, a safety net beside the change "
        "events that refresh them.",
    )
    orchestrator_schedule_tick_s: float = Field(
        default=1.0, gt=0, description="Seconds between two checks of the cron schedules."
    )
    orchestrator_run_lease_s: float = Field(
        default=3600.0,
        gt=0,
        description="How far ahead each heartbeat of an execution renews its run slot, seconds: "
        "how long a slot stays taken when its execution vanished without a trace.",
    )
    orchestrator_execution_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="A replica renews its lease on an execution every third of this (seconds); "
        "once it runs out another replica resumes the execution.",
    )
    orchestrator_resume_scan_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between two looks of each replica for executions to take over.",
    )
    orchestrator_drain_s: float = Field(
        default=5.0,
        ge=0,
        description="On stop, seconds executions may go on before they are handed over to other "
        "replicas.",
    )
    orchestrator_wait_poll_s: float = Field(
        default=1.0, gt=0, description="Seconds between two looks of a WAIT step at the clock."
    )
    orchestrator_max_context_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        description="The largest context (trigger data, outputs, errors) of an execution, bytes "
        "of JSON; past it the execution fails (`ContextTooLarge`).",
    )
    orchestrator_max_steps: int = Field(
        default=1000,
        ge=1,
        description="Step runs per execution; past it the execution fails (`StepLimitExceeded`).",
    )
    orchestrator_max_item_bytes: int = Field(
        default=350 * 1024,
        ge=8 * 1024,
        le=390 * 1024,
        description="The largest execution log item, bytes (DynamoDB refuses items over 400 KB).",
    )
    orchestrator_inline_limit_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        description="Execution inputs above this many bytes go to S3 by reference (claim check).",
    )
    orchestrator_log_inline_bytes: int = Field(
        default=16 * 1024,
        ge=256,
        description="Step values in the execution log above this many bytes go to S3 too.",
    )
    orchestrator_log_ttl_days: float = Field(
        default=30.0, gt=0, description="Lifetime of the execution log items, days."
    )
    orchestrator_commands: list[str] = Field(
        default_factory=lambda: ["aggregate", "report", "status"],
        description="The `aegis` subcommands a RUN_COMMAND step may run, as a JSON list.",
    )
    orchestrator_command_timeout_s: float = Field(
        default=600.0, gt=0, description="Seconds a RUN_COMMAND step's command may run."
    )
    job_egress_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names and networks, comma-separated (`hooks.internal,10.20.0.0/16`), "
        "that HTTP_WEBHOOK and SLACK_NOTIFY steps may call over plain http and at non-public "
        "addresses; other than these only public https addresses. Jobs cannot read it.",
    )
    orchestrator_response_max_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * 1024 * 1024,
        description="The most of an answer a job's HTTP step reads, bytes (`truncated: true` in "
        "its output beyond).",
    )
    orchestrator_clock_file: Path | None = Field(
        default=None,
        description="Tests and drills only: the service's time is the ISO-8601 instant in this "
        "file instead of the system clock, so WAITs and leases pass when the file is rewritten.",
    )
    orchestrator_engine: Literal["builtin", "stepfunctions"] = Field(
        default="builtin",
        description="What runs an execution: `builtin` (this service's engine, with its "
        "execution log) or `stepfunctions` (an AWS Step Functions execution of the job's "
        "exported state machine, started once per trigger; see the Step Functions section of "
        "docs/orchestration.md).",
    )
    orchestrator_state_machine_arn_prefix: str = Field(
        default="",
        pattern=r"^(arn:[a-z-]+:states:[a-z0-9-]+:\d{12}:stateMachine:[A-Za-z0-9_-]*)?$",
        description="With the `stepfunctions` engine: the state machines' ARN up to the job id "
        "(`arn:aws:states:REGION:ACCOUNT:stateMachine:aegis-job-`; the template of `aegis jobs "
        "export-sfn` outputs it as StateMachineArnPrefix).",
    )
    orchestrator_sfn_poll_batch: int = Field(
        default=25,
        ge=1,
        le=1000,
        description="With the `stepfunctions` engine: DescribeExecution calls each replica makes "
        "per round (every `AEGIS_ORCHESTRATOR_RESUME_SCAN_S`) at most, to record how the "
        "executions it watches ended; the least recently seen go first.",
    )
    orchestrator_expiry_stream: bool = Field(
        default=False,
        description="Read the table's DynamoDB stream and announce the items DynamoDB deleted "
        "once their `ttl` passed as REMOVE changes (`expired: true`), so BizObject Delete jobs "
        "fire for expiries too. Turn it on where DynamoDB expires items (AWS); the local "
        "emulator never does. Needs dynamodb:DescribeStream, GetShardIterator and GetRecords "
        "on the table's stream.",
    )
    orchestrator_expiry_poll_s: float = Field(
        default=5.0,
        gt=0,
        description="With `orchestrator_expiry_stream`: seconds between two reads of the "
        "table's stream (an expiry is announced within about this much of its stream record).",
    )
    orchestrator_expiry_lease_s: float = Field(
        default=30.0,
        gt=0,
        description="With `orchestrator_expiry_stream`: one replica reads each stream shard, "
        "renewing its lease while it does; once the lease runs out (seconds) another replica "
        "takes the shard over.",
    )
    orchestrator_s3_events_queue_url: str = Field(
        default="",
        description="An SQS queue of the bucket's S3 event notifications (direct, through SNS, "
        "or from an EventBridge rule): each replica announces the objects it reports that the "
        "platform did not write itself (device image uploads as `image_upload`, keys outside "
        "the layout as `external`) for Component jobs. Empty: none.",
    )
    orchestrator_s3_events_wait_s: int = Field(
        default=20,
        ge=1,
        le=20,
        description="Seconds one ReceiveMessage of the S3 events queue waits for messages "
        "(SQS long polling, at most 20).",
    )
    orchestrator_batch_size: int = Field(
        default=16,
        ge=1,
        le=256,
        validation_alias=AliasChoices("AEGIS_ORCHESTRATOR_BATCH_SIZE", "AEGIS_BATCH_SIZE"),
        description="Trigger events each replica fetches from each consumer at a time.",
    )
    orchestrator_fetch_timeout_s: float = Field(
        default=1.0,
        gt=0,
        validation_alias=AliasChoices(
            "AEGIS_ORCHESTRATOR_FETCH_TIMEOUT_S", "AEGIS_FETCH_TIMEOUT_S"
        ),
        description="Seconds one fetch waits for trigger events (also how quickly a replica "
        "notices a stop).",
    )
    orchestrator_ack_wait_s: float = Field(
        default=60.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_ORCHESTRATOR_ACK_WAIT_S", "AEGIS_ACK_WAIT_S"),
        description="Seconds a trigger event may stay unacknowledged before JetStream delivers "
        "it again.",
    )
    orchestrator_max_deliver: int = Field(
        default=5,
        ge=1,
        validation_alias=AliasChoices("AEGIS_ORCHESTRATOR_MAX_DELIVER", "AEGIS_MAX_DELIVER"),
        description="Deliveries of one trigger event in all; after the last it is dead-lettered.",
    )

    @model_validator(mode="after")
    def _machines_named(self) -> OrchestratorSettings:
        if self.orchestrator_engine == "stepfunctions" and not (
            self.orchestrator_state_machine_arn_prefix
        ):
            raise ValueError(
                "AEGIS_ORCHESTRATOR_ENGINE=stepfunctions needs "
                "AEGIS_ORCHESTRATOR_STATE_MACHINE_ARN_PREFIX (the StateMachineArnPrefix output "
                "of the template `aegis jobs export-sfn` writes)"
            )
        return self

    _comma_separated = field_validator("job_egress_allow", mode="before")(comma_list)
