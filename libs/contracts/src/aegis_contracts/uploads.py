"""A gateway's image uploads: the request it publishes, the answer it reads, and their topics.

A gateway has no AWS credentials. It publishes an :class:`UploadRequest` on
``aegis/{factory_id}/upload_request``; ingest answers on
``aegis/{factory_id}/upload_url/{request_id}``, a topic the broker's ACL lets only that factory's
identity read, with an :class:`UploadGranted` (a presigned S3 POST for exactly one key under the
factory's ``image_snapshot/`` prefix, one content type and one size) or an :class:`UploadRefused`
whose ``reason`` is also the dead-letter reason. The gateway then POSTs the image and publishes its
``image_snapshot`` message as usual.

Requests are control messages, not telemetry: they are answered, never archived under raw/.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import (
    MESSAGE_ID_PATTERN,
    TOPIC_ROOT,
    Filename,
    MessageId,
    validate_factory_id,
    validate_message_id,
)
from aegis_contracts.keys import factory as key_factory
from aegis_contracts.keys import image_snapshot_key
from aegis_contracts.payloads import UtcDatetime, decode_json_object, summarize
from aegis_contracts.times import Timestamp

UPLOAD_REQUEST = "upload_request"
UPLOAD_URL = "upload_url"
# a request is a few hundred bytes: anything far bigger is no request
MAX_UPLOAD_REQUEST_BYTES = 4096

# why a request is refused: the answer's ``reason`` and the dead letter's
MALFORMED_UPLOAD_REQUEST = "malformed_upload_request"
UPLOAD_TYPE_NOT_ALLOWED = "upload_type_not_allowed"
UPLOAD_TOO_LARGE = "upload_too_large"
REFUSAL_REASONS = (MALFORMED_UPLOAD_REQUEST, UPLOAD_TYPE_NOT_ALLOWED, UPLOAD_TOO_LARGE)

# the request id ends the reply topic: the message id's allow-list (no / + # or spaces)
RequestId = MessageId
REQUEST_ID_PATTERN = MESSAGE_ID_PATTERN


class _Message(BaseModel):
    # no length bound on what ingest writes (a policy carrying a session token runs to
    # kilobytes); a request bounds its strings itself
    model_config = ConfigDict(extra="forbid", frozen=True)


class UploadRequest(_Message):
    """What a gateway asks for: a place for one image of ``size_bytes`` bytes of
    ``content_type``, named ``filename``, taken at ``captured_at`` (which picks the hour
    partition of its key, as in the ``image_snapshot`` message that follows)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=4096)

    request_id: RequestId = Field(
        description="Names the reply topic aegis/{factory_id}/upload_url/{request_id}; "
        "unique per gateway (a retry of the same request may reuse it)."
    )
    filename: Filename
    captured_at: UtcDatetime
    content_type: str = Field(min_length=1, max_length=255)
    size_bytes: int = Field(strict=True, gt=0, description="The image's exact size in bytes.")

    def key(self, factory_id: str) -> str:
        """The one key this request may write: ``image_snapshot/factory_id={f}/.../{filename}``."""
        return image_snapshot_key(factory_id, self.captured_at, self.filename)


class UploadGranted(_Message):
    """A presigned S3 POST: send ``fields`` and then the image as the form field ``file``
    (multipart/form-data, the file last) to ``url`` before ``expires_at``."""

    request_id: RequestId
    status: Literal["granted"] = "granted"
    key: str = Field(description="The object key; the image_snapshot message's s3_key.")
    url: str = Field(description="Where to POST the form.")
    fields: dict[str, str] = Field(
        description="The form fields, each sent as is (key, Content-Type, policy, signature...)."
    )
    content_type: str
    size_bytes: int
    expires_at: Timestamp


class UploadRefused(_Message):
    """No upload: ``reason`` is one of :data:`REFUSAL_REASONS`, ``detail`` says what to fix."""

    request_id: RequestId
    status: Literal["refused"] = "refused"
    reason: str
    detail: str


UploadAnswer = Annotated[UploadGranted | UploadRefused, Field(discriminator="status")]


def upload_request_topic(factory_id: str) -> str:
    """``aegis/{factory_id}/upload_request``: where a gateway asks."""
    return f"{TOPIC_ROOT}/{validate_factory_id(factory_id)}/{UPLOAD_REQUEST}"


def upload_url_topic(factory_id: str, request_id: str) -> str:
    """``aegis/{factory_id}/upload_url/{request_id}``: where it reads the answer."""
    return (
        f"{TOPIC_ROOT}/{validate_factory_id(factory_id)}/{UPLOAD_URL}/"
        f"{validate_message_id(request_id)}"
    )


def upload_request_factory(topic: str) -> str | None:
    """The factory of an upload request's topic; None when ``topic`` is not one (the telemetry
    topics, and an upload request under an invalid or reserved factory id, which ingest refuses
    as an invalid topic)."""
    parts = topic.split("/")
    if len(parts) != 3 or parts[0] != TOPIC_ROOT or parts[2] != UPLOAD_REQUEST:
        return None
    try:
        return key_factory(parts[1])
    except ContractError:
        return None


def parse_upload_request(payload: bytes) -> UploadRequest:
    """A request from its bytes; a :class:`ContractError` coded ``malformed_upload_request``
    otherwise (too big, not strict JSON, not an object, a field missing, unknown or invalid)."""
    if len(payload) > MAX_UPLOAD_REQUEST_BYTES:
        raise ContractError(
            MALFORMED_UPLOAD_REQUEST,
            f"request is {len(payload)} bytes, the limit is {MAX_UPLOAD_REQUEST_BYTES}",
        )
    try:
        data = decode_json_object(payload)
        return UploadRequest.model_validate(data)
    except ContractError as err:
        raise ContractError(MALFORMED_UPLOAD_REQUEST, f"{err.code}: {err}") from None
    except ValidationError as err:
        raise ContractError(MALFORMED_UPLOAD_REQUEST, summarize(err)) from None


def request_id_of(payload: bytes) -> str | None:
    """The valid ``request_id`` of a request that is otherwise refused, so the refusal can be
    answered; None when there is none to answer to (never raises)."""
    if len(payload) > MAX_UPLOAD_REQUEST_BYTES or payload.lstrip()[:1] != b"{":
        return None
    try:
        value: Any = json.loads(payload)
        return validate_message_id(value.get("request_id"))
    except (ValueError, AttributeError, RecursionError):  # ContractError is a ValueError
        return None
