"""One contract for a factory's LATEST and HISTORY items, run against both implementations:
DynamoDB (the emulator; integration) and the in-memory one (no server). Whatever the table
refuses, the dict refuses too, and both read back the same plain items."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.times import floor_to, format_ts, utc_now
from aegis_storage.encoding import Encoded, encode
from aegis_storage.errors import Conflict
from aegis_storage.states import FactoryStates, MemoryStates, TableStates

# an hour of today, not of a fixed day: the live items' TTLs (a day ahead) stay ahead when the
# table is a real one that deletes expired items
T0 = floor_to(utc_now(), timedelta(hours=1)) - timedelta(hours=1)
FACTORY = "factory-a"


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.integration)])
def states(request: pytest.FixtureRequest) -> FactoryStates:
    if request.param == "memory":
        return MemoryStates()
    return TableStates(request.getfixturevalue("foundation").readmodel)


def image(at: datetime, score: float = 24.0, **extra: Any) -> dict[str, Any]:
    return {
        "factory_id": FACTORY,
        "updated_at": format_ts(at),
        "risk": {"score": score, "level": "NORMAL", "reasons": []},
        **extra,
    }


def history(at: datetime, *, ttl: int | None = None, factory_id: str = FACTORY) -> Encoded:
    item = {
        **image(at),
        "factory_id": factory_id,
        "pk": keys.factory_pk(factory_id),
        "sk": keys.history_state_sk(at),
    }
    return encode(item if ttl is None else {**item, "ttl": ttl})


async def test_a_first_latest_is_written_only_while_there_is_none(states: FactoryStates) -> None:
    assert await states.replace_latest(FACTORY, image(T0), expected=None)
    assert not await states.replace_latest(FACTORY, image(T0, score=90), expected=None)
    latest = await states.latest(FACTORY)
    assert latest is not None and latest["risk"]["score"] == 24


async def test_latest_is_replaced_only_from_the_version_read(states: FactoryStates) -> None:
    t1 = T0 + timedelta(seconds=1)
    assert not await states.replace_latest(FACTORY, image(t1), expected=format_ts(T0))
    assert await states.latest(FACTORY) is None
    assert await states.replace_latest(FACTORY, image(T0), expected=None)
    assert await states.replace_latest(FACTORY, image(t1, score=50), expected=format_ts(T0))
    # a writer still holding the first version is refused, and changes nothing
    assert not await states.replace_latest(FACTORY, image(t1, score=99), expected=format_ts(T0))
    latest = await states.latest(FACTORY)
    assert latest is not None
    assert (latest["updated_at"], latest["risk"]["score"]) == (format_ts(t1), 50)


async def test_latest_reads_back_as_a_read_returns_it(states: FactoryStates) -> None:
    """Integral numbers as int, the item's keys set, no fleet index bookkeeping."""
    assert await states.replace_latest(FACTORY, encode(image(T0, score=24.0)), expected=None)
    latest = await states.latest(FACTORY)
    assert latest == {
        **image(T0, score=24),
        "pk": keys.factory_pk(FACTORY),
        "sk": keys.LATEST_SK,
    }
    assert isinstance(latest["risk"]["score"], int)
    assert not set(latest) & keys.FLEET_ATTRIBUTES


async def test_a_read_is_a_copy_the_caller_may_change(states: FactoryStates) -> None:
    assert await states.replace_latest(FACTORY, image(T0), expected=None)
    first = await states.latest(FACTORY)
    assert first is not None
    first["risk"]["score"] = 1000
    again = await states.latest(FACTORY)
    assert again is not None and again["risk"]["score"] == 24


async def test_a_history_item_is_added_once_and_never_overwritten(states: FactoryStates) -> None:
    item = history(T0)
    await states.add_history(item)
    other = item.with_fields(risk={"score": 99, "level": "CRITICAL", "reasons": []})
    with pytest.raises(Conflict):
        await states.add_history(other)
    assert await states.history_item(FACTORY, keys.history_state_sk(T0)) == item.plain


async def test_a_removed_history_item_is_gone_and_removing_none_is_no_error(
    states: FactoryStates,
) -> None:
    await states.add_history(history(T0))
    sk = keys.history_state_sk(T0)
    await states.remove_history(FACTORY, sk)
    assert await states.history_item(FACTORY, sk) is None
    await states.remove_history(FACTORY, sk)
    await states.add_history(history(T0))  # the key is free again
    assert await states.history_item(FACTORY, sk) is not None


async def test_history_is_the_live_items_of_the_range_oldest_first(
    states: FactoryStates,
) -> None:
    now = T0 + timedelta(minutes=10)
    alive, expired = int(now.timestamp()) + 86_400, int(now.timestamp())  # ttl == now: expired
    times = [T0 + timedelta(seconds=s) for s in (0, 1, 2, 3, 4)]
    for at in reversed(times):
        await states.add_history(history(at, ttl=alive))
    await states.add_history(history(T0 + timedelta(milliseconds=1500), ttl=expired))
    await states.add_history(history(T0 + timedelta(seconds=2), factory_id="factory-b"))
    assert await states.replace_latest(FACTORY, image(T0 + timedelta(seconds=2)), expected=None)

    found = await states.history(FACTORY, times[1], times[4], now=now)

    assert [i["updated_at"] for i in found] == [format_ts(t) for t in times[1:4]]
    assert all(i["factory_id"] == FACTORY and i["ttl"] == alive for i in found)
