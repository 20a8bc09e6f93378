"""S3's POST Object (a browser-based upload: a multipart form with a signed POST policy) decided
as AWS documents it; moto 5 stores whatever a POST sends, reading neither policy nor signature.

Followed: the S3 API Reference's "Authenticating Requests in Browser-Based Uploads Using POST
(AWS Signature Version 4)", "Creating a POST policy" (Expiration, Condition Matching,
Conditions) and "POST Object", and the S3 User Guide's "Browser-based uploads using POST":

- a form with a ``policy`` field must carry ``x-amz-algorithm`` (``AWS4-HMAC-SHA256``),
  ``x-amz-credential``, ``x-amz-date`` and ``x-amz-signature``; the signature is the SigV4
  HMAC of the base64 policy with the key derived from the credential's secret, date, region and
  service (403 ``SignatureDoesNotMatch``; an access key nobody issued: 403
  ``InvalidAccessKeyId``);
- the policy is base64 JSON with an ``expiration`` (ISO 8601, UTC) and a ``conditions`` list
  (400 ``InvalidPolicyDocument`` otherwise); past its expiration the form is refused (403
  ``AccessDenied``, "Policy expired");
- conditions: ``{"field": "value"}`` and ``["eq", "$field", "value"]`` (exact), ``["starts-with",
  "$field", "prefix"]`` (an empty prefix: any value) and ``["content-length-range", min, max]``
  on the file's size (400 ``EntityTooSmall`` / ``EntityTooLarge``); ``bucket`` is the bucket
  posted to; a field the form lacks fails its condition; a failed one is 403 ``AccessDenied``,
  "Policy Condition failed", naming it;
- every form field except ``x-amz-signature``, ``file``, ``policy`` and names starting with
  ``x-ignore-`` must be named by a condition (403, "Extra input fields");
- field names are matched without regard to case, values exactly; ``${filename}`` in ``key``
  is the uploaded file's base name, and conditions see the expanded key.

Not modelled: the order of the form's fields (AWS ignores fields after ``file``; the form is
read whole here), DevPay's pair of security tokens, SigV2 forms (``AWSAccessKeyId``,
``signature``: refused for want of ``x-amz-algorithm``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from xml.sax.saxutils import escape

ALGORITHM = "AWS4-HMAC-SHA256"
# form fields no condition needs to name
_UNCONDITIONED = frozenset({"x-amz-signature", "file", "policy"})
_IGNORED_PREFIX = "x-ignore-"
_REQUIRED = ("x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-signature")


class PostRefused(Exception):
    """S3's answer to a refused POST: ``status``, its error ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message

    def xml(self) -> str:
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(self.code)}</Code><Message>{escape(self.message)}</Message>"
            "<RequestId>aegis-emulator</RequestId></Error>"
        )


def _denied(message: str) -> PostRefused:
    return PostRefused(403, "AccessDenied", f"Invalid according to Policy: {message}")


@dataclass(frozen=True, slots=True)
class Credential:
    """The parts of ``x-amz-credential``: ``{access key}/{yyyymmdd}/{region}/{service}/aws4_request``."""

    access_key: str
    date: str
    region: str
    service: str


@dataclass(frozen=True, slots=True)
class PostForm:
    """A POST's form fields (names lower-cased; ``key`` expanded) and its file's size (None: the
    form has no file)."""

    fields: Mapping[str, str]
    file_size: int | None

    @classmethod
    def read(cls, fields: Mapping[str, str], file_size: int | None, filename: str = "") -> PostForm:
        lowered = {name.lower(): value for name, value in fields.items()}
        if "key" in lowered:
            base = filename.replace("\\", "/").rsplit("/", 1)[-1]
            lowered["key"] = lowered["key"].replace("${filename}", base)
        return cls(lowered, file_size)

    @property
    def signed(self) -> bool:
        """A form with a policy; one without is an anonymous request."""
        return "policy" in self.fields

    def credential(self) -> Credential:
        """The signer, once :func:`check_form` has passed."""
        access_key, date, region, service, _ = self.fields["x-amz-credential"].split("/")
        return Credential(access_key, date, region, service)


def check_form(form: PostForm) -> dict[str, Any]:
    """The fields a signed form must carry, and its policy (decoded); 400 otherwise."""
    if form.file_size is None:
        raise PostRefused(
            400, "InvalidArgument", "POST requires exactly one file upload per request."
        )
    if "key" not in form.fields:
        raise PostRefused(400, "InvalidArgument", "Bucket POST must contain a field named 'key'.")
    for name in _REQUIRED:
        if not form.fields.get(name):
            raise PostRefused(
                400, "InvalidArgument", f"Bucket POST must contain a field named '{name}'."
            )
    if form.fields["x-amz-algorithm"] != ALGORITHM:
        raise PostRefused(
            400,
            "InvalidArgument",
            f"Only {ALGORITHM} is supported as x-amz-algorithm (SigV2 forms are not).",
        )
    parts = form.fields["x-amz-credential"].split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not all(parts):
        raise PostRefused(
            400, "InvalidArgument", "x-amz-credential is not KEY/DATE/REGION/SERVICE/aws4_request"
        )
    return read_policy(form.fields["policy"])


