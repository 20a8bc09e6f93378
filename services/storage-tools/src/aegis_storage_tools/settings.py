"""Settings of ``aegis migrate``, ``aegis replay``, ``aegis seal`` and ``aegis audit`` (environment,
``AEGIS_`` prefix)."""

from __future__ import annotations

from datetime import time

from pydantic import AliasChoices, Field

from aegis_runtime.settings import AegisSettings
from aegis_storage.s3 import COPY_OBJECT_MAX_BYTES, COPY_PART_BYTES, COPY_PART_MIN_BYTES


class StorageToolsSettings(AegisSettings):
    service: str = "storage-tools"
    migrate_concurrency: int = Field(
        default=32,
        ge=1,
        le=512,
        description="Objects `aegis migrate` copies at once (server-side copies).",
    )
    # S3 copies at most 5 GiB in one CopyObject
    migrate_multipart_threshold_bytes: int = Field(
        default=COPY_OBJECT_MAX_BYTES,
        ge=COPY_PART_MIN_BYTES,
        le=COPY_OBJECT_MAX_BYTES,
        description="Objects above this many bytes are copied in parts (UploadPartCopy); S3 "
        "copies at most 5 GiB in one request. Lower it only to exercise the multipart path.",
    )
    migrate_part_bytes: int = Field(
        default=COPY_PART_BYTES,
        ge=COPY_PART_MIN_BYTES,
        le=COPY_OBJECT_MAX_BYTES,
        description="The size of each part of a multipart copy, bytes.",
    )
    replay_rate: float = Field(
        default=200.0,
        ge=0,
        description="Messages per second `aegis replay` publishes (its `--rate` default); 0: no "
        "limit.",
    )
    replay_concurrency: int = Field(
        default=16, ge=1, le=512, description="Raw objects `aegis replay` handles at once."
    )
    payload_inline_max_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=256 * 1024,
        description="Raw events carry their payload inline up to this size in bytes (saving the "
        "processor a read of the raw object); `aegis replay` must use the same value, or the "
        "events it rebuilds differ from the ones ingest sent.",
    )
    nats_ack_timeout_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_NATS_ACK_TIMEOUT_S", "AEGIS_NATS_ACK_TIMEOUT_SECONDS"),
        description="Seconds JetStream may take to confirm a published raw event.",
    )
    seal_grace_hours: float = Field(
        default=2.0,
        ge=0,
        le=168,
        description="A raw UTC day is sealed once it is over plus this long, hours (objects still "
        "arriving for it).",
    )
    seal_lookback_days: int = Field(
        default=7,
        ge=1,
        le=366,
        description="`aegis seal raw` without `--date`: the newest due days it looks at "
        "(unsealed days are sealed, sealed ones get a supplement for late arrivals).",
    )
    seal_concurrency: int = Field(
        default=32,
        ge=1,
        le=512,
        description="Objects read at once by `aegis seal raw` and `aegis audit raw --deep`.",
    )

    seal_schedule_utc: str = Field(
        default="02:30",
        pattern=r"^([01]\d|2[0-3]):[0-5]\d$",
        description="`aegis seal schedule` (compose's and `make run`'s seal-raw): the UTC time "
        "of day, HH:MM, of its daily `aegis seal raw` (the CronJob's and the ECS schedule's).",
    )
    seal_on_start: bool = Field(
        default=True,
        description="`aegis seal schedule` runs `aegis seal raw` once at start too (a machine "
        "that was off at the time catches up).",
    )

    def seal_schedule_time(self) -> time:
        """:attr:`seal_schedule_utc` as a UTC time of day."""
        return time.fromisoformat(self.seal_schedule_utc)

    @property
    def nats_ack_timeout_seconds(self) -> float:
        """The former name of :attr:`nats_ack_timeout_s`, which ``aegis replay``'s command still
        reads (the variable is ``AEGIS_NATS_ACK_TIMEOUT_S``)."""
        return self.nats_ack_timeout_s
