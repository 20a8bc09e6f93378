"""The sweep over open incidents against the real S3/DynamoDB emulator and local HTTP stand-ins
for Slack and a fallback receiver, time driven by a clock the test moves: escalation on time,
acknowledging stops it, two replicas escalate once, a dead replica's claim is sent once by
another, a failing receiver falls back at once, resolved incidents are archived."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aegis_alert_dispatcher.decide import Policy, Stream
from aegis_alert_dispatcher.dispatcher import Dispatcher, Snapshot
from aegis_alert_dispatcher.escalation import EscalationConfig, load_escalation, parse_escalation
from aegis_alert_dispatcher.escalator import Escalator, Swept
from aegis_alert_dispatcher.receivers import Receiver, SlackWebhookReceiver
from aegis_alert_dispatcher.slack import SlackWebhook
from aegis_contracts import incidents
from aegis_contracts.items import IncidentOutbox
from aegis_contracts.state import Reason
from aegis_contracts.times import format_ts
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock, fired_incident
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.webhook import FakeWebhook, running_webhook
from aegis_storage.incidents import IncidentStore

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FALLBACK = (Path(__file__).parent / "fallback.toml").read_text()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def pager() -> AsyncIterator[FakeWebhook]:
    async with running_webhook("/pager") as fake:
        yield fake


def slack_receiver(name: str, url: str, session: aiohttp.ClientSession) -> Receiver:
    return SlackWebhookReceiver(
        name, SlackWebhook(url, session, first_delay=0.01, max_attempts=2, timeout=5)
    )


def escalator(
    f: Foundation,
    receivers: dict[str, Receiver | None],
    clock: FakeClock,
    *,
    config: EscalationConfig | None = None,
    instance: str = "host-a:1",
    swept: list[Swept] | None = None,
) -> Escalator:
    return Escalator(
        store=IncidentStore(f.readmodel, f.store),
        config=config or load_escalation(None),
        receivers=receivers,
        clock=clock,
        dashboard_url="http://dash.example",
        instance=instance,
        on_swept=swept.append if swept is not None else None,
    )


async def nothing(*args: Any) -> None:
    return None


def dispatcher(
    f: Foundation,
    sender: SlackWebhook,
    clock: FakeClock,
    config: EscalationConfig,
    *,
    dead_letter: Any = nothing,
) -> Dispatcher:
    """A dispatcher handling snapshots directly (no queue), with the escalation file's policies."""
    return Dispatcher(
        store=f.store,
        readmodel=f.readmodel,
        sender=sender,
        dead_letter=dead_letter,
        announce=nothing,
        policy=Policy(),
        ttl=TtlSettings(),
        dashboard_url="http://dash.example",
        clock=clock,
        escalation=config,
    )


def pager_at_level_0() -> EscalationConfig:
    """CRITICAL: Slack and the pager at once, no fallback."""
    return parse_escalation(
        FALLBACK.replace('fallback = "pager"\n', "").replace(
            'after = "0s"\nreceivers = ["slack"]\n\n[[policies.critical.levels]]',
            'after = "0s"\nreceivers = ["slack", "pager"]\n\n[[policies.critical.levels]]',
            1,
        )
    )


def slack_and_pager(
    f: Foundation,
    webhook: FakeWebhook,
    pager: FakeWebhook,
    session: aiohttp.ClientSession,
    clock: FakeClock,
    config: EscalationConfig,
    swept: list[Swept] | None = None,
) -> tuple[Dispatcher, Escalator]:
    """A dispatcher posting to Slack and an escalator with Slack and the pager, wired as the
    service wires them: the dispatcher asks the escalator as it posts."""
    slack = SlackWebhook(webhook.url, session, first_delay=0.01, max_attempts=2, timeout=5)
    d = dispatcher(f, slack, clock, config)
    receivers: dict[str, Receiver | None] = {
        "slack": SlackWebhookReceiver("slack", slack),
        "pager": slack_receiver("pager", pager.url, session),
    }
    e = escalator(f, receivers, clock, config=config, swept=swept)
    d.alongside = e.notify_now
    return d, e


def titles(webhook: FakeWebhook) -> list[str]:
    return [str(body["text"]).split(" AEGIS ", 1)[1] for body in webhook.delivered]


