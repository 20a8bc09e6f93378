"""Settings of ``aegis migrate`` and ``aegis replay`` (environment, ``AEGIS_`` prefix)."""

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
