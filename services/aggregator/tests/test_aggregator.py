"""The aggregator: window statistics against a brute-force reference (second by second, record by
record), then the service over the real S3/DynamoDB emulator with an injected clock: replicas,
catch-up after downtime, byte-identical re-runs, expired items left out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import nats
import pytest
from nats.js.api import DeliverPolicy
from typer.testing import CliRunner

from aegis_aggregator.aggregate import JOB, WINDOW, Aggregator, AggregatorTable, Source
from aegis_aggregator.app import AggregatorApp
from aegis_aggregator.cli import windows_between
from aegis_aggregator.settings import AggregatorSettings
from aegis_aggregator.stats import coverage, window_stats
from aegis_cli.app import app as cli_app
from aegis_contracts import keys
from aegis_contracts.events import ObjectCreated
from aegis_contracts.graph import WindowStats
from aegis_contracts.items import Graph5m, HistoryState
from aegis_contracts.subjects import change_subject
from aegis_contracts.times import floor_to, format_ts, parse_ts, utc_now
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock, meta, seed_latest
from aegis_devstack.testing.emulator import request_counts
from aegis_devstack.testing.storage import Foundation
from aegis_runtime.bus import create_broker, ensure_streams
from aegis_storage.memorytable import MemoryTable
from aegis_storage.objects import MemoryObjects, Objects
from aegis_storage.s3 import to_json_bytes

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


@dataclass
class Snap:
    """One snapshot: LATEST at ``at`` carrying the last factory and infra records."""

    at: datetime
    level: str = "NORMAL"
    score: float = 0.0
    reasons: list[str] = field(default_factory=list)
    fs_id: str | None = None
    fs_at: datetime | None = None
    sensors: dict[str, float] = field(default_factory=dict)
    detections: list[tuple[str, float]] = field(default_factory=list)
    infra_id: str | None = None
    infra_at: datetime | None = None
    host: dict[str, float] = field(default_factory=dict)
    rtt_ms: float | None = None
    cameras: dict[str, str] = field(default_factory=dict)
    pipeline: str = "OK"

    def item(self, factory_id: str = "factory-a", ttl: int | None = None) -> dict[str, Any]:
        """The HISTORY#STATE item; it lives a year past ``at`` unless ``ttl`` says otherwise."""
        if ttl is None:
            ttl = int((self.at + timedelta(days=365)).timestamp())
        item: dict[str, Any] = {
            "pk": keys.factory_pk(factory_id),
            "sk": keys.history_state_sk(self.at),
            "factory_id": factory_id,
            "updated_at": format_ts(self.at),
            "ttl": ttl,
            "risk": {
                "score": self.score,
                "level": self.level,
                "reasons": [
                    {"code": c, "severity": "WARNING", "detail": c.lower()} for c in self.reasons
                ],
            },
            "pipeline_status": {"status": self.pipeline, "checked_at": format_ts(self.at)},
        }
        if self.fs_id is not None:
            item["factory_state"] = {
                "meta": meta(self.fs_id, factory_id="factory-a", at=self.fs_at or self.at),
                "sensors": self.sensors,
                "model_version": "yolo-1",
                "detections": [
                    {"label": label, "confidence": conf, "camera_id": "cam-1"}
                    for label, conf in self.detections
                ],
            }
            item["last_factory_state_at"] = format_ts(self.fs_at or self.at)
        if self.infra_id is not None:
            item["infra_state"] = {
                "meta": meta(self.infra_id, factory_id="factory-a", at=self.infra_at or self.at),
                "host": self.host,
                "network": {} if self.rtt_ms is None else {"rtt_ms": self.rtt_ms},
                "cameras": self.cameras,
            }
        return item

    def state(self, factory_id: str = "factory-a") -> HistoryState:
        return HistoryState.model_validate(self.item(factory_id))


