"""MQTT payloads: the envelope and the three bodies, and strict parsing of raw bytes.

:func:`parse_device_message` is what the processor calls on an archived payload: it refuses
oversize payloads, malformed JSON (including NaN, Infinity and duplicate keys), payloads that are
not objects, schema violations and a factory_id that contradicts the topic, each with a
:class:`ContractError` whose ``code`` is the dead-letter reason.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import (
    MAX_PAYLOAD_BYTES,
    DeviceId,
    FactoryId,
    Filename,
    SourceType,
    validate_source_type,
)
from aegis_contracts.keys import image_snapshot_key
from aegis_contracts.times import ensure_utc

SENSOR_NAME = r"^[a-z][a-z0-9_]{0,63}$"
LABEL = r"^[a-z][a-z0-9_]{0,63}$"
STAGE = r"^[a-z][a-z0-9_-]{0,63}$"
MAX_SENSORS = 256
MAX_DETECTIONS = 512
MAX_CAMERAS = 256
MAX_IMAGE_BYTES = 50 * 1024 * 1024
# the image formats a snapshot may be (its ``content_type``)
ImageContentType = Literal["image/jpeg", "image/png", "image/webp"]
IMAGE_CONTENT_TYPES: tuple[ImageContentType, ...] = get_args(ImageContentType)

# the sensors risk rules know; other names are kept and aggregated, not scored
KNOWN_SENSORS = (
    "temperature_c",
    "humidity_pct",
    "co_ppm",
    "smoke_obscuration_pct",
    "vibration_mm_s",
    "noise_db",
)


# what the read model can store: DynamoDB numbers are 0 or 1e-130 <= |x| < 1e126
SMALLEST_NUMBER = 1e-130
LARGEST_NUMBER = 1e125
# device clocks: a reset clock (1970) still files under arrival time; beyond year 2999 is no clock
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(3000, 1, 1, tzinfo=UTC)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if value != 0 and not SMALLEST_NUMBER <= abs(value) <= LARGEST_NUMBER:
        raise ValueError(
            f"must be 0 or between {SMALLEST_NUMBER:g} and {LARGEST_NUMBER:g} in magnitude "
            "(what the read model can store)"
        )
    return value


def _utc(value: datetime) -> datetime:
    try:
        utc = ensure_utc(value)
    except OverflowError:  # 9999-12-31T23:00-05:00 is in year 10000
        raise ValueError("is out of range (years 1970 to 2999 in UTC)") from None
    if not EARLIEST <= utc < LATEST:
        raise ValueError("is out of range (years 1970 to 2999 in UTC)")
    return utc


Finite = Annotated[float, Field(strict=False), AfterValidator(_finite)]
UtcDatetime = Annotated[datetime, AfterValidator(_utc)]
Pct = Annotated[float, Field(ge=0, le=100)]
CameraId = DeviceId


# ``1``, ``1.0``, ``1.2.3``: what a device message's schema_version may be
SCHEMA_VERSION_PATTERN = r"^\d{1,3}(\.\d{1,3}){0,2}$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=4096)


class Envelope(_Model):
    """Fields every device message carries. ``message_id`` is optional on the wire: ingest derives a
    deterministic one when it is missing or invalid, and that effective id travels in the queue
    event, so here any string is accepted and the event's id is authoritative."""

    message_id: str | None = Field(default=None, max_length=256)
    factory_id: FactoryId
    device_id: DeviceId
    emitted_at: UtcDatetime
    schema_version: str = Field(pattern=SCHEMA_VERSION_PATTERN)


class Detection(_Model):
    label: str = Field(pattern=LABEL)
    confidence: float = Field(ge=0, le=1)
    camera_id: CameraId
    bbox: tuple[Finite, Finite, Finite, Finite] | None = None


class AiBlock(_Model):
    model_version: str = Field(min_length=1, max_length=128)
    detections: list[Detection] = Field(default_factory=list, max_length=MAX_DETECTIONS)


class FactoryStateMessage(Envelope):
    sensors: dict[Annotated[str, Field(pattern=SENSOR_NAME)], Finite] = Field(
        default_factory=dict, max_length=MAX_SENSORS
    )
    ai: AiBlock | None = None

    @field_validator("sensors", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any) -> Any:
        # JSON true/false would otherwise pass as 1.0/0.0
        if isinstance(value, dict) and any(isinstance(v, bool) for v in value.values()):
            raise ValueError("sensor values must be numbers, not booleans")
        return value


