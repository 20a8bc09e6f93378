"""Hold points at the emulator: a test makes one named request wait, sees that it waits, and
decides its fate, so that a fault (a process killed, the storage cut off) is proven to land while
that very piece of work is in flight, not before or after it.

A hold is armed with ``POST /_aegis/holds`` and ``{"name", "service", "operation", "contains":
[...], "when": "before" | "after"}``: the first request of that service and operation (as the
emulator counts them: ``dynamodb`` / ``PutItem``, ``s3`` / ``PutObject``) whose path, query and
body contain every string of ``contains`` is held, one request per hold:

* ``before``: it waits before the emulator applies it (other requests go on meanwhile);
  ``release`` applies and answers it, ``abort`` answers 503 without applying it (what a client
  killed meanwhile would never have seen anyway);
* ``after``: it is applied, and its answer waits; ``release`` sends the answer, ``abort`` cuts
  the connection without one (the write stands, its caller never learns it). Between matching
  and the write being done (it may wait for the emulator's lock) the hold is ``applying``, and
  ``holding`` only once the write is in the store, so a test that sees it held can read it.

``GET /_aegis/holds/{name}`` answers ``{"state": "armed" | "applying" | "holding" | "released" |
"aborted"}``;
``POST /_aegis/holds/{name}/release`` and ``.../abort`` decide; ``DELETE /_aegis/holds/{name}``
forgets it (releasing a held request). A held request that nobody decides on is released after
``HOLD_LIMIT_S``, so a test that failed never leaves the emulator stuck. The client is
:class:`aegis_devstack.testing.holds.Holds`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

HOLDS_PATH = "/_aegis/holds"
HOLD_LIMIT_S = 120.0
_ONE = re.compile(rf"^{re.escape(HOLDS_PATH)}/([A-Za-z0-9_.-]{{1,100}})(?:/(release|abort))?$")

When = Literal["before", "after"]
Decision = Literal["release", "abort"]


@dataclass
class Hold:
    name: str
    service: str
    operation: str
    contains: tuple[str, ...]
    when: When
    state: str = "armed"
    held_at: float | None = None
    decision: Decision | None = None
    decided: threading.Event = field(default_factory=threading.Event)


class Holds:
    """The armed holds of one emulator process (its request threads share them)."""

    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}
        self._lock = threading.Lock()

    def armed(self) -> bool:
        return any(h.state == "armed" for h in self._holds.values())

    def take(self, service: str, operation: str, text: str) -> Hold | None:
        """The armed hold this request matches, now holding it; None when none does."""
        with self._lock:
            for hold in self._holds.values():
                if (
                    hold.state == "armed"
                    and hold.service == service
                    and hold.operation == operation
                    and all(part in text for part in hold.contains)
                ):
                    if hold.when == "after":
                        hold.state = "applying"  # holding once applied: see applied()
                    else:
                        hold.state, hold.held_at = "holding", time.time()
                    return hold
        return None

    def applied(self, hold: Hold) -> None:
        """An ``after`` hold's request is applied: from now on it is holding its answer."""
        with self._lock:
            hold.state, hold.held_at = "holding", time.time()

    def wait(self, hold: Hold) -> Decision:
        """Block the request's thread until a test decides (released after the limit); an
        ``after`` hold's request waits here once applied, so it is holding from now on."""
        if hold.when == "after":
            self.applied(hold)
        hold.decided.wait(HOLD_LIMIT_S)
        decision: Decision = hold.decision or "release"
        with self._lock:
            hold.state = "aborted" if decision == "abort" else "released"
        return decision

    def answer(self, path: str, method: str, body: bytes) -> tuple[str, dict[str, Any]]:
        """The control endpoint: (HTTP status, JSON answer)."""
        if path == HOLDS_PATH and method == "POST":
            return self._arm(body)
        if path == HOLDS_PATH and method == "GET":
            with self._lock:
                return "200 OK", {"holds": {n: h.state for n, h in self._holds.items()}}
        match = _ONE.match(path)
        if match is None:
            return "404 Not Found", {"error": "no such hold endpoint"}
        with self._lock:
            return self._one(match[1], match[2], method)

    def _arm(self, body: bytes) -> tuple[str, dict[str, Any]]:
        try:
            spec = json.loads(body or b"{}")
            hold = Hold(
                name=str(spec["name"]),
                service=str(spec["service"]),
                operation=str(spec["operation"]),
                contains=tuple(str(s) for s in spec.get("contains", ())),
                when="after" if spec.get("when") == "after" else "before",
            )
        except (ValueError, KeyError, TypeError) as err:
            return "400 Bad Request", {"error": f"not a hold: {err}"}
        if not _ONE.match(f"{HOLDS_PATH}/{hold.name}"):
            return "400 Bad Request", {"error": "a hold's name is [A-Za-z0-9_.-]{1,100}"}
        with self._lock:
            self._holds[hold.name] = hold
        return "201 Created", {"name": hold.name, "state": hold.state}

    def _one(self, name: str, verb: str | None, method: str) -> tuple[str, dict[str, Any]]:
        """Read, decide on or forget one hold (under the lock)."""
        hold = self._holds.get(name)
        if hold is None:
            return "404 Not Found", {"error": f"no hold {name!r}"}
        if verb is not None and method == "POST":
            hold.decision = "abort" if verb == "abort" else "release"
            hold.decided.set()
            return "200 OK", {"name": name, "decision": hold.decision}
        if verb is None and method == "DELETE":
            del self._holds[name]
            hold.decided.set()  # a held request goes on (released)
            return "200 OK", {"name": name}
        if verb is None and method == "GET":
            return "200 OK", {"name": name, "state": hold.state, "held_at": hold.held_at}
        return "405 Method Not Allowed", {"error": f"{method} {HOLDS_PATH}/{name}"}
