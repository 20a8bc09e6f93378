"""Incidents on /metrics against the real S3/DynamoDB emulator, time from a clock the test moves:
the open count read at most every refresh_s and kept between reads, and the times to
acknowledge and to resolve observed once per incident across two replicas archiving it at once."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aegis_alert_dispatcher.app import DispatcherApp
from aegis_alert_dispatcher.incident_metrics import IncidentMetrics
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_contracts import incidents
from aegis_contracts.items import Incident
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.storage import Foundation
from aegis_runtime.metrics import Metrics

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: Metrics) -> Samples:
    """/metrics as a Prometheus server parses it."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def open_count(found: Samples, severity: str, state: str) -> float:
    return found[("aegis_incidents_open", (("severity", severity), ("state", state)))]


def observed(replicas: list[Samples], name: str, severity: str) -> tuple[float, float]:
    """The count and sum of a histogram over every replica (what ``sum`` in a query gives)."""
    label = (("severity", severity),)
    return (
        sum(r[(f"aegis_{name}_count", label)] for r in replicas),
        sum(r[(f"aegis_{name}_sum", label)] for r in replicas),
    )


def incident(
    scope: str,
    severity: incidents.Severity,
    *,
    minute: int,
    ack_after: int | None = None,
    resolve_after: int | None = None,
) -> Incident:
    at = T0 + timedelta(minutes=minute)
    i = incidents.open_incident(
        scope=scope, stream="risk", reason="CO_HIGH", severity=severity, at=at
    )
    if ack_after is not None:
        acked = incidents.acknowledge(
            i, by="kim", via="slack", at=at + timedelta(seconds=ack_after)
        )
        assert acked is not None
        i = acked
    if resolve_after is not None:
        closed = incidents.resolve(i, at=at + timedelta(seconds=resolve_after))
        assert closed is not None
        i = closed
    return i


def replica(f: Foundation, clock: FakeClock) -> IncidentMetrics:
    watched = IncidentMetrics(Metrics("alert-dispatcher"), clock=clock, refresh_s=30)
    watched.watch(f.clients, table=f.table, bucket=f.bucket, changes=None)
    return watched


async def test_the_open_incidents_are_read_at_most_every_refresh_and_kept_between(
    foundation: Foundation,
) -> None:
    clock = FakeClock(T0 + timedelta(hours=1))
    one = replica(foundation, clock)
    assert one.store is not None
    before = samples(one.metrics)
    assert open_count(before, "CRITICAL", "triggered") == 0
    assert math.isnan(before[("aegis_incidents_open_age_seconds", ())])
    for i in (
        incident("f-a", "CRITICAL", minute=0),
        incident("f-b", "CRITICAL", minute=1, ack_after=90),
        incident("f-c", "WARNING", minute=2),
        incident("f-d", "WARNING", minute=3, ack_after=30, resolve_after=60),  # not open
    ):
        await one.store.save(i, None)

    assert await one.refresh()
    found = samples(one.metrics)
    assert [
        open_count(found, sev, state)
        for sev in ("CRITICAL", "WARNING")
        for state in ("triggered", "acknowledged")
    ] == [1, 1, 1, 0]
    assert found[("aegis_incidents_open_age_seconds", ())] == 0

    # within refresh_s: no read, the count as it was, and how old it is
    await one.store.save(incident("f-e", "WARNING", minute=4), None)
    clock.advance(timedelta(seconds=29))
    assert not await one.refresh()
    found = samples(one.metrics)
    assert open_count(found, "WARNING", "triggered") == 1
    assert found[("aegis_incidents_open_age_seconds", ())] == 29
    clock.advance(timedelta(seconds=1))
    assert await one.refresh()
    assert open_count(samples(one.metrics), "WARNING", "triggered") == 2


async def test_two_replicas_archiving_at_once_observe_each_incident_once(
    foundation: Foundation,
) -> None:
    clock = FakeClock(T0 + timedelta(hours=2))
    a, b = replica(foundation, clock), replica(foundation, clock)
    assert a.store is not None and b.store is not None
    closed = [
        incident("f-a", "CRITICAL", minute=0, ack_after=240, resolve_after=1800),
        incident("f-b", "CRITICAL", minute=1, ack_after=60, resolve_after=300),
        incident("f-c", "WARNING", minute=2, resolve_after=600),  # never acknowledged
    ]
    for i in closed:
        await a.store.save(i, None)
    for _ in range(2):  # and again: archived already, nothing more
        await asyncio.gather(
            *(r.archive(i.incident_id, now=clock()) for i in closed for r in (a.store, b.store))
        )
    both = [samples(a.metrics), samples(b.metrics)]
    assert observed(both, "incident_time_to_acknowledge_seconds", "CRITICAL") == (2, 300.0)
    assert observed(both, "incident_time_to_acknowledge_seconds", "WARNING") == (0, 0.0)
    assert observed(both, "incident_time_to_resolve_seconds", "CRITICAL") == (2, 2100.0)
    assert observed(both, "incident_time_to_resolve_seconds", "WARNING") == (1, 600.0)
    # a bucket: the 240 s acknowledgement is under 300 s, the 60 s one under 60 s
    le = (("le", "60.0"), ("severity", "CRITICAL"))
    name = "aegis_incident_time_to_acknowledge_seconds_bucket"
    assert sum(r[(name, le)] for r in both) == 1
    for i in closed:
        stored = await a.store.get(i.incident_id)
        assert stored is not None and stored.archived_key == incidents.record_key(i)


def test_the_service_exposes_the_incident_metrics() -> None:
    app = DispatcherApp(DispatcherSettings(incident_metrics_refresh_s=7))
    assert app.incident_metrics.refresh_s == 7
    names = {
        family.name for family in text_string_to_metric_families(app.metrics.render().decode())
    }
    assert {
        "aegis_incidents_open",
        "aegis_incidents_open_age_seconds",
        "aegis_incident_time_to_acknowledge_seconds",
        "aegis_incident_time_to_resolve_seconds",
    } <= names
