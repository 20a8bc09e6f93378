"""One contract for the object calls of a message's processing, run against S3 (the emulator;
integration) and the in-memory store (no server): the same answers, the same refusals."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from aegis_storage.errors import Conflict, NotFound
from aegis_storage.objects import MemoryObjects, Objects
from aegis_storage.s3 import PutOutcome, to_json_bytes

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("s3", marks=pytest.mark.integration)])
def objects(request: pytest.FixtureRequest) -> Objects:
    if request.param == "memory":
        return MemoryObjects()
    store: Objects = request.getfixturevalue("foundation").store
    return store


def md5_etag(body: bytes) -> str:
    return '"' + hashlib.md5(body, usedforsecurity=False).hexdigest() + '"'


async def test_a_key_nobody_wrote_is_not_found(objects: Objects) -> None:
    with pytest.raises(NotFound):
        await objects.get_bytes("processed/f/none.json")
    with pytest.raises(NotFound):
        await objects.get_json("processed/f/none.json")
    assert not await objects.exists("processed/f/none.json")


async def test_a_put_overwrites_and_reads_back_with_s3s_etag(objects: Objects) -> None:
    first = await objects.put_bytes("processed/f/a.json", b'{"v":1}')
    second = await objects.put_bytes("processed/f/a.json", b'{"v":2}')
    assert (first.outcome, first.etag, first.size_bytes) == (
        PutOutcome.CREATED,
        md5_etag(b'{"v":1}'),
        7,
    )
    assert second.etag == md5_etag(b'{"v":2}')
    assert await objects.get_bytes("processed/f/a.json") == b'{"v":2}'
    assert await objects.exists("processed/f/a.json")


async def test_put_json_writes_the_values_json_bytes(objects: Objects) -> None:
    value = {"name": "공장", "score": 24, "at": T0.isoformat()}
    put = await objects.put_json("processed/f/j.json", value)
    assert await objects.get_bytes("processed/f/j.json") == to_json_bytes(value)
    assert await objects.get_json("processed/f/j.json") == value
    assert put.size_bytes == len(to_json_bytes(value))


async def test_an_immutable_key_takes_the_same_bytes_again_and_refuses_others(
    objects: Objects,
) -> None:
    key = "raw/f/factory_state/yyyy=2026/mm=11/dd=30/m-1.json"
    created = await objects.put_immutable(key, b'{"m":1}')
    again = await objects.put_immutable(key, b'{"m":1}')
    assert (created.outcome, again.outcome) == (PutOutcome.CREATED, PutOutcome.DUPLICATE)
    with pytest.raises(Conflict):
        await objects.put_immutable(key, b'{"m":2}')
    assert await objects.get_bytes(key) == b'{"m":1}'


async def test_created_announces_the_put_in_this_bucket(objects: Objects) -> None:
    put = await objects.put_bytes("processed/f/c.json", b"{}")
    event = objects.created(put, producer="processor", at=T0, replayed=True)
    assert (event.bucket, event.key, event.size_bytes, event.etag) == (
        objects.bucket,
        "processed/f/c.json",
        2,
        md5_etag(b"{}"),
    )
    assert (event.producer, event.created_at, event.replayed) == ("processor", T0, True)


async def test_a_listing_names_the_keys_under_a_prefix_in_key_order(objects: Objects) -> None:
    for key in ("incidents/b/2.json", "incidents/a/1.json", "incidents/b/1.json", "other/1.json"):
        await objects.put_bytes(key, b"{}")
    assert await objects.list_keys("incidents/b/") == ["incidents/b/1.json", "incidents/b/2.json"]
    assert await objects.list_keys("incidents/") == [
        "incidents/a/1.json",
        "incidents/b/1.json",
        "incidents/b/2.json",
    ]
    assert await objects.list_keys("none/") == []


async def test_a_listing_between_two_keys_leaves_out_both_ends(objects: Objects) -> None:
    names = [f"processed/a/{i:02d}.json" for i in range(6)]
    for key in [*reversed(names), "processed/b/00.json", "other/00.json"]:
        await objects.put_bytes(key, b"{}")
    assert await objects.list_keys_between("processed/a/", names[1], names[4]) == names[2:4]
    # from before the prefix to past it: the prefix's keys alone
    assert await objects.list_keys_between("processed/a/", "processed/", "processed/~") == names
    assert await objects.list_keys_between("processed/a/", names[5], "processed/~") == []


async def test_a_listing_of_objects_gives_each_ones_size_and_etag(objects: Objects) -> None:
    bodies = {"processed/a/2.json": b'{"n": 2}', "processed/a/1.json": b"{}"}
    puts = {key: await objects.put_bytes(key, body) for key, body in bodies.items()}
    await objects.put_bytes("processed/b/1.json", b"{}")
    listed = [info async for info in objects.list_objects("processed/a/")]
    assert [(i.key, i.size_bytes, i.etag) for i in listed] == [
        (key, len(bodies[key]), puts[key].etag) for key in sorted(bodies)
    ]
