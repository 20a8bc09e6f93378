"""The probes of each tier: gather facts from the broker, the queue, storage and AWS, and hand them
to :mod:`aegis_cloud_collector.domain` for the decision. Read-only everywhere: a collector writes
nothing but its own snapshot."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aegis_cloud_collector import domain
from aegis_cloud_collector.collector import Context, Probe
from aegis_cloud_collector.mqtt_sys import SysMonitor
from aegis_cloud_collector.settings import CollectorSettings
from aegis_contracts import keys
from aegis_contracts.cloud import CloudCheck
from aegis_contracts.state import Level
from aegis_contracts.subjects import STREAMS
from aegis_contracts.times import day_path, parse_ts
from aegis_runtime import natsio
from aegis_runtime.heartbeat import last_heartbeats
from aegis_storage.bootstrap import describe_foundation, expected_foundation
from aegis_storage.clients import AwsClients
from aegis_storage.errors import NotFound, StorageError
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore
from aegis_storage.tasks import all_of

if TYPE_CHECKING:
    from faststream.nats import NatsBroker

# the streams whose durable consumers are watched (AEGIS_DLQ is read by operators, not services)
CONSUMER_STREAMS = ("AEGIS_RAW", "AEGIS_EVENTS")
DLQ_STREAM = "AEGIS_DLQ"


async def _timed(call: Callable[[], Awaitable[Any]]) -> tuple[float | None, str | None]:
    started = time.perf_counter()
    try:
        await call()
    except Exception as err:
        return None, str(err) or type(err).__name__
    return (time.perf_counter() - started) * 1000, None


# -- fast ---------------------------------------------------------------------------------------


@dataclass
class FastProbes:
    settings: CollectorSettings
    broker: NatsBroker  # connected: the queue's state is read through aegis_runtime.natsio
    clients: AwsClients
    readmodel: ReadModel
    monitor: SysMonitor | None

    def probes(self) -> list[Probe]:
        found = [
            Probe("jetstream", self.jetstream, Level.CRITICAL),
            Probe("dead_letters", self.dead_letters),
            Probe("services", self.services, Level.CRITICAL),
            Probe("storage", self.storage, Level.CRITICAL),
            Probe("freshness", self.freshness),
        ]
        if self.monitor is not None:
            found.insert(0, Probe("mqtt", self.mqtt, Level.CRITICAL))
        return found

    async def mqtt(self, context: Context) -> list[CloudCheck]:
        assert self.monitor is not None
        state = self.monitor.state()
        return [
            domain.mqtt_check(
                state,
                sys_interval_s=self.settings.mqtt_sys_interval_s,
                grace_s=self.settings.cloud_startup_grace_s,
            )
        ]

    async def jetstream(self, context: Context) -> list[CloudCheck]:
        s = self.settings
        checks: list[CloudCheck] = []
        present: list[tuple[str, str]] = []
        for spec in STREAMS:
            state = await natsio.stream_state(self.broker, spec.name)
            if state is None:
                checks.append(domain.stream_check(spec.name, None))
                continue
            checks.append(
                domain.stream_check(
                    spec.name,
                    domain.StreamFacts(
                        spec.name, state.messages, state.bytes, state.consumer_count
                    ),
                )
            )
            if spec.name not in CONSUMER_STREAMS:
                continue
            for consumer in await natsio.consumers(self.broker, spec.name):
                durable = consumer.config.durable_name
                if not durable:
                    continue  # ephemeral: someone's live subscription, not a service's
                present.append((spec.name, durable))
                facts = domain.ConsumerFacts(
                    stream=spec.name,
                    durable=durable,
                    pull=consumer.config.deliver_subject is None,
                    push_bound=bool(consumer.push_bound),
                    num_pending=consumer.num_pending or 0,
                    num_ack_pending=consumer.num_ack_pending or 0,
                    num_redelivered=consumer.num_redelivered or 0,
                    num_waiting=consumer.num_waiting or 0,
                    ack_floor=(consumer.ack_floor.stream_seq or 0) if consumer.ack_floor else 0,
                )
                before = context.previous.check(facts.name) if context.previous else None
                checks.append(
                    domain.consumer_check(
                        facts,
                        before,
                        lag_warning=s.consumer_lag_warning,
                        lag_critical=s.consumer_lag_critical,
                    )
                )
        checks += domain.missing_consumer_checks(s.expected_consumers, present)
        return checks

    async def dead_letters(self, context: Context) -> list[CloudCheck]:
        state = await natsio.stream_state(
            self.broker, DLQ_STREAM, subjects_filter=self.settings.dead_letter_filter
        )
        if state is None:
            return []  # the jetstream probe reports the missing stream
        return domain.dead_letter_checks(state.subjects or {}, context.previous)

    async def services(self, context: Context) -> list[CloudCheck]:
        beats = await last_heartbeats(self.broker)
        return domain.service_checks(
            beats,
            self.settings.expected_services,
            context.now,
            missed=self.settings.heartbeat_missed,
            watching_since=context.started_at,
            grace_s=self.settings.cloud_startup_grace_s,
        )

    async def storage(self, context: Context) -> list[CloudCheck]:
        """Round trips of the cheapest read each store has: HeadBucket, and a GetItem of the item
        the dashboard reads most (CLOUD#infra LATEST)."""
        s3, ddb = await asyncio.gather(
            _timed(lambda: self.clients.s3.head_bucket(Bucket=self.settings.bucket)),
            _timed(self.readmodel.get_cloud_latest),
        )
        slow = self.settings.storage_slow_ms
        return [
            domain.storage_check("s3", *s3, slow_ms=slow),
            domain.storage_check("dynamodb", *ddb, slow_ms=slow),
        ]

    async def freshness(self, context: Context) -> list[CloudCheck]:
        return domain.freshness_checks(
            await self.readmodel.factory_latest_items(),
            context.now,
            ingest_lag_warning_s=self.settings.ingest_lag_warning_s,
            stalled_after_s=self.settings.pipeline_stalled_after_s,
        )


# -- slow ---------------------------------------------------------------------------------------

# family -> (root, how many folder levels (factory, dataset, …) before the date, hour partitions)
OBJECT_FAMILIES: dict[str, tuple[str, int, bool]] = {
    "raw": (keys.RAW_PREFIX, 2, False),
    "processed": (keys.PROCESSED_PREFIX, 2, True),
    "processed_agg": (keys.PROCESSED_AGG_PREFIX, 2, True),
    "image_snapshot": (keys.IMAGE_SNAPSHOT_PREFIX, 1, True),
    "reports": (keys.REPORTS_DAILY_PREFIX, 0, False),
}


class ObjectCounter:
    """Today's (UTC) objects and bytes per prefix family. Hour partitions that are closed (past
    their end plus ``grace``) are counted once and cached; each run lists only what can still
    change. raw/ and reports/ have no hour partition: their day is listed every run."""

    def __init__(self, store: ObjectStore, *, grace: timedelta) -> None:
        self.store = store
        self.grace = grace
        self._day: str | None = None
        self._closed: dict[str, tuple[int, int]] = {}
        self.listings = 0  # how many listings the last run made (tests, logs)

    async def count(self, family: str, now: datetime) -> tuple[int, int, int]:
        """(objects, bytes, partitions listed or cached) of ``family`` today."""
        root, depth, hourly = OBJECT_FAMILIES[family]
        day = day_path(now.date())
        if self._day != day:
            self._day, self._closed = day, {}
        bases = [root]
        for _ in range(depth):
            levels = await all_of(*(self.store.child_prefixes(b) for b in bases))
            self.listings += len(bases)
            bases = [child for level in levels for child in level]
        totals = [0, 0]
        partitions = 0
        for base in bases:
            day_prefix = f"{base}{day}/"
            if hourly:
                found = await self._hours(day_prefix, now)
            else:
                found = [await self._sum(day_prefix)]
            partitions += len(found)
            for n, size in found:
                totals[0] += n
                totals[1] += size
        return totals[0], totals[1], partitions

    async def _hours(self, day_prefix: str, now: datetime) -> list[tuple[int, int]]:
        start = datetime(now.year, now.month, now.day, tzinfo=UTC)
        hours = [start + timedelta(hours=h) for h in range(now.hour + 1)]
        prefixes = {h: f"{day_prefix}hh={h.hour:02d}/" for h in hours}
        needed = [h for h in hours if prefixes[h] not in self._closed]
        counted: dict[str, tuple[int, int]] = {}
        if len(needed) > 1:  # first sight of this day: one listing, split by hour
            by_hour: dict[str, list[int]] = defaultdict(lambda: [0, 0])
            self.listings += 1
            async for obj in self.store.list_objects(day_prefix):
                hour_part = obj.key[len(day_prefix) :].split("/", 1)[0]
                entry = by_hour[f"{day_prefix}{hour_part}/"]
                entry[0] += 1
                entry[1] += obj.size_bytes
            counted = {p: (v[0], v[1]) for p, v in by_hour.items()}
        else:
            for h in needed:
                counted[prefixes[h]] = await self._sum(prefixes[h])
        found = []
        for h in hours:
            prefix = prefixes[h]
            if prefix in self._closed:
                found.append(self._closed[prefix])
                continue
            value = counted.get(prefix, (0, 0))
            if domain.hour_closed(h, now, grace=self.grace):
                self._closed[prefix] = value
            found.append(value)
        return found

    async def _sum(self, prefix: str) -> tuple[int, int]:
        self.listings += 1
        n = size = 0
        async for obj in self.store.list_objects(prefix):
            n += 1
            size += obj.size_bytes
        return n, size


# DynamoDB's CloudWatch metrics: ThrottledRequests and SystemErrors are per (TableName, Operation)
CLOUDWATCH_OPERATIONS = ("GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan")
CLOUDWATCH_SPAN = timedelta(minutes=5)


@dataclass
class SlowProbes:
    settings: CollectorSettings
    clients: AwsClients
    readmodel: ReadModel
    counter: ObjectCounter
    cloudwatch: Any | None = None  # an aiobotocore CloudWatch client when enabled

    def probes(self) -> list[Probe]:
        found = [
            Probe("foundation", self.foundation, Level.CRITICAL),
            Probe("objects", self.objects),
            Probe("coverage", self.coverage),
        ]
        if self.cloudwatch is not None:
            found.append(Probe("cloudwatch", self.cloudwatch_metrics))
        return found

    async def foundation(self, context: Context) -> list[CloudCheck]:
        s = self.settings
        try:
            actual = await describe_foundation(self.clients, bucket=s.bucket, table=s.table)
        except NotFound as err:
            return [
                domain.failed_check("foundation", Level.CRITICAL, err).model_copy(
                    update={"reason": "FOUNDATION_MISSING"}
                )
            ]
        except StorageError as err:
            return [
                domain.failed_check("foundation", Level.CRITICAL, err).model_copy(
                    update={"reason": "FOUNDATION_UNREACHABLE"}
                )
            ]
        expected = expected_foundation(bucket=s.bucket, table=s.table, region=s.region)
        return domain.foundation_checks(actual, expected)

    async def objects(self, context: Context) -> list[CloudCheck]:
        self.counter.listings = 0
        checks = []
        for family in OBJECT_FAMILIES:
            count, size, partitions = await self.counter.count(family, context.now)
            checks.append(domain.object_count_check(family, count, size, partitions))
        return checks

    async def coverage(self, context: Context) -> list[CloudCheck]:
        now = context.now
        newest = domain.newest_graded_window(now)
        oldest = newest - (domain.GRAPH_WINDOWS_SHOWN - 1) * domain.GRAPH_WINDOW
        checks = []
        for item in await self.readmodel.factory_latest_items():
            factory = str(item.get("factory_id") or str(item["pk"]).removeprefix("FACTORY#"))
            # one HISTORY item of the newest graded window (did it have any?) and the window
            # buckets: what it reads does not grow with the factory's message rate
            newest_history, graph = await all_of(
                self.readmodel.query_range(
                    keys.factory_pk(factory),
                    keys.HISTORY_STATE_PREFIX,
                    newest,
                    newest + domain.GRAPH_WINDOW,
                    now=now,
                    limit=1,
                ),
                self.readmodel.graph_buckets(
                    factory,
                    min(now - timedelta(hours=1), oldest),
                    newest + domain.GRAPH_WINDOW,
                    now=now,
                ),
            )
            checks.append(
                domain.coverage_check(
                    factory,
                    bool(newest_history),
                    {
                        parse_ts(str(g["bucket_start"])): int(
                            (g.get("stats") or {}).get("samples", 0)
                        )
                        for g in graph
                        if g.get("bucket_start")
                    },
                    now,
                    graph_expected=self.settings.graph_check_enabled,
                )
            )
        return checks

    async def cloudwatch_metrics(self, context: Context) -> list[CloudCheck]:
        table = self.settings.table
        queries: list[dict[str, Any]] = []
        for metric, prefix in (("ThrottledRequests", "t"), ("SystemErrors", "e")):
            for i, operation in enumerate(CLOUDWATCH_OPERATIONS):
                queries.append(
                    _metric_query(
                        f"{prefix}{i}",
                        metric,
                        [("TableName", table), ("Operation", operation)],
                    )
                )
        for i, metric in enumerate(("ReadThrottleEvents", "WriteThrottleEvents")):
            queries.append(_metric_query(f"t{len(queries)}{i}", metric, [("TableName", table)]))
        assert self.cloudwatch is not None
        resp = await self.cloudwatch.get_metric_data(
            MetricDataQueries=queries,
            StartTime=context.now - CLOUDWATCH_SPAN,
            EndTime=context.now,
        )
        sums = {"t": 0.0, "e": 0.0}
        for result in resp.get("MetricDataResults", []):
            sums[str(result["Id"])[0]] += float(sum(result.get("Values", [])))
        return domain.cloudwatch_checks(
            sums["t"], sums["e"], errors_critical=self.settings.cloudwatch_errors_critical
        )


def _metric_query(query_id: str, metric: str, dimensions: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "Id": query_id,
        "MetricStat": {
            "Metric": {
                "Namespace": "AWS/DynamoDB",
                "MetricName": metric,
                "Dimensions": [{"Name": n, "Value": v} for n, v in dimensions],
            },
            "Period": int(CLOUDWATCH_SPAN.total_seconds()),
            "Stat": "Sum",
        },
        "ReturnData": True,
    }
