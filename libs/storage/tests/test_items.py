"""One contract for the table's keyed items, run against both implementations: DynamoDB (the
emulator; integration) and the in-memory one (no server). Whatever the table refuses, the dict
refuses too; both read back the same plain items, keep the fleet index the same way and announce
the same changes."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.times import floor_to, format_ts, utc_now
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.items import Change, Put, Table
from aegis_storage.memorytable import MemoryTable
from aegis_storage.periodic import PeriodicWork
from aegis_storage.readmodel import ReadModel

# now, not a fixed day: live TTLs (a day ahead) stay ahead where the table deletes expired items
NOW = floor_to(utc_now(), timedelta(minutes=1))
LIVE_TTL = int((NOW + timedelta(days=1)).timestamp())
PK = "ALERT#factory-a"


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.integration)])
def changes(request: pytest.FixtureRequest) -> tuple[Table, list[Change]]:
    """The items and the changes they announce."""
    seen: list[Change] = []

    async def sink(change: Change) -> None:
        seen.append(change)

    if request.param == "memory":
        return MemoryTable(changes=sink), seen
    foundation = request.getfixturevalue("foundation")
    return ReadModel(foundation.clients.items, foundation.table, changes=sink), seen


@pytest.fixture
def items(changes: tuple[Table, list[Change]]) -> Table:
    return changes[0]


def intent(sk: str = "INTENT#1", **fields: Any) -> dict[str, Any]:
    return {"pk": PK, "sk": sk, "ttl": LIVE_TTL, **fields}


async def test_if_absent_writes_only_where_no_item_is(items: Table) -> None:
    await items.put_item(intent(version=1), if_absent=True)
    with pytest.raises(Conflict):
        await items.put_item(intent(version=2), if_absent=True)
    stored = await items.get_item(PK, "INTENT#1")
    assert stored is not None and stored["version"] == 1


async def test_expected_writes_only_over_those_values(items: Table) -> None:
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


async def test_if_absent_with_expected_writes_over_nothing_or_those_values(items: Table) -> None:
    await items.put_item(intent(version=1), if_absent=True, expected={"version": 0})
    await items.put_item(intent(version=2), if_absent=True, expected={"version": 1})
    with pytest.raises(Conflict):
        await items.put_item(intent(version=3), if_absent=True, expected={"version": 1})
    stored = await items.get_item(PK, "INTENT#1")
    assert stored is not None and stored["version"] == 2


async def test_a_transaction_writes_all_of_its_puts_or_none(items: Table) -> None:
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


async def test_a_transaction_refuses_two_puts_of_one_item_and_writes_nothing(items: Table) -> None:
    with pytest.raises(StorageError):
        await items.put_items([Put(intent(version=1)), Put(intent(version=2))])
    assert await items.get_item(PK, "INTENT#1") is None


async def test_a_transaction_takes_one_to_a_hundred_puts(items: Table) -> None:
    for size in (0, 101):
        with pytest.raises(ValueError, match="1 to 100"):
            await items.put_items([Put(intent(f"INTENT#{n}")) for n in range(size)])


async def test_reads_return_plain_copies_without_the_index_bookkeeping(items: Table) -> None:
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


async def test_the_fleet_index_follows_each_whole_item_put(items: Table) -> None:
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


async def test_expired_items_are_hidden_from_reads_given_now(items: Table) -> None:
    expired = int((NOW - timedelta(minutes=5)).timestamp())
    await items.put_item({"pk": PK, "sk": "INTENT#old", "ttl": expired})
    await items.put_item(intent("INTENT#live"))
    await items.put_item({"pk": PK, "sk": "CURSOR#1"})
    assert await items.get_item(PK, "INTENT#old", now=NOW) is None
    listed = await items.partition(PK, now=NOW)
    assert [i["sk"] for i in listed] == ["CURSOR#1", "INTENT#live"]
    assert [i["sk"] for i in await items.partition(PK, now=NOW, prefix="INTENT#")] == [
        "INTENT#live"
    ]


async def test_a_batch_returns_the_present_items_and_a_delete_removes_one(items: Table) -> None:
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
    changes: tuple[Table, list[Change]],
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


async def test_a_range_of_sort_keys_is_read_in_time_order_either_way(items: Table) -> None:
    def at(minutes: int) -> datetime:
        return NOW - timedelta(hours=1) + timedelta(minutes=minutes)

    for m in (0, 10, 20, 30):
        await items.put_item({"pk": PK, "sk": f"LOG#{format_ts(at(m))}", "m": m, "ttl": LIVE_TTL})
    await items.put_item({"pk": PK, "sk": f"OTHER#{format_ts(at(10))}", "m": -1})
    found = await items.query_range(PK, "LOG#", at(10), at(30), now=NOW)
    assert [i["m"] for i in found] == [10, 20]  # the end is excluded
    newest = await items.query_range(PK, "LOG#", at(0), at(31), now=NOW, descending=True, limit=2)
    assert [i["m"] for i in newest] == [30, 20]


async def test_a_lease_is_held_by_one_owner_until_it_runs_out(items: Table) -> None:
    until = NOW + timedelta(seconds=30)
    assert await items.acquire_lease(PK, "LEASE#1", owner="a", now=NOW, until=until)
    assert not await items.acquire_lease(PK, "LEASE#1", owner="b", now=NOW, until=until)
    assert not await items.extend_lease(PK, "LEASE#1", owner="b", until=until)
    assert await items.extend_lease(PK, "LEASE#1", owner="a", until=NOW + timedelta(seconds=60))
    later = NOW + timedelta(seconds=45)  # past the first until, inside the extended one
    assert not await items.acquire_lease(PK, "LEASE#1", owner="b", now=later, until=later)
    taken = NOW + timedelta(seconds=61)  # run out: a holder that died does not keep it
    assert await items.acquire_lease(
        PK, "LEASE#1", owner="b", now=taken, until=taken, attributes={"kind": "wait"}
    )
    held = await items.get_item(PK, "LEASE#1")
    assert held is not None and (held["owner"], held["kind"]) == ("b", "wait")
    assert not await items.release_lease(PK, "LEASE#1", owner="a")  # taken over meanwhile
    assert await items.release_lease(PK, "LEASE#1", owner="b")
    assert await items.get_item(PK, "LEASE#1") is None
    assert not await items.extend_lease(PK, "LEASE#1", owner="b", until=until)  # gone
    assert not await items.release_lease(PK, "LEASE#1", owner="b")


async def test_an_item_without_an_until_is_never_taken_as_a_lease(items: Table) -> None:
    await items.put_item({"pk": PK, "sk": "LEASE#2", "owner": "a"})
    assert not await items.acquire_lease(PK, "LEASE#2", owner="b", now=NOW, until=NOW)


async def test_a_window_is_claimed_once_and_again_only_after_its_lease_unfinished(
    items: Table,
) -> None:
    window, lease = NOW - timedelta(minutes=5), timedelta(minutes=2)
    assert await items.claim_window("job", window, owner="a", now=NOW, ttl=LIVE_TTL)
    assert not await items.claim_window("job", window, owner="b", now=NOW, ttl=LIVE_TTL)
    inside = NOW + timedelta(minutes=1)
    assert not await items.claim_window(
        "job", window, owner="b", now=inside, ttl=LIVE_TTL, lease=lease
    )
    after = NOW + timedelta(minutes=3)  # a never-finished claim older than the lease
    assert await items.claim_window("job", window, owner="b", now=after, ttl=LIVE_TTL, lease=lease)
    assert not await items.finish_window("job", window, owner="a", now=after)  # taken over
    assert await items.finish_window("job", window, owner="b", now=after)
    much_later = after + timedelta(hours=1)  # finished: never claimed again
    assert not await items.claim_window(
        "job", window, owner="c", now=much_later, ttl=LIVE_TTL, lease=lease
    )
    assert not await items.finish_window("job", NOW, owner="a", now=NOW)  # no such claim


async def test_late_marks_are_announced_as_their_marker_changes(
    changes: tuple[Table, list[Change]],
) -> None:
    table, seen = changes
    assert isinstance(table, (MemoryTable, ReadModel))
    hour = floor_to(NOW, timedelta(hours=1)) - timedelta(hours=2)
    await table.mark_late("factory-a", hour, now=NOW, ttl=LIVE_TTL)
    await table.mark_late("factory-a", hour, now=NOW, ttl=LIVE_TTL)
    assert not await table.clear_late("factory-a", hour, marks=1)  # a mark came since
    assert [m["marks"] for m in await table.late_hours(now=NOW)] == [2]
    assert await table.clear_late("factory-a", hour, marks=2)
    assert await table.late_hours(now=NOW) == []
    assert [(c.entity, c.event_name) for c in seen] == [
        ("factory_late", "INSERT"),
        ("factory_late", "MODIFY"),
        ("factory_late", "REMOVE"),
    ]
    assert [(c.old_image or {}).get("marks") for c in seen] == [None, 1, 2]
    assert [(c.new_image or {}).get("marks") for c in seen] == [1, 2, None]


async def test_the_first_window_of_a_job_is_recorded_once(items: PeriodicWork) -> None:
    candidates = [NOW + timedelta(minutes=5 * i) for i in range(8)]
    got = await asyncio.gather(*(items.first_window("graph-5m", c, now=c) for c in candidates))
    assert len(set(got)) == 1 and got[0] in candidates  # every replica got the winner's
    assert await items.first_window("graph-5m", NOW - timedelta(days=1), now=NOW) == got[0]
    item = await items.get_item(keys.claim_pk("graph-5m"), keys.CLAIM_FIRST_SK)
    assert item is not None and "ttl" not in item  # never expires
    # window listings never see it
    far = NOW + timedelta(days=3650)
    assert await items.window_claims("graph-5m", NOW - timedelta(days=1), far, now=NOW) == {}


async def test_a_pending_window_is_claimed_once_and_a_finished_one_never_again(
    items: PeriodicWork,
) -> None:
    window, lease = NOW - timedelta(minutes=5), timedelta(minutes=2)
    span = (window, window + timedelta(minutes=5))
    claims = await items.window_claims("report", *span, now=NOW)
    assert claims == {}
    wins = await asyncio.gather(
        *(
            items.claim_pending(
                "report", window, claims=claims, owner=f"r{i}", now=NOW, ttl=LIVE_TTL, lease=lease
            )
            for i in range(4)
        )
    )
    assert wins.count(True) == 1
    winner = f"r{wins.index(True)}"
    assert await items.finish_window("report", window, owner=winner, now=NOW)
    done = await items.window_claims("report", *span, now=NOW)
    assert done[format_ts(window)]["owner"] == winner and done[format_ts(window)]["done_at"]
    later = NOW + timedelta(hours=1)  # its lease long over: finished is finished
    for listing in (done, claims):  # the listing that shows it done, and a stale one
        assert not await items.claim_pending(
            "report", window, claims=listing, owner="late", now=later, ttl=LIVE_TTL, lease=lease
        )


async def test_the_fleets_ids_are_the_factories_with_a_latest(items: PeriodicWork) -> None:
    for factory in ("factory-b", "factory-a"):
        await items.put_item(
            {"pk": keys.factory_pk(factory), "sk": keys.LATEST_SK, "updated_at": format_ts(NOW)}
        )
    await items.put_item({"pk": PK, "sk": "WARNING#fire#FIRING", "ttl": LIVE_TTL})
    assert await items.fleet_ids() == ["factory-a", "factory-b"]