def brute_force(
    snaps: list[Snap], start: datetime, end: datetime, fresh_for_s: int = 60
) -> dict[str, Any]:
    """The window's statistics the slow, obvious way (snapshot times on whole seconds)."""
    inside = sorted((s for s in snaps if start <= s.at < end), key=lambda s: s.at)
    seconds = [start + timedelta(seconds=i) for i in range(int((end - start).total_seconds()))]
    records: dict[str, Snap] = {}
    infra: dict[str, Snap] = {}
    for s in inside:
        if s.fs_id is not None:
            records.setdefault(s.fs_id, s)
        if s.infra_id is not None:
            infra.setdefault(s.infra_id, s)
    ordered = sorted(records.values(), key=lambda s: (s.fs_at or s.at, s.fs_id))
    times = [s.fs_at or s.at for s in ordered]
    covered = sum(
        1 for t in seconds if any(r <= t < r + timedelta(seconds=fresh_for_s) for r in times)
    )

    at_level = {"NORMAL": 0, "WARNING": 0, "CRITICAL": 0}
    score_sum = 0.0
    for t in seconds:
        holding = [s for s in inside if s.at <= t]
        if holding:
            at_level[holding[-1].level] += 1
            score_sum += holding[-1].score
    held = sum(at_level.values())

    sensors: dict[str, list[float]] = {}
    labels: dict[str, list[float]] = {}
    for r in ordered:
        for name, value in r.sensors.items():
            sensors.setdefault(name, []).append(value)
        for label, conf in r.detections:
            labels.setdefault(label, []).append(conf)
    infra_ordered = sorted(infra.values(), key=lambda s: (s.infra_at or s.at, s.infra_id))
    figures: dict[str, list[float]] = {}
    cams_seen: dict[str, int] = {}
    cams_on: dict[str, int] = {}
    for r in infra_ordered:
        for name, value in {
            **r.host,
            **({"rtt_ms": r.rtt_ms} if r.rtt_ms is not None else {}),
        }.items():
            figures.setdefault(name, []).append(value)
        for cam, state in r.cameras.items():
            cams_seen[cam] = cams_seen.get(cam, 0) + 1
            cams_on[cam] = cams_on.get(cam, 0) + (state == "online")

    def series(values: list[float]) -> dict[str, float]:
        return {
            "count": len(values),
            "min": min(values),
            "max": max(values),
            "avg": statistics.fmean(values),
            "last": values[-1],
        }

    return {
        "samples": len(inside),
        "factory_records": len(ordered),
        "infra_records": len(infra_ordered),
        "coverage": covered / len(seconds),
        "sensors": {k: series(v) for k, v in sensors.items()},
        "detections": {k: {"count": len(v), "max_confidence": max(v)} for k, v in labels.items()},
        "risk": None
        if not inside
        else {
            "max_score": max(s.score for s in inside),
            "mean_score": score_sum / held if held else None,
            "worst_level": max(
                (s.level for s in inside), key=["NORMAL", "WARNING", "CRITICAL"].index
            ),
            "seconds_at_level": {k: float(v) for k, v in at_level.items()},
            "reasons": sorted({c for s in inside for c in s.reasons}),
        },
        "infra": {k: series(v) for k, v in figures.items()},
        "camera_online_ratio": sum(cams_on.values()) / sum(cams_seen.values())
        if cams_seen
        else None,
        "cameras": {c: cams_on[c] / n for c, n in cams_seen.items()},
        "pipeline_states": {
            p: sum(1 for s in inside if s.pipeline == p) for p in {s.pipeline for s in inside}
        },
    }


def comparable(stats: WindowStats | dict[str, Any]) -> dict[str, Any]:
    """The aggregator's output in the reference's shape (no window bounds or sample times)."""
    plain = stats.model_dump(mode="json") if isinstance(stats, WindowStats) else stats
    skip = {"window_start", "window_end", "first_sample_at", "last_sample_at"}
    return {k: v for k, v in plain.items() if k not in skip}


def assert_equal(got: WindowStats | dict[str, Any], want: dict[str, Any]) -> None:
    _nested(comparable(got), want)