class HostStats(_Model):
    cpu_pct: Pct | None = None
    mem_pct: Pct | None = None
    disk_pct: Pct | None = None
    temperature_c: Finite | None = None
    uptime_s: Annotated[Finite, Field(ge=0)] | None = None


class NetworkStats(_Model):
    rtt_ms: Annotated[Finite, Field(ge=0)] | None = None
    loss_pct: Pct | None = None


class InfraStateMessage(Envelope):
    host: HostStats = Field(default_factory=HostStats)
    network: NetworkStats = Field(default_factory=NetworkStats)
    cameras: dict[CameraId, Literal["online", "offline"]] = Field(
        default_factory=dict, max_length=MAX_CAMERAS
    )
    pipeline: dict[Annotated[str, Field(pattern=STAGE)], Literal["ok", "degraded", "down"]] = Field(
        default_factory=dict, max_length=64
    )


class ImageSnapshotMessage(Envelope):
    camera_id: CameraId
    filename: Filename
    content_type: ImageContentType
    size_bytes: int = Field(gt=0, le=MAX_IMAGE_BYTES)
    captured_at: UtcDatetime
    s3_key: str = Field(max_length=1024)

    @model_validator(mode="after")
    def _key_is_the_contract_key(self) -> ImageSnapshotMessage:
        expected = image_snapshot_key(self.factory_id, self.captured_at, self.filename)
        if self.s3_key != expected:
            raise ValueError(f"s3_key must be {expected!r} (the image_snapshot/ contract key)")
        return self


DeviceMessage = FactoryStateMessage | InfraStateMessage | ImageSnapshotMessage

MODEL_FOR: dict[
    SourceType, type[FactoryStateMessage | InfraStateMessage | ImageSnapshotMessage]
] = {
    SourceType.FACTORY_STATE: FactoryStateMessage,
    SourceType.INFRA_STATE: InfraStateMessage,
    SourceType.IMAGE_SNAPSHOT: ImageSnapshotMessage,
}


def _refuse_constant(name: str) -> None:
    raise ContractError("malformed_json", f"JSON constant {name} is not allowed")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ContractError("malformed_json", f"duplicate JSON key {key!r:.64}")
        result[key] = value
    return result


def decode_json_object(payload: bytes) -> dict[str, Any]:
    """Strict JSON: UTF-8, an object at the top, no NaN/Infinity, no duplicate keys."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ContractError(
            "payload_too_large", f"payload is {len(payload)} bytes, limit {MAX_PAYLOAD_BYTES}"
        )
    try:
        value = json.loads(
            payload.decode("utf-8"),
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_keys,
        )
    except UnicodeDecodeError as err:
        raise ContractError("malformed_json", f"payload is not UTF-8: {err.reason}") from None
    except json.JSONDecodeError as err:
        raise ContractError(
            "malformed_json", f"payload is not JSON: {err.msg} at line {err.lineno} col {err.colno}"
        ) from None
    except RecursionError:
        raise ContractError("malformed_json", "payload nests too deeply") from None
    except ContractError:
        raise
    except ValueError:  # CPython reads integers of at most 4,300 digits
        raise ContractError(
            "malformed_json", "payload has an integer of more than 4,300 digits"
        ) from None
    if not isinstance(value, dict):
        raise ContractError(
            "not_an_object", f"payload is a JSON {type(value).__name__}, not an object"
        )
    return value


def parse_device_message(
    source_type: SourceType | str, payload: bytes, *, topic_factory_id: str
) -> DeviceMessage:
    """Validate a device payload for its topic; every refusal is a :class:`ContractError`."""
    st = validate_source_type(source_type)
    data = decode_json_object(payload)
    try:
        message = MODEL_FOR[st].model_validate(data)
    except ValidationError as err:
        raise ContractError("schema_violation", summarize(err)) from None
    if message.factory_id != topic_factory_id:
        raise ContractError(
            "factory_mismatch",
            f"payload names factory {message.factory_id!r} but arrived on {topic_factory_id!r}",
        )
    return message


def summarize(err: ValidationError, limit: int = 5) -> str:
    """The first ``limit`` problems of ``err``, each with the field it concerns."""
    parts = []
    for e in err.errors()[:limit]:
        where = ".".join(str(p) for p in e["loc"]) or "(root)"
        parts.append(f"{where}: {e['msg']}")
    more = err.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
