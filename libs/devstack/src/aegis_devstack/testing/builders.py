"""What tests build again and again, built one way: a clock the test moves by hand (and the
environment of a process whose wall clock runs ahead), the ``meta`` block every processed
object carries, read-model items to seed a table with, the fire reason alert tests raise and
the incident a first alert message leaves.

Services take ``clock=`` (a callable returning an aware UTC ``datetime``), so a test passes a
:class:`FakeClock` and moves it instead of sleeping; nothing here reads the calendar.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from aegis_contracts import incidents, keys
from aegis_contracts.items import Incident
from aegis_contracts.times import format_ts
from aegis_storage.encoding import to_plain
from aegis_storage.incidents import IncidentStore
from aegis_storage.items import Items
from aegis_storage.readmodel import LATEST_GROUPS


class FakeClock:
    """``clock()`` is ``clock.now``; ``advance(timedelta(minutes=5))`` or ``advance(300)``
    (seconds) moves it and returns the new now."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta | float) -> datetime:
        self.now += delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        return self.now


# what `make test-at` puts on every Python process's PYTHONPATH: a sitecustomize that moves the
# wall clock by TEST_CLOCK_OFFSET_S seconds (the checkout's tests/tools/clockshift)
CLOCKSHIFT = Path(__file__).resolve().parents[5] / "tests" / "tools" / "clockshift"


def clock_moved(env: Mapping[str, str], seconds: float) -> dict[str, str]:
    """``env`` for a process whose wall clock runs ``seconds`` ahead of this one's (on top of
    the offset `make test-at` gave this one); its monotonic clock is the machine's. What a test
    would otherwise wait for in real time (something falling due) is already past for it."""
    if not (CLOCKSHIFT / "sitecustomize.py").is_file():
        raise FileNotFoundError(f"no {CLOCKSHIFT / 'sitecustomize.py'}: run from a checkout")
    offset = float(os.environ.get("TEST_CLOCK_OFFSET_S") or 0) + seconds
    path = os.pathsep.join(p for p in (str(CLOCKSHIFT), env.get("PYTHONPATH", "")) if p)
    return {**env, "TEST_CLOCK_OFFSET_S": str(offset), "PYTHONPATH": path}


def meta(
    message_id: str,
    at: datetime,
    *,
    factory_id: str = "f",
    source_type: str = "factory_state",
    device_id: str = "edge-01",
) -> dict[str, Any]:
    """The ``meta`` of a processed object (a state or a risk record) of one message emitted,
    received and timed at ``at``, its raw key in that day's partition."""
    ts = format_ts(at)
    return {
        "message_id": message_id,
        "device_id": device_id,
        "emitted_at": ts,
        "event_time": ts,
        "received_at": ts,
        "raw_key": f"raw/{factory_id}/{source_type}/{at:yyyy=%Y/mm=%m/dd=%d}/{message_id}.json",
        "schema_version": "1.0",
    }


def latest_fields(
    group: str, fields: Mapping[str, Any], *, event_time: datetime, updated_at: datetime
) -> dict[str, Any]:
    """``fields`` (the group, and what derives from it, e.g. ``risk``) as a LATEST carries them
    once a message of ``group`` emitted at ``event_time`` was committed at ``updated_at``: with
    the group's event-time guard. For seeding LATEST with :func:`seed_latest`."""
    if group not in fields:
        raise ValueError(f"fields must include the group {group!r}")
    return {
        **fields,
        LATEST_GROUPS[group]: format_ts(event_time),
        "updated_at": format_ts(updated_at),
    }


def history_item(
    factory_id: str, fields: Mapping[str, Any], *, updated_at: datetime, ttl: int
) -> dict[str, Any]:
    """A HISTORY#STATE item of ``factory_id`` holding ``fields``, filed under ``updated_at``."""
    return {
        **fields,
        "pk": keys.factory_pk(factory_id),
        "sk": keys.history_state_sk(updated_at),
        "updated_at": format_ts(updated_at),
        "ttl": ttl,
    }


def fire_reason(**fields: Any) -> dict[str, Any]:
    """A CRITICAL ``FIRE_DETECTED`` reason as a state's risk carries it (``fields`` override)."""
    reason = {
        "code": "FIRE_DETECTED",
        "severity": "CRITICAL",
        "detail": "fire on cam-1",
        "value": 0.93,
        "threshold": 0.8,
    }
    return reason | fields


async def seed_latest(items: Items, factory_id: str, fields: BaseModel | Mapping[str, Any]) -> None:
    """Set ``fields`` on the factory's LATEST (made when absent), as a test seeds a table: the
    item read, ``fields`` merged in, the whole item put back (no condition: nothing else writes
    it meanwhile). Services commit whole states through their repositories instead."""
    old = await items.get_latest(factory_id) or {}
    pk = keys.factory_pk(factory_id)
    item = {**old, **to_plain(fields), "factory_id": factory_id, "pk": pk, "sk": keys.LATEST_SK}
    await items.put_item(item)


async def fired_incident(
    items: Items,
    scope: str,
    *,
    at: datetime,
    outcome: str = "sent",
    reason: str = "GAS_LEAK",
    severity: incidents.Severity = "CRITICAL",
) -> Incident:
    """An incident as the alert dispatcher leaves it after its first message (level 0, told to
    ``slack`` with ``outcome``), stored in ``items``."""
    opened = incidents.open_incident(
        scope=scope, stream="STATE", reason=reason, severity=severity, at=at
    )
    told = incidents.notified(opened, at=at, receiver="slack", outcome=outcome)
    await IncidentStore(items).save(told, None)
    return told
