"""The simulated fleet: determinism, contract validity, scenarios, schedule, PNG bytes."""

from __future__ import annotations

import itertools
import json
import random
import struct
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aegis_contracts.ids import SourceType, parse_topic, validate_message_id
from aegis_contracts.keys import image_snapshot_key
from aegis_contracts.payloads import (
    FactoryStateMessage,
    ImageSnapshotMessage,
    InfraStateMessage,
    parse_device_message,
)
from aegis_contracts.times import parse_iso
from aegis_simulator.domain import (
    CLOCK_SKEW,
    DEFAULT_INTERVALS,
    PNG_SIGNATURE,
    Emission,
    Fleet,
    ScenarioError,
    ScenarioKind,
    ScenarioSpec,
    factory_ids,
    make_png,
    parse_scenario,
    parse_scenarios,
    scaled_intervals,
    snapshot_png,
)

START = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
FACTORIES = ("factory-a", "factory-b", "factory-c")

Timed = list[tuple[datetime, Emission]]


def drive(fleet: Fleet, seconds: float, step: float = 0.5) -> Timed:
    """Call ``due`` every ``step`` seconds of virtual time; what was emitted, and when."""
    out: Timed = []
    t = 0.0
    while t <= seconds:
        now = START + timedelta(seconds=t)
        out.extend((now, e) for e in fleet.due(now))
        t += step
    out.extend((START + timedelta(seconds=seconds), e) for e in fleet.flush())
    return out


def fleet(*scenarios: str, seed: int = 7, **kwargs: Any) -> Fleet:
    return Fleet(
        kwargs.pop("factories", FACTORIES),
        start=START,
        seed=seed,
        run_id="run01",
        scenarios=parse_scenarios(scenarios),
        **kwargs,
    )


def validate(e: Emission) -> FactoryStateMessage | InfraStateMessage | ImageSnapshotMessage:
    factory_id, source = parse_topic(e.topic)
    assert (factory_id, source) == (e.factory_id, e.source_type)
    return parse_device_message(source, e.payload, topic_factory_id=factory_id)


def states(emitted: Timed, factory: str = "factory-b") -> list[tuple[datetime, dict[str, Any]]]:
    return [
        (t, e.body())
        for t, e in emitted
        if e.factory_id == factory and e.source_type is SourceType.FACTORY_STATE
    ]


# -- determinism -----------------------------------------------------------------------------


def test_same_seed_same_run_gives_identical_bytes() -> None:
    a = [e.payload for _, e in drive(fleet("fire@factory-a+30"), 300)]
    b = [e.payload for _, e in drive(fleet("fire@factory-a+30"), 300)]
    assert a == b
    assert len(a) > 150


def test_another_seed_gives_other_values() -> None:
    a = [e.payload for _, e in drive(fleet(seed=1), 60)]
    b = [e.payload for _, e in drive(fleet(seed=2), 60)]
    assert a != b


# -- contract validity -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(ScenarioKind))
def test_every_payload_of_every_scenario_validates(kind: ScenarioKind) -> None:
    emitted = drive(fleet(f"{kind.value}@factory-b+20:200"), 400, step=1.0)
    sources = Counter(e.source_type for _, e in emitted)
    assert set(sources) == set(SourceType)
    for _, e in emitted:
        message = validate(e)
        assert message.message_id == e.message_id
        validate_message_id(e.message_id)
        if isinstance(message, ImageSnapshotMessage):
            assert e.image is not None or "duplicate" in e.tags
            if e.image is not None:
                assert e.image.key == message.s3_key
                assert message.size_bytes == len(e.image.body)
                assert e.image.body.startswith(PNG_SIGNATURE)


def test_message_ids_are_unique_and_fit_even_for_the_longest_factory_id() -> None:
    longest = "f" + "x" * 62
    emitted = drive(fleet(factories=[longest, "factory-a"]), 300)
    ids = [e.message_id for _, e in emitted]
    assert len(ids) == len(set(ids))
    for mid in ids:
        assert validate_message_id(mid) and 8 <= len(mid) <= 64


