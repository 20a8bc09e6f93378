"""The daily report from the aggregator's 5-minute windows equals the report made object by
object, on a simulated day with incidents (one crossing a window, one crossing an hour), gaps,
infra and image records, an unparsable object, a missing hour, data that arrives late (within
its hour, and after its hour's windows ran) and a window object that is gone; and it reads a
small part of the objects the object-by-object report reads."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

from aegis_aggregator.aggregate import Aggregator
from aegis_contracts import keys
from aegis_contracts.keys import Dataset, ReportArtifact
from aegis_contracts.state import Level
from aegis_contracts.times import format_ts
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock, meta, seed_latest
from aegis_devstack.testing.emulator import RequestCounts, arequest_counts
from aegis_devstack.testing.storage import Foundation
from aegis_folds.folds import FoldParams, Hour, InputListing, fold_factory_hour
from aegis_folds.windows import MODELS
from aegis_reporter.day import DayWindow
from aegis_reporter.report import Reporter, TargetRun
from aegis_storage.s3 import ObjectInfo

pytestmark = pytest.mark.integration

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)  # KST 2026-11-30 00:00
AFTER = START + timedelta(days=1, minutes=40)
WINDOW = timedelta(minutes=5)
MINUTE = timedelta(minutes=1)
HOURS = (0, 1, 2, 3, 5)  # KST hour 04 has no data at all
PARAMS = FoldParams(gap_s=60.0, alpha=0.005)


class ObjectByObject(Reporter):
    """The report as it was made before windows: every object of the hour read and folded."""

    async def _fold(
        self,
        target: str,
        window: DayWindow,
        kst_hour: int,
        entries: list[tuple[str, ObjectInfo]],
        listing: InputListing,
        *,
        run: TargetRun,
    ) -> Hour:
        bodies = await asyncio.gather(*(self.store.get_bytes(o.key) for _, o in entries))
        run.objects_read += len(bodies)
        of: dict[str, list[Any]] = {d: [] for d in MODELS}
        skipped = 0
        for (dataset, _), body in zip(entries, bodies, strict=True):
            try:
                of[dataset].append(MODELS[dataset].model_validate_json(body))
            except ValueError:
                skipped += 1
        return fold_factory_hour(
            target=target,
            report_date=window.day,
            kst_hour=kst_hour,
            utc_hour=window.utc_hour(kst_hour),
            params=self.params,
            listing=listing,
            factory_states=of[Dataset.FACTORY_STATE.value],
            risks=of[Dataset.RISK_SCORE.value],
            infras=of[Dataset.INFRA_STATE.value],
            images=of[Dataset.IMAGE_SNAPSHOT.value],
            skipped=skipped,
        )


def level_at(minute: float) -> tuple[Level, float]:
    """A WARNING 01:12:30-01:17:30 (across a window boundary); a CRITICAL 02:57-03:06 inside a
    WARNING 02:50-03:10 (across the hour)."""
    if 72.5 <= minute < 77.5:
        return Level.WARNING, 50.0 + minute - 72.5
    if 177 <= minute < 186:
        return Level.CRITICAL, 210.0 + (minute - 177) * 7
    if 170 <= minute < 190:
        return Level.WARNING, 40.0 + minute % 7
    return Level.NORMAL, 4.0 + (minute % 5) / 3


def day_objects(fid: str) -> list[tuple[datetime, str, bytes]]:
    """(event time, key, body) of a day: factory_state + risk_score every 30 s, infra every
    minute, a camera image every 40 minutes, no data 01:31-01:34 (a gap across a window
    boundary) and none in hour 04."""
    out: list[tuple[datetime, str, bytes]] = []
    for h in HOURS:
        for s in range(0, 3600, 60):
            at = START + timedelta(hours=h, seconds=s, milliseconds=(s * 37) % 1000)
            minute = h * 60 + s / 60
            if 91 <= minute < 94:
                continue
            level, co = level_at(minute)
            mid = f"m-{int(at.timestamp() * 1000)}"
            sensors = {"co_ppm": co, "temperature_c": 20.0 + (s % 700) / 70 + 0.1}
            if h == 3:
                sensors["vibration_mm_s"] = 1.0 + (s % 90) / 1000  # a sensor of one hour only
            detections = (
                [{"label": "no_helmet", "confidence": 0.7 + (s % 20) / 100, "camera_id": "cam-2"}]
                if s % 600 == 0
                else []
            )
            reasons = (
                []
                if level is Level.NORMAL
                else [
                    {
                        "code": "CO_HIGH",
                        "severity": level.value,
                        "detail": f"co_ppm {co:g} high",
                        "value": co,
                        "threshold": 200.0 if level is Level.CRITICAL else 35.0,
                        "source": "sensors.co_ppm",
                    }
                ]
            )
            score = {Level.NORMAL: 0.0, Level.WARNING: 40.0, Level.CRITICAL: 85.0}[level]
            fs = {"meta": meta(mid, at), "sensors": sensors, "detections": detections}
            risk = {
                "meta": meta(mid, at),
                "risk": {"score": score + co / 100, "level": level, "reasons": reasons},
            }
            out.append((at, keys.processed_key(fid, Dataset.FACTORY_STATE, at, mid), _b(fs)))
            out.append((at, keys.processed_key(fid, Dataset.RISK_SCORE, at, mid), _b(risk)))
            if s % 60 == 15:
                imid = f"i-{int(at.timestamp() * 1000)}"
                infra = {
                    "meta": meta(imid, at),
                    "host": {"cpu_pct": 30 + s % 40, "temperature_c": 50.5 + s % 7},
                    "network": {"rtt_ms": 12.5 + s % 11},
                    "cameras": {"cam-1": "offline" if s % 900 == 15 else "online"},
                    "pipeline": {"detector": "degraded" if s % 1200 == 15 else "ok"},
                }
                out.append((at, keys.processed_key(fid, Dataset.INFRA_STATE, at, imid), _b(infra)))
            if s % 2400 == 0:
                gmid = f"g-{int(at.timestamp() * 1000)}"
                image = {
                    "meta": meta(gmid, at),
                    "camera_id": "cam-1",
                    "filename": f"{gmid}.jpg",
                    "content_type": "image/jpeg",
                    "size_bytes": 40_000 + s,
                    "captured_at": format_ts(at),
                    "s3_key": f"image_snapshot/factory_id={fid}/{gmid}.jpg",
                }
                out.append(
                    (at, keys.processed_key(fid, Dataset.IMAGE_SNAPSHOT, at, gmid), _b(image))
                )
    broken_at = START + timedelta(hours=5, minutes=7)
    out.append(
        (broken_at, keys.processed_key(fid, Dataset.FACTORY_STATE, broken_at, "m-broken"), b"{")
    )
    return out


def _b(value: Any) -> bytes:
    return json.dumps(value).encode()


async def put_all(foundation: Foundation, items: list[tuple[datetime, str, bytes]]) -> None:
    slots = asyncio.Semaphore(32)

    async def one(key: str, body: bytes) -> None:
        async with slots:
            await foundation.store.put_bytes(key, body)

    await asyncio.gather(*(one(k, b) for _, k, b in items))


async def artifacts(foundation: Foundation, target: str) -> dict[str, bytes]:
    prefix = keys.report_prefix(DAY, target)
    return {
        k[len(prefix) :]: await foundation.store.get_bytes(k)
        for k in await foundation.store.list_keys(prefix)
    }


async def test_the_report_from_windows_equals_the_report_object_by_object(
    foundation: Foundation, unique_id: str, aws_endpoint: str
) -> None:
    fid = unique_id
    hour2 = START + timedelta(hours=2)
    ttl = int(AFTER.timestamp()) + 86_400
    await seed_latest(foundation.readmodel, fid, {"factory_id": fid})
    objects = day_objects(fid)
    # late within its hour: 01:10-01:15 records land after the 01:15 and 01:20 windows ran;
    # late after its hour: 02:30-02:35 records land once hour 03 is being aggregated
    late_in_hour = [o for o in objects if START + timedelta(hours=1, minutes=10) <= o[0]]
    late_in_hour = [o for o in late_in_hour if o[0] < START + timedelta(hours=1, minutes=15)]
    late_in_hour = late_in_hour[-6:]
    late_after, later = (
        [
            o
            for o in objects
            if START + timedelta(hours=2, minutes=30)
            <= o[0]
            < START + timedelta(hours=2, minutes=35)
        ][i:j]
        for i, j in ((0, 5), (5, 6))
    )
    held = {k for _, k, _ in late_in_hour + late_after + later}
    on_time = [o for o in objects if o[1] not in held]

    clock = FakeClock(START)
    events: list[Any] = []
    racing: list[tuple[datetime, str, bytes]] = []

    async def record(subject: str, event: Any, *, msg_id: str) -> bool:
        events.append(event)
        if racing:  # an object of the hour comes late while its hour is being folded again
            await put_all(foundation, racing)
            await foundation.readmodel.mark_late(fid, hour2, now=clock.now, ttl=ttl)
            racing.clear()
        return False

    agg = Aggregator(
        readmodel=foundation.readmodel,
        store=foundation.store,
        publish=record,
        ttl=TtlSettings(),
        clock=clock,
        fold_params=PARAMS,
    )
    windows = [START + timedelta(hours=h) + i * WINDOW for h in range(6) for i in range(12)]
    for start in windows:
        await put_all(foundation, [o for o in on_time if start <= o[0] < start + WINDOW])
        if start == START + timedelta(hours=1, minutes=25):
            await put_all(foundation, late_in_hour)
        if start == START + timedelta(hours=3, minutes=10):
            await put_all(foundation, late_after)
        clock.now = start + WINDOW + timedelta(seconds=20)
        await agg.run_window(start, [fid], now=clock.now)

    # the late objects of 01:10 were folded into their own window by a later run of the hour
    w110 = await foundation.store.get_json(
        keys.processed_agg_key(fid, START + timedelta(hours=1, minutes=10))
    )
    inputs = {e["key"] for e in w110["report"]["inputs"]}
    assert {k for _, k, _ in late_in_hour} <= inputs
    # those of 02:30 arrived after hour 02's windows ran: no window has them yet
    w230 = await foundation.store.get_json(
        keys.processed_agg_key(fid, START + timedelta(hours=2, minutes=30))
    )
    assert not {k for _, k, _ in late_after} & {e["key"] for e in w230["report"]["inputs"]}
    # the processor marked hour 02 when it wrote them; the aggregator's next tick folds the hour
    # again. One more comes late while it does: the marker stays, and the tick after folds it
    await foundation.readmodel.mark_late(fid, hour2, now=clock.now, ttl=ttl)
    racing.extend(later)
    (first,) = await agg.fold_late(clock.now)
    assert (first.hour, first.keys, first.cleared) == (
        hour2,
        [keys.processed_agg_key(fid, hour2 + timedelta(minutes=30))],
        False,
    )
    (second,) = await agg.fold_late(clock.now)
    assert second.cleared
    assert await agg.fold_late(clock.now) == []
    w230 = await foundation.store.get_json(keys.processed_agg_key(fid, hour2 + 30 * MINUTE))
    assert {k for _, k, _ in late_after + later} <= {e["key"] for e in w230["report"]["inputs"]}
    assert "stats" in w230  # the window's statistics were kept
    # and one window object is gone
    await foundation.store.delete_many(
        [keys.processed_agg_key(fid, START + timedelta(hours=3, minutes=40))]
    )

    async def report(kind: type[Reporter]) -> tuple[TargetRun, RequestCounts, dict[str, bytes]]:
        before = await arequest_counts(aws_endpoint)
        (run,) = await kind(
            store=foundation.store,
            readmodel=foundation.readmodel,
            publish=record,
            clock=FakeClock(AFTER),
            gap_s=PARAMS.gap_s,
            alpha=PARAMS.alpha,
        ).run_day(DAY, [fid])
        return run, await arequest_counts(aws_endpoint) - before, await artifacts(foundation, fid)

    from_windows, windows_requests, made_from_windows = await report(Reporter)
    await foundation.store.delete_many(
        list(await foundation.store.list_keys(keys.report_prefix(DAY, fid)))
    )

    by_object, object_requests, made_by_object = await report(ObjectByObject)

    # the same report: every artifact byte for byte, but the timings of the metadata
    assert sorted(made_from_windows) == sorted(made_by_object)
    metadata = ReportArtifact.METADATA.value
    for name in made_by_object:
        if name != metadata:
            assert made_from_windows[name] == made_by_object[name], name
    meta_w, meta_o = (json.loads(m[metadata]) for m in (made_from_windows, made_by_object))
    assert meta_w["inputs"] == meta_o["inputs"]
    summary = json.loads(made_by_object[ReportArtifact.FACTORY_SUMMARY.value])
    assert [i["level"] for i in summary["incidents"]] == ["WARNING", "CRITICAL"]
    assert summary["completeness"]["missing_hours"] == [4, *range(6, 24)]
    assert summary["completeness"]["skipped_objects"] == 1
    assert any(g["duration_s"] > 60 for g in summary["completeness"]["gaps"])

    # what each read: the windows' report only the objects of the window whose object is gone
    # (03:40; the late ones were folded again); the other, every object
    total = len(objects)
    assert by_object.objects_read == total
    gone = START + timedelta(hours=3, minutes=40)
    assert from_windows.objects_read == sum(1 for o in objects if gone <= o[0] < gone + WINDOW)
    assert from_windows.windows_read >= 12 * len(HOURS) - 1
    gets_w = windows_requests.count("s3", "GetObject")
    gets_o = object_requests.count("s3", "GetObject")
    print(
        f"\nreport of a factory-day: {total} objects; object by object {gets_o} GETs, "
        f"{object_requests.total('s3')} S3 requests; from windows {gets_w} GETs "
        f"({from_windows.objects_read} objects, {from_windows.windows_read} windows), "
        f"{windows_requests.total('s3')} S3 requests"
    )
    assert gets_w * 5 < gets_o