def _nested(got: Any, want: Any, path: str = "") -> None:
    """pytest.approx does not recurse into nested dicts: compare leaf by leaf, naming the path."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{path}: {got!r} != {want!r}"
        for k in want:
            _nested(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9), f"{path}: {got!r} != {want!r}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


W0 = T0  # a window start (03:00:00Z)
W1 = W0 + WINDOW


def at(seconds: float, origin: datetime = W0) -> datetime:
    return origin + timedelta(seconds=seconds)


def recent_window() -> datetime:
    """A window start three hours before the real clock: for the operator's command, which runs
    on the real clock and writes windows that expire 48 hours after they end."""
    return floor_to(utc_now() - timedelta(hours=3), WINDOW)


def steady(
    start: float, stop: float, every: float = 5, *, factory: str = "a", origin: datetime = W0
) -> list[Snap]:
    """A factory publishing every ``every`` s from ``origin``: a factory_state snapshot per
    message, an infra snapshot every 30 s, a fire detection now and then, a CO rise to WARNING
    in the middle."""
    snaps: list[Snap] = []
    last_infra: tuple[str, datetime, dict[str, float], float, dict[str, str]] | None = None
    t, n = start, 0
    while t < stop:
        when = at(t, origin)
        co = 5 + (n % 7) * 3.5
        level = "WARNING" if co > 20 else "NORMAL"
        if n % 6 == 0:
            last_infra = (
                f"{factory}-infra-{n:05d}",
                when,
                {"cpu_pct": 20 + n % 9, "mem_pct": 40 + n % 4, "disk_pct": 71.5},
                3.0 + (n % 5) / 2,
                {"cam-1": "online", "cam-2": "offline" if n % 12 == 0 else "online"},
            )
        infra_id, infra_at, host, rtt, cams = last_infra or (None, None, {}, None, {})
        snaps.append(
            Snap(
                at=when + timedelta(milliseconds=0),
                level=level,
                score=co * 2,
                reasons=["CO_HIGH"] if level == "WARNING" else [],
                fs_id=f"{factory}-fs-{n:05d}",
                fs_at=when,
                sensors={
                    "temperature_c": 21 + (n % 3) / 4,
                    "co_ppm": co,
                    **({"weird_new_sensor": n} if n % 4 == 0 else {}),
                },
                detections=[("fire", 0.5 + (n % 5) / 10)] if n % 9 == 0 else [],
                infra_id=infra_id,
                infra_at=infra_at,
                host=host,
                rtt_ms=rtt,
                cameras=cams,
            )
        )
        t, n = t + every, n + 1
    return snaps


def test_a_steady_window_equals_the_brute_force_reference() -> None:
    snaps = steady(0, 300)
    got = window_stats([s.state() for s in snaps], W0, W1)
    assert got.samples == 60 and got.factory_records == 60 and got.infra_records == 10
    assert "weird_new_sensor" in got.sensors  # unknown sensors are kept and aggregated
    assert got.coverage == 1.0
    assert_equal(got, brute_force(snaps, W0, W1))


def test_an_empty_window_has_no_samples_and_no_coverage() -> None:
    got = window_stats([], W0, W1)
    assert got.samples == 0 and got.coverage == 0 and got.risk is None
    assert got.sensors == {} and got.camera_online_ratio is None
    assert_equal(got, brute_force([], W0, W1))


def test_one_sample_covers_the_freshness_span_and_holds_its_risk_to_the_end() -> None:
    snaps = [
        Snap(
            at=at(100),
            level="CRITICAL",
            score=90,
            reasons=["FIRE_DETECTED"],
            fs_id="only-one-1",
            sensors={"co_ppm": 7},
        )
    ]
    got = window_stats([s.state() for s in snaps], W0, W1)
    assert got.coverage == pytest.approx(60 / 300)
    assert got.risk is not None and got.risk.seconds_at_level["CRITICAL"] == 200
    assert got.sensors["co_ppm"].count == 1 and got.sensors["co_ppm"].last == 7
    assert_equal(got, brute_force(snaps, W0, W1))


def test_a_snapshot_exactly_at_the_start_is_in_and_one_exactly_at_the_end_is_out() -> None:
    snaps = [
        Snap(at=at(0), fs_id="edge-start-1", sensors={"co_ppm": 1}, score=10),
        Snap(at=at(150), fs_id="edge-middle", sensors={"co_ppm": 2}, score=20),
        Snap(at=at(300), fs_id="edge-end-01", sensors={"co_ppm": 99}, score=99, level="CRITICAL"),
        Snap(at=at(-0.001), fs_id="edge-before", sensors={"co_ppm": -5}),
    ]
    got = window_stats([s.state() for s in snaps], W0, W1)
    assert got.samples == 2 and got.first_sample_at == W0
    assert got.sensors["co_ppm"].max == 2 and got.risk is not None and got.risk.max_score == 20
    assert_equal(got, brute_force(snaps, W0, W1))


def test_a_record_repeated_in_many_snapshots_counts_once() -> None:
    # an infra message and refresh ticks re-snapshot the same factory_state
    snaps = [
        Snap(at=at(10), fs_id="same-record", sensors={"co_ppm": 3}),
        Snap(
            at=at(20),
            fs_id="same-record",
            sensors={"co_ppm": 3},
            infra_id="infra-0001",
            host={"cpu_pct": 50},
        ),
        Snap(
            at=at(80),
            fs_id="same-record",
            sensors={"co_ppm": 3},
            infra_id="infra-0001",
            host={"cpu_pct": 50},
            level="WARNING",
            score=40,
            reasons=["STALE_DATA"],
            pipeline="STALE",
        ),
    ]
    got = window_stats([s.state() for s in snaps], W0, W1)
    assert got.sensors["co_ppm"].count == 1 and got.infra["cpu_pct"].count == 1
    assert got.pipeline_states == {"OK": 2, "STALE": 1}
    assert_equal(got, brute_force(snaps, W0, W1))


def test_late_records_and_gaps_follow_their_event_times() -> None:
    snaps = steady(0, 60) + steady(200, 240, factory="b")
    # a record that arrived late: its snapshot is in the window, its event time 90 s before
    snaps.append(Snap(at=at(250), fs_id="late-record", fs_at=at(160), sensors={"co_ppm": 1}))
    got = window_stats([s.state() for s in snaps], W0, W1)
    assert 0 < got.coverage < 1
    assert_equal(got, brute_force(snaps, W0, W1))


def test_coverage_merges_overlapping_spans() -> None:
    spans = [at(0), at(10), at(200)]
    assert coverage(spans, W0, W1, timedelta(seconds=60)) == pytest.approx((70 + 60) / 300)
    assert coverage([at(290)], W0, W1, timedelta(seconds=60)) == pytest.approx(10 / 300)
    assert coverage([at(-30)], W0, W1, timedelta(seconds=60)) == pytest.approx(30 / 300)


# -- the service over the real emulator --------------------------------------------------------


@dataclass
class Recorder:
    """Stands in for the queue: what the aggregator announced, by object key."""

    events: list[tuple[str, ObjectCreated, str]] = field(default_factory=list)

    async def __call__(self, subject: str, event: ObjectCreated, *, msg_id: str) -> bool:
        self.events.append((subject, event, msg_id))
        return False

    def keys(self) -> list[str]:
        return [e.key for _, e, _ in self.events]


class Storage(Protocol):
    """A table and a bucket: a test's foundation on the emulator, or the in-memory twins."""

    @property
    def readmodel(self) -> AggregatorTable: ...

    @property
    def store(self) -> Objects: ...


@dataclass
class Twins:
    readmodel: MemoryTable = field(default_factory=MemoryTable)
    store: MemoryObjects = field(default_factory=MemoryObjects)