def test_normal_operation_stays_in_realistic_ranges() -> None:
    emitted = drive(fleet(), 3600, step=5.0)
    for factory in FACTORIES:
        values = [body["sensors"] for _, body in states(emitted, factory)]
        assert len(values) > 600
        temps = [v["temperature_c"] for v in values]
        assert min(temps) >= 20 and max(temps) <= 30
        assert max(temps) - min(temps) > 0.3  # it drifts
        assert all(1.5 <= v["co_ppm"] <= 7 for v in values)
        assert all(0 <= v["smoke_obscuration_pct"] < 1 for v in values)
        assert all(68 <= v["noise_db"] <= 87 for v in values)
        assert all(20 <= v["humidity_pct"] <= 80 for v in values)
        labels = Counter(
            d["label"] for _, b in states(emitted, factory) for d in b["ai"]["detections"]
        )
        assert set(labels) <= {"no_helmet", "person"}
        assert labels["no_helmet"] > 0
        detections = [d for _, b in states(emitted, factory) for d in b["ai"]["detections"]]
        assert all(0.6 <= d["confidence"] <= 0.8 for d in detections if d["label"] == "no_helmet")
        # mostly nothing detected
        assert (
            sum(1 for _, b in states(emitted, factory) if b["ai"]["detections"]) < len(values) / 4
        )


# -- scenarios --------------------------------------------------------------------------------


def test_fire_heats_smokes_and_is_detected() -> None:
    emitted = drive(fleet("fire@factory-b+60:180"), 400)
    before = [b for t, b in states(emitted) if t < START + timedelta(seconds=60)]
    during = [
        b
        for t, b in states(emitted)
        if START + timedelta(seconds=150) <= t < START + timedelta(seconds=240)
    ]
    after = [b for t, b in states(emitted) if t >= START + timedelta(seconds=250)]
    assert max(b["sensors"]["temperature_c"] for b in before) < 30
    assert min(b["sensors"]["temperature_c"] for b in during) > 60
    assert min(b["sensors"]["smoke_obscuration_pct"] for b in during) > 30
    for b in during:
        labels = {d["label"]: d["confidence"] for d in b["ai"]["detections"]}
        assert labels["fire"] >= 0.85 and labels["smoke"] >= 0.8
    assert all("fire" not in {d["label"] for d in b["ai"]["detections"]} for b in before + after)
    # the other factories are untouched
    assert max(b["sensors"]["temperature_c"] for _, b in states(emitted, "factory-a")) < 30


def test_gas_leak_climbs_past_warning_then_critical() -> None:
    emitted = drive(fleet("gas_leak@factory-b+30:240"), 400)
    co = [(t, b["sensors"]["co_ppm"]) for t, b in states(emitted)]
    assert all(v < 7 for t, v in co if t < START + timedelta(seconds=30))
    first_warning = next(t for t, v in co if v > 35)
    first_critical = next(t for t, v in co if v > 100)
    assert START + timedelta(seconds=30) < first_warning < first_critical
    assert first_critical < START + timedelta(seconds=150)
    assert all(v < 7 for t, v in co if t >= START + timedelta(seconds=275))


def test_edge_offline_silences_the_factory_for_the_duration() -> None:
    emitted = drive(fleet("edge_offline@factory-b+30:60"), 200)
    b_times = [t for t, e in emitted if e.factory_id == "factory-b"]
    gap = [t for t in b_times if START + timedelta(seconds=30) <= t < START + timedelta(seconds=90)]
    assert gap == []
    assert any(t < START + timedelta(seconds=30) for t in b_times)
    assert any(t >= START + timedelta(seconds=90) for t in b_times)
    a_times = [t for t, e in emitted if e.factory_id == "factory-a"]
    assert any(START + timedelta(seconds=30) <= t < START + timedelta(seconds=90) for t in a_times)


def test_camera_offline_shows_in_infra_and_silences_the_camera() -> None:
    emitted = drive(fleet("camera_offline@factory-b:100000"), 3600, step=5.0)
    infra = [
        e.body()
        for _, e in emitted
        if e.factory_id == "factory-b" and e.source_type is SourceType.INFRA_STATE
    ]
    assert infra and all(b["cameras"]["cam-04"] == "offline" for b in infra)
    assert all(b["cameras"]["cam-01"] == "online" for b in infra)
    assert all(b["pipeline"]["capture"] == "degraded" for b in infra)
    detections = [d for _, b in states(emitted) for d in b["ai"]["detections"]]
    assert detections and all(d["camera_id"] != "cam-04" for d in detections)
    shots = [
        e.body()
        for _, e in emitted
        if e.factory_id == "factory-b" and e.source_type is SourceType.IMAGE_SNAPSHOT
    ]
    assert len(shots) > 30 and all(s["camera_id"] != "cam-04" for s in shots)
    other = [
        e.body()
        for _, e in emitted
        if e.factory_id == "factory-a" and e.source_type is SourceType.INFRA_STATE
    ]
    assert all(b["cameras"]["cam-04"] == "online" for b in other)


