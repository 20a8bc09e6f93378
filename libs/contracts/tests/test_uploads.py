"""The upload request contract: topics, strict parsing with one refusal code, the key a request
may write, the request id a refusal can still be answered to, and the answers' JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from aegis_contracts.errors import ContractError
from aegis_contracts.uploads import (
    MALFORMED_UPLOAD_REQUEST,
    MAX_UPLOAD_REQUEST_BYTES,
    UploadAnswer,
    UploadGranted,
    UploadRefused,
    parse_upload_request,
    request_id_of,
    upload_request_factory,
    upload_request_topic,
    upload_url_topic,
)

REQUEST = {
    "request_id": "cam-01-000042",
    "filename": "cam-01-20261130T031500000Z.jpg",
    "captured_at": "2026-11-30T03:15:00.000Z",
    "content_type": "image/jpeg",
    "size_bytes": 48213,
}


def encoded(**changes: object) -> bytes:
    return json.dumps({**REQUEST, **changes}).encode()


def test_topics_of_a_factory():
    assert upload_request_topic("factory-a") == "aegis/factory-a/upload_request"
    assert upload_url_topic("factory-a", "cam-01-000042") == (
        "aegis/factory-a/upload_url/cam-01-000042"
    )


@pytest.mark.parametrize(
    ("topic", "factory"),
    [
        ("aegis/factory-a/upload_request", "factory-a"),
        ("aegis/factory-a/factory_state", None),  # telemetry
        ("aegis/factory-a/upload_url/cam-01-000042", None),  # an answer, not a request
        ("aegis/Factory-A/upload_request", None),  # not a factory id
        ("aegis/cloud-infra/upload_request", None),  # reserved
        ("other/factory-a/upload_request", None),
    ],
)
def test_upload_request_factory(topic: str, factory: str | None):
    assert upload_request_factory(topic) == factory


@pytest.mark.parametrize("request_id", ["short", "has/slash", "has+plus", "has#hash", "x" * 65])
def test_a_request_id_that_could_not_end_a_topic_is_refused(request_id: str):
    with pytest.raises(ContractError):
        upload_url_topic("factory-a", request_id)
    with pytest.raises(ContractError) as refused:
        parse_upload_request(encoded(request_id=request_id))
    assert refused.value.code == MALFORMED_UPLOAD_REQUEST


def test_a_request_names_the_one_key_it_may_write():
    request = parse_upload_request(encoded())
    assert request.key("factory-a") == (
        "image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=03/"
        "cam-01-20261130T031500000Z.jpg"
    )
    # captured_at with an offset files under its UTC hour
    later = parse_upload_request(encoded(captured_at="2026-11-30T12:15:00+09:00"))
    assert "/hh=03/" in later.key("factory-a")


@pytest.mark.parametrize(
    ("payload", "mentions"),
    [
        (b"not json", "malformed_json"),
        (b"[1, 2]", "not_an_object"),
        (b'{"request_id": "cam-01-000042", "request_id": "x"}', "duplicate"),
        (encoded(size_bytes=True), "size_bytes"),  # a boolean is no size
        (encoded(size_bytes=1.5), "size_bytes"),
        (encoded(size_bytes=0), "size_bytes"),
        (encoded(filename="../etc/passwd"), "filename"),
        (encoded(captured_at="2026-11-30T03:15:00"), "captured_at"),  # no zone
        (encoded(extra="field"), "extra"),
        (
            json.dumps({k: v for k, v in REQUEST.items() if k != "content_type"}).encode(),
            "content_type",
        ),
        (b"{" + b" " * MAX_UPLOAD_REQUEST_BYTES + b"}", "limit"),
    ],
)
def test_every_malformed_request_is_refused_with_one_code_and_a_detail(
    payload: bytes, mentions: str
):
    with pytest.raises(ContractError) as refused:
        parse_upload_request(payload)
    assert refused.value.code == MALFORMED_UPLOAD_REQUEST
    assert mentions in str(refused.value)


def test_the_request_id_of_a_refused_request_is_read_when_valid():
    assert request_id_of(encoded(size_bytes="big")) == "cam-01-000042"
    assert request_id_of(encoded(request_id="bad id")) is None
    assert request_id_of(b"[]") is None
    assert request_id_of(b"not json") is None


@given(st.binary(max_size=200))
def test_request_id_of_never_raises(payload: bytes):
    found = request_id_of(payload)
    assert found is None or upload_url_topic("factory-a", found)


def test_answers_serialize_with_their_status_and_fixed_width_time():
    answers = TypeAdapter(UploadAnswer)
    granted = UploadGranted(
        request_id="cam-01-000042",
        key="image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=03/a.jpg",
        url="https://aegis-bucket-data.s3.ap-south-1.amazonaws.com/",
        fields={"key": "image_snapshot/...", "policy": "e30="},
        content_type="image/jpeg",
        size_bytes=48213,
        expires_at=datetime(2026, 11, 30, 3, 20, tzinfo=UTC),
    )
    data = json.loads(granted.model_dump_json())
    assert data["status"] == "granted" and data["expires_at"] == "2026-11-30T03:20:00.000Z"
    assert answers.validate_json(granted.model_dump_json()) == granted
    refused = UploadRefused(request_id="cam-01-000042", reason="upload_too_large", detail="big")
    assert json.loads(refused.model_dump_json())["status"] == "refused"
    assert answers.validate_json(refused.model_dump_json()) == refused
