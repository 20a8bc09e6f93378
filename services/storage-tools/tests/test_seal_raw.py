"""``aegis seal raw`` and ``aegis audit raw`` against the S3 emulator, on raw objects written the
way ingest writes them (its own decision, ``admit``, then ``put_immutable`` with its metadata).

Each test has its own bucket (``foundation``); the clock of the sealer is injected. The
administrator's changes go through the plain S3 client, as they would on AWS (the break-glass
role: the bucket policy refuses them to every service)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.archive import Archive, admit
from aegis_contracts.ids import SourceType
from aegis_contracts.seal import NO_SCHEMA_VERSION, Change, RawPartitionSeal, read_document
from aegis_devstack.testing.cli import invoke_in_thread
from aegis_storage.s3 import ObjectStore
from aegis_storage_tools.audit import Auditor, AuditStatus, exit_code
from aegis_storage_tools.replay import replay
from aegis_storage_tools.seal import Outcome, RawPartition, Sealer

pytestmark = pytest.mark.integration

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 30, tzinfo=UTC)
SEALED_AT = datetime(2026, 12, 1, 2, 30, tzinfo=UTC)
FS, INFRA = SourceType.FACTORY_STATE, SourceType.INFRA_STATE


def clock(at: datetime = SEALED_AT) -> Any:
    return lambda: at


async def ingest(
    store: ObjectStore,
    factory: str,
    source: SourceType,
    received_at: datetime,
    n: int,
    *,
    version: str | None = "1.0",
) -> tuple[str, bytes]:
    """One message archived as ingest archives it; its key and bytes."""
    body: dict[str, Any] = {"message_id": f"m-{factory}-{source.value[:5]}-{n:04d}", "n": n}
    if version is not None:
        body["schema_version"] = version
    payload = json.dumps(body).encode()
    decision = admit(
        f"aegis/{factory}/{source.value}", payload, received_at, 1, bucket=store.bucket
    )
    assert isinstance(decision, Archive)
    await store.put_immutable(decision.key, payload, metadata=decision.metadata)
    return decision.key, payload


async def document(store: ObjectStore, key: str) -> RawPartitionSeal:
    return read_document(key, await store.get_bytes(key))


async def versions(store: ObjectStore, key: str) -> list[tuple[str, str]]:
    resp = await store._s3.list_object_versions(Bucket=store.bucket, Prefix=key)
    return [(v["VersionId"], v["ETag"]) for v in resp.get("Versions", []) if v["Key"] == key]


def outcomes(results: Any) -> dict[tuple[str, str], Outcome]:
    return {
        (r.partition.source_type.value, r.partition.day.isoformat()): r.outcome for r in results
    }


async def test_a_day_is_sealed_once_and_late_arrivals_go_into_a_supplement(
    foundation: Any, unique_id: str
) -> None:
    store: ObjectStore = foundation.store
    f = f"f-{unique_id}"
    written: dict[str, bytes] = {}
    arrivals = [START + timedelta(minutes=97 * i, milliseconds=i) for i in range(12)]
    arrivals[-1] = START + timedelta(days=1, milliseconds=-1)  # the day's last millisecond
    for i, at in enumerate(arrivals):
        version = {0: "1.1", 1: None}.get(i, "1.0")
        key, payload = await ingest(store, f, FS, at, i, version=version)
        written[key] = payload
    infra = dict([await ingest(store, f, INFRA, START + timedelta(hours=h), h) for h in (1, 2)])
    await ingest(store, f, FS, START + timedelta(days=1), 99)  # the next day: not this seal's
    await store.put_bytes("raw/Not_A_Factory/x.json", b"{}")  # a stray prefix, left alone

    sealer = Sealer(store, clock=clock(), concurrency=4)
    results = await sealer.seal([DAY], [f])
    assert outcomes(results) == {
        ("factory_state", "2026-11-30"): Outcome.SEALED,
        ("infra_state", "2026-11-30"): Outcome.SEALED,
    }
    seal_key = keys.raw_metadata_key(f, FS, DAY)
    seal = await document(store, seal_key)
    assert (seal.factory_id, seal.source_type, seal.day, seal.supplement) == (f, FS, DAY, 0)
    assert seal.sealed_at == SEALED_AT
    assert seal.message_count == 12 == len(seal.manifest)
    assert seal.total_bytes == sum(len(b) for b in written.values())
    assert (seal.first_arrival, seal.last_arrival) == (
        arrivals[0],
        START + timedelta(days=1, milliseconds=-1),
    )
    assert seal.schema_versions == {"1.0": 10, "1.1": 1, NO_SCHEMA_VERSION: 1}
    listed = {o.key: o async for o in store.list_objects(keys.raw_day_prefix(f, FS, DAY))}
    for entry in seal.manifest:
        assert entry.sha256 == hashlib.sha256(written[entry.key]).hexdigest()
        assert entry.size_bytes == len(written[entry.key])
        assert f'"{entry.etag}"' == listed[entry.key].etag
    assert [e.key for e in seal.manifest] == sorted(written)
    assert (await document(store, keys.raw_metadata_key(f, INFRA, DAY))).message_count == len(infra)

    # sealing again finds the seal and writes nothing
    before = await versions(store, seal_key)
    again = await Sealer(store, clock=clock(SEALED_AT + timedelta(days=1))).seal([DAY], [f])
    assert set(outcomes(again).values()) == {Outcome.NOTHING_NEW}
    assert await versions(store, seal_key) == before and len(before) == 1

    # a late arrival (a redelivery, a migration) is recorded beside the seal, never in it
    late_key, late_body = await ingest(store, f, FS, START + timedelta(hours=23), 500)
    late = await Sealer(store, clock=clock(SEALED_AT + timedelta(hours=1))).seal([DAY], [f])
    assert outcomes(late) == {
        ("factory_state", "2026-11-30"): Outcome.SUPPLEMENT,
        ("infra_state", "2026-11-30"): Outcome.NOTHING_NEW,
    }
    supplement = await document(store, keys.raw_metadata_late_key(f, FS, DAY, 1))
    assert [e.key for e in supplement.manifest] == [late_key]
    assert supplement.manifest[0].sha256 == hashlib.sha256(late_body).hexdigest()
    assert (supplement.supplement, supplement.message_count) == (1, 1)
    assert supplement.first_arrival == supplement.last_arrival == START + timedelta(hours=23)
    assert await versions(store, seal_key) == before
    last = await Sealer(store, clock=clock(SEALED_AT + timedelta(hours=2))).seal([DAY], [f])
    assert set(outcomes(last).values()) == {Outcome.NOTHING_NEW}

    # replay still reads messages only: the seal and its supplement are no messages
    summary = await replay(
        store, None, factory_id=f, sources=[FS], start=START, end=START + timedelta(days=1)
    )
    assert (summary.found, summary.skipped, summary.failed) == (13, 0, 0)


async def test_two_sealers_at_once_leave_one_seal(foundation: Any, unique_id: str) -> None:
    store: ObjectStore = foundation.store
    f = f"f-{unique_id}"
    for i in range(20):
        await ingest(store, f, FS, START + timedelta(minutes=i), i)
    part = RawPartition(f, FS, DAY)
    first, second = await asyncio.gather(
        Sealer(store, clock=clock()).partition(part),
        Sealer(store, clock=clock(SEALED_AT + timedelta(seconds=1))).partition(part),
    )
    assert {first.outcome, second.outcome} == {Outcome.SEALED, Outcome.ALREADY_SEALED}
    winner = first if first.outcome is Outcome.SEALED else second
    assert winner.objects == 20
    assert len(await versions(store, keys.raw_metadata_key(f, FS, DAY))) == 1


async def cli(*args: str) -> tuple[int, Any]:
    """An ``aegis`` command (its own event loop, in a thread); its exit code and JSON output."""
    result = await invoke_in_thread(*args, "--json")
    try:
        return result.exit_code, json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"exit {result.exit_code}: {result.output}") from None


async def test_audit_names_what_was_deleted_added_and_changed(
    foundation: Any, unique_id: str, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: ObjectStore = foundation.store
    s3 = foundation.clients.s3
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", aws_endpoint)
    monkeypatch.setenv("AEGIS_BUCKET", store.bucket)
    f = f"f-{unique_id}"
    written = [(await ingest(store, f, FS, START + timedelta(hours=i), i))[0] for i in range(6)]
    await ingest(store, f, FS, START + timedelta(days=1, hours=1), 50)  # 1 Dec: never sealed

    code, out = await cli("seal", "raw", "--date", "2026-11-30", "--factory", f)
    assert code == 0, out
    assert [(p["outcome"], p["objects"]) for p in out["partitions"]] == [("sealed", 6)]
    text = await invoke_in_thread("audit", "raw", "--factory", f, "--date", "2026-11-30")
    assert (text.exit_code, text.stdout.split()[:2]) == (
        0,
        ["intact", keys.raw_day_prefix(f, FS, DAY)],
    )
    auditor, deep = Auditor(store), Auditor(store, deep=True)

    # a late arrival is "added" until the next seal takes it into a supplement
    late, _ = await ingest(store, f, FS, START + timedelta(hours=22), 60)
    (audit,) = await auditor.audit(f, DAY)
    assert (audit.status, audit.diff and audit.diff.added) == (AuditStatus.DIFFERS, [late])
    await Sealer(store, clock=clock()).seal([DAY], [f])
    (audit,) = await deep.audit(f, DAY)
    assert (audit.status, audit.documents, audit.objects) == (AuditStatus.INTACT, 2, 7)

    # an administrator deletes one object, adds one and rewrites one (longer)
    gone, altered = written[1], written[2]
    added = keys.raw_key(f, FS, START + timedelta(hours=3), "m-by-hand-0001")
    await s3.delete_object(Bucket=store.bucket, Key=gone)
    await s3.put_object(Bucket=store.bucket, Key=added, Body=b'{"forged":true}')
    await s3.put_object(Bucket=store.bucket, Key=altered, Body=b'{"n": 2, "extra": "bytes"}')
    code, out = await cli("audit", "raw", "--factory", f, "--date", "2026-11-30")
    (partition,) = out["partitions"]
    assert (code, out["exit_code"], partition["status"]) == (4, 4, "differs")
    assert partition["missing"] == [gone]
    assert partition["added"] == [added]
    assert partition["changed"] == [{"key": altered, "what": ["size", "etag"]}]

    # the same length, other bytes: the listing sees a new ETag, --deep the bytes themselves
    same_size = written[4]
    original = await store.get_bytes(same_size)
    await s3.put_object(Bucket=store.bucket, Key=same_size, Body=original.replace(b"4", b"7"))
    (audit,) = await auditor.audit(f, DAY, [FS])
    assert audit.diff is not None and Change(same_size, ("etag",)) in audit.diff.changed
    text = await invoke_in_thread("audit", "raw", "--factory", f, "--date", "2026-11-30", "--deep")
    assert text.exit_code == 4
    assert f"missing {gone}" in text.stdout and f"added   {added}" in text.stdout
    assert f"changed {altered} (size, etag, sha256)" in text.stdout
    assert f"changed {same_size} (etag, sha256)" in text.stdout

    # a day with objects but no seal, and a day with nothing at all
    code, out = await cli("audit", "raw", "--factory", f, "--date", "2026-12-01")
    assert (code, [p["status"] for p in out["partitions"]]) == (3, ["not sealed"])
    assert await auditor.audit(f, date(2026, 11, 1)) == []
    assert exit_code([]) == 3


async def test_a_day_that_is_not_over_plus_grace_is_refused(
    foundation: Any, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AEGIS_AWS_ENDPOINT_URL", aws_endpoint)
    monkeypatch.setenv("AEGIS_BUCKET", foundation.bucket)
    today = datetime.now(UTC).date().isoformat()
    result = await invoke_in_thread("seal", "raw", "--date", today)
    assert result.exit_code == 2 and "not over" in result.output
    result = await invoke_in_thread("seal", "raw", "--date", "30/11/2026")
    assert result.exit_code == 2
