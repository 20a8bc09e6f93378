"""The reporter over the real S3/DynamoDB emulator with an injected clock: a day with known
injected incidents against a brute-force computation, the KST boundary, missing hours,
byte-identical re-runs, resuming a killed run, the schedule across two replicas with catch-up,
cloud-infra, the Bedrock fallback and the CLI."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from nats.js.api import DeliverPolicy
from typer.testing import CliRunner

from aegis_cli.app import app as cli_app
from aegis_contracts import keys
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.events import ObjectCreated, SystemEvent
from aegis_contracts.keys import Dataset, ReportArtifact
from aegis_contracts.state import Level
from aegis_contracts.times import format_ts
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock, meta, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_reporter.generators import BedrockGenerator
from aegis_reporter.report import JOB, Reporter
from aegis_runtime.bus import create_broker, ensure_streams
from aegis_runtime.settings import AegisSettings
from aegis_storage.clients import AwsConfig
from aegis_storage.s3 import ObjectStore, PutResult

pytestmark = pytest.mark.integration

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)  # KST 2026-11-30 00:00
AFTER = START + timedelta(days=1, minutes=40)  # the report is due (00:30 KST next day)
CADENCE = 60
N, W, C = Level.NORMAL, Level.WARNING, Level.CRITICAL
SCORE = {N: 0.0, W: 40.0, C: 85.0}


@dataclass
class Events:
    sent: list[tuple[str, ObjectCreated | SystemEvent]] = field(default_factory=list)

    async def __call__(
        self, subject: str, event: ObjectCreated | SystemEvent, *, msg_id: str
    ) -> bool:
        self.sent.append((subject, event))
        return False


@dataclass
class Rec:
    at: datetime
    level: Level
    co: float
    temp: float


def scenario(cadence: int = CADENCE) -> list[Rec]:
    """KST hours 00, 01, 02, 03 and 05 at one record a minute (hour 04 and 06-23 missing):
    a WARNING 01:10:00-01:25:00 (CO 50-64); a CRITICAL 02:55:00-03:20:00 that crosses the hour
    (WARNING, CRITICAL 03:00:00-03:08:00 at CO up to 256, WARNING again); no data 05:20-05:30."""
    recs: list[Rec] = []
    for h in (0, 1, 2, 3, 5):
        for s in range(0, 3600, cadence):
            at = START + timedelta(hours=h, seconds=s)
            minute = h * 60 + s / 60
            if h == 5 and 20 * 60 < s < 30 * 60:
                continue
            level, co = N, 5.0 + (s % 300) / 100
            if 70 <= minute < 85:
                level, co = W, 50.0 + (minute - 70)
            elif 175 <= minute < 180 or 188 <= minute < 200:
                level, co = W, 40.0 + (minute % 10)
            elif 180 <= minute < 188:
                level, co = C, 200.0 + (minute - 180) * 8
            temp = 20.0 + ((h * 3600 + s) % 1000) / 100
            recs.append(Rec(at, level, co, temp))
    return recs


async def put_all(store: ObjectStore, items: list[tuple[str, bytes]]) -> None:
    slots = asyncio.Semaphore(32)

    async def one(key: str, body: bytes) -> None:
        async with slots:
            await store.put_bytes(key, body)

    await asyncio.gather(*(one(k, b) for k, b in items))


def factory_objects(fid: str, recs: list[Rec], tag: str = "m") -> list[tuple[str, bytes]]:
    items = []
    for i, r in enumerate(recs):
        mid = f"{tag}-{i:08d}-{int(r.at.timestamp() * 1000)}"
        fs = {"meta": meta(mid, r.at), "sensors": {"co_ppm": r.co, "temperature_c": r.temp}}
        reasons = []
        if r.level is not N:
            reasons.append(
                {
                    "code": "CO_HIGH",
                    "severity": r.level.value,
                    "detail": f"co_ppm {r.co:g} ppm >= {r.level.value.lower()} threshold",
                    "value": r.co,
                    "threshold": 200.0 if r.level is C else 35.0,
                }
            )
        risk = {
            "meta": meta(mid, r.at),
            "risk": {"score": SCORE[r.level] + r.co / 100, "level": r.level, "reasons": reasons},
        }
        items.append(
            (keys.processed_key(fid, Dataset.FACTORY_STATE, r.at, mid), json.dumps(fs).encode())
        )
        items.append(
            (keys.processed_key(fid, Dataset.RISK_SCORE, r.at, mid), json.dumps(risk).encode())
        )
    return items


def reporter(f: Foundation, clock: FakeClock, events: Events | None = None, **kw: Any) -> Reporter:
    return Reporter(
        store=kw.pop("store", f.store),
        readmodel=f.readmodel,
        publish=events or Events(),
        clock=clock,
        **kw,
    )


async def artifacts(store: ObjectStore, day: date, target: str) -> dict[str, bytes]:
    prefix = keys.report_prefix(day, target)
    return {k[len(prefix) :]: await store.get_bytes(k) for k in await store.list_keys(prefix)}


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


async def test_a_day_with_known_incidents_matches_brute_force_and_reruns_byte_identical(
    foundation: Foundation, unique_id: str
) -> None:
    recs = scenario()
    await put_all(foundation.store, factory_objects(unique_id, recs))
    events = Events()
    rep = reporter(foundation, FakeClock(AFTER), events)

    (run,) = await rep.run_day(DAY, [unique_id])
    assert run.hours_read == [0, 1, 2, 3, 5] and run.objects == 2 * len(recs)
    files = await artifacts(foundation.store, DAY, unique_id)
    assert sorted(files) == [
        "factory-daily-summary.json",
        "generation-metadata.json",
        *[f"intermediate/hourly/hh={h:02d}.json" for h in (0, 1, 2, 3, 5)],
        "report-context.json",
        "report.md",
    ]
    summary = json.loads(files["factory-daily-summary.json"])

    incidents = [
        (
            i["level"],
            i["start_kst"],
            i["end_kst"],
            i["duration_s"],
            [
                (c["start_kst"][11:23], c["end_kst"][11:23], c["duration_s"])
                for c in i["critical_periods"]
            ],
        )
        for i in summary["incidents"]
    ]
    assert incidents == [
        ("WARNING", "2026-11-30T01:10:00.000+09:00", "2026-11-30T01:25:00.000+09:00", 900.0, []),
        (
            "CRITICAL",
            "2026-11-30T02:55:00.000+09:00",
            "2026-11-30T03:20:00.000+09:00",
            1500.0,
            [("03:00:00.000", "03:08:00.000", 480.0)],
        ),
    ]
    assert [i["start_utc"] for i in summary["incidents"]] == [
        "2026-11-29T16:10:00.000Z",
        "2026-11-29T17:55:00.000Z",
    ]
    # brute force over the inputs
    crit = [r for r in recs if r.level is C]
    assert summary["incidents"][1]["peak_score"] == max(SCORE[C] + r.co / 100 for r in crit)
    assert summary["incidents"][1]["reasons"][0]["peak_value"] == max(r.co for r in crit)
    for name, values in (
        ("co_ppm", [r.co for r in recs]),
        ("temperature_c", [r.temp for r in recs]),
    ):
        s = summary["sensors"][name]
        assert s["count"] == len(values)
        assert s["min"] == min(values) and s["max"] == max(values)
        assert s["avg"] == pytest.approx(math.fsum(values) / len(values), rel=1e-12)
        exact = nearest_rank(values, 0.95)
        assert abs(s["p95"] - exact) <= 0.005 * exact
    assert summary["sensors"]["co_ppm"]["hours_out_of_range"] == [1, 2, 3]
    assert summary["sensors"]["co_ppm"]["records_out_of_range"] == sum(
        r.level is not N for r in recs
    )
    c = summary["completeness"]
    assert c["received"] == len(recs)
    assert c["cadence_s"] == CADENCE and c["expected"] == 86_400 // CADENCE
    assert c["missing_hours"] == [4, *range(6, 24)]
    assert [(g["start_kst"][11:19], g["end_kst"][11:19], g["kind"]) for g in c["gaps"]] == [
        ("03:59:00", "05:00:00", "offline"),
        ("05:20:00", "05:30:00", "offline"),
        ("05:59:00", "00:00:00", "offline"),
    ]
    timeline = {r["kst_hour"]: r for r in summary["timeline"]}
    assert timeline[4]["status"] == "missing" and "max_score" not in timeline[4]
    assert timeline[3]["worst_level"] == "CRITICAL"

    md = files["report.md"].decode()
    assert "**Status: CRITICAL**" in md
    assert "| 2 | CRITICAL | 02:55:00 (17:55:00Z) | 03:20:00 (18:20:00Z) | 25m 00s |" in md
    assert "missing KST hours (no objects at all): 04, 06, 07" in md
    meta_doc = json.loads(files["generation-metadata.json"])
    assert meta_doc["inputs"]["objects"] == 2 * len(recs)
    assert meta_doc["inputs"]["missing_hours"] == [4, *range(6, 24)]
    assert meta_doc["generator"] == {"name": "template", "version": "2"}
    assert [s for s, _ in events.sent] == [
        "aegis.objects.created.reports",
        "aegis.events.report_generated",
    ]
    assert events.sent[1][1].detail["worst_level"] == "CRITICAL"  # type: ignore[union-attr]

    # a second run: every hour reused, every byte the same but the timings
    rerun_clock = FakeClock(AFTER + timedelta(hours=3))
    (again,) = await reporter(foundation, rerun_clock).run_day(DAY, [unique_id])
    assert again.hours_read == [] and again.hours_reused == [0, 1, 2, 3, 5]
    files2 = await artifacts(foundation.store, DAY, unique_id)
    for name, body in files.items():
        if name != "generation-metadata.json":
            assert files2[name] == body, name
    first, second = (json.loads(x["generation-metadata.json"]) for x in (files, files2))
    assert first.pop("timings") != second.pop("timings")
    assert first == second


class FailingStore(ObjectStore):
    """Dies when it is about to write the intermediate of one KST hour (a killed run)."""

    def __init__(self, base: ObjectStore, fail_at: str) -> None:
        super().__init__(base._clients, base.bucket)
        self.fail_at = fail_at
        self.gets: list[str] = []

    async def put_bytes(self, key: str, body: bytes, **kw: Any) -> PutResult:
        if key.endswith(self.fail_at):
            raise RuntimeError("killed")
        return await super().put_bytes(key, body, **kw)

    async def get_bytes(self, key: str) -> bytes:
        self.gets.append(key)
        return await super().get_bytes(key)


async def test_a_run_killed_halfway_resumes_from_the_hourly_intermediates(
    foundation: Foundation, unique_id: str
) -> None:
    recs = [r for r in scenario(cadence=300) if r.at < START + timedelta(hours=4)]
    await put_all(foundation.store, factory_objects(unique_id, recs))
    clock = FakeClock(AFTER)
    dying = FailingStore(foundation.store, "hh=02.json")
    with pytest.raises(RuntimeError, match="killed"):
        await reporter(foundation, clock, store=dying).run_day(DAY, [unique_id])
    written = await artifacts(foundation.store, DAY, unique_id)
    assert sorted(written) == ["intermediate/hourly/hh=00.json", "intermediate/hourly/hh=01.json"]

    late_at = START + timedelta(hours=1, minutes=59, seconds=59)  # late data for hour 01
    late = factory_objects(unique_id, [Rec(late_at, N, 1.0, 99.0)], tag="late")
    await put_all(foundation.store, late)
    counting = FailingStore(foundation.store, "never")
    (run,) = await reporter(foundation, clock, store=counting).run_day(DAY, [unique_id])
    assert run.hours_reused == [0] and run.hours_read == [1, 2, 3]
    hour0 = keys.processed_hour_prefix(unique_id, Dataset.FACTORY_STATE, START)[: -len("hh=15/")]
    read_hours = {
        k.split("hh=")[1][:2] for k in counting.gets if k.startswith(f"processed/{unique_id}/")
    }
    assert "15" not in read_hours and read_hours == {"16", "17", "18"}, hour0
    summary = json.loads(
        await foundation.store.get_bytes(
            keys.report_key(DAY, unique_id, ReportArtifact.FACTORY_SUMMARY)
        )
    )
    assert summary["sensors"]["temperature_c"]["max"] == 99.0
    assert summary["completeness"]["received"] == len(recs) + 1


async def test_the_kst_day_boundary_and_today_so_far(
    foundation: Foundation, unique_id: str
) -> None:
    last_ms = START - timedelta(milliseconds=1)  # UTC 14:59:59.999 of D-1: KST D-1 23:59:59.999
    recs = [
        Rec(last_ms, N, 1.0, 11.0),
        Rec(START, N, 2.0, 22.0),
        Rec(START + timedelta(hours=2), W, 40.0, 33.0),
    ]
    await put_all(foundation.store, factory_objects(unique_id, recs))
    rep = reporter(foundation, FakeClock(START + timedelta(hours=2, minutes=30)))
    (today,) = await rep.run_day(DAY, [unique_id])
    (yesterday,) = await rep.run_day(DAY - timedelta(days=1), [unique_id])
    s_today = json.loads(
        await foundation.store.get_bytes(
            keys.report_key(DAY, unique_id, ReportArtifact.FACTORY_SUMMARY)
        )
    )
    s_prev = json.loads(
        await foundation.store.get_bytes(
            keys.report_key(DAY - timedelta(days=1), unique_id, ReportArtifact.FACTORY_SUMMARY)
        )
    )
    assert (
        s_prev["sensors"]["temperature_c"]["min"],
        s_prev["sensors"]["temperature_c"]["count"],
    ) == (11.0, 1)
    assert s_prev["completeness"]["missing_hours"] == list(range(23))
    assert s_today["sensors"]["temperature_c"]["count"] == 2
    assert s_today["completeness"]["missing_hours"] == [1]
    assert not s_today["complete_day"] and s_today["as_of_kst"] == "2026-11-30T02:30:00.000+09:00"
    assert [r["status"] for r in s_today["timeline"]][:4] == ["ok", "missing", "ok", "future"]
    (inc,) = s_today["incidents"]
    assert inc["ongoing"] and inc["duration_s"] == 1800.0
    assert today.hours_read == [0, 2] and yesterday.hours_read == [23]


async def test_each_day_is_claimed_once_across_replicas_and_missed_days_caught_up(
    foundation: Foundation, unique_id: str
) -> None:
    days = [DAY - timedelta(days=i) for i in (3, 2, 1, 0)]
    recs = [
        Rec(START - timedelta(days=2 - i) + timedelta(hours=1), N, 1.0, 20.0 + i) for i in range(3)
    ]
    await put_all(foundation.store, factory_objects(unique_id, recs))
    # the fleet the reporter reports on: the factories with a LATEST (the processor's first
    # message of a factory makes it)
    await seed_latest(foundation.readmodel, unique_id, {"factory_id": unique_id})
    clock = FakeClock(START + timedelta(days=1, minutes=20))  # 00:20 KST: DAY is not due yet
    a = reporter(foundation, clock, catchup_days=3, owner="replica-a")
    b = reporter(foundation, clock, catchup_days=3, owner="replica-b")
    ran_a, ran_b = await asyncio.gather(a.tick(), b.tick())
    # due at 00:20 KST: the three days before the previous one (DAY-3 has no data, nothing to write)
    assert sorted(ran_a + ran_b) == days[:3] and not set(ran_a) & set(ran_b)
    assert a.next_due(clock()) == START + timedelta(days=1, minutes=30)
    clock.advance(timedelta(minutes=15))  # 00:35 KST
    ran_a, ran_b = await asyncio.gather(a.tick(), b.tick())
    assert ran_a + ran_b == [DAY]
    assert await a.tick() == [] and await b.tick() == []
    claims = await foundation.readmodel.window_claims(
        JOB, START - timedelta(days=3), START + timedelta(days=1), now=clock()
    )
    assert sorted(claims) == [format_ts(START - timedelta(days=i)) for i in (3, 2, 1, 0)]
    assert all(c.get("done_at") for c in claims.values())
    for d in days[1:]:
        assert await foundation.store.exists(keys.report_key(d, unique_id, ReportArtifact.REPORT))


async def test_a_stop_during_a_catch_up_ends_it_after_the_day_being_written(
    foundation: Foundation, unique_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica told to stop while it writes the first of three missed days finishes that day
    and claims no other; the next replica writes the other two."""
    await seed_latest(foundation.readmodel, unique_id, {"factory_id": unique_id})
    clock = FakeClock(START + timedelta(days=1, minutes=20))
    a = reporter(foundation, clock, catchup_days=3, owner="replica-a")
    stop = asyncio.Event()
    run_day = a.run_day

    async def stopped_while_writing(day: date, targets: list[str] | None = None) -> object:
        stop.set()
        return await run_day(day, targets)

    monkeypatch.setattr(a, "run_day", stopped_while_writing)
    due = a.due_days(clock())
    assert len(due) == 3
    assert await a.tick(stop) == due[:1]
    b = reporter(foundation, clock, catchup_days=3, owner="replica-b")
    assert await b.tick() == due[1:]


