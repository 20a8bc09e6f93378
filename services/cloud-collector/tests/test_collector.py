"""The cloud collectors in-process against real NATS JetStream, Mosquitto and the S3/DynamoDB
emulator. Time is a fake clock; each test calls ``tick()`` itself, one window at a time.

Each test has its own NATS server (the collector reads every stream, consumer and heartbeat of the
server, so the shared test server's other tenants would be noise), bucket and table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from nats.js import api

from aegis_cloud_collector.app import CollectorApp, create_app
from aegis_cloud_collector.collector import Context
from aegis_cloud_collector.probes import ObjectCounter, SlowProbes
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts import keys
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.events import ObjectCreated
from aegis_contracts.state import Level
from aegis_contracts.subjects import object_created_subject, raw_subject
from aegis_contracts.times import floor_to, format_ts
from aegis_devstack.localservers import ManagedServer
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_runtime.heartbeat import HeartbeatPublisher
from aegis_storage.bootstrap import LIFECYCLE_RULES, bootstrap
from aegis_storage.clients import AwsConfig, open_client

pytestmark = pytest.mark.integration

T0 = floor_to(datetime.now(UTC), timedelta(minutes=5)) + timedelta(seconds=1)


NO_RULES: dict[str, Any] = {
    "cloud_for_s": 0,
    "cloud_clear_s": 0,
    "cloud_for_by_reason": "SERVICE_DOWN=0,SERVICE_NOT_READY=0,MQTT_SYS_SILENT=0",
    "cloud_startup_grace_s": 0,
}


def collector_settings(
    foundation: Foundation, aws_endpoint: str, nats: str, **overrides: Any
) -> CollectorSettings:
    values: dict[str, Any] = {
        "aws_endpoint_url": aws_endpoint,
        "bucket": foundation.bucket,
        "table": foundation.table,
        "nats_url": nats,
        "expected_services": [],
        "expected_consumers": ["AEGIS_RAW/processor"],
        "mqtt_sys_interval_s": 5,  # the private Mosquitto's
        "storage_slow_ms": 5000,  # a shared 2-core machine: latency is not under test here
        # the checks as measured, each run on its own: these tests are about the probes and the
        # filing (the rules' for, clear and start-up grace have tests of their own)
        **NO_RULES,
        **overrides,
    }
    return CollectorSettings(**values)


@asynccontextmanager
async def running(settings: CollectorSettings, clock: FakeClock) -> AsyncIterator[CollectorApp]:
    app = create_app(settings, clock=clock, background=False)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def reasons(snapshot: CloudSnapshot | None) -> dict[str, str]:
    assert snapshot is not None
    return {c.name: c.reason for c in snapshot.checks if c.status is not Level.NORMAL}


async def overall(foundation: Foundation) -> str:
    latest = await foundation.readmodel.get_cloud_latest()
    assert latest is not None
    return str(latest["overall_status"])


async def test_fast_stalled_consumer_and_lost_heartbeat_turn_critical_and_recover(
    foundation: Foundation,
    aws_endpoint: str,
    private_nats: ManagedServer,
    private_mosquitto: ManagedServer,
) -> None:
    clock = FakeClock(T0)
    settings = collector_settings(
        foundation,
        aws_endpoint,
        private_nats.url,
        mqtt_url=private_mosquitto.url,
        collector_tiers=["fast"],
        expected_services=["watched"],
    )
    async with running(settings, clock) as app:
        assert app.monitor is not None
        stop = asyncio.Event()
        monitor = asyncio.create_task(app.monitor.run(stop))
        await eventually(
            lambda: app.monitor is not None and app.monitor.state().silent_for_s is not None,
            what="$SYS",
        )
        js = app.broker.connection.jetstream()
        await js.add_consumer(
            "AEGIS_RAW",
            api.ConsumerConfig(durable_name="processor", ack_policy=api.AckPolicy.EXPLICIT),
        )
        for _ in range(3):
            await js.publish(raw_subject("factory-a", "factory_state"), b"{}", stream="AEGIS_RAW")

        async def ready() -> dict[str, bool]:
            return {"nats": True}

        watched = HeartbeatPublisher(app.broker, service="watched", readiness=ready, clock=clock)
        await watched.beat()
        fast = app.collectors["fast"]

        first = await fast.tick()
        assert first is not None and reasons(first) == {}
        assert first.check("mqtt") is not None and first.check("mqtt").value is not None  # type: ignore[union-attr]
        consumer = first.check("consumer:AEGIS_RAW/processor")
        assert consumer is not None and consumer.value == 3
        assert await overall(foundation) == "NORMAL"
        key = keys.cloud_infra_key("fast", T0)
        assert CloudSnapshot.model_validate(await foundation.store.get_json(key)) == first
        event = await js.get_last_msg("AEGIS_EVENTS", object_created_subject(keys.CLOUD_INFRA))
        assert ObjectCreated.model_validate_json(event.data).key == key
        assert await fast.tick() is None  # same window: already run

        # a minute later nobody has pulled (ack floor still 0) and "watched" has gone quiet
        clock.advance(60)
        second = await fast.tick()
        assert reasons(second) == {
            "consumer:AEGIS_RAW/processor": "CONSUMER_STALLED",
            "service:watched": "SERVICE_DOWN",
        }
        assert await overall(foundation) == "CRITICAL"

        # recovery: the consumer works off its backlog, the service beats again
        sub = await js.pull_subscribe_bind("processor", stream="AEGIS_RAW")
        for msg in await sub.fetch(3, timeout=5):
            await msg.ack_sync()
        clock.advance(60)
        await watched.beat()
        third = await fast.tick()
        assert reasons(third) == {}
        assert await overall(foundation) == "NORMAL"

        # the broker goes away: MQTT_UNREACHABLE; and with the backlog done and nobody pulling for
        # two samples, the consumer is inactive (a warning: nothing is waiting on it)
        private_mosquitto.stop()
        await eventually(
            lambda: app.monitor is not None and not app.monitor.connected, what="disconnect"
        )
        clock.advance(60)
        await watched.beat()
        fourth = await fast.tick()
        assert reasons(fourth) == {
            "mqtt": "MQTT_UNREACHABLE",
            "consumer:AEGIS_RAW/processor": "CONSUMER_INACTIVE",
        }
        assert await overall(foundation) == "CRITICAL"
        stop.set()
        await monitor
        await sub.unsubscribe()


async def test_slow_drift_lifecycle_and_pitr_then_recovery_leaves_fast_fields_alone(
    foundation: Foundation, aws_endpoint: str, private_nats: ManagedServer
) -> None:
    clock = FakeClock(T0)
    settings = collector_settings(
        foundation, aws_endpoint, private_nats.url, collector_tiers=["slow"]
    )
    fast = CloudSnapshot.of("fast", T0, [CloudCheck.ok("mqtt", 1)])
    await foundation.readmodel.apply_cloud(fast, ttl=int(T0.timestamp()) + 3600)
    async with running(settings, clock) as app:
        slow = app.collectors["slow"]
        first = await slow.tick()
        assert reasons(first) == {}
        names = {c.name for c in first.checks} if first else set()
        assert {"foundation:bucket_lifecycle", "foundation:table_pitr", "objects:raw"} <= names

        s3, ddb = foundation.clients.s3, foundation.clients.dynamodb
        await s3.put_bucket_lifecycle_configuration(
            Bucket=foundation.bucket,
            LifecycleConfiguration={"Rules": LIFECYCLE_RULES[1:]},  # type: ignore[typeddict-item]
        )
        clock.advance(300)
        assert reasons(await slow.tick()) == {"foundation:bucket_lifecycle": "FOUNDATION_DRIFT"}
        assert await overall(foundation) == "WARNING"

        await ddb.update_continuous_backups(
            TableName=foundation.table,
            PointInTimeRecoverySpecification={"PointInTimeRecoveryEnabled": False},
        )
        clock.advance(300)
        drifted = await slow.tick()
        assert reasons(drifted) == {
            "foundation:bucket_lifecycle": "FOUNDATION_DRIFT",
            "foundation:table_pitr": "FOUNDATION_DRIFT",
        }
        pitr = drifted.check("foundation:table_pitr") if drifted else None
        assert pitr is not None and "DISABLED" in pitr.detail
        assert await overall(foundation) == "WARNING"

        await bootstrap(foundation.clients, bucket=foundation.bucket, table=foundation.table)
        clock.advance(300)
        assert reasons(await slow.tick()) == {}
        assert await overall(foundation) == "NORMAL"

    latest = await foundation.readmodel.get_cloud_latest()
    assert latest is not None
    assert latest["fast"] == CloudSnapshot.model_validate(latest["fast"]).model_dump(mode="json")
    assert latest["fast_updated_at"] == format_ts(T0)
    assert latest["slow_updated_at"] == format_ts(T0 + timedelta(seconds=900))


async def test_two_replicas_run_each_window_once(
    foundation: Foundation, aws_endpoint: str, private_nats: ManagedServer
) -> None:
    clock = FakeClock(T0)
    settings = collector_settings(
        foundation, aws_endpoint, private_nats.url, collector_tiers=["fast"]
    )
    async with running(settings, clock) as one, running(settings, clock) as two:
        for _ in range(2):
            runs = await asyncio.gather(
                one.collectors["fast"].tick(), two.collectors["fast"].tick()
            )
            assert sum(run is not None for run in runs) == 1
            clock.advance(60)
    history = await foundation.readmodel.cloud_history(
        "fast", T0 - timedelta(minutes=1), T0 + timedelta(minutes=5), now=T0
    )
    assert len(history) == 2
    assert len(await foundation.store.list_keys(keys.cloud_infra_prefix("fast"))) == 2


async def test_start_up_is_not_reported_and_a_restart_goes_on_from_the_read_model(
    foundation: Foundation, aws_endpoint: str, private_nats: ManagedServer
) -> None:
    """With the rules' defaults: the first run, before anything else is up, reports nothing; a
    service that never comes is pending after the start-up grace; a collector restarted then
    reads where the rule stood from CLOUD#infra LATEST and fires it at the end of its ``for``."""
    clock = FakeClock(T0)
    settings = CollectorSettings(
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        nats_url=private_nats.url,
        collector_tiers=["fast"],
        expected_services=["watched"],
        storage_slow_ms=5000,
    )
    grace = settings.cloud_startup_grace_s

    def watched(snapshot: CloudSnapshot | None) -> tuple[str, str | None]:
        check = snapshot.check("service:watched") if snapshot else None
        assert check is not None and check.alerting is not None
        return check.reason, check.alerting.state

    async with running(settings, clock) as first:
        fast = first.collectors["fast"]
        start = await fast.tick()
        # nothing is up: no $SYS subscription, no durable consumer, no heartbeat; all failing,
        # none reported
        assert start is not None and start.reasons == [] and start.status is Level.NORMAL
        assert watched(start) == ("SERVICE_STARTING", "starting")
        assert {c.alerting.state for c in start.checks if c.alerting} == {
            "ok",
            "starting",
            "pending",
        }
        clock.advance(grace + 30)
        pending = await fast.tick()
        assert pending is not None and "service:watched" not in [r.source for r in pending.reasons]
        assert watched(pending) == ("SERVICE_DOWN", "pending")
    clock.advance(30)
    async with running(settings, clock) as restarted:  # not seen since *its* start: starting
        fast = restarted.collectors["fast"]
        clock.advance(30)
        fired = await fast.tick()
        assert watched(fired) == ("SERVICE_DOWN", "firing")
        assert ("CRITICAL", "SERVICE_DOWN") in [(r.severity, r.code) for r in fired.reasons]  # type: ignore[union-attr]


