"""The storage library against a real S3/DynamoDB emulator over HTTP (LocalStack or moto_server)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

from aegis_contracts import keys
from aegis_contracts.times import Timestamp, format_ts
from aegis_devstack.testing.builders import history_item
from aegis_devstack.testing.emulator import arequest_counts
from aegis_storage.encoding import encode
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.s3 import PutOutcome

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
RAW = keys.raw_key("factory-a", "factory_state", T0, "msg-00000001")


async def test_immutable_put_creates_then_accepts_the_same_bytes(foundation):
    store = foundation.store
    body = b'{"sensors": {"co_ppm": 3}}'
    first = await store.put_immutable(
        RAW, body, metadata={"topic": "aegis/factory-a/factory_state"}
    )
    again = await store.put_immutable(RAW, body)
    assert (first.outcome, again.outcome) == (PutOutcome.CREATED, PutOutcome.DUPLICATE)
    assert await store.get_bytes(RAW) == body
    head = await store.head(RAW)
    assert head is not None
    assert head["Metadata"] == {"topic": "aegis/factory-a/factory_state"}


async def test_immutable_put_refuses_to_change_an_existing_raw_object(foundation):
    store = foundation.store
    await store.put_immutable(RAW, b"first body")
    with pytest.raises(Conflict, match="different body"):
        await store.put_immutable(RAW, b"second body")
    assert await store.get_bytes(RAW) == b"first body"
    # not even a second version was written: versioning is on, so an overwrite would show
    versions = await foundation.clients.s3.list_object_versions(
        Bucket=foundation.bucket, Prefix=RAW
    )
    assert len(versions.get("Versions", [])) == 1


async def test_concurrent_immutable_puts_have_one_winner(foundation):
    bodies = [f"body-{i}".encode() for i in range(8)]
    results = await asyncio.gather(
        *(foundation.store.put_immutable(RAW, b) for b in bodies), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    assert len(created) == 1
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))
    stored = await foundation.store.get_bytes(RAW)
    assert stored == bodies[results.index(created[0])]


async def test_conditional_copy_never_overwrites_and_concurrent_copies_have_one_winner(foundation):
    store = foundation.store
    sources = [f"datasets/x/{i}.json" for i in range(6)]
    for i, key in enumerate(sources):
        await store.put_bytes(key, f"source-{i}".encode())
    infos = {i.key: i for i in [i async for i in store.list_objects("datasets/x/")]}
    await store.put_immutable(RAW, b"already here")
    with pytest.raises(Conflict):
        await store.copy(infos[sources[0]], RAW, if_absent=True)
    assert await store.get_bytes(RAW) == b"already here"
    dest = keys.raw_key("factory-b", "factory_state", T0, "msg-00000002")
    results = await asyncio.gather(
        *(store.copy(infos[k], dest, if_absent=True) for k in sources), return_exceptions=True
    )
    winners = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, Conflict) for r in results if isinstance(r, BaseException))
    assert await store.get_bytes(dest) == f"source-{winners[0]}".encode()


async def test_json_round_trip_listing_and_missing_objects(foundation):
    store = foundation.store
    key = keys.state_snapshot_key("factory-a", T0)
    await store.put_json(key, {"level": "NORMAL", "score": 1.5})
    assert await store.get_json(key) == {"level": "NORMAL", "score": 1.5}
    assert await store.list_keys(keys.processed_prefix("factory-a")) == [key]
    assert await store.head("processed/factory-a/nothing.json") is None
    with pytest.raises(NotFound):
        await store.get_bytes("processed/factory-a/nothing.json")


async def test_a_key_range_is_listed_from_its_start_and_never_past_its_end(
    foundation, aws_endpoint
):
    store = foundation.store
    prefix = keys.processed_hour_prefix("factory-a", "state_snapshot", T0)
    names = [keys.state_snapshot_key("factory-a", T0 + timedelta(seconds=i)) for i in range(1100)]
    slots = asyncio.Semaphore(32)

    async def put(key: str) -> None:
        async with slots:
            await store.put_bytes(key, b"{}")

    await asyncio.gather(*(put(k) for k in names))
    counted = await arequest_counts(aws_endpoint)

    async def lists() -> int:  # the LISTs the emulator answered since the puts
        return (await arequest_counts(aws_endpoint) - counted).count("s3", "ListObjectsV2")

    # the bounds are exclusive: a range from a key's name without ".json" includes that key
    late = await store.list_keys_between(
        prefix, names[1050].removesuffix(".json"), names[1060].removesuffix(".json")
    )
    assert late == names[1050:1060] and await lists() == 1  # started at 1050, not on page one
    early = await store.list_keys_between(prefix, names[0], names[20])
    assert early == names[1:20] and await lists() == 2  # one page, however many follow
    assert await store.list_keys_between(prefix, prefix, prefix + "~") == names
    assert await lists() == 4  # the whole prefix: two pages


async def test_delete_many_chunks_to_1000(foundation):
    store = foundation.store
    names = [f"tmp/{i:05d}.json" for i in range(1005)]
    sem = asyncio.Semaphore(32)

    async def put(k: str) -> None:
        async with sem:
            await store.put_bytes(k, b"{}")

    await asyncio.gather(*(put(k) for k in names))
    assert await store.delete_many(names) == []
    assert await store.list_keys("tmp/") == []


async def test_history_put_with_ttl_and_expired_items_are_not_returned(foundation):
    rm = foundation.readmodel
    now = T0 + timedelta(hours=1)
    live_ttl, expired_ttl = int((now + timedelta(hours=2)).timestamp()), int(now.timestamp()) - 1
    await rm.put_item(
        history_item("factory-a", {"risk": {"level": "NORMAL"}}, updated_at=T0, ttl=expired_ttl)
    )
    await rm.put_item(
        history_item(
            "factory-a",
            {"risk": {"level": "WARNING"}},
            updated_at=T0 + timedelta(minutes=1),
            ttl=live_ttl,
        )
    )
    items = await rm.history_states("factory-a", T0 - timedelta(hours=1), now, now=now)
    assert [i["risk"]["level"] for i in items] == ["WARNING"]
    expired_sk = keys.history_state_sk(T0)
    assert await rm.get_item(keys.factory_pk("factory-a"), expired_sk, now=now) is None
    # without a clock, the raw item is still there: DynamoDB deletes expired items late
    assert await rm.get_item(keys.factory_pk("factory-a"), expired_sk) is not None


async def test_history_keeps_numbers_numbers(foundation):
    rm = foundation.readmodel
    ttl = int((T0 + timedelta(hours=2)).timestamp())
    await rm.put_item(
        history_item("factory-a", {"sensors": {"co_ppm": 60.5, "count": 3}}, updated_at=T0, ttl=ttl)
    )
    (item,) = await rm.history_states("factory-a", T0, T0 + timedelta(seconds=1), now=T0)
    assert item["sensors"] == {"co_ppm": 60.5, "count": 3}
    raw = await foundation.clients.dynamodb.get_item(
        TableName=foundation.table, Key={"pk": {"S": item["pk"]}, "sk": {"S": item["sk"]}}
    )
    assert raw["Item"]["sensors"]["M"]["co_ppm"] == {"N": "60.5"}


async def test_an_item_encoded_once_is_written_under_two_keys_and_read_back_as_plain(foundation):
    rm = foundation.readmodel
    ttl = int((T0 + timedelta(hours=2)).timestamp())
    encoded = encode(
        {
            "pk": keys.factory_pk("factory-e"),
            "sk": keys.LATEST_SK,
            "factory_id": "factory-e",
            "sensors": {"co_ppm": 60.5, "count": 3.0},
            "at": T0,
        }
    )
    assert encoded.plain["sensors"] == {"co_ppm": 60.5, "count": 3}  # as a read returns it
    history_sk = keys.history_state_sk(T0)
    await rm.put_item(encoded.with_fields(sk=history_sk, ttl=ttl), if_absent=True)
    assert await rm.replace_latest("factory-e", encoded, expected=None)
    history = await rm.get_item(keys.factory_pk("factory-e"), history_sk)
    assert history == {**encoded.plain, "sk": history_sk, "ttl": ttl}
    assert await rm.get_latest("factory-e") == encoded.plain
    with pytest.raises(Conflict):
        await rm.put_item(encoded.with_fields(sk=history_sk, ttl=ttl), if_absent=True)


class _Group(BaseModel):
    co_ppm: float
    note: str | None = None


class _State(BaseModel):
    pk: str
    group: _Group | None = None
    other: _Group | None = None
    at: Timestamp


def test_a_model_encodes_as_its_json_dict_and_drop_none_leaves_out_top_level_nones_only():
    state = _State(pk="FACTORY#factory-g", group=_Group(co_ppm=24.0), at=T0)
    by_model = encode(state, drop_none=True)
    assert by_model == encode(state.model_dump(mode="json"), drop_none=True)
    # "other" is absent, the nested "note" stays null, 24.0 reads back as DynamoDB keeps it
    assert by_model.plain == {
        "pk": "FACTORY#factory-g",
        "group": {"co_ppm": 24, "note": None},
        "at": format_ts(T0),
    }
    assert by_model.attributes["group"] == {"M": {"co_ppm": {"N": "24"}, "note": {"NULL": True}}}
    assert encode(state).plain["other"] is None  # kept without drop_none


async def test_range_query_is_half_open_and_ordered(foundation):
    rm = foundation.readmodel
    ttl = int((T0 + timedelta(days=2)).timestamp())
    for minute in (0, 5, 10, 15):
        start = T0 + timedelta(minutes=minute)
        await rm.put_item(
            {
                "pk": keys.factory_pk("factory-a"),
                "sk": keys.graph_5m_sk(start),
                "minute": minute,
                "ttl": ttl,
            }
        )
    got = await rm.graph_buckets(
        "factory-a", T0 + timedelta(minutes=5), T0 + timedelta(minutes=15), now=T0
    )
    assert [i["minute"] for i in got] == [5, 10]
    newest = await rm.query_range(
        keys.factory_pk("factory-a"),
        keys.GRAPH_5M_PREFIX,
        T0,
        T0 + timedelta(hours=1),
        now=T0,
        descending=True,
        limit=1,
    )
    assert [i["minute"] for i in newest] == [15]


async def test_dashboard_windows_read_the_right_family_and_leave_expired_items_out(foundation):
    rm = foundation.readmodel
    now = T0 + timedelta(hours=30)
    pk = keys.factory_pk("factory-a")
    live, dead = (
        int((now + timedelta(hours=1)).timestamp()),
        int((now - timedelta(seconds=1)).timestamp()),
    )
    # HISTORY: one every 10 minutes over the last 2 h; one expired (DynamoDB deletes late)
    for minutes in range(0, 120, 10):
        at = now - timedelta(minutes=minutes)
        await rm.put_item({"pk": pk, "sk": keys.history_state_sk(at), "m": minutes, "ttl": live})
    await rm.put_item(
        {"pk": pk, "sk": keys.history_state_sk(now - timedelta(minutes=5)), "m": -1, "ttl": dead}
    )
    # GRAPH: one bucket per hour over the last 30 h; one expired
    for hours in range(30):
        start = keys.graph_bucket_start(now.replace(minute=0) - timedelta(hours=hours))
        await rm.put_item(
            {
                "pk": pk,
                "sk": keys.graph_5m_sk(start),
                "h": hours,
                "ttl": live if hours != 3 else dead,
            }
        )

    family, hour = await rm.factory_window("factory-a", "1h", now=now)
    assert family == keys.HISTORY_STATE_PREFIX
    assert [i["m"] for i in hour] == [60, 50, 40, 30, 20, 10, 0]  # oldest first, expired left out
    for window, hours in (("6h", 6), ("12h", 12), ("24h", 24)):
        family, buckets = await rm.factory_window("factory-a", window, now=now)
        assert family == keys.GRAPH_5M_PREFIX
        # [now - span, now]: the buckets of hours span..0 (on the hour), oldest first, without h=3
        assert [i["h"] for i in buckets] == [h for h in range(hours, -1, -1) if h != 3]
    assert await rm.factory_window("factory-z", "6h", now=now) == (keys.GRAPH_5M_PREFIX, [])
    with pytest.raises(ValueError, match="unknown window"):
        await rm.factory_window("factory-a", "2h", now=now)


async def test_an_unfinished_claim_is_taken_over_after_its_lease_and_a_finished_one_never(
    foundation,
):
    rm = foundation.readmodel
    ttl = int((T0 + timedelta(days=1)).timestamp())
    lease = timedelta(minutes=2)
    assert await rm.claim_window("graph-5m", T0, owner="a", now=T0, ttl=ttl, lease=lease)
    assert not await rm.claim_window(
        "graph-5m", T0, owner="b", now=T0 + timedelta(minutes=1), ttl=ttl, lease=lease
    )
    later = T0 + timedelta(minutes=3)
    wins = await asyncio.gather(
        *(
            rm.claim_window("graph-5m", T0, owner=f"r{i}", now=later, ttl=ttl, lease=lease)
            for i in range(4)
        )
    )
    assert wins.count(True) == 1
    winner = f"r{wins.index(True)}"
    assert not await rm.finish_window("graph-5m", T0, owner="a", now=later)  # "a" lost it
    assert await rm.finish_window("graph-5m", T0, owner=winner, now=later)
    much_later = T0 + timedelta(hours=1)
    assert not await rm.claim_window(
        "graph-5m", T0, owner="c", now=much_later, ttl=ttl, lease=lease
    )
    claims = await rm.window_claims("graph-5m", T0, T0 + timedelta(minutes=5), now=T0)
    assert claims[keys.claim_sk(T0)]["owner"] == winner and claims[keys.claim_sk(T0)]["done_at"]


async def test_window_claim_has_exactly_one_winner(foundation):
    rm = foundation.readmodel
    ttl = int((T0 + timedelta(days=1)).timestamp())
    # many rounds of many racing replicas: the emulator must keep conditional writes atomic
    # (moto_server alone does not under load; aegis_devstack.motoserver serializes its requests)
    for minute in range(20):
        window = T0 + timedelta(minutes=minute)
        wins = await asyncio.gather(
            *(rm.claim_window("refresh", window, owner=f"r{i}", now=T0, ttl=ttl) for i in range(16))
        )
        assert wins.count(True) == 1, f"window {minute}: {wins.count(True)} winners"
    assert not await rm.claim_window("refresh", T0, owner="late", now=T0, ttl=ttl)


async def test_a_lease_is_extended_only_by_its_owner_and_handed_over_by_ending_it_now(foundation):
    rm = foundation.readmodel
    pk, sk = "JOB#lease-test", keys.running_sk(0)
    assert await rm.acquire_lease(pk, sk, owner="a", now=T0, until=T0 + timedelta(seconds=30))
    later = T0 + timedelta(seconds=40)
    # a heartbeat keeps it: past the first end, nobody else may take it
    assert await rm.extend_lease(pk, sk, owner="a", until=later + timedelta(seconds=30))
    assert not await rm.acquire_lease(pk, sk, owner="b", now=later, until=later)
    assert not await rm.extend_lease(pk, sk, owner="b", until=later + timedelta(hours=1))
    # ended now (a replica stopping): another one takes it at once
    assert await rm.extend_lease(pk, sk, owner="a", until=later)
    after = later + timedelta(milliseconds=1)
    assert await rm.acquire_lease(pk, sk, owner="b", now=after, until=after + timedelta(seconds=30))
    assert not await rm.extend_lease(pk, sk, owner="a", until=after + timedelta(seconds=30))
    assert not await rm.extend_lease("JOB#lease-test", keys.running_sk(1), owner="a", until=after)


async def test_the_read_model_hands_each_announced_write_to_its_change_sink(foundation):
    from aegis_storage.items import Change, Put  # noqa: PLC0415
    from aegis_storage.readmodel import ReadModel  # noqa: PLC0415

    seen: list[Change] = []

    async def sink(change: Change) -> None:
        seen.append(change)

    model = ReadModel(foundation.readmodel._ddb, foundation.table, changes=sink)
    pk, sk = keys.alert_pk("factory-a"), keys.alert_sk("CRITICAL", "CO_HIGH", "RISK")
    await model.put_item({"pk": pk, "sk": sk, "firing": True, "version": 1})
    await model.put_item({"pk": pk, "sk": sk, "firing": True, "version": 1})  # no change
    await model.put_item({"pk": pk, "sk": sk, "firing": False, "version": 2})
    await model.put_item({"pk": pk, "sk": keys.alert_cursor_sk("RISK"), "x": 1})  # not announced
    old = {"pk": pk, "sk": sk, "firing": False, "version": 2}
    await model.put_items([Put({**old, "version": 3}, expected={"version": 2}, before=old)])
    await model.delete_item(pk, sk)
    await model.delete_item(pk, sk)  # nothing left to delete: nothing announced
    assert [(c.entity, c.event_name) for c in seen] == [
        ("alert", "INSERT"),
        ("alert", "MODIFY"),
        ("alert", "MODIFY"),
        ("alert", "REMOVE"),
    ]
    assert seen[1].old_image is not None and seen[1].old_image["firing"] is True
    assert seen[1].new_image is not None and seen[1].new_image["firing"] is False
    assert seen[2].old_image == old and seen[3].new_image is None
    assert seen[3].old_image is not None and seen[3].old_image["version"] == 3
