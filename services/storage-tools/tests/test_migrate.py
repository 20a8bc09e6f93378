"""``aegis migrate`` against the S3 emulator: the legacy datasets/ + processing/ layout moved
onto raw/ + prod/.

Each test has its own bucket (``foundation``); tens of objects, one 6 MiB object for the
multipart path (the threshold lowered to 5 MiB, moto's smallest part)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectInfo, ObjectStore
from aegis_storage_tools.migrate import CopyOptions, Journal, Migrator, PurgeFigures, plan
from aegis_storage_tools.rules import datasets_processing

pytestmark = pytest.mark.integration

D = "country=us/category=news/date=2026-01-28"
MIB = 1024 * 1024


def legacy_objects() -> dict[str, tuple[bytes, str, dict[str, str]]]:
    """key -> (body, content type, metadata): datasets/ with .success markers, processing/, prod/."""
    objs: dict[str, tuple[bytes, str, dict[str, str]]] = {}
    for i in range(1, 11):
        name = f"raw_{i:04d}.json"
        objs[f"datasets/{D}/{name}"] = (
            json.dumps({"n": i}).encode(),
            "application/json",
            {"source": "crawler", "n": str(i)},
        )
        objs[f"datasets/{D}/{name}.success"] = (b"", "application/octet-stream", {})
    for site in ("example.com", "example.org"):
        base = f"processing/{D}/{site}"
        objs[f"{base}/domain_metadata.json"] = (
            b'{"site":"%s"}' % site.encode(),
            "application/json",
            {"stage": "silver"},
        )
        objs[f"{base}/robots.txt"] = (b"User-agent: *\nDisallow:\n", "text/plain", {})
        objs[f"{base}/sitemap.xml"] = (b"<urlset/>", "application/xml", {"gz": "no"})
    objs[f"prod/{D}/final/summary.json"] = (b'{"final":true}', "application/json", {})
    return objs


def expected_after(objs: dict[str, tuple[bytes, str, dict[str, str]]]) -> dict[str, Any]:
    rules = datasets_processing()
    out = {}
    for key, value in objs.items():
        from aegis_storage_tools.rules import Move, map_key  # noqa: PLC0415

        mapped = map_key(key, rules)
        out[mapped.dest if isinstance(mapped, Move) else key] = value
    return out


async def seed(store: ObjectStore, objs: dict[str, tuple[bytes, str, dict[str, str]]]) -> None:
    for key, (body, ctype, meta) in objs.items():
        await store.put_bytes(key, body, content_type=ctype, metadata=meta)


async def state(store: ObjectStore) -> dict[str, tuple[bytes, str, dict[str, str]]]:
    """Every object: body, content type, metadata."""
    out = {}
    for key in await store.list_keys(""):
        got = await store.get_object(key)
        out[key] = (got.body, got.content_type, got.metadata)
    return out


async def versions(store: ObjectStore) -> list[tuple[str, str]]:
    resp = await store._s3.list_object_versions(Bucket=store.bucket)
    return sorted(
        [(v["Key"], v["VersionId"]) for v in resp.get("Versions", [])]
        + [(m["Key"], m["VersionId"]) for m in resp.get("DeleteMarkers", [])]
    )


@pytest.fixture
async def legacy(foundation: Any) -> ObjectStore:
    await seed(foundation.store, legacy_objects())
    return foundation.store  # type: ignore[no-any-return]


def test_a_dry_run_changes_nothing(
    legacy: ObjectStore, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import asyncio  # noqa: PLC0415

    before = asyncio.run(_versions_via_new_client(aws_endpoint, legacy.bucket))
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", aws_endpoint)
    monkeypatch.setenv("AEGIS_BUCKET", legacy.bucket)
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(
        app,
        ["migrate", "plan", "--preset", "datasets-processing", "--out", str(out), "--no-progress"],
    )
    assert result.exit_code == 0, result.output
    planned = json.loads(out.read_text())
    as_json = CliRunner().invoke(
        app, ["migrate", "plan", "--preset", "datasets-processing", "--json", "--no-progress"]
    )
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == planned | {"exit_code": 0}  # stdout: the plan alone
    assert planned["rules"]["datasets"]["objects"] == 20  # 10 objects + 10 .success markers
    assert planned["rules"]["datasets"]["copy"] == 20
    assert planned["rules"]["processing"]["objects"] == 6
    assert planned["skipped"] == {}  # prod/ is no source: it stays as it is
    assert planned["conflicts"] == []
    assert asyncio.run(_versions_via_new_client(aws_endpoint, legacy.bucket)) == before


async def _versions_via_new_client(endpoint: str, bucket: str) -> list[tuple[str, str]]:
    from aegis_storage.clients import AwsConfig, open_clients  # noqa: PLC0415

    async with open_clients(AwsConfig(endpoint_url=endpoint)) as clients:
        return await versions(ObjectStore(clients, bucket))


async def test_copy_only_leaves_sources(legacy: ObjectStore, tmp_path: Path) -> None:
    objs = legacy_objects()
    summary = await Migrator(
        legacy, datasets_processing(), journal=Journal(tmp_path / "j.json")
    ).run(delete=False)
    assert (summary.copied, summary.verified, summary.deleted, summary.failed) == (26, 26, 0, 0)
    after = await state(legacy)
    for key, value in objs.items():
        assert after[key] == value  # every source still there, unchanged
    for key, value in expected_after(objs).items():
        assert after[key] == value


async def test_a_full_run_leaves_each_object_once_at_its_destination(
    legacy: ObjectStore, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.json"
    summary = await Migrator(legacy, datasets_processing(), journal=Journal(journal)).run()
    assert (summary.copied, summary.verified, summary.deleted, summary.conflicts) == (26, 26, 26, 0)
    assert await state(legacy) == expected_after(legacy_objects())  # bytes, type, metadata
    doc = json.loads(journal.read_text())
    assert {e["state"] for e in doc["objects"].values() if e.get("dest")} == {"deleted"}
    assert doc["runs"][0]["summary"]["deleted"] == 26
    again = await Migrator(legacy, datasets_processing(), journal=Journal(journal)).run()
    assert (again.planned, again.copied, again.deleted) == (0, 0, 0)  # nothing twice
    assert len(json.loads(journal.read_text())["runs"]) == 2


async def test_an_interrupted_run_then_a_re_run_ends_as_a_clean_run(
    legacy: ObjectStore, foundation: Any, tmp_path: Path
) -> None:
    # the clean run, in a bucket of its own
    clean = ObjectStore(foundation.clients, f"{legacy.bucket}-clean")
    await foundation.clients.s3.create_bucket(
        Bucket=clean.bucket, CreateBucketConfiguration={"LocationConstraint": "ap-south-1"}
    )
    await seed(clean, legacy_objects())
    await Migrator(clean, datasets_processing()).run()

    calls = 0
    real_copy = legacy.copy

    async def crashing_copy(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 9:
            raise RuntimeError("injected crash in the middle of the copies")
        return await real_copy(*args, **kwargs)

    journal = tmp_path / "journal.json"
    legacy.copy = crashing_copy  # type: ignore[method-assign]
    with pytest.raises(ExceptionGroup):
        await Migrator(
            legacy,
            datasets_processing(),
            journal=Journal(journal),
            options=CopyOptions(concurrency=4),
        ).run()
    legacy.copy = real_copy  # type: ignore[method-assign]
    interrupted = json.loads(journal.read_text())
    assert 0 < sum(e.get("state") == "copied" for e in interrupted["objects"].values()) < 26
    assert not any(e.get("state") == "deleted" for e in interrupted["objects"].values())

    rerun = await Migrator(legacy, datasets_processing(), journal=Journal(journal)).run()
    assert rerun.present >= 1 and rerun.copied + rerun.present == 26 and rerun.failed == 0
    assert await state(legacy) == await state(clean)


async def test_a_conflicting_destination_under_raw_is_reported_and_left_untouched(
    legacy: ObjectStore, tmp_path: Path
) -> None:
    taken = f"raw/{D}/raw_0003.json"
    await legacy.put_bytes(taken, b'{"someone":"else"}', metadata={"owner": "other"})
    before = await legacy.get_object(taken)
    the_plan = await plan(legacy, datasets_processing())
    assert [(c.move.source, c.move.dest) for c in the_plan.conflicts] == [
        (f"datasets/{D}/raw_0003.json", taken)
    ]
    summary = await Migrator(
        legacy, datasets_processing(), journal=Journal(tmp_path / "j.json")
    ).run()
    assert summary.conflicts == 1 and summary.deleted == 25
    after = await legacy.get_object(taken)
    assert (after.body, after.metadata, after.etag) == (before.body, before.metadata, before.etag)
    assert await legacy.exists(f"datasets/{D}/raw_0003.json")  # the source is kept
    entry = json.loads((tmp_path / "j.json").read_text())["objects"][f"datasets/{D}/raw_0003.json"]
    assert entry["state"] == "conflict" and "another body" in entry["detail"]


async def test_a_destination_that_appears_during_the_run_is_not_overwritten(
    legacy: ObjectStore,
) -> None:
    # written after the plan's listing, right before the copy: the conditional copy is refused
    taken = f"raw/{D}/raw_0005.json"
    real_copy = legacy.copy

    async def copy_after_a_rival(source: ObjectInfo, dest: str, **options: Any) -> Any:
        if dest == taken:
            await legacy.put_bytes(taken, b"rival")
        return await real_copy(source, dest, **options)

    legacy.copy = copy_after_a_rival  # type: ignore[method-assign]
    summary = await Migrator(legacy, datasets_processing()).run()
    assert summary.conflicts == 1
    assert await legacy.get_bytes(taken) == b"rival"
    assert await legacy.exists(f"datasets/{D}/raw_0005.json")


async def test_multipart_copy_above_the_threshold_keeps_bytes_type_and_metadata(
    foundation: Any,
) -> None:
    store: ObjectStore = foundation.store
    body = bytes(range(256)) * (6 * MIB // 256) + b"tail"
    await store.put_bytes(
        f"datasets/{D}/big.bin", body, content_type="application/x-big", metadata={"k": "v"}
    )
    options = CopyOptions(multipart_threshold=5 * MIB, part_bytes=5 * MIB)
    summary = await Migrator(store, datasets_processing(), options=options).run()
    assert (summary.copied, summary.verified, summary.deleted) == (1, 1, 1)
    got = await store.get_object(f"raw/{D}/big.bin")
    assert got.body == body
    assert (got.content_type, got.metadata) == ("application/x-big", {"k": "v"})
    assert got.etag.endswith('-2"')  # two UploadPartCopy parts
    assert not await store.exists(f"datasets/{D}/big.bin")


# -- --purge-versions: the versions a move leaves behind in the versioned bucket ---------------


async def all_versions(store: ObjectStore) -> dict[tuple[str, str], tuple[int, bool]]:
    """(key, version id) -> (size, is a delete marker), for every version in the bucket."""
    return {
        (v.key, v.version_id): (v.size_bytes, v.delete_marker)
        async for v in store.list_versions("")
    }


async def test_purge_versions_frees_exactly_the_old_versions_of_the_moved_keys(
    foundation: Any, tmp_path: Path
) -> None:
    store: ObjectStore = foundation.store
    moved = [f"datasets/{D}/raw_0001.json", f"datasets/{D}/raw_0002.json"]
    moved.append(f"processing/{D}/example.com/robots.txt")
    for i, key in enumerate(moved):
        for n in range(3):  # three versions each, of different sizes: the last one is moved
            await store.put_bytes(key, json.dumps({"key": i, "n": n, "pad": "x" * 10 * n}).encode())
    # deleted before the run (a delete marker on top of its version): not moved, not touched
    await store.put_bytes(f"datasets/{D}/deleted_before.json", b"old")
    await store.delete_many([f"datasets/{D}/deleted_before.json"])
    # a conflict: its source is kept, and all its versions with it
    clash = f"datasets/{D}/raw_0003.json"
    await store.put_bytes(clash, b'{"mine":1}')
    await store.put_bytes(clash, b'{"mine":2}')
    await store.put_bytes(f"raw/{D}/raw_0003.json", b'{"theirs":1}')
    # history under the target prefixes: prod/'s own, and a copy made by an earlier run
    await store.put_bytes(f"prod/{D}/final/summary.json", b"v1")
    await store.put_bytes(f"prod/{D}/final/summary.json", b"v2")
    await store.put_bytes(f"raw/{D}/raw_0002.json", await store.get_bytes(moved[1]))
    before = await all_versions(store)
    old = {kv: value for kv, value in before.items() if kv[0] in moved}
    assert len(old) == 9

    the_plan = await plan(store, datasets_processing(), versions=True)
    freed = sum(size for size, _ in old.values())
    # 9 versions, and 3 delete markers: the ones the run's deletes will leave
    assert the_plan.purge == PurgeFigures(keys=3, versions=9, bytes=freed, markers=3)
    assert "would free 9 versions" in "\n".join(the_plan.notes())

    journal = tmp_path / "journal.json"
    summary = await Migrator(store, datasets_processing(), journal=Journal(journal)).run(
        purge_versions=True
    )
    assert (summary.copied, summary.present, summary.deleted, summary.conflicts) == (2, 1, 3, 1)
    assert summary.purged == the_plan.purge  # what the plan said, to the byte
    after = await all_versions(store)
    assert set(before) - set(after) == set(old)  # exactly those went, nothing else
    # what was added: the two copies, current at their destinations (the deletes' markers: purged)
    assert {key for key, _ in set(after) - set(before)} == {
        f"raw/{D}/raw_0001.json",
        f"prod/{D}/example.com/robots.txt",
    }
    for dest in (f"raw/{D}/raw_0001.json", f"raw/{D}/raw_0002.json"):
        assert json.loads(await store.get_bytes(dest))["n"] == 2  # the current version, moved
    assert await store.get_bytes(f"prod/{D}/final/summary.json") == b"v2"
    entries = json.loads(journal.read_text())["objects"]
    assert {k: entries[k]["purge"]["status"] for k in moved} == dict.fromkeys(moved, "done")
    assert sum(entries[k]["purge"]["bytes"] for k in moved) == freed

    again = await Migrator(store, datasets_processing(), journal=Journal(journal)).run(
        purge_versions=True
    )
    assert (again.planned, again.copied, again.deleted, again.conflicts) == (1, 0, 0, 1)
    assert again.purged == PurgeFigures()  # nothing purged twice
    assert await all_versions(store) == after


async def test_an_interrupted_purge_is_finished_by_the_next_run(
    foundation: Any, tmp_path: Path
) -> None:
    store: ObjectStore = foundation.store
    keys = [f"datasets/{D}/raw_{i:04d}.json" for i in (1, 2)]
    for key in keys:
        await store.put_bytes(key, b'{"n":1}')
        await store.put_bytes(key, b'{"n":22}')
    real = store.delete_versions

    async def dropped(versions: Any) -> Any:
        raise StorageError("injected: the connection dropped")

    journal = tmp_path / "journal.json"
    store.delete_versions = dropped  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="injected"):
        await Migrator(store, datasets_processing(), journal=Journal(journal)).run(
            purge_versions=True
        )
    store.delete_versions = real  # type: ignore[method-assign]
    entries = json.loads(journal.read_text())["objects"]
    assert {entries[k]["state"] for k in keys} == {"deleted"}
    assert {entries[k]["purge"]["status"] for k in keys} == {"pending"}
    assert len([kv for kv in await all_versions(store) if kv[0] in keys]) == 6  # 4 + 2 markers

    rerun = await Migrator(store, datasets_processing(), journal=Journal(journal)).run(
        purge_versions=True
    )
    assert rerun.planned == 0  # the moves were done: only the purge was left
    assert rerun.purged == PurgeFigures(keys=2, versions=4, bytes=2 * (7 + 8), markers=2)
    assert not [kv for kv in await all_versions(store) if kv[0] in keys]


async def test_a_key_written_again_after_the_move_keeps_its_versions(foundation: Any) -> None:
    """Between the run's delete and its purge a legacy writer puts one key again (live), and puts
    and deletes another (a delete marker on top again, but the newest version was never moved):
    both keep every version; the third key is purged."""
    store: ObjectStore = foundation.store
    keys = [f"datasets/{D}/raw_{i:04d}.json" for i in (1, 2, 3)]
    for key in keys:
        await store.put_bytes(key, b'{"n":1}')
    real_delete = store.delete_many

    async def then_a_legacy_writer(batch: Any) -> Any:
        failed = await real_delete(batch)
        await store.put_bytes(keys[0], b'{"late":true}')
        await store.put_bytes(keys[1], b'{"late":1}')
        await real_delete([keys[1]])
        return failed

    store.delete_many = then_a_legacy_writer  # type: ignore[method-assign]
    summary = await Migrator(store, datasets_processing()).run(purge_versions=True)
    assert summary.purged == PurgeFigures(keys=1, versions=1, bytes=7, markers=1, left=2)
    assert await store.get_bytes(keys[0]) == b'{"late":true}'  # current, and its history kept
    left = await all_versions(store)
    assert len([kv for kv in left if kv[0] == keys[0]]) == 3  # moved, marker, the late one
    assert len([kv for kv in left if kv[0] == keys[1]]) == 4  # moved, marker, late, marker
    assert not [kv for kv in left if kv[0] == keys[2]]


async def test_a_plan_whose_versions_cannot_be_listed_says_so_and_stands(
    legacy: ObjectStore,
) -> None:
    async def refused(prefix: str) -> Any:
        raise StorageError(f"list versions s3://{legacy.bucket}/{prefix}: AccessDenied")
        yield  # an async generator, as list_versions is

    legacy.list_versions = refused  # type: ignore[method-assign]
    the_plan = await plan(legacy, datasets_processing(), versions=True)
    assert the_plan.totals()["datasets"].copy == 20  # the plan itself stands
    assert the_plan.purge is None
    assert "purge-versions: unknown: listing the versions failed" in "\n".join(the_plan.notes())
    assert "AccessDenied" in the_plan.as_dict()["purge_versions_error"]
