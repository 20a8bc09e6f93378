"""admit(): the pure decision of ingest for one MQTT message (topic, payload and time checks)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from aegis_contracts.ids import MAX_PAYLOAD_BYTES, SourceType, derive_message_id
from aegis_ingest.domain import (
    INVALID_TOPIC,
    MESSAGE_ID_CONFLICT,
    PAYLOAD_TOO_LARGE,
    Archive,
    Reject,
    admit,
    conflict,
)

AT = datetime(2026, 11, 30, 23, 59, 59, 999_999, tzinfo=UTC)
BUCKET = "aegis-bucket-data"


def _admit(topic: str, payload: bytes, **kw: int) -> Archive | Reject:
    return admit(topic, payload, AT, 1, bucket=BUCKET, **kw)


def _payload(**fields: object) -> bytes:
    return json.dumps({"factory_id": "factory-a", **fields}).encode()


def test_valid_message_is_archived_under_its_own_id_at_the_contract_key() -> None:
    payload = _payload(message_id="msg-0001-abcd", sensors={"co_ppm": 3})
    decision = _admit("aegis/factory-a/factory_state", payload)
    assert isinstance(decision, Archive)
    assert decision.key == "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-0001-abcd.json"
    assert (decision.message_id, decision.message_id_derived) == ("msg-0001-abcd", False)
    assert decision.factory_id == "factory-a"
    assert decision.source_type is SourceType.FACTORY_STATE
    assert decision.metadata == {
        "topic": "aegis/factory-a/factory_state",
        "received_at": "2026-11-30T23:59:59.999Z",
        "qos": "1",
    }
    event = decision.event
    assert event.key == decision.key and event.bucket == BUCKET
    assert event.message_id == "msg-0001-abcd" and not event.message_id_derived
    assert event.size_bytes == len(payload) and event.qos == 1
    assert event.payload_text == payload.decode()
    assert event.received_at == AT


@pytest.mark.parametrize(
    "payload",
    [
        _payload(),  # no message_id
        _payload(message_id="short"),  # too short
        _payload(message_id="has/slash-0001"),
        _payload(message_id="raw_metadata.json"),  # a reserved name cannot become an id
        _payload(message_id=12345678),
        b'[{"message_id": "msg-0001-abcd"}]',  # not an object
        b'{"body": {"message_id": "msg-0001-abcd"}}',  # only a nested one
    ],
)
def test_missing_or_invalid_message_id_is_derived_deterministically(payload: bytes) -> None:
    topic = "aegis/factory-a/infra_state"
    first, again = _admit(topic, payload), _admit(topic, payload)
    assert isinstance(first, Archive) and isinstance(again, Archive)
    assert first.message_id_derived and first.event.message_id_derived
    assert first.message_id == again.message_id == derive_message_id(topic, payload)
    assert first.key.endswith(f"/{first.message_id}.json")


def test_derived_id_depends_on_topic_and_bytes() -> None:
    a = _admit("aegis/factory-a/factory_state", b"{}")
    b = _admit("aegis/factory-b/factory_state", b"{}")
    c = _admit("aegis/factory-a/factory_state", b"{ }")
    assert isinstance(a, Archive) and isinstance(b, Archive) and isinstance(c, Archive)
    assert len({a.message_id, b.message_id, c.message_id}) == 3


@pytest.mark.parametrize(
    "payload",
    [b"not json at all", b'{"message_id": "msg-0001-abcd", broken', b"\xff\xfe\x00binary", b""],
)
def test_non_json_payload_on_a_valid_topic_is_still_archived(payload: bytes) -> None:
    decision = _admit("aegis/factory-a/factory_state", payload)
    assert isinstance(decision, Archive)
    assert decision.message_id_derived
    assert decision.event.size_bytes == len(payload)


def test_binary_or_large_payload_is_not_inlined() -> None:
    binary = _admit("aegis/factory-a/image_snapshot", b"\xff\xd8\xff\xe0")
    assert isinstance(binary, Archive) and binary.event.payload_text is None
    big = _payload(message_id="msg-0001-abcd", pad="x" * 2000)
    small_limit = _admit("aegis/factory-a/factory_state", big, inline_max_bytes=1000)
    assert isinstance(small_limit, Archive) and small_limit.event.payload_text is None


@pytest.mark.parametrize(
    "topic",
    [
        "aegis/../factory_state",
        "aegis/Factory-A/factory_state",  # upper case
        "aegis/f\u0430ctory-a/factory_state",  # Cyrillic a
        "aegis/factory-a/factory_statе",  # Cyrillic e in the source type
        "aegis/factory-a/camera_state",  # unknown source type
        "aegis/factory-a/",
        "aegis//factory_state",
        "aegis/-leading/factory_state",
        "aegis/factory-a/factory_state/extra",
        "other/factory-a/factory_state",
        "aegis/cloud-infra/infra_state",  # reserved target name
        "aegis/" + "a" * 64 + "/factory_state",  # too long
        "aegis/+/factory_state",
        "aegis/factory.a/factory_state",
    ],
)
def test_hostile_topics_are_rejected_before_anything_is_built(topic: str) -> None:
    payload = _payload(message_id="msg-0001-abcd")
    decision = _admit(topic, payload)
    assert isinstance(decision, Reject)
    assert decision.reason == INVALID_TOPIC
    assert decision.payload == payload
    assert decision.factory_id is None


def test_oversize_payload_is_rejected_with_a_bounded_prefix_size_and_digest() -> None:
    payload = b"{" + b" " * MAX_PAYLOAD_BYTES + b"}"
    decision = _admit("aegis/factory-a/factory_state", payload, dead_letter_prefix_bytes=100)
    assert isinstance(decision, Reject)
    assert decision.reason == PAYLOAD_TOO_LARGE
    assert decision.payload == payload[:100]
    assert str(len(payload)) in decision.detail
    assert hashlib.sha256(payload).hexdigest() in decision.detail
    assert decision.message_id == derive_message_id("aegis/factory-a/factory_state", payload)


def test_payload_at_the_limit_is_archived() -> None:
    payload = b"x" * MAX_PAYLOAD_BYTES
    assert isinstance(_admit("aegis/factory-a/factory_state", payload), Archive)


def test_conflict_dead_letters_the_new_body_under_the_same_id() -> None:
    first = _admit("aegis/factory-a/factory_state", _payload(message_id="msg-0001-abcd"))
    assert isinstance(first, Archive)
    other = _payload(message_id="msg-0001-abcd", sensors={"co_ppm": 99})
    rejected = conflict(first, other, "exists with a different body")
    assert rejected.reason == MESSAGE_ID_CONFLICT
    assert rejected.payload == other
    assert rejected.message_id == "msg-0001-abcd" and rejected.factory_id == "factory-a"


def test_qos_and_partition_come_from_arrival() -> None:
    midnight = datetime(2026, 12, 1, 0, 0, 0, tzinfo=UTC)
    decision = admit("aegis/factory-a/factory_state", b"{}", midnight, 0, bucket=BUCKET)
    assert isinstance(decision, Archive)
    assert "/yyyy=2026/mm=12/dd=01/" in decision.key
    assert decision.metadata["qos"] == "0"
    assert decision.metadata["received_at"] == "2026-12-01T00:00:00.000Z"
