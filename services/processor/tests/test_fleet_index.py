"""The fleet index against the emulator: it holds exactly the factories with a LATEST and the
alert states that are firing, whoever wrote them and however; listings read it, not the table;
``aegis bootstrap`` adds it to a table made without it, backfills it, and is idempotent."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock, history_item, latest_fields, seed_latest
from aegis_processor.handlers import Processor
from aegis_processor.refresh import Refresher
from aegis_processor.rules import load_rules
from aegis_runtime.bus import Outgoing

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def state(at: datetime) -> dict[str, object]:
    return {"factory_state": {"sensors": {"co_ppm": 3.5}, "at": format_ts(at)}}


async def raw_items(foundation) -> list[dict]:
    """Every stored item as DynamoDB holds it (the test's own look at the table)."""
    items: list[dict] = []
    paginator = foundation.clients.dynamodb.get_paginator("scan")
    async for page in paginator.paginate(TableName=foundation.table):
        items.extend(page["Items"])
    return items


async def test_the_fleet_is_exactly_the_factories_with_a_latest_whoever_wrote_them(
    foundation, fire_alert
):
    rm = foundation.readmodel
    guarded = [f"factory-g{i:03d}" for i in range(120)]  # more than one BatchGetItem of 100
    replaced = [f"factory-r{i:03d}" for i in range(10)]
    # a LATEST put by many writers at once, made by the processor's guarded replace and
    # rewritten again and again, and one holding nothing but a field of its own
    await asyncio.gather(
        *(
            seed_latest(
                rm, f, latest_fields("factory_state", state(T0), event_time=T0, updated_at=T0)
            )
            for f in guarded
        )
    )
    for f in replaced:
        assert await rm.replace_latest(
            f, {"factory_id": f, "updated_at": format_ts(T0)}, expected=None
        )
        for n in range(1, 4):  # rewritten again and again: still one entry
            at = format_ts(T0 + timedelta(seconds=n))
            prev = format_ts(T0 + timedelta(seconds=n - 1))
            assert await rm.replace_latest(f, {"factory_id": f, "updated_at": at}, expected=prev)
    await seed_latest(rm, "factory-set", {"note": "by hand"})
    # items that are no factory LATEST stay out: history, graph, cloud, claims, alerts at rest
    ttl = int(T0.timestamp()) + 3600
    await rm.put_item(history_item(guarded[0], state(T0), updated_at=T0, ttl=ttl), if_absent=True)
    await rm.put_item({"pk": keys.factory_pk(guarded[1]), "sk": keys.graph_5m_sk(T0), "ttl": ttl})
    await rm.put_item({"pk": keys.CLOUD_PK, "sk": keys.LATEST_SK, "overall_status": "NORMAL"})
    await rm.claim_window("refresh", T0, owner="t", now=T0, ttl=ttl)
    await rm.put_item(fire_alert(guarded[2], firing=False, version=1, ttl=ttl))

    fleet = await rm.factory_latest_items()
    expected = sorted([*guarded, *replaced, "factory-set"])
    assert [i["pk"] for i in fleet] == [keys.factory_pk(f) for f in expected]
    assert {i["sk"] for i in fleet} == {keys.LATEST_SK}
    assert all(keys.FLEET_PK not in i and keys.FLEET_SK not in i for i in fleet)
    assert await rm.fleet_ids() == expected
    # each one entry, spread over every shard
    members = await rm.index_members(keys.FLEET_LATEST)
    assert len(members) == len(expected)
    stored = await raw_items(foundation)
    shards = Counter(i[keys.FLEET_PK]["S"] for i in stored if keys.FLEET_PK in i)
    assert set(shards) == set(keys.fleet_partitions(keys.FLEET_LATEST))
    assert sum(shards.values()) == len(expected)
    # what a reader gets back carries no index bookkeeping
    latest = await rm.get_latest(replaced[0])
    assert latest is not None and keys.FLEET_PK not in latest
    assert latest["updated_at"] == format_ts(T0 + timedelta(seconds=3))


async def test_a_firing_alert_enters_the_index_and_leaves_it_when_resolved(foundation, fire_alert):
    rm = foundation.readmodel
    now = T0
    ttl = int(now.timestamp()) + 3600
    await rm.put_item(fire_alert("factory-a", firing=True, version=1, ttl=ttl))
    await rm.put_item(fire_alert("factory-b", firing=True, version=1, ttl=ttl))
    # the cursor and observations of a scope never enter it
    await rm.put_item(
        {
            "pk": keys.alert_pk("factory-a"),
            "sk": keys.observation_sk("WARNING", "CO_HIGH", "STATE"),
            "firing": True,
            "ttl": ttl,
        }
    )
    firing = await rm.firing_alerts(now=now)
    assert [(a["pk"], a["firing"]) for a in firing] == [
        ("ALERT#factory-a", True),
        ("ALERT#factory-b", True),
    ]
    assert len(await rm.index_members(keys.FLEET_FIRING)) == 2

    # resolved: the dispatcher writes the state with firing false (a whole-item put)
    await rm.put_item(
        fire_alert("factory-a", firing=False, version=2, ttl=ttl), expected={"version": 1}
    )
    assert [a["pk"] for a in await rm.firing_alerts(now=now)] == ["ALERT#factory-b"]
    assert len(await rm.index_members(keys.FLEET_FIRING)) == 1
    # and fires again
    await rm.put_item(
        fire_alert("factory-a", firing=True, version=3, ttl=ttl), expected={"version": 2}
    )
    assert len(await rm.firing_alerts(now=now)) == 2
    # an expired one (DynamoDB deletes late) is not open, though still indexed
    later = now + timedelta(hours=2)
    assert await rm.firing_alerts(now=later) == []
    assert len(await rm.index_members(keys.FLEET_FIRING)) == 2


async def test_replicas_share_the_refresh_tick_and_refresh_each_factory_once(foundation):
    """Two processor replicas tick in the same minute over a fleet whose every factory is due:
    they split the fleet index's shards between them (each claims a shard, refreshes it, takes
    the next free one), each factory is committed once, and a third replica ticking in that
    minute finds every shard taken."""
    rm = foundation.readmodel
    factories = [f"factory-s{i:03d}" for i in range(40)]
    for f in factories:  # last written an hour before the tick: every one is due
        assert await rm.replace_latest(
            f, {"factory_id": f, "updated_at": format_ts(T0)}, expected=None
        )
    published: list[Outgoing] = []

    async def publish(events: Sequence[Outgoing]) -> list[bool]:
        published.extend(events)
        return [True] * len(events)

    clock = FakeClock(T0 + timedelta(hours=1))

    def replica(owner: str) -> Refresher:
        processor = Processor(
            store=foundation.store,
            readmodel=rm,
            publish=publish,
            rules=load_rules(None),
            ttl=TtlSettings(),
            clock=clock,
        )
        return Refresher(
            processor, interval=timedelta(seconds=60), catchup=0, clock=clock, owner=owner
        )

    written = await asyncio.gather(replica("replica-a").tick(), replica("replica-b").tick())
    assert sum(written) == len(factories)
    assert all(n > 0 for n in written), written  # the tick was shared
    now = clock()
    for f in factories:
        history = await rm.history_states(f, T0, now + timedelta(seconds=1), now=now)
        assert len(history) == 1, f  # committed once
    assert await replica("replica-c").tick() == 0  # every shard of this minute is taken