async def test_object_counts_cache_closed_hours(foundation: Foundation) -> None:
    store = foundation.store
    day = datetime(2026, 11, 30, tzinfo=UTC)
    for hour, n in ((8, 2), (10, 1)):
        for i in range(n):
            at = day + timedelta(hours=hour, minutes=i)
            await store.put_json(keys.state_snapshot_key("factory-a", at), {"i": i})
    await store.put_bytes("raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/m-1.json", b"12345")
    await store.put_bytes("raw/factory-a/factory_state/yyyy=2026/mm=11/dd=29/m-0.json", b"1")
    counter = ObjectCounter(store, grace=timedelta(minutes=5))
    now = day + timedelta(hours=10, minutes=30)
    processed, _, partitions = await counter.count("processed", now)
    assert (processed, partitions) == (3, 11)  # hours 00..10
    assert (await counter.count("raw", now))[:2] == (1, 5)  # yesterday's is not today's

    # a late object in a closed hour is not listed again; the open hour is
    await store.put_json(
        keys.state_snapshot_key("factory-a", day + timedelta(hours=8, minutes=9)), {}
    )
    await store.put_json(
        keys.state_snapshot_key("factory-a", day + timedelta(hours=10, minutes=9)), {}
    )
    counter.listings = 0
    assert (await counter.count("processed", now))[0] == 4
    assert counter.listings == 3  # processed/, processed/factory-a/, and hh=10 only


