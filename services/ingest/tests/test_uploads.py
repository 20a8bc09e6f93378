"""plan_upload(): the pure decision on a gateway's upload request: the key under the topic's
factory, the reply topic, and each refusal with its reason, dead letter and answer."""

from __future__ import annotations

import json

import pytest

from aegis_contracts.payloads import IMAGE_CONTENT_TYPES
from aegis_contracts.uploads import (
    MALFORMED_UPLOAD_REQUEST,
    UPLOAD_TOO_LARGE,
    UPLOAD_TYPE_NOT_ALLOWED,
)
from aegis_ingest.domain import UploadPlan, UploadRefusal, gateway_url, plan_upload

MAX = 5 * 1024 * 1024
REQUEST = {
    "request_id": "cam-01-000042",
    "filename": "cam-01-20261130T031500000Z.jpg",
    "captured_at": "2026-11-30T03:15:00.000Z",
    "content_type": "image/jpeg",
    "size_bytes": 48213,
}


def plan(factory: str = "factory-a", *, types=IMAGE_CONTENT_TYPES, **changes: object):
    payload = json.dumps({**REQUEST, **changes}).encode()
    return plan_upload(factory, payload, content_types=types, max_bytes=MAX)


def test_a_valid_request_gets_its_key_under_the_topics_factory_and_its_reply_topic():
    decision = plan("factory-b")
    assert isinstance(decision, UploadPlan)
    assert decision.key == (
        "image_snapshot/factory_id=factory-b/yyyy=2026/mm=11/dd=30/hh=03/"
        "cam-01-20261130T031500000Z.jpg"
    )
    assert decision.reply_topic == "aegis/factory-b/upload_url/cam-01-000042"
    assert decision.request_id == "cam-01-000042"


def test_the_largest_allowed_size_is_granted_one_byte_more_is_not():
    assert isinstance(plan(size_bytes=MAX), UploadPlan)
    refused = plan(size_bytes=MAX + 1)
    assert isinstance(refused, UploadRefusal)
    assert refused.reject.reason == UPLOAD_TOO_LARGE
    assert str(MAX) in refused.reject.detail


@pytest.mark.parametrize(
    "content_type", ["image/gif", "text/html", "image/jpeg; x=1", "IMAGE/JPEG"]
)
def test_a_content_type_outside_the_settings_is_refused(content_type: str):
    refused = plan(content_type=content_type)
    assert isinstance(refused, UploadRefusal)
    assert refused.reject.reason == UPLOAD_TYPE_NOT_ALLOWED


def test_the_allowed_types_are_the_settings_not_the_contracts():
    assert isinstance(plan(types=["image/png"]), UploadRefusal)
    assert isinstance(plan(types=["image/png"], content_type="image/png"), UploadPlan)


def test_a_refusal_is_answered_on_the_reply_topic_and_dead_lettered_with_the_same_reason():
    refused = plan(content_type="image/gif")
    assert isinstance(refused, UploadRefusal)
    assert refused.reply_topic == "aegis/factory-a/upload_url/cam-01-000042"
    assert refused.answer is not None
    assert (refused.answer.reason, refused.answer.status) == (UPLOAD_TYPE_NOT_ALLOWED, "refused")
    assert refused.answer.detail == refused.reject.detail
    assert refused.reject.factory_id == "factory-a"
    assert json.loads(refused.reject.payload)["content_type"] == "image/gif"


def test_a_malformed_request_with_a_valid_id_is_answered_one_without_is_only_dead_lettered():
    answered = plan(size_bytes="big")
    assert isinstance(answered, UploadRefusal)
    assert answered.reject.reason == MALFORMED_UPLOAD_REQUEST
    assert answered.request_id == "cam-01-000042" and answered.reply_topic is not None
    unanswerable = plan_upload("factory-a", b"not json", content_types=["image/png"], max_bytes=MAX)
    assert isinstance(unanswerable, UploadRefusal)
    assert unanswerable.reject.reason == MALFORMED_UPLOAD_REQUEST
    assert (unanswerable.reply_topic, unanswerable.answer, unanswerable.request_id) == (
        None,
        None,
        None,
    )
    assert unanswerable.reject.payload == b"not json"


@pytest.mark.parametrize(
    ("url", "endpoint", "expected"),
    [
        (
            "http://localstack:4566/aegis-bucket-data",
            None,
            "http://localstack:4566/aegis-bucket-data",
        ),
        (
            "http://localstack:4566/aegis-bucket-data",
            "http://127.0.0.1:4566",
            "http://127.0.0.1:4566/aegis-bucket-data",
        ),
        (
            "https://aegis-bucket-data.s3.ap-south-1.amazonaws.com/",
            "https://s3-gw.example:8443/",
            "https://s3-gw.example:8443/",
        ),
    ],
)
def test_the_url_a_gateway_gets_takes_the_public_endpoints_scheme_and_host(url, endpoint, expected):
    assert gateway_url(url, endpoint) == expected
