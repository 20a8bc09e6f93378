"""``python -m aegis_runtime.motoserver -H HOST -p PORT``: moto_server with one request at a time.

moto serves each request in its own thread and checks a condition (DynamoDB's
``attribute_not_exists``, S3's ``If-None-Match``) and then writes, with nothing in between to stop a
second thread from doing the same: under load two concurrent conditional writes can both succeed,
which real DynamoDB and S3 never allow. The claims that make N replicas do a piece of work once
rely on exactly that, so the local emulator runs its requests under one lock. moto is GIL-bound
Python, so this costs little throughput.

Its full garbage collections are deferred too: moto keeps every object and item in one Python
heap, and a full collection of a heap that a test suite has filled stalls every request for up to
a second (measured by ``make bench``), which AWS does not do and which made latency assertions
flaky.

``AEGIS_MOTO_LATENCY_MS`` adds a round trip to every request (benchmarks only, default 0).

CopyObject honours ``If-None-Match: *`` as S3 does (412 PreconditionFailed when the destination
exists); moto 5.2 honours it on PutObject and CompleteMultipartUpload but ignores it on
CopyObject, and the migration's never-overwrite-raw/ guarantee rests on it. Under the request
lock the check and the copy are one step.

When IAM enforcement is switched on (``POST /moto-api/reset-auth`` with ``0``, or
``INITIAL_NO_AUTH_ACTION_COUNT``), requests are authorized as AWS would: moto's own S3 action names
that IAM does not have are mapped to IAM's (HeadBucket needs ``s3:ListBucket``), DynamoDB calls are
checked against the table's ARN (moto checks them against ``*``, so no table-scoped policy could
allow anything), and DeleteObjects is checked per key (moto checks the bucket's ARN). Without
enforcement these checks never run. Everything else is moto_server's own ``main``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import threading
import time
from html import unescape
from typing import Any

LATENCY_ENV = "AEGIS_MOTO_LATENCY_MS"

# moto's S3 action names that are not IAM actions, and the IAM action AWS checks instead
_IAM_ACTIONS = {
    "s3:HeadBucket": "s3:ListBucket",
    "s3:GetPublicAccessBlock": "s3:GetBucketPublicAccessBlock",
    "s3:PutPublicAccessBlock": "s3:PutBucketPublicAccessBlock",
    "s3:DeletePublicAccessBlock": "s3:PutBucketPublicAccessBlock",
}
_DELETE_KEY = re.compile(rb"<Key>([^<]*)</Key>")


def serialize_requests(latency_s: float = 0.0) -> None:
    """One request at a time; with ``latency_s``, each request first waits that long outside the
    lock (concurrent requests wait together), as a remote S3/DynamoDB's round trip would: for
    benchmarks that compare clients whose concurrency matters against a real endpoint."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication  # noqa: PLC0415

    lock = threading.Lock()
    dispatch = DomainDispatcherApplication.__call__

    def serialized(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        if latency_s > 0:
            time.sleep(latency_s)
        with lock:
            return dispatch(self, environ, start_response)

    DomainDispatcherApplication.__call__ = serialized  # type: ignore[method-assign]


def honour_copy_if_none_match() -> None:
    from moto.s3.exceptions import PreconditionFailed  # noqa: PLC0415
    from moto.s3.responses import S3Response  # noqa: PLC0415

    copy_object = S3Response.copy_object

    def conditional_copy_object(self: Any) -> Any:
        if self.headers.get("If-None-Match") == "*" and (
            self.backend.get_object(self.bucket_name, self.parse_key_name()) is not None
        ):
            raise PreconditionFailed("If-None-Match")
        return copy_object(self)

    S3Response.copy_object = conditional_copy_object  # type: ignore[method-assign]


def authorize_like_aws() -> None:
    from moto.iam.access_control import IAMRequestBase  # noqa: PLC0415

    check = IAMRequestBase.check_action_permitted

    def checked(self: Any, resource: str) -> None:
        self._action = _IAM_ACTIONS.get(self._action, self._action)
        if self._action.startswith("dynamodb:") and resource == "*":
            table = json.loads(self._body or b"{}").get("TableName")
            if table:
                resource = f"arn:aws:dynamodb:{self._region}:{self.account_id}:table/{table}"
        if self._action == "s3:DeleteObject" and "/" not in resource.split(":::", 1)[-1]:
            # DeleteObjects: AWS authorizes s3:DeleteObject on each key, not on the bucket
            for key in _DELETE_KEY.findall(self._body or b""):
                check(self, f"{resource}/{unescape(key.decode())}")
            return
        check(self, resource)

    IAMRequestBase.check_action_permitted = checked  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main  # noqa: PLC0415

    gc.set_threshold(700, 10, 1_000_000)
    serialize_requests(float(os.environ.get(LATENCY_ENV, "0")) / 1000)
    honour_copy_if_none_match()
    authorize_like_aws()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
