"""Identifiers that end up inside S3 keys, DynamoDB keys and NATS subjects, and their validation.

Validation is an allow-list over ASCII, applied before anything is built from an id: ``..``,
``/``, MQTT wildcards, NATS tokens, unicode look-alikes (a Cyrillic a is not a Latin a), empty and
over-long values are refused with a :class:`ContractError` saying which rule failed.
"""

from __future__ import annotations

import hashlib
import re
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

from aegis_contracts.errors import ContractError

FACTORY_ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
MESSAGE_ID_PATTERN = re.compile(r"[A-Za-z0-9-]{8,64}")
# device and camera ids are not part of any key, but they reach logs and the dashboard
DEVICE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# file names of image snapshots end a key: no separators, no leading dot
FILENAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

TOPIC_ROOT = "aegis"
MAX_PAYLOAD_BYTES = 256 * 1024


class SourceType(StrEnum):
    FACTORY_STATE = "factory_state"
    INFRA_STATE = "infra_state"
    IMAGE_SNAPSHOT = "image_snapshot"


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check(pattern: re.Pattern[str], value: object, what: str, rule: str) -> str:
    if not isinstance(value, str):
        raise ContractError(
            f"invalid_{what}", f"{what} must be a string, got {type(value).__name__}"
        )
    if not value:
        raise ContractError(f"invalid_{what}", f"{what} is empty")
    if not value.isascii():
        raise ContractError(
            f"invalid_{what}", f"{what} {_describe(value)} has non-ASCII characters; {rule}"
        )
    if pattern.fullmatch(value) is None:
        raise ContractError(f"invalid_{what}", f"{what} {_describe(value)} does not match {rule}")
    return value


def validate_factory_id(value: object) -> str:
    return _check(FACTORY_ID_PATTERN, value, "factory_id", "^[a-z0-9][a-z0-9-]{0,62}$")


def validate_message_id(value: object) -> str:
    return _check(MESSAGE_ID_PATTERN, value, "message_id", "^[A-Za-z0-9-]{8,64}$")


def validate_device_id(value: object) -> str:
    return _check(DEVICE_ID_PATTERN, value, "device_id", "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def validate_filename(value: object) -> str:
    return _check(FILENAME_PATTERN, value, "filename", "^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def validate_source_type(value: object) -> SourceType:
    if isinstance(value, str) and value in SourceType.__members__.values():
        return SourceType(value)
    allowed = ", ".join(s.value for s in SourceType)
    raise ContractError(
        "invalid_source_type", f"source_type {_describe(value)} is not one of {allowed}"
    )


def _schema(pattern: re.Pattern[str]) -> WithJsonSchema:
    """The JSON Schema of an id: the pattern its validator checks (validation stays the
    validator's, with its clearer message)."""
    return WithJsonSchema({"type": "string", "pattern": f"^{pattern.pattern}$"})


FactoryId = Annotated[str, AfterValidator(validate_factory_id), _schema(FACTORY_ID_PATTERN)]
MessageId = Annotated[str, AfterValidator(validate_message_id), _schema(MESSAGE_ID_PATTERN)]
DeviceId = Annotated[str, AfterValidator(validate_device_id), _schema(DEVICE_ID_PATTERN)]
Filename = Annotated[str, AfterValidator(validate_filename), _schema(FILENAME_PATTERN)]


def parse_topic(topic: str) -> tuple[str, SourceType]:
    """Split ``aegis/{factory_id}/{source_type}``; anything else is a :class:`ContractError`."""
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != TOPIC_ROOT:
        raise ContractError(
            "invalid_topic", f"topic {_describe(topic)} is not aegis/{{factory_id}}/{{source_type}}"
        )
    return validate_factory_id(parts[1]), validate_source_type(parts[2])


def topic_for(factory_id: str, source_type: SourceType | str) -> str:
    return (
        f"{TOPIC_ROOT}/{validate_factory_id(factory_id)}/{validate_source_type(source_type).value}"
    )


def derive_message_id(topic: str, payload: bytes) -> str:
    """A deterministic id for a message without a valid one: a QoS 1 redelivery maps to the same id.

    64 hex characters of SHA-256 over topic and payload, so it always satisfies the message_id rule.
    """
    digest = hashlib.sha256()
    digest.update(topic.encode())
    digest.update(b"\x00")
    digest.update(payload)
    return digest.hexdigest()


def message_id_or_derived(candidate: object, topic: str, payload: bytes) -> tuple[str, bool]:
    """The device's message_id when valid, else the derived one; the flag says which."""
    try:
        return validate_message_id(candidate), False
    except ContractError:
        return derive_message_id(topic, payload), True