def snapshot(
    tier: str, at: datetime, latency: float, *, drift: bool = False, down: bool = False
) -> CloudSnapshot:
    checks = [
        CloudCheck.ok("storage:s3", value=latency, unit="ms"),
        CloudCheck(name="service:processor", status=C, reason="SERVICE_DOWN", detail="no replica")
        if down
        else CloudCheck.ok("service:processor", value=1, unit="replicas"),
    ]
    if tier == "slow":
        checks.append(
            CloudCheck(
                name="foundation:bucket",
                status=W,
                reason="FOUNDATION_DRIFT",
                detail="versioning off",
            )
            if drift
            else CloudCheck.ok("foundation:bucket")
        )
    return CloudSnapshot.of(tier, at, checks)  # type: ignore[arg-type]


async def test_cloud_infra_availability_incidents_latencies_and_drift(
    foundation: Foundation,
) -> None:
    snaps = [
        snapshot("fast", START + timedelta(minutes=m), 10.0 + m, down=10 <= m < 13)
        for m in range(0, 20)
    ] + [snapshot("slow", START + timedelta(minutes=m), 5.0, drift=m == 5) for m in (0, 5, 10)]
    await put_all(
        foundation.store,
        [(keys.cloud_infra_key(s.tier, s.updated_at), s.model_dump_json().encode()) for s in snaps],
    )
    rep = reporter(foundation, FakeClock(AFTER))
    (run,) = await rep.run_day(DAY, [keys.CLOUD_INFRA_TARGET])
    body = await foundation.store.get_bytes(
        keys.report_key(DAY, "cloud-infra", ReportArtifact.CLOUD_SUMMARY)
    )
    s = json.loads(body)
    assert (
        s["availability"]["service:processor"]["availability"] == 20 / 23
    )  # fast 17 of 20 ok, slow 3 of 3
    assert s["availability"]["foundation:bucket"]["runs"] == 3
    assert s["worst_latencies"][0] == {
        "check": "storage:s3",
        "worst_ms": 29.0,
        "worst_kst": "2026-11-30T00:19:00.000+09:00",
    }
    assert [
        (i["tier"], i["level"], i["start_kst"][11:19], i["end_kst"][11:19]) for i in s["incidents"]
    ] == [
        ("slow", "WARNING", "00:05:00", "00:10:00"),
        ("fast", "CRITICAL", "00:10:00", "00:13:00"),
    ]
    assert s["drift"]["foundation:bucket"]["detail"] == "versioning off"
    md = (
        await foundation.store.get_bytes(keys.report_key(DAY, "cloud-infra", ReportArtifact.REPORT))
    ).decode()
    assert "## Availability per check" in md and "| service:processor | 23 | 87.0 % |" in md
    assert run.worst_level == "CRITICAL"