def read_policy(encoded: str) -> dict[str, Any]:
    """A POST policy from its base64 form field; 400 ``InvalidPolicyDocument`` when it is none."""
    try:
        policy = json.loads(base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        raise PostRefused(400, "InvalidPolicyDocument", "Invalid Policy: Invalid JSON.") from None
    if not isinstance(policy, dict):
        raise PostRefused(400, "InvalidPolicyDocument", "Invalid Policy: Invalid JSON.")
    if "expiration" not in policy:
        raise PostRefused(
            400, "InvalidPolicyDocument", "Invalid Policy: Policy missing expiration."
        )
    if not isinstance(policy.get("conditions"), list):
        raise PostRefused(
            400, "InvalidPolicyDocument", "Invalid Policy: Policy missing conditions."
        )
    expiration(policy)  # readable, or refused here
    return policy


def expiration(policy: Mapping[str, Any]) -> datetime:
    value = policy.get("expiration")
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise PostRefused(
            400, "InvalidPolicyDocument", f"Invalid Policy: Invalid 'expiration' value: {value!r}"
        )
    return parsed.astimezone(UTC)


def signature(secret_key: str, credential: Credential, policy_b64: str) -> str:
    """SigV4: HMAC-SHA256 of the base64 policy under the key derived from the secret and the
    credential's scope (date, region, service, ``aws4_request``)."""
    key = f"AWS4{secret_key}".encode()
    for part in (credential.date, credential.region, credential.service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, policy_b64.encode(), hashlib.sha256).hexdigest()


def check_signature(form: PostForm, secret_key: str) -> None:
    want = signature(secret_key, form.credential(), form.fields["policy"])
    if not hmac.compare_digest(want, form.fields["x-amz-signature"]):
        raise PostRefused(
            403,
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided. "
            "Check your key and signing method.",
        )


def check_policy(policy: Mapping[str, Any], form: PostForm, *, bucket: str, now: datetime) -> None:
    """The policy's expiration and conditions against the form, at ``now``."""
    if now > expiration(policy):  # "not valid after" the instant it names
        raise _denied("Policy expired.")
    values = {**form.fields, "bucket": bucket}
    named: set[str] = set()
    for condition in policy["conditions"]:
        named |= _check_condition(condition, values, form.file_size or 0)
    extra = sorted(
        name
        for name in form.fields
        if name not in named and name not in _UNCONDITIONED and not name.startswith(_IGNORED_PREFIX)
    )
    if extra:
        raise _denied(f"Extra input fields: {', '.join(extra)}")


def _check_condition(condition: Any, values: Mapping[str, str], file_size: int) -> set[str]:
    """Check one condition; the field it names (none for a size range)."""
    text = json.dumps(condition)
    if isinstance(condition, dict) and len(condition) == 1:
        [(name, want)] = condition.items()
        op, field = "eq", str(name).lower()
    elif isinstance(condition, list) and len(condition) == 3:
        op = str(condition[0]).lower()
        if op == "content-length-range":
            _check_range(condition[1], condition[2], file_size, text)
            return set()
        if op not in ("eq", "starts-with") or not str(condition[1]).startswith("$"):
            raise _invalid_condition(text)
        field, want = str(condition[1])[1:].lower(), condition[2]
    else:
        raise _invalid_condition(text)
    if not isinstance(want, str):
        raise _invalid_condition(text)
    value = values.get(field)
    if value is None or (value != want if op == "eq" else not value.startswith(want)):
        raise _denied(f"Policy Condition failed: {text}")
    return {field}


def _check_range(low: Any, high: Any, size: int, text: str) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)):
        raise _invalid_condition(text)
    if size < low:
        raise PostRefused(
            400,
            "EntityTooSmall",
            "Your proposed upload is smaller than the minimum allowed size",
        )
    if size > high:
        raise PostRefused(
            400, "EntityTooLarge", "Your proposed upload exceeds the maximum allowed size"
        )


def _invalid_condition(text: str) -> PostRefused:
    return PostRefused(
        400, "InvalidPolicyDocument", f"Invalid Policy: Invalid Condition: {text[:200]}"
    )


class EmulatorClock:
    """The emulator's time for what S3 decides by the clock (a POST policy's expiration): the
    system's, or an instant a test fixed (``/_aegis/clock``)."""

    def __init__(self) -> None:
        self._fixed: datetime | None = None
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._fixed or datetime.now(UTC)

    def fix(self, at: datetime | None) -> None:
        """Stop the clock at ``at`` (aware); None: follow the system clock again."""
        if at is not None and at.tzinfo is None:
            raise ValueError("the emulator's clock takes an aware instant (with a zone)")
        with self._lock:
            self._fixed = None if at is None else at.astimezone(UTC)

    def answer(self, method: str, body: bytes) -> tuple[str, dict[str, Any]]:
        """``GET``: ``{"now", "fixed"}``; ``POST {"now": ISO-8601 | null}``: fix or release."""
        if method == "POST":
            try:
                given = json.loads(body or b"{}")["now"]
                self.fix(None if given is None else datetime.fromisoformat(given))
            except (ValueError, KeyError, TypeError) as err:
                return "400 Bad Request", {"error": f'expected {{"now": ISO-8601 or null}}: {err}'}
        elif method != "GET":
            return "405 Method Not Allowed", {"error": "GET or POST"}
        with self._lock:
            fixed = self._fixed is not None
        return "200 OK", {"now": self.now().isoformat(), "fixed": fixed}