@pytest.fixture(params=["memory", pytest.param("emulator", marks=pytest.mark.integration)])
def site(request: pytest.FixtureRequest) -> Storage:
    """The in-memory table and bucket (a unit test), or a foundation on the emulator."""
    if request.param == "memory":
        return Twins()
    foundation: Foundation = request.getfixturevalue("foundation")
    return foundation


def aggregator(
    foundation: Storage, clock: FakeClock, recorder: Recorder, **kwargs: Any
) -> Aggregator:
    return Aggregator(
        readmodel=foundation.readmodel,
        store=foundation.store,
        publish=recorder,
        ttl=TtlSettings(),
        clock=clock,
        **kwargs,
    )


async def running_since(foundation: Storage, first: datetime) -> None:
    """Record that aggregators have run on this table since the window ``first`` (what the
    first tick on a fresh table records), so a tick may look back that far."""
    assert await foundation.readmodel.first_window(JOB, first, now=first) == first


async def seed(foundation: Storage, snaps: list[Snap], factory: str, **item: Any) -> None:
    for s in snaps:
        await foundation.readmodel.put_item({**s.item(factory), **item})
    if await foundation.readmodel.get_latest(factory) is None:
        await seed_latest(foundation.readmodel, factory, {"updated_at": format_ts(snaps[-1].at)})


async def seed_objects(
    foundation: Storage, snaps: list[Snap], factory: str, *, concurrency: int = 16
) -> None:
    """The state_snapshot objects of ``snaps``, as the processor writes them: the HISTORY item
    without ``ttl``, named by its updated_at."""
    slots = asyncio.Semaphore(concurrency)

    async def put(s: Snap) -> None:
        body = {k: v for k, v in s.item(factory).items() if k != "ttl"}
        async with slots:
            await foundation.store.put_json(keys.state_snapshot_key(factory, s.at), body)

    await asyncio.gather(*(put(s) for s in snaps))


async def test_a_window_is_written_as_graph_item_and_processed_agg_object(
    site: Storage,
) -> None:
    live = steady(0, 300)
    expired = [
        Snap(at=at(7), level="CRITICAL", score=100, fs_id="expired-1", sensors={"co_ppm": 999})
    ]
    await seed(site, live, "factory-a")
    await seed(site, expired, "factory-a", ttl=int((W0 + timedelta(minutes=6)).timestamp()))
    await running_since(site, W0)
    clock, recorder = FakeClock(W1 + timedelta(minutes=2)), Recorder()
    agg = aggregator(site, clock, recorder, catchup=WINDOW)

    runs = await agg.tick()

    assert [r.start for r in runs] == [W0]
    item = await site.readmodel.get_item(keys.factory_pk("factory-a"), keys.graph_5m_sk(W0))
    assert item is not None
    graph = Graph5m.model_validate(item)
    assert graph.bucket_start == W0 and graph.bucket_end == W1
    assert graph.ttl == int((W1 + timedelta(hours=48)).timestamp())
    # the expired snapshot (ttl passed at 03:06, now 03:07) is left out
    assert graph.stats.sensors["co_ppm"].max < 999
    assert_equal(graph.stats, brute_force(live, W0, W1))
    key = keys.processed_agg_key("factory-a", W0)
    assert key == "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=03/mm=00.json"
    body = await site.store.get_json(key)
    assert body["factory_id"] == "factory-a"
    assert WindowStats.model_validate(body["stats"]) == graph.stats
    assert recorder.keys() == [key]
    subject, event, _ = recorder.events[0]
    assert subject == "aegis.objects.created.metrics_5m" and event.producer == "aggregator"


async def test_two_replicas_produce_each_window_once(site: Storage) -> None:
    await seed(site, steady(0, 900), "factory-a")
    await seed(site, steady(0, 900, every=10, factory="b"), "factory-b")
    await running_since(site, W0 - timedelta(hours=1))
    clock, recorder = FakeClock(W0 + timedelta(minutes=15, seconds=20)), Recorder()
    one = aggregator(site, clock, recorder, catchup=6 * WINDOW, owner="replica-one")
    two = aggregator(site, clock, recorder, catchup=6 * WINDOW, owner="replica-two")

    runs = await asyncio.gather(one.tick(), two.tick(), one.tick())

    windows = sorted(r.start for rs in runs for r in rs)
    assert windows == [W0 + i * WINDOW - 3 * WINDOW for i in range(6)]  # 6 windows, each once
    written = recorder.keys()
    assert len(written) == len(set(written)) == 12  # 6 windows x 2 factories
    # and a later tick by either replica finds nothing left to do
    assert await one.tick() == [] and await two.tick() == []


async def test_a_restart_after_30_minutes_fills_the_six_missed_windows_oldest_first(
    site: Storage,
) -> None:
    await seed(site, steady(-300, 2400, every=15), "factory-a")
    clock, recorder = FakeClock(W0 + timedelta(seconds=20)), Recorder()
    before = aggregator(site, clock, recorder)
    # the first tick on this table: windows already due then are never looked back at
    assert await before.tick() == []

    clock.advance(timedelta(minutes=30))  # down for 30 minutes, a new replica starts
    after = aggregator(site, clock, recorder)  # default catch-up (24 h)
    runs = await after.tick()

    assert [r.start for r in runs] == [W0 + i * WINDOW for i in range(6)]
    assert all(r.factories == 1 and r.samples == 20 for r in runs)
    for r in runs:
        item = await site.readmodel.get_item(
            keys.factory_pk("factory-a"), keys.graph_5m_sk(r.start)
        )
        assert item is not None and item["stats"]["samples"] == 20