def test_clock_skew_moves_emitted_at_ten_minutes_ahead() -> None:
    emitted = drive(fleet("clock_skew@factory-b+20:60"), 120)
    for t, e in emitted:
        if e.factory_id != "factory-b":
            continue
        body = e.body()
        skew = parse_iso(body["emitted_at"]) - t
        skewed = START + timedelta(seconds=20) <= t < START + timedelta(seconds=80)
        assert abs(skew - (CLOCK_SKEW if skewed else timedelta(0))) < timedelta(milliseconds=1)
        assert ("clock_skew" in e.tags) == skewed
        if e.source_type is SourceType.IMAGE_SNAPSHOT:
            captured = parse_iso(body["captured_at"])
            assert body["s3_key"] == image_snapshot_key("factory-b", captured, body["filename"])


def test_duplicate_republishes_the_same_bytes_right_after() -> None:
    emitted = [e for _, e in drive(fleet("duplicate@factory-b+10:30"), 60)]
    dups = [i for i, e in enumerate(emitted) if "duplicate" in e.tags]
    assert len(dups) >= 6
    for i in dups:
        original, copy = emitted[i - 1], emitted[i]
        assert copy.payload == original.payload and copy.message_id == original.message_id
        assert copy.topic == original.topic and copy.image is None
    ids = Counter(e.message_id for e in emitted)
    assert sum(n == 2 for n in ids.values()) == len(dups)
    assert all(e.factory_id == "factory-b" for e in emitted if "duplicate" in e.tags)


def test_out_of_order_sends_an_older_message_after_a_newer_one_and_loses_none() -> None:
    plain = drive(fleet(), 120)
    emitted = drive(fleet("out_of_order@factory-b+10:60"), 120)
    # the same messages, only in another order
    assert sorted(e.payload for _, e in emitted) == sorted(e.payload for _, e in plain)
    for source in SourceType:
        stamps = [
            parse_iso(e.body()["emitted_at"])
            for _, e in emitted
            if e.factory_id == "factory-b" and e.source_type is source
        ]
        inversions = sum(1 for x, y in itertools.pairwise(stamps) if y < x)
        if source is SourceType.FACTORY_STATE:
            assert inversions >= 4
    a_stamps = [
        parse_iso(e.body()["emitted_at"])
        for _, e in emitted
        if e.factory_id == "factory-a" and e.source_type is SourceType.FACTORY_STATE
    ]
    assert a_stamps == sorted(a_stamps)
    reordered = [e for _, e in emitted if "reordered" in e.tags]
    assert reordered and all(e.factory_id == "factory-b" for e in reordered)


def test_recurring_scenario_comes_back() -> None:
    spec = parse_scenario("gas_leak@factory-b+10:20/100")
    assert [spec.active_at(t) is not None for t in (5, 15, 35, 115, 135, 215)] == [
        False, True, False, True, False, True,
    ]  # fmt: skip


# -- schedule and rates -----------------------------------------------------------------------


def test_default_schedule_rates_and_jitter() -> None:
    emitted = drive(fleet(factories=["factory-a"]), 3600, step=0.25)
    by_source: dict[SourceType, list[datetime]] = {}
    for t, e in emitted:
        by_source.setdefault(e.source_type, []).append(t)
    for source, interval in DEFAULT_INTERVALS.items():
        times = by_source[source]
        expected = 3600 / interval
        assert abs(len(times) - expected) <= expected * 0.05 + 1
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
        # ±10 % jitter, sampled every 0.25 s
        assert min(gaps) >= interval * 0.9 - 0.25 and max(gaps) <= interval * 1.1 + 0.25
        assert len({round(g, 2) for g in gaps}) > 3  # really jittered
        assert times[0] <= START + timedelta(seconds=1.25)  # everything starts at once


