"""The emulator's POST Object rules (aegis_devstack.motopost), pure: the SigV4 signature of a
policy as botocore signs it, each kind of condition, extra fields, size ranges, the expiration
instant, and the clock a test may stop."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from botocore.auth import S3SigV4PostAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from aegis_devstack.motopost import (
    EmulatorClock,
    PostForm,
    PostRefused,
    check_form,
    check_policy,
    check_signature,
)

BUCKET = "aegis-bucket-data"
KEY = "image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=03/a.jpg"
EXPIRES = datetime(2026, 11, 30, 3, 20, tzinfo=UTC)


def botocore_form(secret: str = "s3cr3t", conditions: list[Any] | None = None) -> dict[str, str]:
    """A form signed by botocore's own POST signer (what the AWS SDK sends)."""
    request = AWSRequest(method="POST", url=f"https://{BUCKET}.s3.amazonaws.com/")
    request.context["s3-presign-post-fields"] = {"key": KEY, "Content-Type": "image/jpeg"}
    request.context["s3-presign-post-policy"] = {
        "expiration": "2026-11-30T03:20:00Z",
        "conditions": conditions
        if conditions is not None
        else [
            {"bucket": BUCKET},
            {"key": KEY},
            {"Content-Type": "image/jpeg"},
            ["content-length-range", 5, 5],
        ],
    }
    S3SigV4PostAuth(Credentials("AKIDEXAMPLE", secret), "s3", "ap-south-1").add_auth(request)
    return dict(request.context["s3-presign-post-fields"])


def form(fields: dict[str, str], size: int | None = 5) -> PostForm:
    return PostForm.read(fields, size, "a.jpg")


def refused(call: Any, *args: Any, **kwargs: Any) -> PostRefused:
    with pytest.raises(PostRefused) as caught:
        call(*args, **kwargs)
    return caught.value


def decide(fields: dict[str, str], size: int | None = 5, now: datetime = EXPIRES) -> None:
    posted = form(fields, size)
    check_policy(check_form(posted), posted, bucket=BUCKET, now=now)


def test_a_form_botocore_signed_passes_with_its_secret_and_fails_with_another():
    signed = form(botocore_form())
    check_form(signed)
    check_signature(signed, "s3cr3t")
    assert refused(check_signature, signed, "other").code == "SignatureDoesNotMatch"


def test_a_policy_changed_after_signing_fails_the_signature():
    fields = botocore_form()
    policy = json.loads(base64.b64decode(fields["policy"]))
    policy["conditions"][1] = ["starts-with", "$key", "image_snapshot/"]
    fields["policy"] = base64.b64encode(json.dumps(policy).encode()).decode()
    assert refused(check_signature, form(fields), "s3cr3t").code == "SignatureDoesNotMatch"


def test_the_policy_holds_at_its_expiration_and_not_a_moment_later():
    fields = botocore_form()
    decide(fields, now=EXPIRES)
    expired = refused(decide, fields, now=EXPIRES + timedelta(microseconds=1))
    assert (expired.status, expired.code) == (403, "AccessDenied")
    assert "Policy expired" in expired.message


@pytest.mark.parametrize(
    ("change", "status", "code", "says"),
    [
        ({"key": KEY.replace("factory-a", "factory-b")}, 403, "AccessDenied", '"key"'),
        ({"Content-Type": "text/html"}, 403, "AccessDenied", "Content-Type"),
        ({"x-amz-meta-owner": "me"}, 403, "AccessDenied", "Extra input fields: x-amz-meta-owner"),
        ({"success_action_status": "201"}, 403, "AccessDenied", "Extra input fields"),
    ],
)
def test_a_field_the_policy_does_not_allow_is_refused(change, status, code, says):
    answer = refused(decide, {**botocore_form(), **change})
    assert (answer.status, answer.code) == (status, code)
    assert says in answer.message