async def test_a_rerun_is_byte_identical(site: Storage) -> None:
    await seed(site, steady(0, 300, every=3), "factory-a")
    await running_since(site, W0)
    clock, recorder = FakeClock(W1 + timedelta(seconds=30)), Recorder()
    agg = aggregator(site, clock, recorder, catchup=WINDOW)
    await agg.tick()
    key = keys.processed_agg_key("factory-a", W0)
    first_body = await site.store.get_bytes(key)
    first_item = await site.readmodel.get_item(keys.factory_pk("factory-a"), keys.graph_5m_sk(W0))

    clock.advance(timedelta(minutes=40))  # an operator re-runs the window later
    await agg.run_window(W0, ["factory-a"], now=clock())

    assert await site.store.get_bytes(key) == first_body
    again = await site.readmodel.get_item(keys.factory_pk("factory-a"), keys.graph_5m_sk(W0))
    assert again == first_item


async def test_a_claim_left_unfinished_by_a_dead_replica_is_taken_over_after_the_lease(
    site: Storage,
) -> None:
    await seed(site, steady(0, 300), "factory-a")
    clock, recorder = FakeClock(W1 + timedelta(seconds=30)), Recorder()
    # a replica claimed the window and died before writing anything
    assert await site.readmodel.claim_window(
        "graph-5m", W0, owner="dead", now=clock(), ttl=2_000_000_000
    )
    agg = aggregator(site, clock, recorder, catchup=WINDOW, lease=timedelta(minutes=2))
    assert await agg.tick() == []  # inside the lease: not yet
    clock.advance(timedelta(minutes=3))
    assert [r.start for r in await agg.tick()] == [W0]
    assert recorder.keys() == [keys.processed_agg_key("factory-a", W0)]


@pytest.mark.integration
async def test_a_damaged_history_item_is_skipped_not_fatal(foundation: Foundation) -> None:
    snaps = steady(0, 60)
    await seed(foundation, snaps, "factory-a")
    await foundation.readmodel.put_item(
        {
            "pk": keys.factory_pk("factory-a"),
            "sk": keys.history_state_sk(at(30.5)),
            "updated_at": "not-a-time",
            "ttl": 2_000_000_000,
        }
    )
    await running_since(foundation, W0)
    clock, recorder = FakeClock(W1 + timedelta(seconds=30)), Recorder()
    runs = await aggregator(foundation, clock, recorder, catchup=WINDOW).tick()
    assert runs[0].skipped_items == 1 and runs[0].samples == len(snaps)


def test_windows_between_covers_every_overlapping_window() -> None:
    assert windows_between(W0, W0 + timedelta(minutes=10)) == [W0, W1]
    assert windows_between(W0 + timedelta(minutes=2), W1 + timedelta(seconds=1)) == [W0, W1]
    assert windows_between(W0, W0 + timedelta(milliseconds=1)) == [W0]


@pytest.mark.integration
async def test_the_service_aggregates_on_its_own_and_announces_on_the_queue(
    foundation: Foundation, nats_url: str, aws_endpoint: str
) -> None:
    await seed(foundation, steady(0, 300), "factory-a")
    await running_since(foundation, W0)
    clock = FakeClock(W1 + timedelta(seconds=20))
    settings = AggregatorSettings(
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        nats_url=nats_url,
    )
    app = AggregatorApp(settings, clock=clock)
    seen: list[ObjectCreated] = []
    broker = create_broker(settings, name="aggregator-test-client")
    await ensure_streams(broker)
    js = broker.config.connection_state.stream
    sub = await js.subscribe("aegis.objects.created.metrics_5m", deliver_policy=DeliverPolicy.NEW)

    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        msg = await sub.next_msg(timeout=20)
        seen.append(ObjectCreated.model_validate_json(msg.data))
        assert seen[0].key == keys.processed_agg_key("factory-a", W0)
        item = await foundation.readmodel.get_item(
            keys.factory_pk("factory-a"), keys.graph_5m_sk(W0)
        )
        assert item is not None and item["stats"]["samples"] == 60
    finally:
        stop.set()
        await task
        await sub.unsubscribe()
        await broker.stop()


@pytest.mark.integration
async def test_aegis_aggregate_rewrites_a_range_for_an_operator(
    foundation_env: Foundation,
) -> None:
    foundation = foundation_env  # the aegis command reaches its bucket and table
    # seeded both ways: the command reads the range from HISTORY or, where HISTORY would no
    # longer hold it, from the state_snapshot objects
    w0 = recent_window()
    await seed(foundation, steady(0, 600, every=10, origin=w0), "factory-a")
    await seed_objects(foundation, steady(0, 600, every=10, origin=w0), "factory-a")
    args = ["aggregate", "--from", format_ts(w0), "--to", format_ts(w0 + 2 * WINDOW)]
    # the command runs its own event loop: give it a thread
    result = await asyncio.to_thread(CliRunner().invoke, cli_app, [*args, "--no-events"])
    assert result.exit_code == 0, result.output
    assert "2 window(s) written" in result.output
    for start in (w0, w0 + WINDOW):
        item = await foundation.readmodel.get_item(
            keys.factory_pk("factory-a"), keys.graph_5m_sk(start)
        )
        assert item is not None and item["stats"]["samples"] == 30
    bad = await asyncio.to_thread(
        CliRunner().invoke, cli_app, ["aggregate", "--from", "yesterday", "--to", "now"]
    )
    assert bad.exit_code == 2


