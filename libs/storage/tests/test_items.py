"""One contract for the table's keyed items, run against both implementations: DynamoDB (the
emulator; integration) and the in-memory one (no server). Whatever the table refuses, the dict
refuses too; both read back the same plain items, keep the fleet index the same way and announce
the same changes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.times import floor_to, utc_now
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.items import Items, MemoryItems
from aegis_storage.readmodel import Change, Put, ReadModel

# now, not a fixed day: live TTLs (a day ahead) stay ahead where the table deletes expired items
NOW = floor_to(utc_now(), timedelta(minutes=1))
LIVE_TTL = int((NOW + timedelta(days=1)).timestamp())
PK = "ALERT#factory-a"


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.integration)])
def changes(request: pytest.FixtureRequest) -> tuple[Items, list[Change]]:
    """The items and the changes they announce."""
    seen: list[Change] = []

    async def sink(change: Change) -> None:
        seen.append(change)

    if request.param == "memory":
        return MemoryItems(changes=sink), seen
    foundation = request.getfixturevalue("foundation")
    return ReadModel(foundation.clients.items, foundation.table, changes=sink), seen


@pytest.fixture
def items(changes: tuple[Items, list[Change]]) -> Items:
    return changes[0]


def intent(sk: str = "INTENT#1", **fields: Any) -> dict[str, Any]:
    return {"pk": PK, "sk": sk, "ttl": LIVE_TTL, **fields}


async def test_if_absent_writes_only_where_no_item_is(items: Items) -> None:
    await items.put_item(intent(version=1), if_absent=True)
    with pytest.raises(Conflict):
        await items.put_item(intent(version=2), if_absent=True)
    stored = await items.get_item(PK, "INTENT#1")
    assert stored is not None and stored["version"] == 1


async def test_expected_writes_only_over_those_values(items: Items) -> None:
    with pytest.raises(Conflict):  # no item: nothing has the value
        await items.put_item(intent(version=2), expected={"version": 1})
    await items.put_item(intent(version=1, owner="a"))
    with pytest.raises(Conflict):  # an attribute the item does not have
        await items.put_item(intent(version=2), expected={"lease": "x"})
    with pytest.raises(Conflict):  # another value
        await items.put_item(intent(version=2), expected={"version": 7})
    with pytest.raises(Conflict):  # the same digits as another type
        await items.put_item(intent(version=2), expected={"version": "1"})
    await items.put_item(intent(version=2, owner="b"), expected={"version": 1.0, "owner": "a"})
    stored = await items.get_item(PK, "INTENT#1")
    assert stored is not None and (stored["version"], stored["owner"]) == (2, "b")


async def test_if_absent_with_expected_writes_over_nothing_or_those_values(items: Items) -> None:
    await items.put_item(intent(version=1), if_absent=True, expected={"version": 0})
    await items.put_item(intent(version=2), if_absent=True, expected={"version": 1})
    with pytest.raises(Conflict):
        await items.put_item(intent(version=3), if_absent=True, expected={"version": 1})
    stored = await items.get_item(PK, "INTENT#1")
    assert stored is not None and stored["version"] == 2


async def test_a_transaction_writes_all_of_its_puts_or_none(items: Items) -> None:
    await items.put_item(intent("INTENT#taken", version=1))
    with pytest.raises(Conflict):
        await items.put_items(
            [
                Put(intent("INTENT#new", version=1), if_absent=True),
                Put(intent("INTENT#taken", version=2), if_absent=True),
            ]
        )
    assert await items.get_item(PK, "INTENT#new") is None
    await items.put_items(
        [
            Put(intent("INTENT#new", version=1), if_absent=True),
            Put(intent("INTENT#taken", version=2), expected={"version": 1}),
        ]
    )
    found = await items.batch_get([(PK, "INTENT#new"), (PK, "INTENT#taken")])
    assert sorted((i["sk"], i["version"]) for i in found) == [
        ("INTENT#new", 1),
        ("INTENT#taken", 2),
    ]


async def test_a_transaction_refuses_two_puts_of_one_item_and_writes_nothing(items: Items) -> None:
    with pytest.raises(StorageError):
        await items.put_items([Put(intent(version=1)), Put(intent(version=2))])
    assert await items.get_item(PK, "INTENT#1") is None


async def test_a_transaction_takes_one_to_a_hundred_puts(items: Items) -> None:
    for size in (0, 101):
        with pytest.raises(ValueError, match="1 to 100"):
            await items.put_items([Put(intent(f"INTENT#{n}")) for n in range(size)])


async def test_reads_return_plain_copies_without_the_index_bookkeeping(items: Items) -> None:
    await items.put_item(
        {"pk": PK, "sk": "WARNING#fire#FIRING", "firing": True, "score": 24.0, "tags": ["a"]}
    )
    first = await items.get_item(PK, "WARNING#fire#FIRING")
    assert first == {
        "pk": PK,
        "sk": "WARNING#fire#FIRING",
        "firing": True,
        "score": 24,
        "tags": ["a"],
    }
    assert isinstance(first["score"], int)
    first["tags"].append("changed")
    assert (await items.get_item(PK, "WARNING#fire#FIRING")) == {**first, "tags": ["a"]}


async def test_the_fleet_index_follows_each_whole_item_put(items: Items) -> None:
    state = {"pk": PK, "sk": "WARNING#fire#FIRING"}
    await items.put_item({**state, "firing": True})
    assert await items.index_members(keys.FLEET_FIRING) == [(PK, "WARNING#fire#FIRING")]
    shard = keys.fleet_shard(PK)
    assert await items.index_members(keys.FLEET_FIRING, shards=[shard]) == [
        (PK, "WARNING#fire#FIRING")
    ]
    other = (shard + 1) % keys.FLEET_SHARDS
    assert await items.index_members(keys.FLEET_FIRING, shards=[other]) == []
    await items.put_item({**state, "firing": False})
    assert await items.index_members(keys.FLEET_FIRING) == []


async def test_expired_items_are_hidden_from_reads_given_now(items: Items) -> None:
    expired = int((NOW - timedelta(minutes=5)).timestamp())
    await items.put_item({"pk": PK, "sk": "INTENT#old", "ttl": expired})
    await items.put_item(intent("INTENT#live"))
    await items.put_item({"pk": PK, "sk": "CURSOR#1"})
    assert await items.get_item(PK, "INTENT#old", now=NOW) is None
    assert await items.get_item(PK, "INTENT#old") is not None  # not yet deleted
    listed = await items.partition(PK, now=NOW)
    assert [i["sk"] for i in listed] == ["CURSOR#1", "INTENT#live"]
    assert [i["sk"] for i in await items.partition(PK, now=NOW, prefix="INTENT#")] == [
        "INTENT#live"
    ]


async def test_a_batch_returns_the_present_items_and_a_delete_removes_one(items: Items) -> None:
    await items.put_item(intent("INTENT#a"))
    await items.put_item(intent("INTENT#b"))
    found = await items.batch_get([(PK, "INTENT#a"), (PK, "INTENT#none"), (PK, "INTENT#b")])
    assert sorted(i["sk"] for i in found) == ["INTENT#a", "INTENT#b"]
    await items.delete_item(PK, "INTENT#a")
    await items.delete_item(PK, "INTENT#none")  # nothing there: nothing happens
    assert [i["sk"] for i in await items.batch_get([(PK, "INTENT#a"), (PK, "INTENT#b")])] == [
        "INTENT#b"
    ]


async def test_announced_entities_changes_are_handed_on_as_written(
    changes: tuple[Items, list[Change]],
) -> None:
    items, seen = changes
    state = {"pk": PK, "sk": "WARNING#fire#FIRING", "firing": True}
    await items.put_item(state)
    await items.put_item(state)  # the same item again: no change
    await items.put_item({**state, "firing": False})
    await items.put_item(intent())  # alert bookkeeping: not announced
    await items.put_items([Put({**state, "count": 2}, before={**state, "firing": False})])
    await items.delete_item(PK, "WARNING#fire#FIRING")
    assert [(c.entity, c.event_name, c.old_image, c.new_image) for c in seen] == [
        ("alert", "INSERT", None, state),
        ("alert", "MODIFY", state, {**state, "firing": False}),
        ("alert", "MODIFY", {**state, "firing": False}, {**state, "count": 2}),
        ("alert", "REMOVE", {**state, "count": 2}, None),
    ]
