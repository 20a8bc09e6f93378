"""A test's side of the emulator's hold points (:mod:`aegis_devstack.motoholds`): arm a hold on
one named request, wait until the emulator holds it (the work is in flight there and then),
bring the fault, then release or abort the request.

    holds = Holds(aws_endpoint)
    holds.arm("commit", "dynamodb", "PutItem", contains=['"LATEST"', message_id])
    await holds.held("commit", within=60)   # the named message is between two writes
    pipeline.kill("processor")
    holds.abort("commit")                   # never applied
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any, Literal

from aegis_devstack.motoholds import HOLDS_PATH

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Holds:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 (the local emulator's http URL)
            f"{self.endpoint}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with _DIRECT.open(request, timeout=10) as answer:
            return json.loads(answer.read() or b"null")

    def arm(
        self,
        name: str,
        service: str,
        operation: str,
        *,
        contains: list[str],
        when: Literal["before", "after"] = "before",
    ) -> None:
        self._call(
            "POST",
            HOLDS_PATH,
            {
                "name": name,
                "service": service,
                "operation": operation,
                "contains": contains,
                "when": when,
            },
        )

    def state(self, name: str) -> str:
        return str(self._call("GET", f"{HOLDS_PATH}/{name}")["state"])

    async def held(self, name: str, *, within: float) -> None:
        """Wait until the emulator holds the request (AssertionError after ``within`` s: the
        work never reached the hold point, so a fault now would not be mid-work)."""
        deadline = time.monotonic() + within
        while (state := await asyncio.to_thread(self.state, name)) in ("armed", "applying"):
            if time.monotonic() > deadline:
                raise AssertionError(f"hold {name!r}: no request reached it in {within} s")
            await asyncio.sleep(0.05)
        if state != "holding":
            raise AssertionError(f"hold {name!r} is {state}, not holding")

    def release(self, name: str) -> None:
        self._call("POST", f"{HOLDS_PATH}/{name}/release")

    def abort(self, name: str) -> None:
        self._call("POST", f"{HOLDS_PATH}/{name}/abort")

    def forget(self, name: str) -> None:
        self._call("DELETE", f"{HOLDS_PATH}/{name}")