async def test_an_unacknowledged_critical_escalates_on_time_repeats_and_stops_when_acknowledged(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    clock = FakeClock(T0)
    e = escalator(foundation, {"slack": slack_receiver("slack", webhook.url, session)}, clock)
    gas = await fired_incident(foundation.readmodel, unique_id, at=T0)
    clock.now = T0 + timedelta(minutes=4, seconds=59)
    await e.sweep()
    assert webhook.delivered == []  # not yet
    clock.now = T0 + timedelta(minutes=5)
    await e.sweep()
    await e.sweep()  # due once, sent once
    assert titles(webhook) == [f"ESCALATED to level 1 · CRITICAL · {unique_id} · GAS_LEAK"]
    body = webhook.delivered[0]
    assert gas.incident_id in str(body)  # the Acknowledge button names it
    now = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert now is not None and now.level == 1 and now.outbox is None
    assert [(e.kind, e.receiver, e.outcome) for e in now.timeline[-2:]] == [
        ("escalated", None, None),
        ("notified", "slack", "sent"),
    ]
    # the packaged policy repeats level 1 every 30 minutes until acknowledged
    clock.now = T0 + timedelta(minutes=35)
    await e.sweep()
    assert titles(webhook)[1] == f"STILL CRITICAL, unacknowledged · {unique_id} · GAS_LEAK"
    ack = functools.partial(incidents.acknowledge, by="kim", via="cli", at=clock.now)
    await IncidentStore(foundation.readmodel).change(gas.incident_id, ack)
    clock.now = T0 + timedelta(hours=3)
    await e.sweep()
    await e.sweep()
    # no more escalation nor reminder: only, once, who is on it (the policy's ack_notify)
    assert titles(webhook)[2:] == [f"ACKNOWLEDGED · CRITICAL · {unique_id} · GAS_LEAK"]


async def test_two_replicas_sweeping_at_once_escalate_once(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    clock = FakeClock(T0 + timedelta(minutes=6))
    receivers: dict[str, Receiver | None] = {"slack": slack_receiver("slack", webhook.url, session)}
    swept: list[Swept] = []
    replicas = [
        escalator(foundation, receivers, clock, instance=f"host-{n}:1", swept=swept)
        for n in range(2)
    ]
    for n in range(5):
        await fired_incident(foundation.readmodel, f"{unique_id}-{n}", at=T0)
    for _ in range(3):
        await asyncio.gather(*(r.sweep() for r in replicas))
    mine = sorted(t for t in titles(webhook) if unique_id in t)
    assert mine == sorted(
        f"ESCALATED to level 1 · CRITICAL · {unique_id}-{n} · GAS_LEAK" for n in range(5)
    )
    ids = {i.incident_id for i in await IncidentStore(foundation.readmodel).open(now=clock.now)}
    escalations = [s for s in swept if s.incident_id in ids and s.outcome == "escalate"]
    assert len(escalations) == 5  # the other replica's tries were claimed_elsewhere or nothing


async def test_a_notification_claimed_by_a_dead_replica_is_sent_once_after_its_lease(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    """Replica A claimed the escalation (its outbox is on the incident) and died before sending.
    Inside A's lease B leaves it; after the lease B sends it once and clears it."""
    store = IncidentStore(foundation.readmodel)
    gas = await fired_incident(foundation.readmodel, unique_id, at=T0)
    claimed = incidents.escalated(gas, level=1, at=T0 + timedelta(minutes=5)).model_copy(
        update={
            "outbox": IncidentOutbox(
                attempt_id="a" * 16,
                kind="escalate",
                level=1,
                receivers=["slack"],
                owner="host-a:41",
                lease_until=T0 + timedelta(minutes=5, seconds=30),
            ),
        }
    )
    await store.save(claimed, gas)
    clock = FakeClock(T0 + timedelta(minutes=5, seconds=10))
    receivers: dict[str, Receiver | None] = {"slack": slack_receiver("slack", webhook.url, session)}
    b = escalator(foundation, receivers, clock, instance="host-b:7")
    await b.sweep()
    assert webhook.delivered == []  # A may still be sending
    clock.now = T0 + timedelta(minutes=5, seconds=31)
    await b.sweep()
    await b.sweep()
    assert titles(webhook) == [f"ESCALATED to level 1 · CRITICAL · {unique_id} · GAS_LEAK"]
    now = await store.get(gas.incident_id)
    assert now is not None and now.outbox is None and now.level == 1


async def test_a_claim_whose_owner_stopped_is_taken_over_before_its_lease(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    """Inside the claim's lease, another replica leaves it while its owner is alive; once the
    owner's heartbeat has run out (it was killed), it takes the claim over at once."""
    store = IncidentStore(foundation.readmodel)
    gas = await fired_incident(foundation.readmodel, unique_id, at=T0)
    outbox = IncidentOutbox(
        attempt_id="b" * 16,
        kind="escalate",
        level=1,
        receivers=["slack"],
        owner="pod-7:41",
        lease_until=T0 + timedelta(minutes=6),
    )
    await store.save(gas.model_copy(update={"outbox": outbox, "version": gas.version + 1}), gas)
    clock = FakeClock(T0 + timedelta(minutes=5, seconds=1))  # well inside the lease
    receivers: dict[str, Receiver | None] = {"slack": slack_receiver("slack", webhook.url, session)}
    alive_until = {"pod-7:41": T0 + timedelta(minutes=5, seconds=4)}

    async def owner_dead(owner: str, now: datetime) -> bool:
        return alive_until[owner] <= now

    e = escalator(foundation, receivers, clock, instance="pod-9:41")
    e.owner_dead = owner_dead
    await e.sweep()
    assert webhook.delivered == []  # its owner says it is alive: the lease stands
    clock.now = T0 + timedelta(minutes=5, seconds=5)
    await e.sweep()
    assert len(webhook.delivered) == 1  # its heartbeat ran out: the owner is dead


async def test_a_failing_slack_falls_back_at_once_and_nothing_is_sent_twice(
    foundation: Foundation,
    webhook: FakeWebhook,
    pager: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
) -> None:
    """The first message could not reach Slack (undeliverable): the next sweep sends the
    incident to the policy's fallback receiver at once; later sweeps send nothing more."""
    gas = await fired_incident(foundation.readmodel, unique_id, outcome="undeliverable", at=T0)
    webhook.down()
    clock = FakeClock(T0 + timedelta(seconds=5))
    receivers: dict[str, Receiver | None] = {
        "slack": slack_receiver("slack", webhook.url, session),
        "pager": slack_receiver("pager", pager.url, session),
    }
    e = escalator(foundation, receivers, clock, config=parse_escalation(FALLBACK))
    for _ in range(3):
        await e.sweep()
        clock.advance(timedelta(seconds=5))
    assert titles(pager) == [f"CRITICAL · {unique_id} · GAS_LEAK"]
    assert webhook.delivered == []
    now = await IncidentStore(foundation.readmodel).get(gas.incident_id)
    assert now is not None and now.notifications == 1
    assert [(e.receiver, e.outcome) for e in now.timeline if e.kind == "notified"] == [
        ("slack", "undeliverable"),
        ("pager", "sent"),
    ]


async def test_when_every_receiver_fails_it_is_retried_with_back_off_not_parked(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    await fired_incident(foundation.readmodel, unique_id, outcome="undeliverable", at=T0)
    webhook.down()
    clock = FakeClock(T0 + timedelta(seconds=1))
    e = escalator(foundation, {"slack": slack_receiver("slack", webhook.url, session)}, clock)
    await e.sweep()  # only one receiver, and it failed: all again after the back-off
    assert webhook.requests == []
    clock.now = T0 + timedelta(seconds=31)
    await e.sweep()
    tried = len(webhook.requests)
    assert tried == 2  # one notification, its two attempts
    clock.advance(timedelta(seconds=29))
    await e.sweep()  # the second failure doubled the wait to 30 s: not yet
    assert len(webhook.requests) == tried
    webhook.up()
    clock.advance(timedelta(seconds=60))
    await e.sweep()
    assert len(webhook.delivered) == 1


async def test_a_resolved_incident_is_archived_by_the_sweep_once_its_message_had_time(
    foundation: Foundation, unique_id: str
) -> None:
    store = IncidentStore(foundation.readmodel, foundation.store)
    gas = await fired_incident(foundation.readmodel, unique_id, at=T0)
    closed = incidents.resolve(gas, at=T0 + timedelta(minutes=1))
    assert closed is not None
    await store.save(closed, gas)
    clock = FakeClock(T0 + timedelta(minutes=2))
    e = escalator(foundation, {}, clock)
    await e.sweep()
    assert (await store.get(gas.incident_id)).archived_key is None  # type: ignore[union-attr]
    clock.now = T0 + timedelta(minutes=3)
    await e.sweep()
    archived = await store.get(gas.incident_id)
    assert archived is not None and archived.archived_key is not None
    record = await foundation.store.get_json(archived.archived_key)
    assert record["incident_id"] == gas.incident_id and record["state"] == "resolved"


async def test_slack_down_for_ten_minutes_the_fallback_hears_each_notification_once(
    foundation: Foundation,
    webhook: FakeWebhook,
    pager: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
) -> None:
    """Slack answers 503 throughout. The first message fails, the policy has a fallback: it is
    not dead-lettered, the next sweep gives it to the pager; the snapshots that follow (every
    30 s, still firing) send nothing of their own; the escalation at 5 minutes fails on Slack and
    reaches the pager too. Each notification reaches the pager once."""
    webhook.down()
    config = parse_escalation(FALLBACK)
    clock = FakeClock(T0)
    dead: list[dict[str, Any]] = []

    async def dead_letter(record: dict[str, Any], detail: str, message_id: str) -> None:
        dead.append(record)

    slack = SlackWebhook(webhook.url, session, first_delay=0.01, max_attempts=2, timeout=5)
    d = dispatcher(foundation, slack, clock, config, dead_letter=dead_letter)
    receivers: dict[str, Receiver | None] = {
        "slack": SlackWebhookReceiver("slack", slack),
        "pager": slack_receiver("pager", pager.url, session),
    }
    e = escalator(foundation, receivers, clock, config=config)
    fire = Reason(code="GAS_LEAK", severity="CRITICAL", detail="CO 410 ppm")
    outcomes: list[str] = []
    for step in range(21):  # 10 minutes, a snapshot every 30 s and a sweep after each
        clock.now = T0 + timedelta(seconds=30 * step)
        snapshot = Snapshot(unique_id, Stream.STATE, clock.now, (fire,))
        outcomes += [r.outcome for r in await d.handle_snapshot(snapshot)]
        await e.sweep()
    assert dead == []
    assert outcomes[0] == "failing_over"
    assert set(outcomes[1:]) == {"suppressed_cooldown", "suppressed_policy"}
    assert [str(b["text"]).split(" AEGIS ", 1)[1] for b in pager.delivered] == [
        f"CRITICAL · {unique_id} · GAS_LEAK",  # the first message, at once
        f"CRITICAL · {unique_id} · GAS_LEAK",  # level 1 at 5 minutes, Slack failing again
    ]
    (incident,) = await IncidentStore(foundation.readmodel).open(now=clock.now)
    told = [(x.receiver, x.outcome, x.level) for x in incident.timeline if x.kind == "notified"]
    assert told == [
        ("slack", "undeliverable", 0),
        ("pager", "sent", 0),
        ("slack", "undeliverable", 1),
        ("pager", "sent", 1),
    ]
    assert webhook.delivered == []


@pytest.mark.parametrize(("via", "told"), [("dashboard", 1), ("cli", 1), ("slack", 0)])
async def test_an_acknowledgement_is_told_once_to_the_receivers_reached_but_slack_by_slack(
    foundation: Foundation,
    webhook: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
    via: str,
    told: int,
) -> None:
    """``ack_notify``: the receivers that heard of the incident hear once who is on it; an
    acknowledgement made in Slack updated the Slack message itself, so no Slack post."""
    gas = await fired_incident(foundation.readmodel, unique_id, at=T0)
    ack = functools.partial(incidents.acknowledge, by="kim", via=via, at=T0 + timedelta(minutes=1))
    await IncidentStore(foundation.readmodel).change(gas.incident_id, ack)
    clock = FakeClock(T0 + timedelta(minutes=1))
    e = escalator(foundation, {"slack": slack_receiver("slack", webhook.url, session)}, clock)
    for _ in range(3):
        await e.sweep()
        clock.advance(timedelta(minutes=10))  # and never an escalation
    assert titles(webhook) == [f"ACKNOWLEDGED · CRITICAL · {unique_id} · GAS_LEAK"] * told
    if told:
        assert "acknowledged by kim" in str(webhook.delivered[0])
        assert "aegis_ack" not in str(webhook.delivered[0])  # nothing left to acknowledge


async def test_a_policy_that_does_not_tell_of_resolutions_resolves_quietly(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    config = parse_escalation(
        FALLBACK.replace("[policies.warning]", "[policies.warning]\nresolve_notify = false")
    )
    clock = FakeClock(T0)

    d = dispatcher(foundation, SlackWebhook(webhook.url, session, first_delay=0.01), clock, config)
    smoke = Reason(code="SMOKE", severity="WARNING", detail="smoke on cam-2")
    await d.handle_snapshot(Snapshot(unique_id, Stream.STATE, T0, (smoke,)))
    clock.now = T0 + timedelta(minutes=1)
    results = await d.handle_snapshot(Snapshot(unique_id, Stream.STATE, clock.now, ()))
    assert [r.outcome for r in results] == ["suppressed_policy"]
    assert titles(webhook) == [f"WARNING · {unique_id} · SMOKE at 2026-11-30 12:00:00 KST"]
    assert await IncidentStore(foundation.readmodel).open(now=clock.now) == []


@pytest.mark.parametrize("asked", [True, False], ids=["as_posted", "next_sweep"])
async def test_the_other_receivers_of_level_0_hear_of_a_fire_as_posted_else_at_the_next_sweep(
    foundation: Foundation,
    webhook: FakeWebhook,
    pager: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
    asked: bool,
) -> None:
    """The dispatcher asks for the incident's other level-0 receivers as it posts; when it did
    not (it died right after posting), the next sweep tells them. Either way once."""
    clock = FakeClock(T0)
    swept: list[Swept] = []
    d, e = slack_and_pager(foundation, webhook, pager, session, clock, pager_at_level_0(), swept)
    if not asked:
        d.alongside = None
    fire = Reason(code="GAS_LEAK", severity="CRITICAL", detail="CO 410 ppm")
    await d.handle_snapshot(Snapshot(unique_id, Stream.STATE, T0, (fire,)))
    await d.drain()
    if not asked:
        assert pager.delivered == []
        clock.now = T0 + timedelta(seconds=5)
        await e.sweep()
    assert titles(pager) == [f"CRITICAL · {unique_id} · GAS_LEAK"]
    assert len(webhook.delivered) == 1  # Slack has the dispatcher's message only
    assert [(x.outcome, x.receivers) for x in swept] == [("failover", ("pager",))]
    # the sweeps after it have nothing left to tell at level 0
    clock.now = T0 + timedelta(seconds=10)
    assert await e.sweep() == []
    (incident,) = await IncidentStore(foundation.readmodel).open(now=clock.now)
    told = {x.receiver for x in incident.timeline if x.kind == "notified" and x.outcome == "sent"}
    assert told == {"slack", "pager"} and incident.notifications == 2


async def test_with_no_other_receiver_a_dead_lettered_fire_stays_one_incident_retried_until_sent(
    foundation: Foundation, webhook: FakeWebhook, session: aiohttp.ClientSession, unique_id: str
) -> None:
    """The packaged policy has Slack only. Slack is down: the first message is dead-lettered
    once; the fire stays one incident (later snapshots open no second one), which the sweep
    retries with back-off and delivers once Slack is back."""
    webhook.down()
    clock = FakeClock(T0)
    dead: list[dict[str, Any]] = []

    async def dead_letter(record: dict[str, Any], detail: str, message_id: str) -> None:
        dead.append(record)

    slack = SlackWebhook(webhook.url, session, first_delay=0.01, max_attempts=2, timeout=5)
    config = load_escalation(None)
    d = dispatcher(foundation, slack, clock, config, dead_letter=dead_letter)
    e = escalator(foundation, {"slack": SlackWebhookReceiver("slack", slack)}, clock)
    fire = Reason(code="GAS_LEAK", severity="CRITICAL", detail="CO 410 ppm")
    outcomes: list[str] = []
    for step in range(12):  # 6 minutes: a snapshot every 30 s, a sweep after each
        clock.now = T0 + timedelta(seconds=30 * step)
        if step == 8:
            webhook.up()
        snapshot = Snapshot(unique_id, Stream.STATE, clock.now, (fire,))
        outcomes += [r.outcome for r in await d.handle_snapshot(snapshot)]
        await e.sweep()
    assert outcomes[0] == "undeliverable" and len(dead) == 1
    assert "undeliverable" not in outcomes[1:]  # the later snapshots post nothing of their own
    (incident,) = await IncidentStore(foundation.readmodel).open(now=clock.now)
    assert titles(webhook) == [
        f"CRITICAL · {unique_id} · GAS_LEAK",  # the retry, once Slack is back
        f"ESCALATED to level 1 · CRITICAL · {unique_id} · GAS_LEAK",  # at 5 minutes
    ]
    assert incident.notifications == 2
    sent = [x for x in incident.timeline if x.kind == "notified" and x.outcome == "sent"]
    assert len(sent) == len(webhook.delivered)  # each delivery is one line: nothing twice


async def test_an_incident_whose_resolve_was_never_handled_is_resolved_from_latest_not_escalated(
    foundation: Foundation,
    webhook: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
) -> None:
    """The snapshots after a resolve are routine, read by nobody: when the resolve itself was
    lost (its event dead-lettered through an outage), the sweep finds the reason gone from the
    factory's LATEST before it reminds, and resolves the incident from there."""
    clock = FakeClock(T0)
    slack = SlackWebhook(webhook.url, session, first_delay=0.01, max_attempts=2, timeout=5)
    config = load_escalation(None)  # CRITICAL: level 1 after 5 min, repeated every 30 min
    d = dispatcher(foundation, slack, clock, config)
    e = escalator(foundation, {"slack": SlackWebhookReceiver("slack", slack)}, clock)
    e.still_reported = d.still_reported
    fire = Reason(code="GAS_LEAK", severity="CRITICAL", detail="CO 410 ppm")

    async def latest(at: datetime, reasons: list[Reason]) -> None:
        await foundation.readmodel.put_item(
            {
                "pk": f"FACTORY#{unique_id}",
                "sk": "LATEST",
                "factory_id": unique_id,
                "updated_at": format_ts(at),
                "risk": {
                    "score": 90 if reasons else 0,
                    "level": "CRITICAL" if reasons else "NORMAL",
                    "reasons": [r.model_dump(exclude_none=True) for r in reasons],
                },
            }
        )

    await d.handle_snapshot(Snapshot(unique_id, Stream.STATE, T0, (fire,)))
    await latest(T0, [fire])
    clock.now = T0 + timedelta(minutes=5)
    assert [s.outcome for s in await e.sweep()] == ["escalate"]  # still reported: escalated
    await latest(T0 + timedelta(minutes=6), [])  # calm again; its event never handled
    clock.now = T0 + timedelta(minutes=36)  # the level's reminder is due
    assert [s.outcome for s in await e.sweep()] == ["no_longer_reported"]
    assert [t.split(" at ")[0] for t in titles(webhook)] == [
        f"CRITICAL · {unique_id} · GAS_LEAK",
        f"ESCALATED to level 1 · CRITICAL · {unique_id} · GAS_LEAK",
        f"RESOLVED · {unique_id} · GAS_LEAK",
    ]
    assert await IncidentStore(foundation.readmodel).open(now=clock.now) == []


async def test_a_first_post_slack_refuses_goes_to_the_fallback_without_waiting_for_a_sweep(
    foundation: Foundation,
    webhook: FakeWebhook,
    pager: FakeWebhook,
    session: aiohttp.ClientSession,
    unique_id: str,
) -> None:
    """As the service runs it (posting beside the handler): no sweep runs here."""
    webhook.down()
    clock = FakeClock(T0)
    d, _ = slack_and_pager(foundation, webhook, pager, session, clock, parse_escalation(FALLBACK))
    d.post_in_background = True
    fire = Reason(code="GAS_LEAK", severity="CRITICAL", detail="CO 410 ppm")
    assert await d.handle_snapshot(Snapshot(unique_id, Stream.STATE, T0, (fire,))) == []
    await d.drain()
    assert len(webhook.requests) == 2 and webhook.delivered == []  # Slack refused both tries
    assert titles(pager) == [f"CRITICAL · {unique_id} · GAS_LEAK"]
    (incident,) = await IncidentStore(foundation.readmodel).open(now=clock.now)
    told = [(x.receiver, x.outcome) for x in incident.timeline if x.kind == "notified"]
    assert told == [("slack", "undeliverable"), ("pager", "sent")]
