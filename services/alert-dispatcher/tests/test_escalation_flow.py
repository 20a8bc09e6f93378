"""The sweep over open incidents without servers: incidents in the in-memory table
(:class:`~aegis_storage.items.MemoryTable`, which refuses what DynamoDB refuses), receivers that
record what they are given, time from a clock the test turns. Escalation on time, repeated and
stopped by an acknowledgement; two replicas sweeping at once; a failing receiver's fallback. The
same rules run against the emulator and webhook servers in test_escalator.py."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from aegis_alert_dispatcher.delivery import Delivery, Undeliverable
from aegis_alert_dispatcher.escalation import EscalationConfig, load_escalation, parse_escalation
from aegis_alert_dispatcher.escalator import Escalator, Swept
from aegis_alert_dispatcher.receivers import Notification, Receiver
from aegis_contracts import incidents
from aegis_devstack.testing.builders import FakeClock, fired_incident
from aegis_storage.incidents import IncidentStore
from aegis_storage.memorytable import MemoryTable
from aegis_storage.objects import MemoryObjects

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FALLBACK = (Path(__file__).parent / "fallback.toml").read_text()


@dataclass
class Heard:
    """A receiver that takes every notification, or refuses each while ``down``."""

    name: str
    kind: str = "slack_webhook"
    down: bool = False
    titles: list[str] = field(default_factory=list)

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        if self.down:
            raise Undeliverable("HTTP 503", attempts=2, status=503)
        self.titles.append(str(n.slack_payload["text"]).split(" AEGIS ", 1)[1])
        return Delivery(attempts=1, status=200)


def escalator(
    table: MemoryTable,
    receivers: dict[str, Receiver | None],
    clock: FakeClock,
    *,
    config: EscalationConfig | None = None,
    instance: str = "host-a:1",
    swept: list[Swept] | None = None,
) -> Escalator:
    return Escalator(
        store=IncidentStore(table, MemoryObjects()),
        config=config or load_escalation(None),
        receivers=receivers,
        clock=clock,
        dashboard_url="http://dash.example",
        instance=instance,
        on_swept=swept.append if swept is not None else None,
    )


async def test_an_unacknowledged_critical_escalates_on_time_repeats_and_stops_when_acknowledged() -> (
    None
):
    table, clock, slack = MemoryTable(), FakeClock(T0), Heard("slack")
    e = escalator(table, {"slack": slack}, clock)
    gas = await fired_incident(table, "factory-a", at=T0)
    clock.now = T0 + timedelta(minutes=4, seconds=59)
    await e.sweep()
    assert slack.titles == []  # not yet
    clock.now = T0 + timedelta(minutes=5)
    await e.sweep()
    await e.sweep()  # due once, sent once
    assert slack.titles == ["ESCALATED to level 1 · CRITICAL · factory-a · GAS_LEAK"]
    now = await IncidentStore(table).get(gas.incident_id)
    assert now is not None and now.level == 1 and now.outbox is None
    clock.now = T0 + timedelta(minutes=35)  # the packaged policy repeats level 1 every 30 min
    await e.sweep()
    assert slack.titles[1] == "STILL CRITICAL, unacknowledged · factory-a · GAS_LEAK"
    ack = functools.partial(incidents.acknowledge, by="kim", via="cli", at=clock.now)
    await IncidentStore(table).change(gas.incident_id, ack)
    clock.now = T0 + timedelta(hours=3)
    await e.sweep()
    await e.sweep()
    # no more escalation nor reminder: only, once, who is on it
    assert slack.titles[2:] == ["ACKNOWLEDGED · CRITICAL · factory-a · GAS_LEAK"]


async def test_two_replicas_sweeping_at_once_escalate_each_incident_once() -> None:
    table, clock, slack = MemoryTable(), FakeClock(T0 + timedelta(minutes=6)), Heard("slack")
    swept: list[Swept] = []
    replicas = [
        escalator(table, {"slack": slack}, clock, instance=f"host-{n}:1", swept=swept)
        for n in range(2)
    ]
    for n in range(5):
        await fired_incident(table, f"factory-{n}", at=T0)
    for _ in range(3):
        await asyncio.gather(*(r.sweep() for r in replicas))
    assert sorted(slack.titles) == [
        f"ESCALATED to level 1 · CRITICAL · factory-{n} · GAS_LEAK" for n in range(5)
    ]
    assert sum(s.outcome == "escalate" for s in swept) == 5


async def test_a_message_slack_could_not_take_goes_to_the_fallback_once() -> None:
    table, clock = MemoryTable(), FakeClock(T0 + timedelta(seconds=5))
    slack, pager = Heard("slack", down=True), Heard("pager")
    gas = await fired_incident(table, "factory-a", at=T0, outcome="undeliverable")
    receivers: dict[str, Receiver | None] = {"slack": slack, "pager": pager}
    e = escalator(table, receivers, clock, config=parse_escalation(FALLBACK))
    for _ in range(3):
        await e.sweep()
        clock.advance(timedelta(seconds=5))
    assert pager.titles == ["CRITICAL · factory-a · GAS_LEAK"] and slack.titles == []
    now = await IncidentStore(table).get(gas.incident_id)
    assert now is not None and now.notifications == 1
    assert [(e.receiver, e.outcome) for e in now.timeline if e.kind == "notified"] == [
        ("slack", "undeliverable"),
        ("pager", "sent"),
    ]


class NotedBeforeTheFirstClaim(IncidentStore):
    """The dispatcher noting its own post (Slack told) between the escalator's read of the
    incident and its claim: the interleaving a busy replica meets as it posts."""

    noted = False

    async def save(self, new: incidents.Incident, old: incidents.Incident | None) -> None:
        if old is not None and new.outbox is not None and not self.noted:
            self.noted = True
            told = functools.partial(incidents.notified, at=T0, receiver="slack", outcome="sent")
            await self.change(old.incident_id, told)
        await super().save(new, old)


async def test_a_fire_noted_by_the_dispatcher_as_the_pager_is_claimed_still_reaches_the_pager_at_once() -> (
    None
):
    table, clock, pager = MemoryTable(), FakeClock(T0), Heard("pager")
    config = parse_escalation(
        '[receivers.slack]\ntype = "slack_webhook"\nurl_env = "AEGIS_SLACK_WEBHOOK_URL"\n'
        '[receivers.pager]\ntype = "slack_webhook"\nurl_env = "PAGER_URL"\n'
        '[[policies.critical.levels]]\nafter = "0s"\nreceivers = ["slack", "pager"]\n'
        '[defaults]\ncritical = "critical"\nwarning = "critical"\n'
    )
    opened = incidents.open_incident(
        scope="factory-a", stream="STATE", reason="GAS_LEAK", severity="CRITICAL", at=T0
    )
    store = NotedBeforeTheFirstClaim(table, MemoryObjects())
    await store.save(opened, None)  # the message is on its way to Slack
    swept: list[Swept] = []
    e = Escalator(
        store=store,
        config=config,
        receivers={"slack": Heard("slack"), "pager": pager},
        clock=clock,
        dashboard_url="http://dash.example",
        instance="host-a:1",
        on_swept=swept.append,
    )
    await e.notify_now([opened.incident_id])
    assert store.noted  # the note did land between the read and the claim
    assert pager.titles == ["CRITICAL · factory-a · GAS_LEAK"]
    assert [(s.outcome, s.receivers) for s in swept] == [("failover", ("pager",))]
    now = await store.get(opened.incident_id)
    assert now is not None and now.outbox is None
    told = [(x.receiver, x.outcome) for x in now.timeline if x.kind == "notified"]
    assert told == [("slack", "sent"), ("pager", "sent")]
