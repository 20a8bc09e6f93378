"""The dispatcher's whole flow without servers: the table and the bucket in memory
(:class:`~aegis_storage.items.MemoryTable` and :class:`~aegis_storage.objects.MemoryObjects`,
which refuse what DynamoDB and S3 refuse), a receiver that records what it is given, time from a
clock the test turns. The same rules run against the emulator and a webhook server in
test_dispatcher.py; here each takes milliseconds."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aegis_alert_dispatcher.decide import Policy
from aegis_alert_dispatcher.delivery import Delivery, Undeliverable
from aegis_alert_dispatcher.dispatcher import Dispatcher, Result
from aegis_contracts import keys
from aegis_contracts.events import ObjectCreated
from aegis_contracts.times import format_ts
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock, fire_reason
from aegis_devstack.testing.webhook import Unanswered
from aegis_storage.incidents import IncidentStore
from aegis_storage.memorytable import MemoryTable
from aegis_storage.objects import MemoryObjects

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FIRE = fire_reason()
TEMPERATURE = {"code": "TEMPERATURE_HIGH", "severity": "CRITICAL", "detail": "71 °C", "value": 71}


@dataclass
class Storage:
    items: MemoryTable = field(default_factory=MemoryTable)
    objects: MemoryObjects = field(default_factory=MemoryObjects)

    async def state(
        self, factory: str, at: datetime, reasons: list[dict[str, Any]]
    ) -> ObjectCreated:
        """A state snapshot written as the processor writes it, and its announcement."""
        level = "CRITICAL" if reasons else "NORMAL"
        body = {
            "pk": keys.factory_pk(factory),
            "sk": keys.LATEST_SK,
            "factory_id": factory,
            "updated_at": format_ts(at),
            "risk": {"score": 90 if reasons else 0, "level": level, "reasons": reasons},
        }
        put = await self.objects.put_json(keys.state_snapshot_key(factory, at), body)
        return self.objects.created(put, producer="test", at=at)


@dataclass
class Receiver:
    """Takes every message (200), or refuses each with ``refusing`` until told otherwise."""

    payloads: list[dict[str, Any]] = field(default_factory=list)
    refusing: int | None = None

    async def send(self, payload: dict[str, Any], *, deadline: float | None = None) -> Delivery:
        if self.refusing is not None:
            raise Undeliverable(f"HTTP {self.refusing}", attempts=3, status=self.refusing)
        self.payloads.append(payload)
        return Delivery(attempts=1, status=200)

    def headlines(self) -> list[str]:
        return [str(p["text"]).split(" AEGIS ", 1)[1].split(" at ")[0] for p in self.payloads]


@dataclass
class Recorded:
    dead: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    announced: list[dict[str, Any]] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)

    async def dead_letter(self, record: dict[str, Any], detail: str, message_id: str) -> None:
        self.dead.append((record, detail))

    async def announce(self, detail: dict[str, Any], msg_id: str) -> None:
        self.announced.append(detail)

    def outcomes(self) -> list[str]:
        return [r.outcome for r in self.results]


def dispatcher(
    storage: Storage, receiver: Any, rec: Recorded, clock: FakeClock | None = None
) -> Dispatcher:
    return Dispatcher(
        store=storage.objects,
        readmodel=storage.items,
        sender=receiver,
        dead_letter=rec.dead_letter,
        announce=rec.announce,
        policy=Policy(),
        ttl=TtlSettings(),
        dashboard_url="http://dash.example",
        clock=clock or FakeClock(T0),
        on_result=rec.results.append,
    )


async def test_a_fire_sends_once_then_cooldown_then_again_then_one_resolved() -> None:
    storage, receiver, rec = Storage(), Receiver(), Recorded()
    d = dispatcher(storage, receiver, rec)
    await d.handle(await storage.state("factory-a", T0, [FIRE]))
    assert receiver.headlines() == ["CRITICAL · factory-a · FIRE_DETECTED"]
    for i in range(1, 21):  # 20 more critical snapshots inside the 5-minute cooldown
        await d.handle(await storage.state("factory-a", T0 + timedelta(seconds=10 * i), [FIRE]))
    assert len(receiver.payloads) == 1
    assert rec.outcomes().count("suppressed_cooldown") == 20
    await d.handle(await storage.state("factory-a", T0 + timedelta(minutes=5), [FIRE]))
    for i in range(3):  # recovery: one RESOLVED, nothing for the normal snapshots after it
        await d.handle(await storage.state("factory-a", T0 + timedelta(minutes=6, seconds=i), []))
    assert receiver.headlines()[1:] == [
        "CRITICAL · factory-a · FIRE_DETECTED",
        "RESOLVED · factory-a · FIRE_DETECTED",
    ]
    assert [a["action"] for a in rec.announced] == ["fire", "fire", "resolve"]
    item = await storage.items.get_item(
        keys.alert_pk("factory-a"), keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE")
    )
    assert item is not None and item["firing"] is False and item["sent_count"] == 2
    assert item["ttl"] == int((T0 + timedelta(minutes=6)).timestamp()) + 604_800


async def test_late_and_replayed_snapshots_send_nothing_extra() -> None:
    storage, receiver, rec = Storage(), Receiver(), Recorded()
    d = dispatcher(storage, receiver, rec)
    old_fire = await storage.state("factory-a", T0, [FIRE])
    calm = await storage.state("factory-a", T0 + timedelta(seconds=30), [])
    await d.handle(calm)
    await d.handle(old_fire)  # older than the newest handled
    assert receiver.payloads == [] and rec.outcomes()[-1] == "stale"
    fire = await storage.state("factory-a", T0 + timedelta(seconds=60), [FIRE])
    await d.handle(fire)
    for event in (fire, calm, old_fire, fire):  # the queue replays everything
        await d.handle(event)
    assert len(receiver.payloads) == 1


async def test_two_dispatchers_racing_on_the_same_snapshots_send_each_alert_once() -> None:
    storage, receiver = Storage(), Receiver()
    one, two = (dispatcher(storage, receiver, Recorded()) for _ in range(2))
    events = [await storage.state(f"factory-{c}", T0, [FIRE]) for c in "abc"]
    await asyncio.gather(*(d.handle(e) for e in events for d in (one, two)))
    assert sorted(receiver.headlines()) == [
        f"CRITICAL · factory-{c} · FIRE_DETECTED" for c in "abc"
    ]


async def test_an_undeliverable_message_is_dead_lettered_and_the_next_snapshot_sends_it() -> None:
    storage, receiver, rec = Storage(), Receiver(refusing=503), Recorded()
    d = dispatcher(storage, receiver, rec)
    await d.handle(await storage.state("factory-a", T0, [FIRE]))
    ((record, detail),) = rec.dead
    assert record["reason"] == "FIRE_DETECTED" and "503" in detail
    assert rec.outcomes()[-1] == "undeliverable"
    receiver.refusing = None  # the claim was released: inside what would be the cooldown
    await d.handle(await storage.state("factory-a", T0 + timedelta(seconds=5), [FIRE]))
    assert receiver.headlines() == ["CRITICAL · factory-a · FIRE_DETECTED"]


async def test_an_intent_left_by_a_dead_replica_is_completed_by_another_after_its_lease() -> None:
    """Replica A records the message and dies mid-post. Replica B handles the scope's next
    snapshot: inside A's lease it leaves the intent alone; after it, B posts the recorded
    message once and confirms it."""
    storage, stuck = Storage(), Unanswered()
    dead = dispatcher(storage, stuck, Recorded())
    handler = asyncio.ensure_future(
        dead.handle(await storage.state("factory-a", T0, [FIRE, TEMPERATURE]))
    )
    await asyncio.wait_for(stuck.posted.wait(), 10)
    for task in (*dead._settling, handler):  # the process is gone: nothing finishes
        task.cancel()
    await asyncio.gather(*dead._settling, handler, return_exceptions=True)
    intents = await storage.items.partition(
        keys.alert_pk("factory-a"), now=T0, prefix=keys.INTENT_PREFIX
    )
    (left,) = intents
    assert left["state"] == "sending"

    receiver, rec, clock = Receiver(), Recorded(), FakeClock(T0)
    other = dispatcher(storage, receiver, rec, clock)
    clock.advance(timedelta(seconds=60))  # inside the 120 s lease: A may still be posting
    state = [FIRE, TEMPERATURE]
    await other.handle(await storage.state("factory-a", T0 + timedelta(seconds=60), state))
    assert receiver.payloads == [] and rec.outcomes() == ["in_flight"] * 2
    clock.advance(timedelta(seconds=61))  # the lease is over
    await other.handle(await storage.state("factory-a", T0 + timedelta(seconds=121), state))
    assert receiver.headlines() == ["CRITICAL · factory-a · FIRE_DETECTED, TEMPERATURE_HIGH"]
    assert json.dumps(receiver.payloads[0]) == json.dumps(json.loads(left["payload"]))
    assert rec.outcomes()[2:] == ["completed_sent"] * 2 + ["suppressed_cooldown"] * 2
    (done,) = await storage.items.partition(
        keys.alert_pk("factory-a"), now=T0, prefix=keys.INTENT_PREFIX
    )
    assert done["state"] == "sent" and done["version"] == left["version"] + 2


async def test_a_fire_opens_one_incident_and_its_resolve_archives_the_record_once() -> None:
    storage, receiver = Storage(), Receiver()
    d = dispatcher(storage, receiver, Recorded())
    incidents = IncidentStore(storage.items, storage.objects)
    await d.handle(await storage.state("factory-a", T0, [FIRE]))
    (opened,) = await incidents.open(now=T0)
    assert (opened.scope, opened.reason, opened.state) == (
        "factory-a",
        "FIRE_DETECTED",
        "triggered",
    )
    await d.handle(await storage.state("factory-a", T0 + timedelta(minutes=6), []))
    closed = await incidents.get(opened.incident_id)
    assert closed is not None and closed.state == "resolved"
    assert closed.archived_key == keys.incident_record_key("factory-a", T0, opened.incident_id)
    assert await incidents.open(now=T0 + timedelta(minutes=6)) == []
    record = await storage.objects.get_json(closed.archived_key)
    assert [(e["kind"], e.get("outcome")) for e in record["timeline"]] == [
        ("triggered", None),
        ("notified", "sent"),
        ("resolved", None),
        ("notified", "sent"),
    ]
    assert record["time_to_resolve_s"] == 360.0
