"""The cloud checks' decisions: thresholds and their boundaries, without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aegis_cloud_collector import domain
from aegis_cloud_collector.domain import ConsumerFacts, SysState
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.events import Heartbeat
from aegis_contracts.state import Level
from aegis_contracts.times import format_ts
from aegis_storage.bootstrap import expected_foundation

NOW = datetime(2026, 11, 30, 10, 12, 30, tzinfo=UTC)


def levels(checks: list[CloudCheck]) -> dict[str, tuple[Level, str]]:
    return {c.name: (c.status, c.reason) for c in checks}


# -- MQTT -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (SysState(False, None, error="refused"), (Level.CRITICAL, "MQTT_UNREACHABLE")),
        (SysState(False, 1.0), (Level.CRITICAL, "MQTT_UNREACHABLE")),
        (SysState(True, None), (Level.WARNING, "MQTT_SYS_SILENT")),
        (SysState(True, 15.0), (Level.NORMAL, "OK")),  # exactly 3 intervals: not yet silent
        (SysState(True, 15.001), (Level.WARNING, "MQTT_SYS_SILENT")),
        (SysState(True, 0.0), (Level.NORMAL, "OK")),
    ],
)
def test_mqtt(state: SysState, expected: tuple[Level, str]) -> None:
    check = domain.mqtt_check(state, sys_interval_s=5)
    assert (check.status, check.reason) == expected
    assert check.name == "mqtt"


def test_mqtt_values_are_read_from_sys_topics() -> None:
    values = {
        domain.SYS_CLIENTS: "7",
        domain.SYS_RECEIVED_1MIN: "120.5",
        domain.SYS_SENT_1MIN: "99",
        domain.SYS_UPTIME: "3600 seconds",
        "$SYS/broker/version": "mosquitto version 2.0.11",
    }
    check = domain.mqtt_check(SysState(True, 1.0, values), sys_interval_s=10)
    assert check.value == 7 and check.unit == "clients"
    assert check.measures == {"received_1min": 120.5, "sent_1min": 99, "uptime_s": 3600}
    garbled = domain.mqtt_check(SysState(True, 1.0, {domain.SYS_CLIENTS: "?"}), sys_interval_s=10)
    assert garbled.value is None and garbled.status is Level.NORMAL


# -- JetStream ------------------------------------------------------------------------------------


def facts(**overrides: Any) -> ConsumerFacts:
    base: dict[str, Any] = {
        "stream": "AEGIS_RAW",
        "durable": "processor",
        "pull": True,
        "push_bound": False,
        "num_pending": 0,
        "num_ack_pending": 0,
        "num_redelivered": 0,
        "num_waiting": 1,
        "ack_floor": 10,
    }
    return ConsumerFacts(**{**base, **overrides})


def previous(**overrides: Any) -> CloudCheck:
    return domain.consumer_check(facts(**overrides), None, lag_warning=1000, lag_critical=10_000)


@pytest.mark.parametrize(
    ("lag", "expected"),
    [
        (0, (Level.NORMAL, "OK")),
        (1000, (Level.NORMAL, "OK")),
        (1001, (Level.WARNING, "CONSUMER_LAG")),
        (10_000, (Level.WARNING, "CONSUMER_LAG")),
        (10_001, (Level.CRITICAL, "CONSUMER_LAG")),
    ],
)
def test_consumer_lag_thresholds(lag: int, expected: tuple[Level, str]) -> None:
    check = domain.consumer_check(
        facts(num_pending=lag), None, lag_warning=1000, lag_critical=10_000
    )
    assert (check.status, check.reason) == expected
    assert check.value == lag and check.name == "consumer:AEGIS_RAW/processor"
    assert check.measures["ack_floor"] == 10


@pytest.mark.parametrize(
    ("now", "before", "expected"),
    [
        # stopped: nobody waiting, now and before, and the ack floor did not move
        ({"num_waiting": 0, "num_pending": 5}, {"num_waiting": 0}, "CONSUMER_STALLED"),
        ({"num_waiting": 0, "num_ack_pending": 2}, {"num_waiting": 0}, "CONSUMER_STALLED"),
        ({"num_waiting": 0}, {"num_waiting": 0}, "CONSUMER_INACTIVE"),
        # one sample without a waiting pull is the gap between two fetches
        ({"num_waiting": 0, "num_pending": 5}, {"num_waiting": 1}, "OK"),
        ({"num_waiting": 0, "num_pending": 5}, None, "OK"),
        # the ack floor moved: it is consuming
        ({"num_waiting": 0, "num_pending": 5, "ack_floor": 11}, {"num_waiting": 0}, "OK"),
        # a pull request is waiting: alive and idle
        ({"num_waiting": 1, "num_pending": 5}, {"num_waiting": 0}, "OK"),
    ],
)
def test_consumer_stopped(
    now: dict[str, Any], before: dict[str, Any] | None, expected: str
) -> None:
    prev = None if before is None else previous(**before)
    check = domain.consumer_check(facts(**now), prev, lag_warning=1000, lag_critical=10_000)
    assert check.reason == expected
    level = {"CONSUMER_STALLED": Level.CRITICAL, "CONSUMER_INACTIVE": Level.WARNING}
    assert check.status is level.get(expected, Level.NORMAL)


def test_a_stall_outranks_lag_and_push_consumers_are_stopped_when_unbound() -> None:
    prev = previous(num_waiting=0)
    stalled = domain.consumer_check(
        facts(num_waiting=0, num_pending=50_000), prev, lag_warning=1000, lag_critical=10_000
    )
    assert stalled.reason == "CONSUMER_STALLED"
    push = {"pull": False, "num_waiting": 0}
    unbound = domain.consumer_check(
        facts(**push, num_pending=3), None, lag_warning=1000, lag_critical=10_000
    )
    bound = domain.consumer_check(
        facts(**push, push_bound=True, num_pending=3), None, lag_warning=1000, lag_critical=10_000
    )
    assert (unbound.reason, bound.reason) == ("CONSUMER_STALLED", "OK")


def test_missing_consumers() -> None:
    checks = domain.missing_consumer_checks(
        ["AEGIS_RAW/processor", "AEGIS_EVENTS/alerts"], [("AEGIS_RAW", "processor")]
    )
    assert levels(checks) == {"consumer:AEGIS_EVENTS/alerts": (Level.CRITICAL, "CONSUMER_MISSING")}
    assert domain.consumer_check_name("S", "weird name!") == "consumer:S/weird_name_"


def test_streams() -> None:
    assert domain.stream_check("AEGIS_RAW", None).reason == "STREAM_MISSING"
    ok = domain.stream_check("AEGIS_RAW", domain.StreamFacts("AEGIS_RAW", 5, 900, 1))
    assert (ok.status, ok.value, ok.measures) == (
        Level.NORMAL,
        5,
        {"bytes": 900, "consumers": 1},
    )


# -- dead letters ---------------------------------------------------------------------------------


def snapshot(checks: list[CloudCheck], tier: str = "fast") -> CloudSnapshot:
    return CloudSnapshot.of(tier, NOW, checks)  # type: ignore[arg-type]


def test_dead_letters_warn_on_growth_only() -> None:
    subject = "aegis.dlq.processor.schema_violation"
    first = domain.dead_letter_checks({subject: 4}, None)
    assert levels(first) == {"dead_letters:processor.schema_violation": (Level.NORMAL, "OK")}
    same = domain.dead_letter_checks({subject: 4}, snapshot(first))
    assert same[0].status is Level.NORMAL and same[0].value == 0
    grew = domain.dead_letter_checks({subject: 6}, snapshot(first))
    assert (grew[0].status, grew[0].reason, grew[0].value) == (Level.WARNING, "DEAD_LETTERS", 2)
    assert grew[0].measures == {"total": 6}
    expired = domain.dead_letter_checks({subject: 1}, snapshot(grew))
    assert expired[0].status is Level.NORMAL
    other = "aegis.dlq.ingest.invalid_topic"
    new_subject = domain.dead_letter_checks({subject: 6, other: 3}, snapshot(grew))
    assert [c.value for c in new_subject] == [3, 0]


# -- heartbeats -----------------------------------------------------------------------------------


def beat(service: str, ago: float, **fields: Any) -> Heartbeat:
    at = NOW - timedelta(seconds=ago)
    return Heartbeat(
        service=service,
        instance=fields.pop("instance", f"{service}-1"),
        at=at,
        started_at=at - timedelta(hours=1),
        interval_s=10,
        ready=fields.pop("ready", True),
        **fields,
    )


def test_services() -> None:
    beats = [
        beat("ingest", 5),
        beat("ingest", 100, instance="ingest-old"),
        beat("processor", 30),  # exactly 3 intervals: still alive
        beat("simulator", 30.001),  # not expected, lost: down
        beat("reporter", 200, stopping=True),  # not expected, stopped cleanly
        beat("aggregator", 1, ready=False, checks={"storage": False, "nats": True}),
    ]
    checks = domain.service_checks(
        beats, ["ingest", "processor", "cloud-collector", "aggregator"], NOW
    )
    assert levels(checks) == {
        "service:aggregator": (Level.WARNING, "SERVICE_NOT_READY"),
        "service:cloud-collector": (Level.CRITICAL, "SERVICE_DOWN"),
        "service:ingest": (Level.NORMAL, "OK"),
        "service:processor": (Level.NORMAL, "OK"),
        "service:reporter": (Level.NORMAL, "OK"),
        "service:simulator": (Level.CRITICAL, "SERVICE_DOWN"),
    }
    by_name = {c.name: c for c in checks}
    assert by_name["service:ingest"].value == 1  # the old replica is gone
    assert by_name["service:simulator"].value == pytest.approx(30.001)
    assert by_name["service:cloud-collector"].value is None
    assert "storage" in by_name["service:aggregator"].detail
    # an expected service whose replicas all stopped is down, not "stopped cleanly"
    stopped = domain.service_checks([beat("ingest", 1, stopping=True)], ["ingest"], NOW)
    assert stopped[0].reason == "SERVICE_DOWN"


# -- storage --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("latency", "error", "expected"),
    [
        (12.0, None, "OK"),
        (500.0, None, "OK"),
        (500.1, None, "STORAGE_SLOW"),
        (None, "Could not connect", "STORAGE_UNREACHABLE"),
    ],
)
def test_storage(latency: float | None, error: str | None, expected: str) -> None:
    check = domain.storage_check("s3", latency, error, slow_ms=500)
    assert check.reason == expected and check.name == "storage:s3"
    assert (
        check.status
        is {
            "OK": Level.NORMAL,
            "STORAGE_SLOW": Level.WARNING,
            "STORAGE_UNREACHABLE": Level.CRITICAL,
        }[expected]
    )


# -- freshness ------------------------------------------------------------------------------------


def latest(factory: str, age: float | None, lag: float, status: str = "OK") -> dict[str, Any]:
    item: dict[str, Any] = {"pk": f"FACTORY#{factory}", "factory_id": factory}
    if age is not None:
        at = NOW - timedelta(seconds=age)
        item |= {
            "last_factory_state_at": format_ts(at),
            "updated_at": format_ts(at + timedelta(seconds=lag)),
            "factory_state": {"meta": {"received_at": format_ts(at)}},
            "pipeline_status": {"status": status},
        }
    return item


def test_freshness_and_ingest_lag() -> None:
    checks = domain.freshness_checks(
        [latest("a", 2, 10), latest("b", 3, 10.5), latest("c", 400, 90, "OFFLINE")],
        NOW,
        ingest_lag_warning_s=10,
        stalled_after_s=300,
    )
    assert levels(checks) == {
        "freshness:a": (Level.NORMAL, "OK"),
        "freshness:b": (Level.WARNING, "INGEST_LAG"),
        "freshness:c": (Level.NORMAL, "OK"),  # stale: the refresh rewrote LATEST, no lag to tell
        "pipeline": (Level.NORMAL, "OK"),
    }
    by_name = {c.name: c for c in checks}
    assert by_name["freshness:b"].measures == {"ingest_lag_s": 10.5}
    assert by_name["freshness:a"].value == 2
    assert by_name["pipeline"].value == 2  # fresh factories


@pytest.mark.parametrize(
    ("ages", "expected"),
    [
        ([300, 301], "OK"),  # one factory exactly at the limit is still fresh
        ([301, 302, None], "PIPELINE_STALLED"),
        ([None], "PIPELINE_STALLED"),
        ([], "OK"),  # no factories yet: nothing to be stalled
    ],
)
def test_pipeline_stalled(ages: list[float | None], expected: str) -> None:
    items = [latest(f"f{i}", age, 0) for i, age in enumerate(ages)]
    checks = domain.freshness_checks(items, NOW, ingest_lag_warning_s=10, stalled_after_s=300)
    fleet = next(c for c in checks if c.name == "pipeline")
    assert fleet.reason == expected
    assert fleet.status is (Level.CRITICAL if expected != "OK" else Level.NORMAL)


def test_ingest_lag_needs_a_received_time_and_never_goes_negative() -> None:
    assert domain.ingest_lag_s({"updated_at": format_ts(NOW)}) is None
    item = latest("a", 5, -1)
    assert domain.ingest_lag_s(item) == 0.0


# -- foundation -----------------------------------------------------------------------------------


def test_foundation_parts_cover_the_whole_description() -> None:
    expected = expected_foundation(bucket="b", table="t", region="ap-south-1")
    covered = {part for parts in domain.FOUNDATION_PARTS.values() for part in parts}
    described = {(res, part) for res, body in expected.items() for part in body}
    assert covered == described


def test_foundation_drift_per_check() -> None:
    expected = expected_foundation(bucket="b", table="t", region="ap-south-1")
    assert {c.status for c in domain.foundation_checks(expected, expected)} == {Level.NORMAL}
    actual = {
        "bucket": {**expected["bucket"], "lifecycle": expected["bucket"]["lifecycle"][:1]},
        "table": {**expected["table"], "pitr": "DISABLED", "stream": {"enabled": False}},
    }
    checks = levels(domain.foundation_checks(actual, expected))
    drifted = {name for name, (level, _) in checks.items() if level is not Level.NORMAL}
    assert drifted == {
        "foundation:bucket_lifecycle",
        "foundation:table_pitr",
        "foundation:table_stream",
    }
    assert all(checks[n] == (Level.WARNING, "FOUNDATION_DRIFT") for n in drifted)
    pitr = next(c for c in domain.foundation_checks(actual, expected) if c.name.endswith("pitr"))
    assert "table.pitr: expected 'ENABLED', found 'DISABLED'" in pitr.detail


# -- objects and coverage -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hour", "closed"),
    [(9, True), (10, False)],
)
def test_hour_closed(hour: int, closed: bool) -> None:
    start = datetime(2026, 11, 30, hour, tzinfo=UTC)
    grace = timedelta(minutes=5)
    assert domain.hour_closed(start, datetime(2026, 11, 30, 10, 5, tzinfo=UTC), grace=grace) is (
        closed
    )
    # the boundary: end + grace exactly is closed, a millisecond before is not
    end = start + timedelta(hours=1) + grace
    assert domain.hour_closed(start, end, grace=grace)
    assert not domain.hour_closed(start, end - timedelta(milliseconds=1), grace=grace)


def test_newest_graded_window() -> None:
    at = datetime(2026, 11, 30, 10, 10, tzinfo=UTC)
    assert domain.newest_graded_window(at) == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert domain.newest_graded_window(at - timedelta(milliseconds=1)) == datetime(
        2026, 11, 30, 9, 55, tzinfo=UTC
    )


def test_coverage() -> None:
    now = datetime(2026, 11, 30, 10, 12, tzinfo=UTC)
    newest = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    # all but the newest, 6 samples each; the buckets of the last hour count
    graphs = {newest - timedelta(minutes=5 * i): 6 for i in range(1, 12)}
    behind = domain.coverage_check("a", True, graphs, now)
    assert (behind.status, behind.reason, behind.value) == (Level.WARNING, "GRAPH_BEHIND", 11)
    assert behind.measures == {"history_last_hour": 6 * 9}  # 09:15 .. 09:55
    caught_up = domain.coverage_check("a", True, {**graphs, newest: 4}, now)
    assert (caught_up.status, caught_up.value) == (Level.NORMAL, 12)
    assert caught_up.measures == {"history_last_hour": 6 * 9 + 4}
    # the newest window had no HISTORY (nothing to aggregate): not behind
    quiet = domain.coverage_check("a", False, graphs, now)
    assert quiet.status is Level.NORMAL
    off = domain.coverage_check("a", True, graphs, now, graph_expected=False)
    assert off.status is Level.NORMAL


# -- CloudWatch -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("throttled", "errors", "expected"),
    [
        (0, 0, {"OK"}),
        (1, 0, {"DYNAMODB_THROTTLED", "OK"}),
        (0, 100, {"OK", "DYNAMODB_SYSTEM_ERRORS"}),
    ],
)
def test_cloudwatch(throttled: float, errors: float, expected: set[str]) -> None:
    checks = domain.cloudwatch_checks(throttled, errors, errors_critical=100)
    assert {c.reason for c in checks} == expected


def test_cloudwatch_errors_critical_above_threshold() -> None:
    at, above = (domain.cloudwatch_checks(0, n, errors_critical=100)[1].status for n in (100, 101))
    assert (at, above) == (Level.WARNING, Level.CRITICAL)


# -- failures and settings ------------------------------------------------------------------------


def test_failed_check() -> None:
    timed_out = domain.failed_check("jetstream", Level.CRITICAL, TimeoutError())
    assert (timed_out.status, timed_out.reason, timed_out.detail) == (
        Level.CRITICAL,
        "CHECK_FAILED",
        "jetstream: timed out",
    )
    long = domain.failed_check("x", Level.WARNING, RuntimeError("e" * 2000))
    assert len(long.detail) == 512


def test_settings_read_comma_lists() -> None:
    s = CollectorSettings(
        collector_tiers="fast",  # type: ignore[arg-type]
        expected_services="ingest, processor",  # type: ignore[arg-type]
    )
    assert s.collector_tiers == ["fast"] and s.expected_services == ["ingest", "processor"]
    assert s.cloudwatch is True  # real AWS
    assert CollectorSettings(aws_endpoint_url="http://127.0.0.1:4566").cloudwatch is False
    with pytest.raises(ValueError, match="STREAM/durable"):
        CollectorSettings(expected_consumers="processor")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LAG_CRITICAL"):
        CollectorSettings(consumer_lag_warning=10, consumer_lag_critical=5)
