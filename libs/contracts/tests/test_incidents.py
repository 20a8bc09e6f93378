"""The incident lifecycle: ids, transitions, the closed record (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aegis_contracts import incidents, keys
from aegis_contracts.errors import ContractError

T0 = datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC)


def fire() -> incidents.Incident:
    return incidents.open_incident(
        scope="factory-a", stream="STATE", reason="FIRE_DETECTED", severity="WARNING", at=T0
    )


def test_an_incident_id_is_the_same_for_the_same_first_message_and_names_its_day() -> None:
    a, b = fire(), fire()
    assert a.incident_id == b.incident_id and a.incident_id.startswith("20261130-")
    other = incidents.new_incident_id(
        "factory-a", "STATE", "FIRE_DETECTED", T0 + timedelta(seconds=1)
    )
    assert other != a.incident_id
    assert a.pk == f"INCIDENT#{a.incident_id}"
    assert incidents.record_key(a) == (
        f"incidents/factory-a/yyyy=2026/mm=11/dd=30/{a.incident_id}.json"
    )
    assert keys.parse_key(incidents.record_key(a)).incident_id == a.incident_id


def test_the_first_acknowledgement_stands_and_each_change_adds_a_version_and_a_line() -> None:
    opened = fire()
    acked = incidents.acknowledge(opened, by="kim", via="slack", at=T0 + timedelta(minutes=2))
    assert acked is not None
    assert (acked.state, acked.acknowledged_by, acked.acknowledged_via) == (
        "acknowledged",
        "kim",
        "slack",
    )
    assert acked.version == opened.version + 1
    assert [e.kind for e in acked.timeline] == ["triggered", "acknowledged"]
    assert incidents.acknowledge(acked, by="lee", via="cli", at=T0 + timedelta(minutes=3)) is None


def test_a_resolved_incident_cannot_be_acknowledged_and_a_person_resolving_gives_a_note() -> None:
    opened = fire()
    with pytest.raises(ContractError) as no_note:
        incidents.resolve(opened, at=T0, by="kim", via="dashboard", note=" ")
    assert no_note.value.code == "note_required"
    closed = incidents.resolve(
        opened, at=T0 + timedelta(minutes=5), by="kim", via="dashboard", note="false alarm: welding"
    )
    assert closed is not None and closed.resolution_note == "false alarm: welding"
    assert incidents.resolve(closed, at=T0 + timedelta(minutes=6)) is None
    with pytest.raises(ContractError) as refused:
        incidents.acknowledge(closed, by="lee", via="slack", at=T0 + timedelta(minutes=7))
    assert refused.value.code == "incident_resolved"


@pytest.mark.parametrize("bad", [{"by": "", "via": "slack"}, {"by": "kim", "via": "email"}])
def test_an_acknowledgement_names_a_person_and_a_known_place(bad: dict[str, str]) -> None:
    with pytest.raises(ContractError):
        incidents.acknowledge(fire(), at=T0, **bad)


def test_the_record_has_the_times_to_acknowledge_and_resolve_and_an_open_one_has_none() -> None:
    opened = incidents.raise_severity(fire(), "CRITICAL", T0 + timedelta(seconds=30))
    with pytest.raises(ContractError):
        incidents.record(opened)
    acked = incidents.acknowledge(opened, by="kim", via="cli", at=T0 + timedelta(seconds=90))
    assert acked is not None
    told = incidents.notified(acked, at=T0 + timedelta(seconds=1), receiver="slack", outcome="sent")
    closed = incidents.resolve(told, at=T0 + timedelta(minutes=10))
    assert closed is not None
    body = incidents.record(closed)
    assert body["time_to_acknowledge_s"] == 90.0 and body["time_to_resolve_s"] == 600.0
    assert body["severity"] == "CRITICAL" and body["notifications"] == 1
    assert {"pk", "sk", "version", "ttl"}.isdisjoint(body)


def test_a_timeline_keeps_its_first_line_and_the_newest_when_it_grows_long() -> None:
    item = fire()
    for n in range(incidents.MAX_TIMELINE + 50):
        item = incidents.notified(
            item, at=T0 + timedelta(seconds=n), receiver="slack", outcome="undeliverable"
        )
    assert len(item.timeline) == incidents.MAX_TIMELINE
    assert item.timeline[0].kind == "triggered" and item.timeline[1].kind == "note"
    assert item.timeline[-1].at == T0 + timedelta(seconds=incidents.MAX_TIMELINE + 49)
    assert item.notifications == 0  # nothing was delivered
