"""Ingest settings: the shared ``AEGIS_*`` ones plus MQTT session, in-flight bound, retry budget
and the limits of the image uploads it presigns for gateways."""

from __future__ import annotations

import socket
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode

from aegis_contracts.payloads import IMAGE_CONTENT_TYPES, MAX_IMAGE_BYTES, ImageContentType
from aegis_runtime.settings import AegisSettings, comma_list


def _default_client_id() -> str:
    # one persistent MQTT session per replica: the broker redelivers its unacked messages to the
    # replica that comes back under the same name (a StatefulSet or fixed ECS task name keeps it)
    return f"aegis-ingest-{socket.gethostname()}"[:64]


class IngestSettings(AegisSettings):
    service: str = "ingest"

    mqtt_client_id: str = Field(
        default_factory=_default_client_id,
        min_length=1,
        max_length=128,
        json_schema_extra={"default_doc": "`aegis-ingest-{hostname}`"},
        description="The replica's persistent MQTT session: keep it stable across restarts (a "
        "StatefulSet's pod name, a fixed task name), so that the broker hands the replica that "
        "comes back under it the messages it had not acknowledged.",
    )
    mqtt_share_group: str = Field(
        default="aegis-ingest",
        pattern=r"^([A-Za-z0-9_-]{1,64})?$",
        description="Replicas in one group share the messages (`$share/{group}/...`). Empty: a "
        "plain subscription, for one replica (`make run` and compose). Mosquitto restores a "
        "persistent session's plain subscriptions when it restarts, but shared ones only with "
        "its persist-sqlite plugin (Mosquitto 2.1, as `deploy/mosquitto/` configures it); "
        "otherwise what devices publish between a broker restart and the replicas' next "
        "subscribe is dropped for a group.",
    )
    mqtt_topic_filter: str = Field(
        default="aegis/+/+",
        description="The topics ingest subscribes to (`aegis/{factory}/{source}`).",
    )
    mqtt_session_expiry_s: int = Field(
        default=3600,
        gt=0,
        le=0xFFFFFFFF,
        validation_alias=AliasChoices(
            "AEGIS_MQTT_SESSION_EXPIRY_S", "AEGIS_MQTT_SESSION_EXPIRY_SECONDS"
        ),
        description="Seconds the broker keeps a stopped replica's session, with the messages "
        "sent to it meanwhile and those it had not acknowledged.",
    )
    # MQTT v5 Receive Maximum is the backpressure: a slow archive stops the flow at the broker,
    # not in ingest's memory
    mqtt_max_inflight: int = Field(
        default=64,
        ge=1,
        le=65535,
        description="MQTT Receive Maximum: the broker sends a replica at most this many "
        "unacknowledged messages at once.",
    )
    mqtt_keepalive_s: int = Field(
        default=30,
        ge=5,
        le=3600,
        validation_alias=AliasChoices("AEGIS_MQTT_KEEPALIVE_S", "AEGIS_MQTT_KEEPALIVE_SECONDS"),
        description="MQTT keep-alive, seconds: the broker drops a connection silent for 1.5 "
        "times this.",
    )
    mqtt_reconnect_min_s: float = Field(
        default=0.5,
        gt=0,
        validation_alias=AliasChoices(
            "AEGIS_MQTT_RECONNECT_MIN_S", "AEGIS_MQTT_RECONNECT_MIN_SECONDS"
        ),
        description="Seconds before the first reconnect after the broker connection is lost "
        "(doubling up to `AEGIS_MQTT_RECONNECT_MAX_S`).",
    )
    mqtt_reconnect_max_s: float = Field(
        default=30.0,
        gt=0,
        validation_alias=AliasChoices(
            "AEGIS_MQTT_RECONNECT_MAX_S", "AEGIS_MQTT_RECONNECT_MAX_SECONDS"
        ),
        description="The longest wait between two reconnects, seconds.",
    )

    ingest_retry_attempts: int = Field(
        default=8,
        ge=1,
        le=100,
        validation_alias=AliasChoices("AEGIS_INGEST_RETRY_ATTEMPTS", "AEGIS_RETRY_ATTEMPTS"),
        description="Attempts at one message on a transient storage or NATS failure; after the "
        "last the message stays unacknowledged and the connection is recycled, so that the "
        "broker delivers it again. The default waits about 12 s in all (with the default "
        "delays): longer than a NATS cluster takes to elect a new stream leader (4 to 8 s), so "
        "a leader's loss costs no redelivery.",
    )
    ingest_retry_first_delay_s: float = Field(
        default=0.2,
        gt=0,
        validation_alias=AliasChoices(
            "AEGIS_INGEST_RETRY_FIRST_DELAY_S", "AEGIS_RETRY_FIRST_DELAY_SECONDS"
        ),
        description="Seconds before the second attempt at a message (doubling after each).",
    )
    ingest_retry_max_delay_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices(
            "AEGIS_INGEST_RETRY_MAX_DELAY_S", "AEGIS_RETRY_MAX_DELAY_SECONDS"
        ),
        description="The longest wait between two attempts at a message, seconds.",
    )
    aws_max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="The S3 client's own attempts per call (inside each of ingest's attempts).",
    )
    nats_ack_timeout_s: float = Field(
        default=5.0,
        gt=0,
        validation_alias=AliasChoices("AEGIS_NATS_ACK_TIMEOUT_S", "AEGIS_NATS_ACK_TIMEOUT_SECONDS"),
        description="Seconds JetStream may take to confirm a published raw event.",
    )

    payload_inline_max_bytes: int = Field(
        default=64 * 1024,
        ge=0,
        le=256 * 1024,
        description="Raw events carry their payload inline up to this size in bytes (saving the "
        "processor a read of the raw object); `aegis replay` must use the same value, or the "
        "events it rebuilds differ from the ones ingest sent.",
    )
    dead_letter_prefix_bytes: int = Field(
        default=4096,
        ge=0,
        le=64 * 1024,
        description="The bytes of an oversize payload its dead letter keeps (with its size and "
        "SHA-256).",
    )
    ingest_shutdown_grace_s: float = Field(
        default=15.0,
        ge=0,
        validation_alias=AliasChoices(
            "AEGIS_INGEST_SHUTDOWN_GRACE_S", "AEGIS_SHUTDOWN_GRACE_SECONDS"
        ),
        description="On stop, seconds in-flight messages get to finish before they are left "
        "unacknowledged (the broker delivers them again).",
    )

    ingest_upload_content_types: Annotated[list[ImageContentType], NoDecode] = Field(
        default_factory=lambda: list(IMAGE_CONTENT_TYPES),
        min_length=1,
        description="The image types a gateway may upload (`aegis/{factory}/upload_request`).",
    )
    ingest_upload_max_bytes: int = Field(
        default=5 * 1024 * 1024,
        ge=1,
        le=MAX_IMAGE_BYTES,
        description="The largest image a gateway may upload, bytes (the image_snapshot "
        f"contract allows up to {MAX_IMAGE_BYTES}).",
    )
    ingest_upload_url_ttl_s: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="Seconds a gateway's presigned upload stays valid (the POST policy's "
        "expiration).",
    )

    ingest_upload_endpoint_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/?#\s]+/?$",
        description="Where gateways reach S3 when that differs from where ingest does: the "
        "scheme and host of the upload url it hands out are replaced by these (the path, the "
        "bucket on an emulator, is kept; a POST's signature covers its policy, not the url). "
        "For an emulator behind a name only the services resolve (compose: "
        "`http://127.0.0.1:4566`). Unset: the url the SDK makes for `AEGIS_AWS_ENDPOINT_URL` "
        "(on AWS, the bucket's own endpoint).",
    )

    _comma_list = field_validator("ingest_upload_content_types", mode="before")(comma_list)

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
