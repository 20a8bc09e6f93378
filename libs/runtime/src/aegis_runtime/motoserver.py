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
flaky. Everything else is moto_server's own ``main``.
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any


def serialize_requests() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication  # noqa: PLC0415

    lock = threading.Lock()
    dispatch = DomainDispatcherApplication.__call__

    def serialized(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        with lock:
            return dispatch(self, environ, start_response)

    DomainDispatcherApplication.__call__ = serialized  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    from moto.server import main as moto_main  # noqa: PLC0415

    gc.set_threshold(700, 10, 1_000_000)
    serialize_requests()
    moto_main(argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    main()