async def test_cloudwatch_dynamodb_metrics(foundation: Foundation, aws_endpoint: str) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    async with open_client("cloudwatch", AwsConfig(endpoint_url=aws_endpoint)) as cloudwatch:
        settings = CollectorSettings(
            aws_endpoint_url=aws_endpoint, table=foundation.table, cloudwatch_enabled=True
        )
        probes = SlowProbes(
            settings,
            foundation.clients,
            foundation.readmodel,
            ObjectCounter(foundation.store, grace=timedelta(0)),
            cloudwatch,
        )
        assert [p.name for p in probes.probes()][-1] == "cloudwatch"
        quiet = await probes.cloudwatch_metrics(Context(now, None))
        assert {c.reason for c in quiet} == {"OK"}
        await cloudwatch.put_metric_data(
            Namespace="AWS/DynamoDB",
            MetricData=[
                {
                    "MetricName": "ThrottledRequests",
                    "Dimensions": [
                        {"Name": "TableName", "Value": foundation.table},
                        {"Name": "Operation", "Value": "PutItem"},
                    ],
                    "Timestamp": now - timedelta(minutes=1),
                    "Value": 4,
                    "Unit": "Count",
                }
            ],
        )
        checks = await probes.cloudwatch_metrics(Context(now, None))
        by_name = {c.name: c for c in checks}
        throttled = by_name["cloudwatch:dynamodb_throttled"]
        assert (throttled.status, throttled.reason, throttled.value) == (
            Level.WARNING,
            "DYNAMODB_THROTTLED",
            4,
        )
        assert by_name["cloudwatch:dynamodb_errors"].status is Level.NORMAL


