"""The processor's commit protocol, against the in-memory states, objects and late marks (no
server): a state reaches HISTORY, LATEST and its snapshot exactly once, whatever another replica
wrote meanwhile, and a redelivery after a crash at any step finishes what the first delivery
began. The same protocol against DynamoDB, S3 and JetStream: test_processor.py."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aegis_contracts import keys
from aegis_contracts.archive import Archive, admit
from aegis_contracts.events import ChangeEvent, ObjectCreated, RawArchived
from aegis_contracts.times import format_ts
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.devices import factory_state_message
from aegis_processor.handlers import Processor
from aegis_processor.rules import load_rules
from aegis_runtime.bus import Outgoing
from aegis_storage.encoding import Encoded
from aegis_storage.latemarks import MemoryLateMarks
from aegis_storage.objects import MemoryObjects
from aegis_storage.states import MemoryStates

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
FACTORY = "factory-a"
RULES = load_rules()


class Crash(Exception):
    """The process dies here (the broker redelivers the message later)."""


class CrashingStates(MemoryStates):
    """Dies at the next LATEST replace while ``crash_before_latest`` is set."""

    crash_before_latest = False

    async def replace_latest(
        self, factory_id: str, image: Encoded | dict[str, Any], *, expected: str | None
    ) -> bool:
        if self.crash_before_latest:
            self.crash_before_latest = False
            raise Crash("before LATEST")
        return await super().replace_latest(factory_id, image, expected=expected)


class Replica:
    """One processor on the shared in-memory storage, recording what it published."""

    def __init__(self, objects: MemoryObjects, states: MemoryStates, clock: FakeClock) -> None:
        self.objects, self.states, self.clock = objects, states, clock
        self.published: list[Outgoing] = []
        self.crash_on_publish = False
        self.processor = Processor(
            store=objects,
            readmodel=None,
            states=states,
            late=MemoryLateMarks(),
            publish=self.publish,
            rules=RULES,
            ttl=TtlSettings(),
            clock=clock,
        )

    async def publish(self, events: Sequence[Outgoing]) -> list[bool]:
        if self.crash_on_publish:
            self.crash_on_publish = False
            raise Crash("before the events")
        self.published.extend(events)
        return [False] * len(events)

    async def archive(
        self, message_id: str, *, fire: bool = False, emitted_at: datetime | None = None
    ) -> RawArchived:
        """The message emitted at ``emitted_at`` (default now) and archived now, as ingest
        archives it; its RawArchived event."""
        now = self.clock()
        payload = factory_state_message(FACTORY, message_id, emitted_at or now, fire=fire)
        decision = admit(f"aegis/{FACTORY}/factory_state", payload, now, 1, bucket="memory")
        assert isinstance(decision, Archive)
        await self.objects.put_immutable(decision.key, payload)
        return decision.event

    def changes(self) -> list[ChangeEvent]:
        return [e.payload for e in self.published if isinstance(e.payload, ChangeEvent)]

    def created(self) -> list[str]:
        return [e.payload.key for e in self.published if isinstance(e.payload, ObjectCreated)]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def objects() -> MemoryObjects:
    return MemoryObjects("memory")


@pytest.fixture
def states() -> CrashingStates:
    return CrashingStates()


@pytest.fixture
def replica(objects: MemoryObjects, states: CrashingStates, clock: FakeClock) -> Replica:
    return Replica(objects, states, clock)


async def history(states: MemoryStates) -> list[dict[str, Any]]:
    return await states.history(FACTORY, T0 - timedelta(days=1), T0 + timedelta(days=1), now=T0)


def message_of(item: dict[str, Any] | None) -> str:
    assert item is not None
    return str(item["factory_state"]["meta"]["message_id"])


def assert_one_chain(items: list[dict[str, Any]]) -> None:
    """Each HISTORY item names the one before it as its predecessor; the first names none."""
    assert items[0].get("prev_updated_at") is None
    for before, after in itertools.pairwise(items):
        assert after["prev_updated_at"] == before["updated_at"]


async def test_a_message_commits_one_state_to_history_latest_and_a_snapshot(
    replica: Replica, states: MemoryStates, objects: MemoryObjects
) -> None:
    outcome = await replica.processor.handle(await replica.archive("msg-00000001", fire=True))

    assert outcome.latest == "applied"
    latest = await states.latest(FACTORY)
    items = await history(states)
    assert message_of(latest) == "msg-00000001"
    assert latest is not None and latest["risk"]["level"] == "CRITICAL"
    assert [i["updated_at"] for i in items] == [latest["updated_at"]]
    assert {k: v for k, v in items[0].items() if k not in ("sk", "ttl")} == {
        k: v for k, v in latest.items() if k != "sk"
    }
    snapshot = keys.state_snapshot_key(FACTORY, T0)
    assert await objects.exists(snapshot)
    assert sorted(replica.created()) == sorted(outcome.objects)
    assert snapshot in outcome.objects and len(outcome.objects) == 3  # state, risk, snapshot
    [change] = replica.changes()
    assert (change.event_name, change.old_image, message_of(change.new_image)) == (
        "INSERT",
        None,
        "msg-00000001",
    )


async def test_an_older_message_writes_its_objects_and_leaves_latest_alone(
    replica: Replica, states: MemoryStates, clock: FakeClock
) -> None:
    older = await replica.archive("msg-00000001")
    clock.advance(5)
    await replica.processor.handle(await replica.archive("msg-00000002"))
    replica.published.clear()

    outcome = await replica.processor.handle(older)

    assert outcome.latest == "older"
    assert message_of(await states.latest(FACTORY)) == "msg-00000002"
    assert len(await history(states)) == 1
    assert replica.changes() == []
    assert len(replica.created()) == 2  # its processed state and risk record, no snapshot


async def test_the_same_message_again_commits_nothing_more(
    replica: Replica, states: MemoryStates
) -> None:
    event = await replica.archive("msg-00000001")
    first = await replica.processor.handle(event)
    again = await replica.processor.handle(event)

    assert (first.latest, again.latest) == ("applied", "older")
    assert len(await history(states)) == 1


async def test_a_latest_another_replica_replaced_meanwhile_is_read_again(
    replica: Replica, objects: MemoryObjects, states: CrashingStates, clock: FakeClock
) -> None:
    """Replica one holds LATEST as it wrote it; replica two commits after it; replica one's
    replace from its stale copy is refused, its HISTORY item removed, and it commits on top."""
    other = Replica(objects, states, clock)
    await replica.processor.handle(await replica.archive("msg-00000001"))
    clock.advance(1)
    await other.processor.handle(await other.archive("msg-00000002"))
    clock.advance(1)

    outcome = await replica.processor.handle(await replica.archive("msg-00000003"))

    assert outcome.latest == "applied"
    items = await history(states)
    assert [message_of(i) for i in items] == ["msg-00000001", "msg-00000002", "msg-00000003"]
    assert_one_chain(items)
    latest = await states.latest(FACTORY)
    assert latest is not None and latest["updated_at"] == items[-1]["updated_at"]
    [change] = replica.changes()[1:]
    assert message_of(change.old_image) == "msg-00000002"


async def test_a_history_millisecond_another_state_holds_moves_the_state_to_the_next(
    replica: Replica, objects: MemoryObjects, states: CrashingStates, clock: FakeClock
) -> None:
    """All three commits in the same millisecond: the second takes the next one, and the
    third, whose stale copy points it at the second's millisecond, finds it taken."""
    other = Replica(objects, states, clock)
    emitted = [T0 - timedelta(seconds=3 - k) for k in range(3)]  # newer and newer, all before
    await replica.processor.handle(await replica.archive("msg-00000001", emitted_at=emitted[0]))
    await other.processor.handle(await other.archive("msg-00000002", emitted_at=emitted[1]))

    outcome = await replica.processor.handle(
        await replica.archive("msg-00000003", emitted_at=emitted[2])
    )

    assert outcome.latest == "applied"
    items = await history(states)
    ms = timedelta(milliseconds=1)
    assert [i["updated_at"] for i in items] == [format_ts(T0 + k * ms) for k in range(3)]
    assert [message_of(i) for i in items] == ["msg-00000001", "msg-00000002", "msg-00000003"]
    assert_one_chain(items)