def test_fields_named_x_ignore_need_no_condition_and_names_match_without_case():
    fields = botocore_form()
    fields["x-ignore-tag"] = "anything"
    fields["content-type"] = fields.pop("Content-Type")
    decide(fields)


@pytest.mark.parametrize(("size", "code"), [(6, "EntityTooLarge"), (4, "EntityTooSmall")])
def test_the_file_size_must_fall_in_the_content_length_range(size: int, code: str):
    answer = refused(decide, botocore_form(), size)
    assert (answer.status, answer.code) == (400, code)


def test_starts_with_matches_a_prefix_and_an_empty_one_anything():
    conditions = [
        {"bucket": BUCKET},
        ["starts-with", "$key", "image_snapshot/factory_id=factory-a/"],
        ["starts-with", "$Content-Type", ""],
    ]
    decide(botocore_form(conditions=conditions))
    fields = {**botocore_form(conditions=conditions), "key": "raw/factory-a/x.json"}
    assert "Policy Condition failed" in refused(decide, fields).message


def test_a_condition_on_a_field_the_form_lacks_fails():
    conditions = [{"bucket": BUCKET}, {"key": KEY}, {"success_action_status": "201"}]
    fields = {k: v for k, v in botocore_form(conditions=conditions).items() if k != "Content-Type"}
    assert "success_action_status" in refused(decide, fields).message


def test_the_bucket_condition_is_the_bucket_posted_to():
    posted = form(botocore_form())
    policy = check_form(posted)
    other = refused(check_policy, policy, posted, bucket="another-bucket", now=EXPIRES)
    assert '"bucket"' in other.message


@pytest.mark.parametrize(
    "condition",
    [["in", "$key", ["a"]], ["eq", "key", KEY], {"a": 1, "b": 2}, ["content-length-range", "1", 5]],
)
def test_a_condition_aws_does_not_define_makes_the_policy_invalid(condition: Any):
    answer = refused(decide, botocore_form(conditions=[{"bucket": BUCKET}, condition]))
    assert (answer.status, answer.code) == (400, "InvalidPolicyDocument")


@pytest.mark.parametrize(
    ("drop", "says"),
    [
        ("x-amz-signature", "x-amz-signature"),
        ("x-amz-credential", "x-amz-credential"),
        ("key", "'key'"),
    ],
)
def test_a_signed_form_without_a_required_field_is_a_bad_request(drop: str, says: str):
    fields = {k: v for k, v in botocore_form().items() if k != drop}
    answer = refused(check_form, form(fields))
    assert (answer.status, answer.code) == (400, "InvalidArgument") and says in answer.message


def test_a_form_without_a_file_is_a_bad_request():
    assert "one file" in refused(check_form, form(botocore_form(), None)).message


@pytest.mark.parametrize("policy", ["not base64!", base64.b64encode(b"[1]").decode()])
def test_an_unreadable_policy_is_an_invalid_policy_document(policy: str):
    answer = refused(check_form, form({**botocore_form(), "policy": policy}))
    assert answer.code == "InvalidPolicyDocument"


def test_filename_in_the_key_is_the_uploaded_files_base_name():
    posted = PostForm.read({"key": "uploads/${filename}"}, 1, "C:\\photos\\cam.jpg")
    assert posted.fields["key"] == "uploads/cam.jpg"


def test_the_emulator_clock_follows_the_system_until_stopped_and_after_release():
    clock = EmulatorClock()
    status, answer = clock.answer("POST", json.dumps({"now": EXPIRES.isoformat()}).encode())
    assert status == "200 OK" and answer["fixed"] is True
    assert clock.now() == EXPIRES
    clock.answer("POST", b'{"now": null}')
    assert clock.answer("GET", b"")[1]["fixed"] is False
    assert clock.answer("POST", b'{"now": "tomorrow"}')[0] == "400 Bad Request"
    assert clock.answer("POST", b'{"now": "2026-11-30T03:20:00"}')[0] == "400 Bad Request"
