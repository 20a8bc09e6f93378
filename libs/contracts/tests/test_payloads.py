"""Device payload parsing: every refusal has a code (the dead-letter reason) and a clear message."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import (
    MAX_PAYLOAD_BYTES,
    derive_message_id,
    message_id_or_derived,
    parse_topic,
    topic_for,
)
from aegis_contracts.payloads import (
    FactoryStateMessage,
    ImageSnapshotMessage,
    InfraStateMessage,
    parse_device_message,
)


def envelope(**extra: object) -> dict[str, object]:
    return {
        "message_id": "m-00000001",
        "factory_id": "factory-a",
        "device_id": "edge-01",
        "emitted_at": "2026-11-30T10:00:00.250Z",
        "schema_version": "1.0",
        **extra,
    }


def encode(data: object) -> bytes:
    return json.dumps(data).encode()


def test_factory_state_parses():
    payload = encode(
        envelope(
            sensors={"temperature_c": 24.5, "co_ppm": 3, "custom_probe": -1.5},
            ai={
                "model_version": "yolo-v8.2",
                "detections": [
                    {
                        "label": "fire",
                        "confidence": 0.91,
                        "camera_id": "cam-1",
                        "bbox": [1, 2, 3, 4],
                    }
                ],
            },
        )
    )
    msg = parse_device_message("factory_state", payload, topic_factory_id="factory-a")
    assert isinstance(msg, FactoryStateMessage)
    assert msg.sensors["custom_probe"] == -1.5  # unknown sensors are kept
    assert msg.emitted_at == datetime(2026, 11, 30, 10, 0, 0, 250_000, tzinfo=UTC)
    assert msg.ai is not None
    assert msg.ai.detections[0].label == "fire"


def test_infra_state_parses():
    payload = encode(
        envelope(
            host={
                "cpu_pct": 35.5,
                "mem_pct": 61,
                "disk_pct": 40,
                "temperature_c": 55,
                "uptime_s": 9,
            },
            network={"rtt_ms": 12.5, "loss_pct": 0},
            cameras={"cam-1": "online", "cam-2": "offline"},
            pipeline={"inference": "ok", "uploader": "degraded"},
        )
    )
    msg = parse_device_message("infra_state", payload, topic_factory_id="factory-a")
    assert isinstance(msg, InfraStateMessage)
    assert msg.cameras["cam-2"] == "offline"


def test_image_snapshot_must_name_its_contract_key():
    good = envelope(
        camera_id="cam-1",
        filename="cam-1_100000.jpg",
        content_type="image/jpeg",
        size_bytes=20_480,
        captured_at="2026-11-30T10:00:00Z",
        s3_key="image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=10/cam-1_100000.jpg",
    )
    msg = parse_device_message("image_snapshot", encode(good), topic_factory_id="factory-a")
    assert isinstance(msg, ImageSnapshotMessage)
    bad = {**good, "s3_key": "raw/factory-a/../../secrets.jpg"}
    with pytest.raises(ContractError) as info:
        parse_device_message("image_snapshot", encode(bad), topic_factory_id="factory-a")
    assert info.value.code == "schema_violation"
    assert "s3_key" in str(info.value)


@pytest.mark.parametrize(
    ("payload", "code", "says"),
    [
        (b"{not json", "malformed_json", "not JSON"),
        (b"\xff\xfe{}", "malformed_json", "UTF-8"),
        (b'{"a": NaN}', "malformed_json", "NaN"),
        (b'{"a": Infinity}', "malformed_json", "Infinity"),
        (b'{"a": 1, "a": 2}', "malformed_json", "duplicate"),
        (b"[1, 2]", "not_an_object", "list"),
        (b'"text"', "not_an_object", "str"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed_json", "deep"),
        (b" " * (MAX_PAYLOAD_BYTES + 1), "payload_too_large", "limit"),
        (encode(envelope(sensors={"co_ppm": "high"})), "schema_violation", "sensors.co_ppm"),
        (encode(envelope(sensors={"co_ppm": True})), "schema_violation", "boolean"),
        (encode(envelope(sensors={"Bad Name": 1})), "schema_violation", "sensors"),
        (encode(envelope(emitted_at="2026-11-30T10:00:00")), "schema_violation", "emitted_at"),
        (
            encode({k: v for k, v in envelope().items() if k != "device_id"}),
            "schema_violation",
            "device_id",
        ),
        (encode(envelope(unexpected=1)), "schema_violation", "unexpected"),
        (encode(envelope(factory_id="factory-b")), "factory_mismatch", "factory-b"),
        (encode(envelope(factory_id="../x")), "schema_violation", "factory_id"),
    ],
)
def test_bad_payloads_are_refused_with_a_reason(payload, code, says):
    with pytest.raises(ContractError) as info:
        parse_device_message("factory_state", payload, topic_factory_id="factory-a")
    assert info.value.code == code
    assert says in str(info.value)


def test_infra_percentages_are_bounded():
    with pytest.raises(ContractError):
        parse_device_message(
            "infra_state", encode(envelope(host={"cpu_pct": 140})), topic_factory_id="factory-a"
        )


@pytest.mark.parametrize(
    "topic",
    [
        "aegis/factory-a",
        "aegis/factory-a/factory_state/extra",
        "aegis/../factory_state",
        "aegis/+/factory_state",
        "aegis/#",
        "aegis/factory-a/weather",
        "other/factory-a/factory_state",
        "aegis/fаctory-a/factory_state",
        "",
    ],
)
def test_hostile_topics_are_refused(topic):
    with pytest.raises(ContractError):
        parse_topic(topic)


def test_topic_round_trip():
    assert parse_topic(topic_for("factory-a", "infra_state")) == ("factory-a", "infra_state")


def test_derived_message_id_is_deterministic_and_valid():
    topic, payload = "aegis/factory-a/factory_state", b'{"x": 1}'
    first, derived = message_id_or_derived(None, topic, payload)
    assert derived
    assert first == derive_message_id(topic, payload)
    assert message_id_or_derived("bad/id", topic, payload) == (first, True)
    assert derive_message_id(topic, payload + b" ") != first
    assert message_id_or_derived("device-id-0001", topic, payload) == ("device-id-0001", False)