async def test_a_redelivery_after_a_crash_before_latest_rolls_latest_forward(
    replica: Replica, states: CrashingStates, objects: MemoryObjects
) -> None:
    event = await replica.archive("msg-00000001")
    states.crash_before_latest = True
    with pytest.raises(Crash):
        await replica.processor.handle(event)
    # the fault hit with the state half written: in HISTORY, not in LATEST, no snapshot
    assert len(await history(states)) == 1
    assert await states.latest(FACTORY) is None
    assert not await objects.exists(keys.state_snapshot_key(FACTORY, T0))

    outcome = await replica.processor.handle(event, redelivered=True)

    assert outcome.latest == "recovered"
    items = await history(states)
    assert len(items) == 1
    latest = await states.latest(FACTORY)
    assert latest is not None and latest["updated_at"] == items[0]["updated_at"]
    assert await objects.exists(keys.state_snapshot_key(FACTORY, T0))
    assert [message_of(c.new_image) for c in replica.changes()] == ["msg-00000001"]


async def test_a_redelivery_of_a_committed_message_redoes_only_its_snapshot_and_events(
    replica: Replica, states: CrashingStates
) -> None:
    event = await replica.archive("msg-00000001")
    replica.crash_on_publish = True
    with pytest.raises(Crash):
        await replica.processor.handle(event)
    committed = await states.latest(FACTORY)
    assert message_of(committed) == "msg-00000001" and replica.published == []

    outcome = await replica.processor.handle(event, redelivered=True)

    assert outcome.latest == "recovered"
    assert await states.latest(FACTORY) == committed
    assert len(await history(states)) == 1
    [change] = replica.changes()
    assert (change.event_name, message_of(change.new_image)) == ("INSERT", "msg-00000001")
