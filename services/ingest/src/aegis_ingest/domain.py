"""What ingest does with one MQTT message, decided without I/O. The archive decisions live in
:mod:`aegis_contracts.archive` so that ``aegis replay`` rebuilds the very same event; this module
names them for ingest, and decides a gateway's upload request (:func:`plan_upload`)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from aegis_contracts.archive import (
    DEFAULT_DEAD_LETTER_PREFIX_BYTES,
    DEFAULT_INLINE_MAX_BYTES,
    INVALID_TOPIC,
    MESSAGE_ID_CONFLICT,
    PAYLOAD_TOO_LARGE,
    QUEUE_FULL,
    Archive,
    Decision,
    Reject,
    admit,
    conflict,
    queue_full,
)
from aegis_contracts.errors import ContractError
from aegis_contracts.uploads import (
    MAX_UPLOAD_REQUEST_BYTES,
    UPLOAD_TOO_LARGE,
    UPLOAD_TYPE_NOT_ALLOWED,
    UploadRefused,
    UploadRequest,
    parse_upload_request,
    request_id_of,
    upload_url_topic,
)

__all__ = [
    "DEFAULT_DEAD_LETTER_PREFIX_BYTES",
    "DEFAULT_INLINE_MAX_BYTES",
    "INVALID_TOPIC",
    "MESSAGE_ID_CONFLICT",
    "PAYLOAD_TOO_LARGE",
    "QUEUE_FULL",
    "Archive",
    "Decision",
    "Reject",
    "UploadPlan",
    "UploadRefusal",
    "admit",
    "conflict",
    "gateway_url",
    "plan_upload",
    "queue_full",
]


@dataclass(frozen=True, slots=True)
class UploadPlan:
    """Presign a POST for ``key`` and answer on ``reply_topic``."""

    factory_id: str
    request: UploadRequest
    key: str
    reply_topic: str

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True, slots=True)
class UploadRefusal:
    """Refuse: answer ``answer`` on ``reply_topic`` (none when the request has no valid
    request_id to answer to), and dead-letter ``reject``."""

    reject: Reject
    reply_topic: str | None
    answer: UploadRefused | None

    @property
    def request_id(self) -> str | None:
        return None if self.answer is None else self.answer.request_id


def plan_upload(
    factory_id: str,
    payload: bytes,
    *,
    content_types: Collection[str],
    max_bytes: int,
) -> UploadPlan | UploadRefusal:
    """Decide the upload request ``payload`` that arrived on ``factory_id``'s request topic
    (the topic is authoritative: the key is always under that factory's prefix)."""
    try:
        request = parse_upload_request(payload)
    except ContractError as err:
        return _refusal(factory_id, payload, err.code, str(err), request_id_of(payload))
    if request.content_type not in content_types:
        allowed = ", ".join(content_types)
        detail = f"content_type {request.content_type!r:.80} is not one of {allowed}"
        return _refusal(factory_id, payload, UPLOAD_TYPE_NOT_ALLOWED, detail, request.request_id)
    if request.size_bytes > max_bytes:
        detail = f"size_bytes {request.size_bytes} is over the limit of {max_bytes} bytes"
        return _refusal(factory_id, payload, UPLOAD_TOO_LARGE, detail, request.request_id)
    return UploadPlan(
        factory_id=factory_id,
        request=request,
        key=request.key(factory_id),
        reply_topic=upload_url_topic(factory_id, request.request_id),
    )


def _refusal(
    factory_id: str, payload: bytes, reason: str, detail: str, request_id: str | None
) -> UploadRefusal:
    reject = Reject(
        reason,
        detail,
        payload[:MAX_UPLOAD_REQUEST_BYTES],  # an oversize request keeps its head, like a payload
        factory_id=factory_id,
    )
    if request_id is None:
        return UploadRefusal(reject, None, None)
    answer = UploadRefused(request_id=request_id, reason=reason, detail=detail[:500])
    return UploadRefusal(reject, upload_url_topic(factory_id, request_id), answer)


def gateway_url(url: str, endpoint: str | None) -> str:
    """The upload ``url`` as gateways reach it: with ``endpoint``'s scheme and host when one is
    set (an emulator only the services resolve by name), its path kept."""
    if not endpoint:
        return url
    public, presigned = urlsplit(endpoint), urlsplit(url)
    return urlunsplit((public.scheme, public.netloc, presigned.path, presigned.query, ""))
