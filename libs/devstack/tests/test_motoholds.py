"""The hold points' states (aegis_devstack.motoholds), without a server."""

from __future__ import annotations

import json

from aegis_devstack.motoholds import Holds


def arm(holds: Holds, name: str, when: str) -> None:
    spec = {"name": name, "service": "s3", "operation": "PutObject", "contains": ["/k"]}
    status, _ = holds.answer("/_aegis/holds", "POST", json.dumps(spec | {"when": when}).encode())
    assert status == "201 Created"


def state(holds: Holds, name: str) -> str:
    return holds.answer(f"/_aegis/holds/{name}", "GET", b"")[1]["state"]


def test_a_hold_after_is_holding_only_once_its_request_is_applied() -> None:
    """A request matched by an ``after`` hold may still wait for the emulator's lock: until it
    is applied, a test that saw it held would read a store without its write."""
    holds = Holds()
    arm(holds, "after", "after")
    hold = holds.take("s3", "PutObject", "PUT /bucket/k")
    assert hold is not None
    assert state(holds, "after") == "applying"
    assert not holds.armed()  # no second request matches it meanwhile
    holds.applied(hold)
    assert state(holds, "after") == "holding"


def test_a_hold_before_is_holding_as_soon_as_its_request_arrives() -> None:
    holds = Holds()
    arm(holds, "before", "before")
    assert holds.take("s3", "PutObject", "PUT /bucket/k") is not None
    assert state(holds, "before") == "holding"
