"""Migrated legacy datasets are sealed and audited like everything else under raw/: ``aegis
migrate`` (the ``datasets-processing`` preset: ``datasets/country=.../category=.../date=.../`` ->
the same folders under raw/) seals the partitions it copied into, ``aegis seal raw`` finds dataset
partitions of its days (and of every day with ``--all-days``), and ``aegis audit raw --prefix``
finds what was changed in them, on the S3 emulator.

Each test has its own bucket (``foundation_env``); the sealer's clock is injected. The tampering
goes through the plain S3 client, as an administrator's would (the break-glass role)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from aegis_contracts.seal import DatasetPartitionSeal, days_to_seal, read_document
from aegis_devstack.testing.cli import invoke_in_thread
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.migrate import Migrator
from aegis_storage_tools.rules import datasets_processing
from aegis_storage_tools.seal import DatasetPartition, Outcome, Sealer

pytestmark = pytest.mark.integration

US = "country=us/category=news/date=2026-01-28"
KR = "country=kr/category=sports/date=2026-01-29"
NOW = datetime(2026, 11, 30, 2, 30, tzinfo=UTC)
GRACE = timedelta(hours=2)


async def audit(*args: str) -> tuple[int, dict[str, Any]]:
    """``aegis audit raw ARGS --json`` (its own event loop, in a thread): exit code, document."""
    result = await invoke_in_thread("audit", "raw", *args, "--json")
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}: {result.output}") from None


async def seed_legacy(store: ObjectStore) -> None:
    """The legacy three-tier layout: crawled pages with their checkpoints, the legacy system's own
    manifest of a partition, and a processing/ output."""
    for i in range(1, 6):
        await store.put_bytes(f"datasets/{US}/raw_{i:04d}.json", json.dumps({"n": i}).encode())
        await store.put_bytes(f"datasets/{US}/raw_{i:04d}.json.success", b"")
    await store.put_bytes(f"datasets/{US}/raw_metadata.json", b'{"files": 5}')
    await store.put_bytes(f"datasets/{KR}/raw_0001.json", b'{"n": 1}')
    await store.put_bytes(f"processing/{US}/example.com/robots.txt", b"User-agent: *\n")


def migrator(store: ObjectStore) -> Migrator:
    return Migrator(
        store,
        datasets_processing(),
        sealer=Sealer(store, clock=lambda: NOW),
        seal_grace=GRACE,
    )


async def test_a_migrated_country_layout_is_sealed_audited_intact_and_tampering_is_found(
    foundation_env: Any,
) -> None:
    store: ObjectStore = foundation_env.store
    await seed_legacy(store)

    summary = await migrator(store).run()
    assert (summary.failed, summary.conflicts) == (0, 0)
    assert (summary.sealed, summary.seal_later) == ({"sealed": 2}, 0)
    # the legacy manifest went to prod/ with the checkpoints: raw_metadata.json is the sealer's
    assert await store.get_bytes(f"prod/{US}/raw_metadata.json") == b'{"files": 5}'
    seal_key = f"raw/{US}/raw_metadata.json"
    seal = read_document(seal_key, await store.get_bytes(seal_key))
    assert isinstance(seal, DatasetPartitionSeal)
    assert (seal.partition, seal.labels, seal.day) == (
        f"raw/{US}/",
        {"country": "us", "category": "news"},
        date(2026, 1, 28),
    )
    assert [e.key for e in seal.manifest] == [f"raw/{US}/raw_{i:04d}.json" for i in range(1, 6)]

    code, out = await audit("--prefix", "raw/", "--deep")
    assert code == 0, out
    assert [(p["prefix"], p["status"], p["objects"]) for p in out["partitions"]] == [
        (f"raw/{KR}/", "intact", 1),
        (f"raw/{US}/", "intact", 5),
    ]

    # an administrator rewrites one migrated object with bytes of the same length
    tampered = f"raw/{US}/raw_0003.json"
    await foundation_env.clients.s3.put_object(
        Bucket=store.bucket, Key=tampered, Body=json.dumps({"n": 8}).encode()
    )
    code, out = await audit("--prefix", "raw/country=us/", "--date", "2026-01-28", "--deep")
    (partition,) = out["partitions"]
    assert (code, partition["status"], partition["layout"]) == (4, "differs", "dataset")
    assert partition["changed"] == [{"key": tampered, "what": ["etag", "sha256"]}]
    assert partition["missing"] == partition["added"] == []
    # the other partition is untouched
    code, out = await audit("--prefix", f"raw/{KR}/")
    assert (code, [p["status"] for p in out["partitions"]]) == (0, ["intact"])


async def test_a_second_migration_into_a_sealed_partition_writes_a_supplement(
    foundation_env: Any,
) -> None:
    store: ObjectStore = foundation_env.store
    await seed_legacy(store)
    await migrator(store).run()
    await store.put_bytes(f"datasets/{US}/raw_0006.json", b'{"n": 6}')

    summary = await migrator(store).run()
    assert summary.sealed == {"supplement written": 1}
    supplement_key = f"raw/{US}/raw_metadata.late-0001.json"
    supplement = read_document(supplement_key, await store.get_bytes(supplement_key))
    assert [e.key for e in supplement.manifest] == [f"raw/{US}/raw_0006.json"]
    code, out = await audit("--prefix", f"raw/{US}/")
    assert (code, out["partitions"][0]["documents"], out["partitions"][0]["objects"]) == (0, 2, 6)


async def test_a_migration_into_a_day_not_over_leaves_it_to_the_daily_run(
    foundation_env: Any,
) -> None:
    store: ObjectStore = foundation_env.store
    today = f"country=us/category=news/date={NOW.date().isoformat()}"
    await store.put_bytes(f"datasets/{today}/raw_0001.json", b'{"n": 1}')

    summary = await migrator(store).run()
    assert (summary.sealed, summary.seal_later) == ({}, 1)
    code, _ = await audit("--prefix", f"raw/{today}/")
    assert code == 3  # not sealed yet

    # the daily run, once the day is over plus grace, finds it among its lookback days
    later = NOW + timedelta(days=1)
    results = await Sealer(store, clock=lambda: later).seal(days_to_seal(later, GRACE, 7))
    assert [(r.partition.prefix, r.outcome) for r in results if r.outcome is not Outcome.EMPTY] == [
        (f"raw/{today}/", Outcome.SEALED)
    ]
    code, _ = await audit("--prefix", f"raw/{today}/")
    assert code == 0


async def test_a_dataset_layout_left_in_place_is_sealed_with_all_days_and_audited(
    foundation_env: Any,
) -> None:
    """Seed-style data written straight under raw/ by an older system (never migrated): every
    due day of it is sealed by ``seal raw --all-days`` (here the library with its clock);
    folders that are no partition are left alone and the audit says nothing of them."""
    store: ObjectStore = foundation_env.store
    days = [date(2025, 12, 31), date(2026, 1, 1)]
    for day in days:
        await store.put_bytes(f"raw/country=jp/category=ir/date={day}/raw_0001.json", b"{}")
        await store.put_bytes(f"raw/country=jp/category=ir/date={day}/sub/page.html", b"<p/>")
    await store.put_bytes("raw/country=jp/readme.txt", b"no partition")
    await store.put_bytes("raw/country=jp/category=ir/notes/x.json", b"no partition either")

    results = await Sealer(store, clock=lambda: NOW).seal(
        None, under="raw/country=jp/", grace=GRACE
    )
    assert sorted((r.partition.prefix, r.outcome, r.objects) for r in results) == [
        (f"raw/country=jp/category=ir/date={day}/", Outcome.SEALED, 2) for day in days
    ]
    assert all(isinstance(r.partition, DatasetPartition) for r in results)
    code, out = await audit("--prefix", "raw/country=jp/")
    assert (code, [p["status"] for p in out["partitions"]]) == (0, ["intact", "intact"])
    # sealing again finds nothing new
    again = await Sealer(store, clock=lambda: NOW).seal(None, under="raw/country=jp/", grace=GRACE)
    assert {r.outcome for r in again} == {Outcome.NOTHING_NEW}