@pytest.mark.integration
async def test_aegis_aggregate_announces_its_windows_as_the_service_does(
    foundation: Foundation,
    aws_endpoint: str,
    nats_url: str,
    unique_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The windows the command writes are announced (ObjectCreated and their change events),
    so jobs and dashboards see an operator's re-run as they see the service's."""
    factory = f"f-{unique_id}"[:40].lower()
    w0 = recent_window()
    await seed(foundation, steady(0, 600, every=10, origin=w0), factory)
    await seed_objects(foundation, steady(0, 600, every=10, origin=w0), factory)
    for name, value in {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
        "AEGIS_NATS_URL": nats_url,
    }.items():
        monkeypatch.setenv(name, value)
    heard: list[dict[str, Any]] = []
    nc = await nats.connect(nats_url)
    try:
        await nc.subscribe(change_subject("graph_5m"), cb=_collect_into(heard))
        await nc.flush()
        args = ["aggregate", "--from", format_ts(w0), "--to", format_ts(w0 + 2 * WINDOW)]
        args += ["--factory", factory]
        result = await asyncio.to_thread(CliRunner().invoke, cli_app, args)
        assert result.exit_code == 0, result.output

        def announced() -> list[str]:
            return sorted(e["sk"] for e in heard if e["pk"] == keys.factory_pk(factory))

        for _ in range(100):
            if len(announced()) == 2:
                break
            await asyncio.sleep(0.1)
        assert announced() == sorted(keys.graph_5m_sk(start) for start in (w0, w0 + WINDOW))
        assert {e["producer"] for e in heard} == {"aggregator"}
        assert all(e["new_image"]["stats"]["samples"] == 30 for e in heard)
    finally:
        await nc.close()


def _collect_into(heard: list[dict[str, Any]]) -> Any:
    async def collect(msg: Any) -> None:
        heard.append(json.loads(msg.data))

    return collect


# -- windows older than HISTORY: read from the state_snapshot objects ---------------------------

FACTORIES = ("factory-a", "factory-b")
HISTORY_TTL = timedelta(hours=2)


@contextlib.contextmanager
def counted(foundation: Foundation) -> Iterator[Counter[str]]:
    """The S3 and DynamoDB requests the emulator answered inside the block, by operation name
    (whichever client sent them: the per-message S3 calls go through obstore)."""
    endpoint = foundation.clients.config.endpoint_url
    assert endpoint is not None
    calls: Counter[str] = Counter()
    before = request_counts(endpoint)
    yield calls
    done = request_counts(endpoint) - before
    for service in ("s3", "dynamodb"):
        calls.update(done.ops(service))


def irregular(factory: str, start: datetime, stop: datetime) -> list[Snap]:
    """A factory's snapshots every 40 to 60 s (an uneven, repeatable rhythm): a factory_state
    record in each, an infra record every fourth, CO rising to WARNING now and then."""
    snaps: list[Snap] = []
    n = 0
    t = start + timedelta(seconds=FACTORIES.index(factory) * 3)
    infra: tuple[str, datetime] | None = None
    while t < stop:
        co = 5 + (n % 7) * 3.5
        level = "WARNING" if co > 20 else "NORMAL"
        if n % 4 == 0:
            infra = (f"{factory}-infra-{n:06d}", t)
        assert infra is not None
        snaps.append(
            Snap(
                at=t,
                level=level,
                score=co * 2,
                reasons=["CO_HIGH"] if level == "WARNING" else [],
                fs_id=f"{factory}-fs-{n:06d}",
                fs_at=t,
                sensors={"co_ppm": co, "temperature_c": 21 + (n % 4) / 4},
                infra_id=infra[0],
                infra_at=infra[1],
                host={"cpu_pct": 20 + n % 9},
                cameras={"cam-1": "online" if n % 5 else "offline"},
            )
        )
        t += timedelta(seconds=40 + (n * 7) % 21)
        n += 1
    return snaps


async def write_snapshots(foundation: Foundation, snaps: list[Snap], factory: str) -> None:
    """What the processor writes for each state: the HISTORY item with its real ttl (2 h after
    it was written) and the state_snapshot object."""
    slots = asyncio.Semaphore(16)

    async def history(s: Snap) -> None:
        async with slots:
            await foundation.readmodel.put_item(
                s.item(factory, ttl=TtlSettings().history_expiry(s.at))
            )

    await asyncio.gather(*(history(s) for s in snaps))
    await seed_objects(foundation, snaps, factory)
    if await foundation.readmodel.get_latest(factory) is None:
        await seed_latest(foundation.readmodel, factory, {"updated_at": format_ts(snaps[-1].at)})


def inside(snaps: list[Snap], start: datetime) -> list[Snap]:
    return [s for s in snaps if start <= s.at < start + WINDOW]


@pytest.mark.integration
async def test_a_window_read_from_the_snapshot_objects_equals_it_read_from_history(
    foundation: Foundation,
) -> None:
    # the same snapshots as HISTORY items and as objects; the window is W1, with snapshots of
    # other windows before and after it in the same hour partition
    snaps = steady(0, 900, every=4)
    snaps += [Snap(at=at(599), fs_id="last-second", sensors={"co_ppm": 2}, score=3)]
    await seed(foundation, snaps, "factory-a")
    await seed_objects(foundation, snaps, "factory-a")
    clock, recorder = FakeClock(W1), Recorder()
    agg = aggregator(foundation, clock, recorder)
    key = keys.processed_agg_key("factory-a", W1)
    pk, sk = keys.factory_pk("factory-a"), keys.graph_5m_sk(W1)

    with counted(foundation) as history_calls:
        recent = await agg.run_window(W1, ["factory-a"], now=W1 + WINDOW + timedelta(seconds=30))
    from_history = (
        await foundation.store.get_bytes(key),
        await foundation.readmodel.get_item(pk, sk),
    )
    await foundation.store.delete_many([key])
    await foundation.readmodel.delete_item(pk, sk)
    with counted(foundation) as object_calls:
        old = await agg.run_window(W1, ["factory-a"], now=W1 + timedelta(hours=3))
    from_objects = (
        await foundation.store.get_bytes(key),
        await foundation.readmodel.get_item(pk, sk),
    )

    assert (recent.source, old.source) == (Source.HISTORY, Source.SNAPSHOTS)
    assert recent.samples == old.samples == len(inside(snaps, W1)) == 76
    assert from_objects == from_history  # the same bytes, the same GRAPH item
    assert from_history[1] is not None
    assert_equal(Graph5m.model_validate(from_history[1]).stats, brute_force(snaps, W1, W1 + WINDOW))
    # the cost of one factory-window on each path; both also list the hour's four processed/
    # partitions and its window objects for the report's window fold (5 LISTs; this factory has
    # no processed/ records, so nothing more is read)
    assert history_calls == Counter({"Query": 1, "ListObjectsV2": 5, "PutObject": 1, "PutItem": 1})
    assert object_calls == Counter(
        {"ListObjectsV2": 1 + 5, "GetObject": 76, "PutObject": 1, "PutItem": 1}
    )


UP = W0 + timedelta(seconds=20)  # the aggregator's first tick on the table
DOWN = W1 + timedelta(seconds=20)  # its last tick before the outage
BACK = DOWN + timedelta(hours=3)  # the first tick after it
MISSED = [W1 + i * WINDOW for i in range(36)]  # the windows due during the outage


async def outage(foundation: Foundation) -> tuple[FakeClock, dict[str, list[Snap]]]:
    """An aggregator runs (W0), then is down for 3 hours while both factories keep writing
    snapshots; returns the clock at the end of the outage and what was written."""
    written = {f: irregular(f, W0 - timedelta(minutes=10), BACK) for f in FACTORIES}
    clock, recorder = FakeClock(UP), Recorder()
    before = {f: [s for s in snaps if s.at < DOWN] for f, snaps in written.items()}
    for f in FACTORIES:
        await write_snapshots(foundation, [s for s in before[f] if s.at < UP], f)
    assert await aggregator(foundation, clock, recorder).tick() == []  # the first tick
    for f in FACTORIES:
        await write_snapshots(foundation, [s for s in before[f] if s.at >= UP], f)
    clock.now = DOWN
    assert [r.start for r in await aggregator(foundation, clock, recorder).tick()] == [W0]
    for f in FACTORIES:  # the aggregator is down; the processor keeps writing
        await write_snapshots(foundation, [s for s in written[f] if s.at >= DOWN], f)
    clock.now = BACK
    return clock, written


@pytest.mark.integration
async def test_after_a_3_hour_outage_one_tick_fills_every_window_from_history_or_s3(
    foundation: Foundation,
) -> None:
    clock, written = await outage(foundation)
    recorder = Recorder()
    now = clock()

    runs = await aggregator(foundation, clock, recorder).tick()

    assert [r.start for r in runs] == MISSED  # every window, oldest first, once
    sources = {r.start: r.source for r in runs}
    # HISTORY holds a window whole until 2 h after its start (10 min of margin): older ones
    # are read from S3
    assert [sources[w] for w in MISSED] == [Source.SNAPSHOTS] * 15 + [Source.HISTORY] * 21
    expired = [w for w in MISSED if w + WINDOW + HISTORY_TTL <= now]
    assert len(expired) == 12
    for start in MISSED:
        for f in FACTORIES:
            wanted = inside(written[f], start)
            assert 5 <= len(wanted) <= 8  # a snapshot every 40-60 s
            item = await foundation.readmodel.get_item(
                keys.factory_pk(f), keys.graph_5m_sk(start), now=now
            )
            assert item is not None, (f, start)
            graph = Graph5m.model_validate(item)
            assert graph.stats.samples == len(wanted)
            assert_equal(graph.stats, brute_force(wanted, start, start + WINDOW))
            body = await foundation.store.get_json(keys.processed_agg_key(f, start))
            assert WindowStats.model_validate(body["stats"]) == graph.stats
            if start in expired:  # HISTORY has nothing of it any more: these came from S3
                assert (
                    await foundation.readmodel.history_states(f, start, start + WINDOW, now=now)
                    == []
                )
    assert sorted(recorder.keys()) == sorted(
        keys.processed_agg_key(f, w) for f in FACTORIES for w in MISSED
    )
    claims = await foundation.readmodel.window_claims(JOB, W0, MISSED[-1] + WINDOW, now=now)
    assert sorted(claims) == [format_ts(w) for w in [W0, *MISSED]]
    assert all(c.get("done_at") for c in claims.values())
    assert await aggregator(foundation, clock, recorder).tick() == []


@pytest.mark.integration
async def test_two_replicas_after_the_outage_run_each_window_once(foundation: Foundation) -> None:
    clock, _ = await outage(foundation)
    recorder = Recorder()
    one = aggregator(foundation, clock, recorder, owner="replica-one")
    two = aggregator(foundation, clock, recorder, owner="replica-two")

    runs = await asyncio.gather(one.tick(), two.tick())

    assert runs[0] and runs[1]  # both took part
    assert sorted(r.start for rs in runs for r in rs) == MISSED  # each window once
    written = recorder.keys()
    assert len(written) == len(set(written)) == 2 * len(MISSED)
    assert await one.tick() == [] and await two.tick() == []


@pytest.mark.integration
async def test_the_first_tick_on_a_fresh_table_claims_no_window_already_due(
    foundation: Foundation,
) -> None:
    # three hours of snapshots (one in six: every 1-2 min) before any aggregator ran on the table
    for f in FACTORIES:
        await write_snapshots(foundation, irregular(f, UP - timedelta(hours=3), UP)[::6], f)
    clock, recorder = FakeClock(UP), Recorder()
    delay = timedelta(seconds=15)

    assert await aggregator(foundation, clock, recorder, delay=delay).tick() == []

    day_before = UP - timedelta(hours=24)
    assert await foundation.readmodel.window_claims(JOB, day_before, UP, now=UP) == {}
    assert recorder.keys() == []
    # later ticks, by any replica, run the windows from the one not yet due at UP
    clock.advance(timedelta(hours=1))
    runs = await aggregator(foundation, clock, recorder, owner="later").tick()
    assert [r.start for r in runs] == [W0 + i * WINDOW for i in range(12)]
    claimed = await foundation.readmodel.window_claims(JOB, day_before, clock(), now=clock())
    assert min(claimed) == format_ts(W0)
    assert all(parse_ts(start) + WINDOW > UP - delay for start in claimed)


@pytest.mark.integration
async def test_claims_already_on_the_table_count_as_the_first_run(foundation: Foundation) -> None:
    # an aggregator from before the FIRST record ran up to W0 - 30 min, then stopped
    for i in range(6, 12):
        start = W0 - i * WINDOW
        assert await foundation.readmodel.claim_window(
            JOB, start, owner="old", now=start + WINDOW, ttl=2_000_000_000
        )
        assert await foundation.readmodel.finish_window(JOB, start, owner="old", now=start)
    clock, recorder = FakeClock(W0 + timedelta(hours=1, seconds=20)), Recorder()

    runs = await aggregator(foundation, clock, recorder).tick()

    assert [r.start for r in runs] == [W0 - 5 * WINDOW + i * WINDOW for i in range(17)]


@pytest.mark.integration
async def test_a_damaged_or_foreign_snapshot_object_is_skipped_not_fatal(
    foundation: Foundation,
) -> None:
    snaps = steady(0, 60)
    await seed_objects(foundation, snaps, "factory-a")

    def key(seconds: float) -> str:
        return keys.state_snapshot_key("factory-a", at(seconds))

    body = {k: v for k, v in Snap(at=at(31.5)).item("factory-b").items() if k != "ttl"}
    moved = {k: v for k, v in Snap(at=at(40)).item("factory-a").items() if k != "ttl"}
    for name, data in {
        key(30.5): b"{not json",
        key(31.5): to_json_bytes(body),  # another factory's state
        key(32.5): to_json_bytes(moved),  # its updated_at is not its name
        key(33.5): to_json_bytes(Snap(at=at(33.5)).item("factory-a")),  # a HISTORY item (ttl)
        key(34.5) + ".bak": b"{}",  # no snapshot name: not even fetched
    }.items():
        await foundation.store.put_bytes(name, data)
    clock, recorder = FakeClock(W1 + timedelta(hours=3)), Recorder()

    run = await aggregator(foundation, clock, recorder).run_window(W0, ["factory-a"], now=clock())

    assert run.source is Source.SNAPSHOTS
    assert run.skipped_items == 5 and run.samples == len(snaps)


@pytest.mark.integration
async def test_a_window_past_its_graph_ttl_gets_its_object_but_no_graph_item(
    foundation: Foundation,
) -> None:
    await seed_objects(foundation, steady(0, 300, every=10), "factory-a")
    clock, recorder = FakeClock(W1 + timedelta(hours=48, seconds=1)), Recorder()

    run = await aggregator(foundation, clock, recorder).run_window(W0, ["factory-a"], now=clock())

    assert run.samples == 30
    body = await foundation.store.get_json(keys.processed_agg_key("factory-a", W0))
    assert body["stats"]["samples"] == 30
    assert recorder.keys() == [keys.processed_agg_key("factory-a", W0)]
    assert (
        await foundation.readmodel.get_item(keys.factory_pk("factory-a"), keys.graph_5m_sk(W0))
        is None
    )
