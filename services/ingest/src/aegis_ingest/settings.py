"""Ingest settings: the shared ``AEGIS_*`` ones plus MQTT session, in-flight bound and retry budget."""

from __future__ import annotations

import socket
from dataclasses import replace
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from aegis_runtime.settings import AegisSettings
from aegis_storage.clients import AwsConfig


def _default_client_id() -> str:
    # one persistent MQTT session per replica: the broker redelivers its unacked messages to the
    # replica that comes back under the same name (a StatefulSet or fixed ECS task name keeps it)
    return f"aegis-ingest-{socket.gethostname()}"[:64]


class IngestSettings(AegisSettings):
    service: str = "ingest"

    mqtt_client_id: str = Field(default_factory=_default_client_id, min_length=1, max_length=128)
    # replicas in one group share the messages ($share/{group}/...); empty: a plain subscription
    # for a single replica. Mosquitto restores a persistent session's plain subscriptions when it
    # restarts, but not its shared ones: what devices publish between a broker restart and the
    # replicas' next subscribe is dropped for a group, kept for a plain subscription
    mqtt_share_group: str = Field(default="aegis-ingest", pattern=r"^([A-Za-z0-9_-]{1,64})?$")
    mqtt_topic_filter: str = "aegis/+/+"
    # > 0, else the broker drops the session, and with it the offline and unacked messages
    mqtt_session_expiry_seconds: int = Field(default=3600, gt=0, le=0xFFFFFFFF)
    # MQTT v5 Receive Maximum: the broker sends at most this many unacknowledged QoS 1 messages,
    # which is the backpressure: a slow archive stops the flow at the broker, not in our memory
    mqtt_max_inflight: int = Field(default=64, ge=1, le=65535)
    mqtt_keepalive_seconds: int = Field(default=30, ge=5, le=3600)
    mqtt_reconnect_min_seconds: float = Field(default=0.5, gt=0)
    mqtt_reconnect_max_seconds: float = Field(default=30.0, gt=0)

    # in-process retries of one message on a transient storage/NATS failure; after the last one the
    # message stays unacknowledged and the connection is recycled so that the broker redelivers it
    retry_attempts: int = Field(default=5, ge=1, le=100)
    retry_first_delay_seconds: float = Field(default=0.2, gt=0)
    retry_max_delay_seconds: float = Field(default=5.0, gt=0)
    # botocore's own attempts per S3 call (inside one of ours)
    aws_max_attempts: int = Field(default=3, ge=1, le=10)
    nats_ack_timeout_seconds: float = Field(default=5.0, gt=0)

    # RawArchived carries the payload inline up to this size (saves the processor a GET)
    payload_inline_max_bytes: int = Field(default=64 * 1024, ge=0, le=256 * 1024)
    # an oversize payload's dead letter keeps only this prefix (plus its size and sha256)
    dead_letter_prefix_bytes: int = Field(default=4096, ge=0, le=64 * 1024)
    # on SIGTERM, in-flight messages get this long to finish before they are left unacknowledged
    shutdown_grace_seconds: float = Field(default=15.0, ge=0)

    @field_validator("mqtt_url")
    @classmethod
    def _mqtt_scheme(cls, value: str) -> str:
        if urlsplit(value).scheme not in {"mqtt", "tcp", "mqtts", "ssl"}:
            raise ValueError(
                f"AEGIS_MQTT_URL must be mqtt://host:port or mqtts://host:port, not {value!r}"
            )
        return value

    @property
    def subscription(self) -> str:
        """The subscription ingest makes: shared by the group's replicas, or plain (no group)."""
        if not self.mqtt_share_group:
            return self.mqtt_topic_filter
        return f"$share/{self.mqtt_share_group}/{self.mqtt_topic_filter}"

    def aws(self) -> AwsConfig:
        return replace(super().aws(), max_attempts=self.aws_max_attempts)
