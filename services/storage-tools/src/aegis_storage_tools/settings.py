"""Settings of ``aegis migrate``, ``aegis replay``, ``aegis seal`` and ``aegis audit`` (environment,
``AEGIS_`` prefix)."""

from __future__ import annotations

from pydantic import Field

from aegis_runtime.settings import AegisSettings
from aegis_storage.s3 import COPY_OBJECT_MAX_BYTES, COPY_PART_BYTES, COPY_PART_MIN_BYTES


class StorageToolsSettings(AegisSettings):
    service: str = "storage-tools"
    migrate_concurrency: int = Field(default=32, ge=1, le=512)
    # S3 copies at most 5 GiB in one CopyObject; lower it only to exercise the multipart path
    migrate_multipart_threshold_bytes: int = Field(
        default=COPY_OBJECT_MAX_BYTES, ge=COPY_PART_MIN_BYTES, le=COPY_OBJECT_MAX_BYTES
    )
    migrate_part_bytes: int = Field(
        default=COPY_PART_BYTES, ge=COPY_PART_MIN_BYTES, le=COPY_OBJECT_MAX_BYTES
    )
    replay_rate: float = Field(default=200.0, ge=0)  # messages/s; 0 = no limit
    replay_concurrency: int = Field(default=16, ge=1, le=512)
    # must match ingest's, or the rebuilt RawArchived differs from the one ingest sent
    payload_inline_max_bytes: int = Field(default=64 * 1024, ge=0, le=256 * 1024)
    nats_ack_timeout_seconds: float = Field(default=5.0, gt=0)
    # a raw day is sealed once it is over plus this long (objects still arriving for it)
    seal_grace_hours: float = Field(default=2.0, ge=0, le=168)
    # `aegis seal raw` without --date: the newest due days it looks at (unsealed days are sealed,
    # sealed ones get a supplement for late arrivals)
    seal_lookback_days: int = Field(default=7, ge=1, le=366)
    # objects read at once by `aegis seal raw` and `aegis audit raw --deep`
    seal_concurrency: int = Field(default=32, ge=1, le=512)
