"""The alert incidents of the daily report over the real S3/DynamoDB emulator, with a clock the
test sets: closed records read from the two UTC days a KST day overlaps (an incident at 23:50 KST
is in the day it was triggered, whatever UTC day holds its record), open ones from the read model,
MTTA and MTTR exact, the fleet's totals, and the same bytes on a second run."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import pytest

from aegis_contracts import incidents, keys
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.items import Incident
from aegis_contracts.keys import ReportArtifact
from aegis_devstack.testing.builders import FakeClock, seed_latest
from aegis_devstack.testing.storage import Foundation
from aegis_reporter.incidents import utc_days
from aegis_reporter.report import Reporter
from aegis_storage.incidents import IncidentStore
from aegis_storage.s3 import to_json_bytes

pytestmark = pytest.mark.integration

DAY = date(2026, 11, 30)
START = datetime(2026, 11, 29, 15, 0, tzinfo=UTC)  # KST 2026-11-30 00:00
AFTER = START + timedelta(days=1, minutes=40)
CLOUD = keys.CLOUD_INFRA_TARGET


ONE = timedelta(days=1)


def kst(on: date, hour: int, minute: int) -> datetime:
    """UTC of KST ``on`` hour:minute."""
    return datetime(on.year, on.month, on.day, hour, minute, tzinfo=UTC) - timedelta(hours=9)


def made(
    scope: str,
    reason: str,
    severity: incidents.Severity,
    at: datetime,
    *,
    told: tuple[tuple[str, str], ...] = (("slack", "sent"),),
    ack: tuple[str, str, int] | None = None,
    resolved: tuple[int, str, str, str | None] | None = None,
    escalate_to: tuple[str, int] | None = None,
) -> Incident:
    """An incident as the dispatcher and a person leave it: notified, maybe escalated,
    acknowledged (by, via, after s) and resolved (after s, by, via, note)."""
    i = incidents.open_incident(scope=scope, stream="risk", reason=reason, severity=severity, at=at)
    for n, (receiver, outcome) in enumerate(told):
        i = incidents.notified(
            i, at=at + timedelta(seconds=n + 1), receiver=receiver, outcome=outcome
        )
    if escalate_to is not None:
        receiver, after = escalate_to
        i = incidents.escalated(i, level=1, at=at + timedelta(seconds=after))
        i = incidents.notified(
            i, at=at + timedelta(seconds=after), receiver=receiver, outcome="sent"
        )
    if ack is not None:
        by, via, after = ack
        acked = incidents.acknowledge(i, by=by, via=via, at=at + timedelta(seconds=after))
        assert acked is not None
        i = acked
    if resolved is not None:
        after, by, via, note = resolved
        closed = incidents.resolve(i, at=at + timedelta(seconds=after), by=by, via=via, note=note)
        assert closed is not None
        i = closed
    return i


async def seed(f: Foundation, fid: str) -> dict[str, Incident]:
    """Closed records (archived by the store, or written as the record alone), open incidents
    and a resolved one whose record is not written yet."""
    store = IncidentStore(f.readmodel, f.store)
    seen = {
        # KST 11-29 23:50 (UTC 11-29 14:50): the day before; its record is under dd=29
        "before": made(
            fid, "CO_HIGH", "WARNING", kst(DAY - ONE, 23, 50), resolved=(300, "aegis", "data", None)
        ),
        # KST 11-30 00:10 (UTC 11-29 15:10): this day, its record under the previous UTC date
        "first": made(
            fid,
            "FIRE_DETECTED",
            "CRITICAL",
            kst(DAY, 0, 10),
            escalate_to=("pager", 200),
            ack=("kim", "slack", 240),
            resolved=(1800, "kim", "dashboard", "valve closed, area ventilated"),
        ),
        # KST 11-30 23:50 (UTC 11-30 14:50): this day, never acknowledged, resolved by the data
        "last": made(
            fid,
            "CO_HIGH",
            "WARNING",
            kst(DAY, 23, 50),
            told=(("slack", "sent"), ("pager", "undeliverable")),
            resolved=(600, "aegis", "data", None),
        ),
        # KST 12-01 00:10 (UTC 11-30 15:10): the next day, its record under dd=30
        "after": made(
            fid, "CO_HIGH", "WARNING", kst(DAY + ONE, 0, 10), resolved=(60, "aegis", "data", None)
        ),
        # open: acknowledged, and not
        "acked": made(fid, "GAS_LEAK", "CRITICAL", kst(DAY, 10, 0), ack=("lee", "cli", 120)),
        "open": made(fid, "NO_HELMET_DETECTED", "WARNING", kst(DAY, 12, 0)),
        # resolved, its record not yet written: from the read model, closed
        "unarchived": made(
            fid,
            "TEMP_HIGH",
            "WARNING",
            kst(DAY, 13, 0),
            ack=("park", "dashboard", 60),
            resolved=(300, "aegis", "data", None),
        ),
        "cloud": made(
            CLOUD,
            "SERVICE_DOWN",
            "CRITICAL",
            kst(DAY, 5, 0),
            ack=("ops", "slack", 30),
            resolved=(90, "aegis", "data", None),
        ),
    }
    for name in ("before", "first", "acked", "open", "unarchived", "cloud"):
        await store.save(seen[name], None)
    for name in ("before", "first", "cloud"):
        await store.archive(seen[name].incident_id, now=AFTER)
    for name in ("last", "after"):  # a record alone (its item expired long ago)
        i = seen[name]
        await f.store.put_immutable(incidents.record_key(i), to_json_bytes(incidents.record(i)))
    return seen


def test_a_kst_day_reads_the_records_of_two_utc_days() -> None:
    from aegis_reporter.day import DayWindow  # noqa: PLC0415

    assert utc_days(DayWindow.of(DAY)) == [date(2026, 11, 29), date(2026, 11, 30)]
    assert incidents.record_key(made("f-1", "CO_HIGH", "WARNING", kst(DAY, 0, 10))).startswith(
        "incidents/f-1/yyyy=2026/mm=11/dd=29/"
    )


async def test_the_days_alert_incidents_with_exact_mtta_mttr_and_fleet_totals(
    foundation: Foundation, unique_id: str
) -> None:
    fid = unique_id
    seen = await seed(foundation, fid)
    await seed_latest(foundation.readmodel, fid, {"factory_id": fid})
    clock = FakeClock(AFTER)
    rep = Reporter(
        store=foundation.store, readmodel=foundation.readmodel, publish=_quiet, clock=clock
    )

    runs = await rep.run_day(DAY)
    # neither target has processed data: each is reported for its alert incidents
    assert sorted((r.target, r.alert_incidents, r.objects) for r in runs) == [
        (CLOUD, 1, 0),
        (fid, 5, 0),
    ]
    summary = json.loads(
        await foundation.store.get_bytes(keys.report_key(DAY, fid, ReportArtifact.FACTORY_SUMMARY))
    )
    alerts = summary["alert_incidents"]
    ids = {i.incident_id: name for name, i in seen.items()}
    assert [ids[r["incident_id"]] for r in alerts["items"]] == [
        "first",
        "acked",
        "open",
        "unarchived",
        "last",
    ]
    assert [(r["open"], r["state"]) for r in alerts["items"]] == [
        (False, "resolved"),
        (True, "acknowledged"),
        (True, "triggered"),
        (False, "resolved"),
        (False, "resolved"),
    ]
    first = alerts["items"][0]
    assert first == {
        "incident_id": seen["first"].incident_id,
        "stream": "risk",
        "reason": "FIRE_DETECTED",
        "severity": "CRITICAL",
        "state": "resolved",
        "open": False,
        "triggered_kst": "2026-11-30T00:10:00.000+09:00",
        "triggered_utc": "2026-11-29T15:10:00.000Z",
        "acknowledged": True,
        "acknowledged_kst": "2026-11-30T00:14:00.000+09:00",
        "acknowledged_utc": "2026-11-29T15:14:00.000Z",
        "acknowledged_by": "kim",
        "acknowledged_via": "slack",
        "time_to_acknowledge_s": 240.0,
        "resolved_kst": "2026-11-30T00:40:00.000+09:00",
        "resolved_utc": "2026-11-29T15:40:00.000Z",
        "resolved_by": "kim",
        "resolved_via": "dashboard",
        "resolution_note": "valve closed, area ventilated",
        "time_to_resolve_s": 1800.0,
        "escalation_level": 1,
        "notifications": 2,
        "receivers": {"pager": 1, "slack": 1},
        "failed_notifications": 0,
    }
    last = alerts["items"][-1]
    assert (last["acknowledged"], last["time_to_acknowledge_s"], last["time_to_resolve_s"]) == (
        False,
        None,
        600.0,
    )
    assert (last["receivers"], last["failed_notifications"]) == ({"slack": 1}, 1)
    # MTTA over the acknowledged (240, 120, 60); MTTR over the resolved (1800, 300, 600)
    assert (alerts["mtta_s"], alerts["mtta_over"]) == (140.0, 3)
    assert (alerts["mttr_s"], alerts["mttr_over"]) == (900.0, 3)
    assert alerts["counts"] == {
        "total": 5,
        "critical": 2,
        "warning": 3,
        "open": 2,
        "resolved": 3,
        "acknowledged": 3,
        "unacknowledged": 2,
        "escalated": 1,
        "resolved_by_data": 2,
        "resolved_by_person": 1,
    }
    head = summary["headline"]
    assert (head["alert_incidents"], head["open_alert_incidents"]) == (5, 2)
    assert (head["mtta_s"], head["mttr_s"]) == (140.0, 900.0)

    md = (
        await foundation.store.get_bytes(keys.report_key(DAY, fid, ReportArtifact.REPORT))
    ).decode()
    assert "## Alert incidents" in md
    assert (
        "MTTA 2m 20s over 3 acknowledged (2 unacknowledged, left out); "
        "MTTR 15m 00s over 3 resolved (2 still open)." in md
    )
    assert (
        "| 1 | 00:10:00 (15:10:00Z) | CRITICAL | FIRE_DETECTED | kim via slack after 4m 00s "
        "| after 30m 00s by kim via dashboard | valve closed, area ventilated "
        "| 2: pager x1, slack x1 |" in md
    )
    assert (
        "| 5 | 23:50:00 (14:50:00Z) | WARNING | CO_HIGH | unacknowledged "
        "| after 10m 00s by the data | — | 1: slack x1; 1 failed |" in md
    )
    assert (
        "| 3 | 12:00:00 (03:00:00Z) | WARNING | NO_HELMET_DETECTED | unacknowledged | open (triggered) |"
        in md
    )
    context = json.loads(
        await foundation.store.get_bytes(keys.report_key(DAY, fid, ReportArtifact.CONTEXT))
    )
    assert "alert_incident" in context["conventions"]
    assert context["facts"]["alert_incidents"] == alerts

    # the fleet: MTTA over 240, 120, 60 and the cloud's 30; MTTR over 1800, 600, 300 and 90
    fleet = json.loads(await foundation.store.get_bytes(keys.report_fleet_key(DAY)))
    assert fleet["kind"] == "fleet-incidents" and fleet["report_date"] == "2026-11-30"
    assert sorted(fleet["targets"]) == [CLOUD, fid]
    assert (fleet["targets"][CLOUD]["mtta_s"], fleet["targets"][CLOUD]["mttr_s"]) == (30.0, 90.0)
    totals = fleet["totals"]
    assert (totals["mtta_s"], totals["mtta_over"]) == (112.5, 4)
    assert (totals["mttr_s"], totals["mttr_over"]) == (697.5, 4)
    assert totals["counts"]["total"] == 6 and totals["counts"]["unacknowledged"] == 2
    cloud_md = (
        await foundation.store.get_bytes(keys.report_key(DAY, CLOUD, ReportArtifact.REPORT))
    ).decode()
    assert (
        "| 1 | 05:00:00 (20:00:00Z) | CRITICAL | SERVICE_DOWN | ops via slack after 30s |"
        in cloud_md
    )

    # the day before has the 23:50 KST incident, whose record shares a UTC date with "first"
    (prev,) = await rep.run_day(DAY - timedelta(days=1), [fid])
    prev_summary = json.loads(
        await foundation.store.get_bytes(
            keys.report_key(DAY - timedelta(days=1), fid, ReportArtifact.FACTORY_SUMMARY)
        )
    )
    assert [r["incident_id"] for r in prev_summary["alert_incidents"]["items"]] == [
        seen["before"].incident_id
    ]
    assert prev.alert_incidents == 1

    # again, later: the same bytes (nothing changed but the clock)
    prefix = keys.report_prefix(DAY)
    before = {
        k: await foundation.store.get_bytes(k) for k in await foundation.store.list_keys(prefix)
    }
    clock.advance(timedelta(hours=2))
    await rep.run_day(DAY)
    after = {
        k: await foundation.store.get_bytes(k) for k in await foundation.store.list_keys(prefix)
    }
    assert sorted(before) == sorted(after)
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed == [
        keys.report_key(DAY, CLOUD, ReportArtifact.METADATA),
        keys.report_key(DAY, fid, ReportArtifact.METADATA),
    ]


async def test_a_day_without_alert_incidents_says_so(foundation: Foundation) -> None:
    """Data and no incident: an empty section, no means, and the report says nobody was paged."""
    snap = CloudSnapshot.of("fast", START, [CloudCheck.ok("storage:s3", value=3.0, unit="ms")])
    await foundation.store.put_bytes(
        keys.cloud_infra_key(snap.tier, snap.updated_at), snap.model_dump_json().encode()
    )
    rep = Reporter(
        store=foundation.store,
        readmodel=foundation.readmodel,
        publish=_quiet,
        clock=FakeClock(AFTER),
    )
    (run,) = await rep.run_day(DAY, [CLOUD])
    assert run.alert_incidents == 0
    summary = json.loads(
        await foundation.store.get_bytes(keys.report_key(DAY, CLOUD, ReportArtifact.CLOUD_SUMMARY))
    )
    alerts = summary["alert_incidents"]
    assert alerts["items"] == [] and alerts["mtta_s"] is None and alerts["mttr_s"] is None
    md = (
        await foundation.store.get_bytes(keys.report_key(DAY, CLOUD, ReportArtifact.REPORT))
    ).decode()
    assert "## Alert incidents\n\nNo alert was paged." in md


async def _quiet(subject: str, event: object, *, msg_id: str) -> bool:
    return False