async def test_bedrock_failure_falls_back_to_the_template(
    foundation: Foundation, unique_id: str
) -> None:
    await put_all(foundation.store, factory_objects(unique_id, [Rec(START, N, 1.0, 20.0)]))
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: every call fails at once
    gen = BedrockGenerator(
        model_id="test-model", aws=AwsConfig(endpoint_url=dead, max_attempts=1, connect_timeout=1)
    )
    (run,) = await reporter(foundation, FakeClock(AFTER), generator=gen).run_day(DAY, [unique_id])
    assert run.generator == "template"
    meta_doc = json.loads(
        await foundation.store.get_bytes(keys.report_key(DAY, unique_id, ReportArtifact.METADATA))
    )
    assert meta_doc["generator"]["fallback_from"] == "bedrock"
    assert meta_doc["generator"]["model"] == "test-model"
    assert meta_doc["generator"]["name"] == "template" and meta_doc["generator"]["error"]
    md = await foundation.store.get_bytes(keys.report_key(DAY, unique_id, ReportArtifact.REPORT))
    assert md.startswith(f"# Daily report {unique_id}: 2026-11-30 (KST)".encode())


async def test_aegis_report_backfills_a_date_and_publishes_the_events(
    foundation: Foundation,
    unique_id: str,
    aws_endpoint: str,
    nats_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await put_all(
        foundation.store,
        factory_objects(unique_id, [Rec(START + timedelta(hours=3), W, 40.0, 20.0)]),
    )
    for name, value in {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
        "AEGIS_NATS_URL": nats_url,
    }.items():
        monkeypatch.setenv(name, value)
    broker = create_broker(AegisSettings(nats_url=nats_url), name="report-test-client")
    await ensure_streams(broker)
    js = broker.config.connection_state.stream
    sub = await js.subscribe("aegis.events.report_generated", deliver_policy=DeliverPolicy.NEW)
    try:
        runner = CliRunner()
        bad = await asyncio.to_thread(runner.invoke, cli_app, ["report", "--date", "2999-01-01"])
        assert bad.exit_code == 2
        result = await asyncio.to_thread(
            runner.invoke, cli_app, ["report", "--date", DAY.isoformat(), "--factory", unique_id]
        )
        assert result.exit_code == 0, result.output
        assert f"{unique_id}: WARNING, 1 incident(s)" in result.output
        event = SystemEvent.model_validate_json((await sub.next_msg(timeout=10)).data)
        assert event.kind == "report_generated"
        assert event.detail["key"] == keys.report_key(DAY, unique_id, ReportArtifact.REPORT)
    finally:
        await broker.stop()


async def test_aegis_report_backfills_a_range_of_dates_with_a_progress_bar(
    foundation: Foundation,
    unique_id: str,
    aws_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--from/--to: every date in order (inclusive), one JSON document on stdout, the bar on
    stderr; a date without data writes nothing and says so."""
    day2 = DAY + timedelta(days=2)
    await put_all(
        foundation.store,
        factory_objects(unique_id, [Rec(START + timedelta(hours=3), W, 40.0, 20.0)])
        + factory_objects(unique_id, [Rec(START + timedelta(days=2, hours=1), C, 220.0, 20.0)]),
    )
    for name, value in {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
    }.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    args = ["report", "--from", DAY.isoformat(), "--to", day2.isoformat(), "--factory", unique_id]
    result = await asyncio.to_thread(
        runner.invoke, cli_app, [*args, "--no-events", "--json", "--progress"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [d["date"] for d in doc["days"]] == ["2026-11-30", "2026-12-01", "2026-12-02"]
    runs = [d["targets"][0] for d in doc["days"]]
    assert [r["worst_level"] for r in runs] == ["WARNING", None, "CRITICAL"]
    assert runs[1]["report_key"] is None and doc["written"] == 2
    for run, day in ((runs[0], DAY), (runs[2], day2)):
        assert run["report_key"] == keys.report_key(day, unique_id, ReportArtifact.REPORT)
        assert await foundation.store.get_bytes(run["report_key"])
    assert "3/3" in result.stderr  # the bar, on stderr only

    # without --json: one line per date and target, then the summary
    text = await asyncio.to_thread(runner.invoke, cli_app, [*args, "--no-events"])
    assert text.exit_code == 0, text.output
    assert "2026-12-01  " + unique_id + ": no processed data that day" in text.stdout
    assert "report: 2 report(s) written for 2026-11-30 to 2026-12-02" in text.stdout

    for bad in (
        ["report", "--from", DAY.isoformat()],
        ["report", "--from", day2.isoformat(), "--to", DAY.isoformat()],
        ["report", "--from", DAY.isoformat(), "--to", day2.isoformat(), "--date", "2026-11-30"],
        ["report", "--from", "2024-01-01", "--to", "2026-01-01"],
        ["report", "--from", DAY.isoformat(), "--to", "2999-01-01"],
    ):
        refused = await asyncio.to_thread(runner.invoke, cli_app, bad)
        assert refused.exit_code == 2, (bad, refused.output)


async def test_a_simulated_day_reports_exactly_the_injected_incidents(
    foundation: Foundation, unique_id: str
) -> None:
    """The simulator's own model (gas leak and fire injected at known times) -> the processor's own
    normalization and risk -> processed/ objects -> the report; incidents and numbers against a
    brute-force computation over the same records."""
    from aegis_contracts.events import RawArchived  # noqa: PLC0415
    from aegis_contracts.ids import SourceType  # noqa: PLC0415
    from aegis_contracts.payloads import parse_device_message  # noqa: PLC0415
    from aegis_contracts.state import FactoryState, RiskRecord  # noqa: PLC0415
    from aegis_contracts.times import parse_ts, resolve_event_time  # noqa: PLC0415
    from aegis_processor.domain import message_risk, normalize  # noqa: PLC0415
    from aegis_processor.rules import load_rules  # noqa: PLC0415
    from aegis_simulator.domain import Fleet, parse_scenarios  # noqa: PLC0415

    fid = unique_id
    begin = START + timedelta(hours=2)  # KST 02:00
    fleet = Fleet(
        [fid],
        start=begin,
        seed=11,
        run_id="rep",
        scenarios=parse_scenarios([f"gas_leak@{fid}+600:300", f"fire@{fid}+1800:180"]),
        intervals={SourceType.FACTORY_STATE: 5.0},
        jitter=0.0,
    )
    rules = load_rules()
    records: list[tuple[FactoryState, RiskRecord]] = []
    now = begin
    while now < begin + timedelta(minutes=50):
        for emission in fleet.due(now):
            received = now + timedelta(milliseconds=40)
            message = parse_device_message(
                emission.source_type, emission.payload, topic_factory_id=fid
            )
            event = RawArchived(
                message_id=emission.message_id,
                factory_id=fid,
                source_type=emission.source_type,
                topic=emission.topic,
                bucket=foundation.bucket,
                key=keys.raw_key(fid, emission.source_type, received, emission.message_id),
                received_at=received,
                size_bytes=len(emission.payload),
                qos=1,
            )
            when = resolve_event_time(message.emitted_at, received)
            state = normalize(message, event, when)
            assert isinstance(state, FactoryState)
            records.append((state, RiskRecord(meta=state.meta, risk=message_risk(state, rules))))
        now += timedelta(seconds=1)
    objects = []
    for state, risk in records:
        at, mid = state.meta.event_time, state.meta.message_id
        objects.append(
            (
                keys.processed_key(fid, Dataset.FACTORY_STATE, at, mid),
                state.model_dump_json().encode(),
            )
        )
        objects.append(
            (keys.processed_key(fid, Dataset.RISK_SCORE, at, mid), risk.model_dump_json().encode())
        )
    await put_all(foundation.store, objects)

    (run,) = await reporter(foundation, FakeClock(AFTER)).run_day(DAY, [fid])
    assert run.objects == len(objects)
    summary = json.loads(
        (await artifacts(foundation.store, DAY, fid))["factory-daily-summary.json"]
    )

    # brute force: runs of consecutive records at WARNING or above, each ending at the first
    # record below it
    ordered = sorted(records, key=lambda r: (r[0].meta.event_time, r[0].meta.message_id))
    expected: list[tuple[str, datetime, datetime]] = []
    start_at: datetime | None = None
    worst = Level.NORMAL
    for state, risk in ordered:
        level = risk.risk.level
        if level is not Level.NORMAL:
            if start_at is None:
                start_at, worst = state.meta.event_time, level
            worst = Level.worst(worst, level)
        elif start_at is not None:
            expected.append((worst.value, start_at, state.meta.event_time))
            start_at = None
    assert start_at is None  # both scenarios are over before the data ends
    got = [(i["level"], i["start_utc"], i["end_utc"]) for i in summary["incidents"]]
    assert got == [(lvl, format_ts(s), format_ts(e)) for lvl, s, e in expected]
    # exactly the injected ones: the gas leak (600-900 s) and the fire (1800-1980 s)
    # the injected ones are exactly the incidents with a gas or fire reason (the simulator's
    # background also has short PPE detections, NO_HELMET_DETECTED, which are incidents too)
    injected = [
        i
        for i in summary["incidents"]
        if {r["code"] for r in i["reasons"]} & {"CO_HIGH", "FIRE_DETECTED"}
    ]
    assert all(
        {r["code"] for r in i["reasons"]} == {"NO_HELMET_DETECTED"}
        for i in summary["incidents"]
        if i not in injected
    )
    assert [i["level"] for i in injected] == ["WARNING", "CRITICAL"]
    gas, fire = ((parse_ts(i["start_utc"]), parse_ts(i["end_utc"])) for i in injected)
    # gas leak +600 s for 300 s (CO ramps up, so it crosses the threshold a little later)
    assert 600 <= (gas[0] - begin).total_seconds() < 900 < (gas[1] - begin).total_seconds() <= 910
    # fire +1800 s for 180 s: CRITICAL from its first message to the first one after it
    assert 1800 <= (fire[0] - begin).total_seconds() <= 1805
    assert 1980 <= (fire[1] - begin).total_seconds() <= 1985
    assert injected[1]["duration_s"] == (fire[1] - fire[0]).total_seconds()
    reasons = {r["code"] for i in summary["incidents"] for r in i["reasons"]}
    assert "FIRE_DETECTED" in reasons and any(
        code.startswith("CO") or "GAS" in code for code in reasons
    )
    kst = summary["incidents"][1]["start_kst"]
    assert kst.endswith("+09:00") and kst[11:13] == "02"
    values = [s.sensors["co_ppm"] for s, _ in ordered if "co_ppm" in s.sensors]
    co = summary["sensors"]["co_ppm"]
    assert co["count"] == len(values) and co["max"] == max(values) and co["min"] == min(values)
    assert co["avg"] == pytest.approx(math.fsum(values) / len(values), rel=1e-12)
    assert summary["completeness"]["received"] == len(records)