def test_rate_override_keeps_the_mix() -> None:
    intervals = scaled_intervals(30.0, 3)
    assert sum(3 / s for s in intervals.values()) == pytest.approx(30.0)
    ratio = intervals[SourceType.INFRA_STATE] / intervals[SourceType.FACTORY_STATE]
    assert ratio == pytest.approx(3.0)
    assert SourceType.IMAGE_SNAPSHOT not in scaled_intervals(None, 3, images=False)
    emitted = drive(fleet(intervals=intervals), 60, step=0.05)
    assert len(emitted) == pytest.approx(30 * 60, rel=0.05)
    with pytest.raises(ValueError, match="positive"):
        scaled_intervals(0, 3)


def test_next_due_and_take_for_load_mode() -> None:
    f = fleet()
    assert START <= f.next_due() <= START + timedelta(seconds=1)
    taken = [e for _ in range(100) for e in f.take(START)]
    assert len(taken) == 100
    assert Counter(e.source_type for e in taken)[SourceType.FACTORY_STATE] > 60
    for e in taken:
        validate(e)


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fire", ScenarioSpec(ScenarioKind.FIRE, None, 0.0, 180.0)),
        ("fire@factory-b+30", ScenarioSpec(ScenarioKind.FIRE, "factory-b", 30.0, 180.0)),
        ("gas_leak+5:60", ScenarioSpec(ScenarioKind.GAS_LEAK, None, 5.0, 60.0)),
        (
            "gas_leak@factory-b+300:240/600",
            ScenarioSpec(ScenarioKind.GAS_LEAK, "factory-b", 300.0, 240.0, 600.0),
        ),
        (" clock_skew@f-1 ", ScenarioSpec(ScenarioKind.CLOCK_SKEW, "f-1", 0.0, 60.0)),
    ],
)
def test_parse_scenario(text: str, expected: ScenarioSpec) -> None:
    assert parse_scenario(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("earthquake", "unknown scenario"),
        ("fire@Factory-B", "does not match"),
        ("fire+x", "does not match"),
        ("fire:0", "positive"),
        ("fire:60/30", "more often"),
    ],
)
def test_parse_scenario_refuses(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(text)


def test_parse_scenarios_lists_and_off() -> None:
    assert parse_scenarios(["off"]) == [] and parse_scenarios([""]) == []
    assert [s.kind for s in parse_scenarios(["fire,duplicate", "gas_leak"])] == [
        ScenarioKind.FIRE,
        ScenarioKind.DUPLICATE,
        ScenarioKind.GAS_LEAK,
    ]


def test_a_scenario_for_an_unknown_factory_is_refused() -> None:
    with pytest.raises(ScenarioError, match="not simulated"):
        fleet("fire@factory-z")


def test_factory_ids() -> None:
    assert factory_ids() == ["factory-a", "factory-b", "factory-c"]
    assert factory_ids(count=3) == ["factory-001", "factory-002", "factory-003"]
    assert factory_ids("x-1, y-2") == ["x-1", "y-2"]
    with pytest.raises(ValueError, match="twice"):
        factory_ids("a,a")
    with pytest.raises(ValueError, match="not both"):
        factory_ids("a", 2)
    with pytest.raises(ValueError, match="factory_id"):
        factory_ids("Bad/Id")


# -- PNG --------------------------------------------------------------------------------------


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], len(PNG_SIGNATURE)
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        out.append((kind, data))
        pos += 12 + length
    return out


def test_png_is_valid() -> None:
    png = snapshot_png(random.Random(1), alarm=False, width=32, height=24)
    assert png.startswith(PNG_SIGNATURE)
    chunks = _chunks(png)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, colour, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (width, height, depth, colour) == (32, 24, 8, 2)
    raw = zlib.decompress(chunks[1][1])
    assert len(raw) == height * (1 + 3 * width)
    assert raw[0] == 0
    assert make_png(1, 1, lambda x, y: (1, 2, 3)).startswith(PNG_SIGNATURE)


def test_payloads_are_compact_json() -> None:
    _, e = drive(fleet(), 2)[0]
    assert json.loads(e.payload) == e.body()
    assert b" " not in e.payload