async def test_coverage_reads_the_buckets_and_one_history_item_whatever_the_history(
    foundation: Foundation, aws_endpoint: str
) -> None:
    """GRAPH_BEHIND when the newest graded window had HISTORY but has no bucket; the HISTORY
    read is one small page, however many snapshots the window holds (a busy factory)."""
    from aegis_cloud_collector import domain  # noqa: PLC0415
    from aegis_devstack.testing.emulator import arequest_counts  # noqa: PLC0415

    now = datetime(2026, 11, 30, 10, 12, tzinfo=UTC)
    newest = domain.newest_graded_window(now)
    rm = foundation.readmodel
    await seed_latest(rm, "factory-a", {"factory_id": "factory-a"})
    ttl = int((now + timedelta(hours=1)).timestamp())
    for i in range(120):  # a snapshot every 2.5 s in the newest window
        at = newest + timedelta(milliseconds=2500 * i)
        await rm.put_item({"pk": "FACTORY#factory-a", "sk": keys.history_state_sk(at), "ttl": ttl})
    for i in range(1, 12):  # every bucket but the newest
        start = newest - i * domain.GRAPH_WINDOW
        await rm.put_item(
            {
                "pk": "FACTORY#factory-a",
                "sk": keys.graph_5m_sk(start),
                "bucket_start": format_ts(start),
                "stats": {"samples": 60},
                "ttl": ttl,
            }
        )
    probes = SlowProbes(
        CollectorSettings(aws_endpoint_url=aws_endpoint, table=foundation.table),
        foundation.clients,
        rm,
        ObjectCounter(foundation.store, grace=timedelta(0)),
    )
    before = await arequest_counts(aws_endpoint)
    (behind,) = await probes.coverage(Context(now, None))
    read = await arequest_counts(aws_endpoint) - before
    assert (behind.reason, behind.value) == ("GRAPH_BEHIND", 11)
    assert behind.measures == {"history_last_hour": 60 * 9}
    # 8 index queries (the fleet), one small HISTORY page, the buckets (11 items)
    assert read.count("dynamodb", "Query") == 2
    assert read.items_scanned("Query") <= 10 + 11

    await rm.put_item(
        {
            "pk": "FACTORY#factory-a",
            "sk": keys.graph_5m_sk(newest),
            "bucket_start": format_ts(newest),
            "stats": {"samples": 120},
            "ttl": ttl,
        }
    )
    (caught_up,) = await probes.coverage(Context(now, None))
    assert (caught_up.status, caught_up.value) == (Level.NORMAL, 12)
