"""The processor app in-process against real NATS JetStream and the S3/DynamoDB emulator.

Each test has its own bucket/table (``foundation``), factory id, durable consumer filtered to that
factory's raw subjects, and dead-letter service name, because AEGIS_RAW/EVENTS/DLQ are shared.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from faststream.nats import NatsBroker
from nats.js import JetStreamContext, api

from aegis_contracts import keys
from aegis_contracts.events import ChangeEvent, ObjectCreated, RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.items import FactoryLatest, HistoryState
from aegis_contracts.keys import Dataset, ReportArtifact
from aegis_contracts.subjects import DEAD_LETTER, dead_letter_subject, raw_subject
from aegis_contracts.times import format_ts, kst_report_date, parse_ts, truncate_ms
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.waiting import eventually
from aegis_processor.app import ProcessorApp, create_app
from aegis_processor.settings import ProcessorSettings
from aegis_runtime.bus import DeadLetter, create_broker, ensure_streams, publish
from aegis_runtime.settings import AegisSettings
from aegis_storage import fleetindex

pytestmark = pytest.mark.integration


@pytest.fixture
async def broker(nats_url: str) -> AsyncIterator[NatsBroker]:
    broker = create_broker(AegisSettings(nats_url=nats_url), name="processor-test-client")
    await broker.connect()
    await ensure_streams(broker)
    yield broker
    await broker.stop()


@pytest.fixture
def js(broker: NatsBroker) -> JetStreamContext:
    return broker.connection.jetstream()


class Events:
    """Filtered durable consumers on AEGIS_EVENTS (created before the test publishes)."""

    def __init__(self, js: JetStreamContext, unique_id: str, factory: str) -> None:
        self.js, self.uid, self.factory = js, unique_id, factory
        self.subs: dict[str, Any] = {}
        self.objects: list[ObjectCreated] = []
        self.changes: list[ChangeEvent] = []

    async def start(self) -> None:
        for name, subject in (
            ("oc", "aegis.objects.created.>"),
            ("chg", "aegis.changes.factory_latest"),
        ):
            durable = f"test-{self.uid}-{name}"
            self.subs[durable] = await self.js.pull_subscribe(
                subject,
                durable=durable,
                stream="AEGIS_EVENTS",
                config=api.ConsumerConfig(
                    deliver_policy=api.DeliverPolicy.NEW, ack_policy=api.AckPolicy.NONE
                ),
            )

    async def drain(self) -> None:
        for durable, sub in self.subs.items():
            try:
                msgs = await sub.fetch(batch=200, timeout=0.3)
            except TimeoutError:
                continue
            for msg in msgs:
                if durable.endswith("-oc"):
                    oc = ObjectCreated.model_validate_json(msg.data)
                    if oc.key.startswith(f"processed/{self.factory}/"):
                        self.objects.append(oc)
                else:
                    ch = ChangeEvent.model_validate_json(msg.data)
                    if ch.pk == keys.factory_pk(self.factory):
                        self.changes.append(ch)

    async def until(self, predicate: Callable[[], bool]) -> None:
        async def check() -> bool:
            await self.drain()
            return predicate()

        await eventually(check, what="events")

    async def stop(self) -> None:
        for durable, sub in self.subs.items():
            await sub.unsubscribe()
            await self.js.delete_consumer("AEGIS_EVENTS", durable)


class Harness:
    def __init__(self, foundation: Any, broker: NatsBroker, js: JetStreamContext, uid: str) -> None:
        self.f = f"f-{uid}"
        self.uid = uid
        self.foundation = foundation
        self.store = foundation.store
        self.readmodel = foundation.readmodel
        self.broker = broker
        self.js = js
        self.service = f"processor-{uid}"
        self.sent = 0

    async def raw(
        self,
        source_type: str,
        body: dict[str, Any] | bytes,
        *,
        mid: str,
        emitted_at: datetime | None,
        received_at: datetime,
        inline: bool = False,
        factory_in_payload: str | None = None,
    ) -> RawArchived:
        """Archive a payload as ingest would, and publish its RawArchived event."""
        if isinstance(body, bytes):
            payload = body
        else:
            envelope = {
                "message_id": mid,
                "factory_id": factory_in_payload or self.f,
                "device_id": "edge-1",
                "emitted_at": (emitted_at or received_at).isoformat(),
                "schema_version": "1.0",
            }
            payload = json.dumps({**envelope, **body}).encode()
        key = keys.raw_key(self.f, source_type, received_at, mid)
        await self.store.put_immutable(key, payload)
        event = RawArchived(
            message_id=mid,
            factory_id=self.f,
            source_type=SourceType(source_type),
            topic=f"aegis/{self.f}/{source_type}",
            bucket=self.store.bucket,
            key=key,
            received_at=received_at,
            size_bytes=len(payload),
            qos=1,
            payload_text=payload.decode() if inline else None,
        )
        await self.send(event)
        return event

    async def send(self, event: RawArchived) -> None:
        self.sent += 1  # a fresh Nats-Msg-Id each time: a re-send is a redelivery, not a duplicate
        await publish(
            self.broker,
            raw_subject(event.factory_id, event.source_type),
            event,
            msg_id=f"{event.message_id}:{self.sent}",
        )

    async def settled(self, app: ProcessorApp, handled: int) -> None:
        async def done() -> bool:
            info = await self.js.consumer_info("AEGIS_RAW", app.settings.durable)
            total = sum(
                s.value
                for fam in app.metrics.messages_total.collect()
                for s in fam.samples
                if s.name.endswith("_total")
            )
            return info.num_pending == 0 and info.num_ack_pending == 0 and total >= handled

        await eventually(done, what=f"{handled} messages settled")

    async def history(self) -> list[dict[str, Any]]:
        now = datetime.now(UTC)
        return await self.readmodel.history_states(
            self.f, now - timedelta(days=30), now + timedelta(days=30), now=now
        )

    async def processed_keys(self) -> list[str]:
        return await self.store.list_keys(f"processed/{self.f}/")


@pytest.fixture
async def harness(
    foundation: Any, broker: NatsBroker, js: JetStreamContext, unique_id: str
) -> AsyncIterator[Harness]:
    h = Harness(foundation, broker, js, unique_id)
    yield h
    await js.purge_stream("AEGIS_DLQ", subject=f"{DEAD_LETTER}.{h.service}.>")


@pytest.fixture
async def events(js: JetStreamContext, unique_id: str) -> AsyncIterator[Events]:
    ev = Events(js, unique_id, f"f-{unique_id}")
    await ev.start()
    yield ev
    await ev.stop()


@pytest.fixture
def run_app(harness: Harness, aws_endpoint: str, nats_url: str) -> Callable[..., Any]:
    @asynccontextmanager
    async def run(clock: Any = None, **overrides: Any) -> AsyncIterator[ProcessorApp]:
        settings = ProcessorSettings(
            aws_endpoint_url=aws_endpoint,
            bucket=harness.foundation.bucket,
            table=harness.foundation.table,
            nats_url=nats_url,
            service=harness.service,
            durable=f"processor-{harness.uid}",
            subject=f"aegis.raw.{harness.f}.>",
            processor_fetch_timeout_s=0.3,
            retry_first_delay_s=0.05,
            retry_max_delay_s=0.2,
            **{"refresh_enabled": False, **overrides},
        )
        app = create_app(settings, **({"clock": clock} if clock else {}))
        await app.start()
        try:
            yield app
        finally:
            await app.stop()
            await harness.js.delete_consumer("AEGIS_RAW", settings.durable)

    return run


def now_ms() -> datetime:
    return truncate_ms(datetime.now(UTC))


FACTORY_BODY = {
    "sensors": {"temperature_c": 24.5, "co_ppm": 60.0, "pressure_kpa": 101.2},
    "ai": {
        "model_version": "yolo-8",
        "detections": [{"label": "fire", "confidence": 0.91, "camera_id": "cam-1"}],
    },
}


# -- the happy path ----------------------------------------------------------------------------


async def test_factory_state_yields_processed_objects_latest_history_snapshot_and_events(
    harness: Harness, events: Events, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    emitted = received - timedelta(seconds=2)
    mid = f"m-{h.uid}-1"
    async with run_app() as app:
        await h.raw(
            "factory_state", FACTORY_BODY, mid=mid, emitted_at=emitted, received_at=received
        )
        await h.settled(app, 1)
        assert await app.health.readiness() == {"nats": True, "storage": True}

    fs_key = keys.processed_key(h.f, Dataset.FACTORY_STATE, emitted, mid)
    risk_key = keys.processed_key(h.f, Dataset.RISK_SCORE, emitted, mid)
    state = await h.store.get_json(fs_key)
    assert state["sensors"] == FACTORY_BODY["sensors"]
    assert state["detections"][0]["label"] == "fire"
    assert state["meta"]["event_time"] == format_ts(emitted)
    assert state["meta"]["received_at"] == format_ts(received)
    assert state["meta"]["flags"] == []
    risk = await h.store.get_json(risk_key)
    assert risk["risk"]["level"] == "CRITICAL"
    assert {r["code"] for r in risk["risk"]["reasons"]} == {"FIRE_DETECTED", "CO_HIGH"}

    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None
    assert latest["factory_state"]["meta"]["message_id"] == mid
    assert latest["last_factory_state_at"] == format_ts(emitted)
    assert "infra_state" not in latest and "last_infra_state_at" not in latest
    assert latest["risk"]["level"] == "CRITICAL"
    assert latest["pipeline_status"]["status"] == "OK"
    updated_at = parse_ts(latest["updated_at"])
    assert abs((updated_at - datetime.now(UTC)).total_seconds()) < 60

    (item,) = await h.history()
    assert item["sk"] == keys.history_state_sk(updated_at)
    expected_ttl = datetime.now(UTC).timestamp() + 2 * 3600
    assert abs(item["ttl"] - expected_ttl) < 60
    assert item["factory_state"] == latest["factory_state"]
    assert item["risk"] == latest["risk"]

    snap_key = keys.state_snapshot_key(h.f, updated_at)
    snapshot = await h.store.get_json(snap_key)
    assert "ttl" not in snapshot
    assert snapshot == {k: v for k, v in item.items() if k != "ttl"}
    # what the aggregator reads for a window older than HISTORY holds: the same state
    assert FactoryLatest.model_validate(snapshot).model_dump() == HistoryState.model_validate(
        item
    ).model_dump(exclude={"ttl"})
    assert sorted(await h.processed_keys()) == sorted([fs_key, risk_key, snap_key])

    wanted = {fs_key, risk_key, snap_key}
    await events.until(lambda: {o.key for o in events.objects} >= wanted)
    by_key = {o.key: o for o in events.objects}
    assert by_key[snap_key].bucket == h.store.bucket
    assert by_key[snap_key].producer == "processor"
    assert by_key[fs_key].size_bytes > 0
    # the snapshot's event carries the risk the dispatcher decides on: the first state, so no
    # reason before it; the other objects carry none
    basis = by_key[snap_key].alert
    assert basis is not None and basis.at == updated_at and basis.previous_reasons == []
    assert [(r.code, r.severity, r.detail) for r in basis.reasons] == [
        (r["code"], r["severity"], r["detail"]) for r in latest["risk"]["reasons"]
    ]
    assert by_key[fs_key].alert is None and by_key[risk_key].alert is None
    await events.until(lambda: len(events.changes) >= 1)
    await events.drain()
    (change,) = events.changes  # one commit: the state with its risk, in one change
    assert (change.event_name, change.old_image) == ("INSERT", None)
    assert change.new_image == latest
    assert change.new_image["risk"]["level"] == "CRITICAL"
    assert change.table == h.foundation.table and change.sk == "LATEST"


# -- ordering and redelivery --------------------------------------------------------------------


async def test_newer_then_older_leaves_latest_on_the_newer(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    newer, older = received - timedelta(seconds=1), received - timedelta(seconds=20)
    body = {"host": {"cpu_pct": 20.5}, "pipeline": {"detector": "ok"}}
    async with run_app() as app:
        await h.raw(
            "infra_state",
            body,
            mid=f"new-{h.uid}",
            emitted_at=newer,
            received_at=received,
            inline=True,
        )
        await h.settled(app, 1)
        await h.raw(
            "infra_state",
            body,
            mid=f"old-{h.uid}",
            emitted_at=older,
            received_at=received,
            inline=True,
        )
        await h.settled(app, 2)

    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None
    assert latest["infra_state"]["meta"]["message_id"] == f"new-{h.uid}"
    assert latest["last_infra_state_at"] == format_ts(newer)
    assert "factory_state" not in latest
    assert latest["pipeline_status"]["status"] == "OK"
    # the late one still has its processed object, filed under its own event time
    assert await h.store.exists(keys.processed_key(h.f, Dataset.INFRA_STATE, older, f"old-{h.uid}"))
    assert len(await h.history()) == 1
    outcomes = {
        s.labels["outcome"]: s.value
        for fam in app.latest_outcomes.collect()
        for s in fam.samples
        if s.name.endswith("_total")
    }
    assert outcomes == {"applied": 1, "older": 1}


async def test_redelivery_changes_nothing(
    harness: Harness, events: Events, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    mid = f"m-{h.uid}-r"
    async with run_app() as app:
        event = await h.raw(
            "factory_state", FACTORY_BODY, mid=mid, emitted_at=received, received_at=received
        )
        await h.settled(app, 1)
        before = await h.readmodel.get_latest(h.f)
        keys_before = sorted(await h.processed_keys())
        snap_key = next(k for k in keys_before if "/state_snapshot/" in k)
        snap_before = await h.store.get_bytes(snap_key)
        fs_key = next(k for k in keys_before if "/factory_state/" in k)
        fs_before = await h.store.get_bytes(fs_key)
        await h.send(event)  # the same event again, as a new stream message (an ingest re-send)
        await h.settled(app, 2)
        outcome = await app.handle(event, redelivered=True)  # and as JetStream redelivers it
        assert outcome.latest == "recovered"

    assert await h.readmodel.get_latest(h.f) == before
    assert len(await h.history()) == 1
    assert sorted(await h.processed_keys()) == keys_before
    assert await h.store.get_bytes(snap_key) == snap_before
    assert await h.store.get_bytes(fs_key) == fs_before
    await events.until(lambda: len(events.changes) >= 1)
    await events.drain()
    assert len(events.changes) == 1  # the recovery's change event is the same de-duplicated one
    assert len({o.key for o in events.objects}) == 3


async def _two_states(h: Harness, app: Any, received: datetime) -> tuple[RawArchived, list[Any]]:
    """M1 then M2 (newer), processed normally; returns M2's event and the HISTORY items."""
    await h.raw(
        "factory_state",
        FACTORY_BODY,
        mid=f"m-{h.uid}-1",
        emitted_at=received - timedelta(seconds=2),
        received_at=received,
    )
    await h.settled(app, 1)
    second = await h.raw(
        "factory_state",
        {"sensors": {"co_ppm": 2.0}},
        mid=f"m-{h.uid}-2",
        emitted_at=received - timedelta(seconds=1),
        received_at=received,
    )
    await h.settled(app, 2)
    history = await h.history()
    assert len(history) == 2
    return second, history


async def test_a_crash_before_the_snapshot_is_finished_by_the_redelivery(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    async with run_app() as app:
        second, (_, item) = await _two_states(h, app, now_ms())
        snap_key = keys.state_snapshot_key(h.f, parse_ts(item["updated_at"]))
        await h.store.delete_many([snap_key])  # committed, then the process died
        assert (await app.handle(second, redelivered=True)).latest == "recovered"

    assert len(await h.history()) == 2
    assert await h.store.get_json(snap_key) == {k: v for k, v in item.items() if k != "ttl"}


async def test_a_crash_between_history_and_latest_is_rolled_forward(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    async with run_app() as app:
        second, (first, item) = await _two_states(h, app, now_ms())
        # the process died after HISTORY and before LATEST: LATEST is still the first state
        state1 = {k: v for k, v in first.items() if k != "ttl"} | {"sk": "LATEST"}
        assert await h.readmodel.replace_latest(h.f, state1, expected=item["updated_at"])
        snap_key = keys.state_snapshot_key(h.f, parse_ts(item["updated_at"]))
        await h.store.delete_many([snap_key])
        assert (await app.handle(second, redelivered=True)).latest == "recovered"

    latest = await h.readmodel.get_latest(h.f)
    assert latest == {k: v for k, v in item.items() if k != "ttl"} | {"sk": "LATEST"}
    assert len(await h.history()) == 2
    assert await h.store.exists(snap_key)


async def test_an_orphaned_state_that_latest_moved_past_is_removed(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    async with run_app() as app:
        second, (first, orphan) = await _two_states(h, app, received)
        state1 = {k: v for k, v in first.items() if k != "ttl"} | {"sk": "LATEST"}
        assert await h.readmodel.replace_latest(h.f, state1, expected=orphan["updated_at"])
        await h.store.delete_many([keys.state_snapshot_key(h.f, parse_ts(orphan["updated_at"]))])
        # a newer message commits on top of the first state before the redelivery comes
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 1.0}},
            mid=f"m-{h.uid}-3",
            emitted_at=received,
            received_at=received,
        )
        await h.settled(app, 3)
        assert (await app.handle(second, redelivered=True)).latest == "older"

    history = await h.history()
    ids = [i["factory_state"]["meta"]["message_id"] for i in history]
    assert ids == [f"m-{h.uid}-1", f"m-{h.uid}-3"]  # the orphan never was a state: gone
    assert history[1]["prev_updated_at"] == history[0]["updated_at"]


class LostAnswer:
    """The processor's DynamoDB client behind a network that loses the answer to one put: the
    first put whose sort key starts with ``sk_prefix`` is applied and its answer never arrives,
    so the SDK sends it again and the caller hears the retry's answer (a failed condition, as
    the first one was applied)."""

    def __init__(self, client: Any, sk_prefix: str) -> None:
        self.client, self.sk_prefix, self.lost = client, sk_prefix, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    async def put_item(self, **request: Any) -> Any:
        if not self.lost and request["Item"]["sk"]["S"].startswith(self.sk_prefix):
            self.lost += 1
            await self.client.put_item(**request)  # applied; its answer is lost
        return await self.client.put_item(**request)


@pytest.mark.parametrize(
    ("sk_prefix", "roll_forward"),
    [("HISTORY#STATE#", False), ("LATEST", False), ("LATEST", True)],
    ids=["history-put", "latest-replace", "latest-roll-forward"],
)
async def test_a_write_whose_answer_is_lost_is_applied_once(
    harness: Harness,
    events: Events,
    run_app: Callable[..., Any],
    sk_prefix: str,
    roll_forward: bool,
) -> None:
    """A put applied by the table whose answer is lost is retried by the SDK and refused by its
    own success: the state is still committed once (one HISTORY item, LATEST, a snapshot, one
    change event), neither written twice nor taken for another writer's and undone."""
    h = harness
    async with run_app() as app:
        second, (first, item) = await _two_states(h, app, now_ms())
        # back to the first state: died between HISTORY and LATEST (the redelivery rolls LATEST
        # forward), or never got to write (the second message comes again)
        state1 = {k: v for k, v in first.items() if k != "ttl"} | {"sk": "LATEST"}
        assert await h.readmodel.replace_latest(h.f, state1, expected=item["updated_at"])
        if not roll_forward:
            await h.readmodel.delete_item(keys.factory_pk(h.f), item["sk"])
            await h.store.delete_many([keys.state_snapshot_key(h.f, parse_ts(item["updated_at"]))])
        await events.until(lambda: len(events.changes) >= 2)
        assert app.processor is not None
        lossy = LostAnswer(app.processor.readmodel._ddb, sk_prefix)
        app.processor.readmodel._ddb = lossy
        app.processor._known.clear()
        outcome = await app.handle(second, redelivered=roll_forward)
        assert lossy.lost == 1  # the fault hit a write of this commit
        assert outcome.latest == ("recovered" if roll_forward else "applied")

    history = await h.history()
    assert [i["factory_state"]["meta"]["message_id"] for i in history] == [
        f"m-{h.uid}-1",
        f"m-{h.uid}-2",
    ]
    assert history[1]["prev_updated_at"] == history[0]["updated_at"]
    latest = await h.readmodel.get_latest(h.f)
    assert latest == {k: v for k, v in history[1].items() if k != "ttl"} | {"sk": "LATEST"}
    snapshots = await h.store.list_keys(keys.processed_prefix(h.f, "state_snapshot"))
    assert len(snapshots) == 2
    await events.until(
        lambda: latest["updated_at"] in [c.new_image["updated_at"] for c in events.changes]
    )
    await events.drain()
    changed = [c.new_image["updated_at"] for c in events.changes]
    assert changed.count(latest["updated_at"]) == 1


# -- poison -------------------------------------------------------------------------------------


async def _dead_letter(h: Harness, reason: str) -> DeadLetter:
    raw = await h.js.get_last_msg("AEGIS_DLQ", dead_letter_subject(h.service, reason))
    assert raw.data is not None
    return DeadLetter.model_validate_json(raw.data)


async def test_invalid_messages_are_dead_lettered_with_their_reason_and_write_nothing(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    async with run_app() as app:
        await h.raw(
            "factory_state",
            b'{"sensors": {"co_ppm": 1}',
            mid=f"bad-{h.uid}-1",
            emitted_at=None,
            received_at=received,
        )
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": "high"}},
            mid=f"bad-{h.uid}-2",
            emitted_at=received,
            received_at=received,
            inline=True,
        )
        await h.raw(
            "infra_state",
            {},
            mid=f"bad-{h.uid}-3",
            emitted_at=received,
            received_at=received,
            factory_in_payload="factory-b",
        )
        await h.settled(app, 3)
        # the service keeps serving
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 1}},
            mid=f"ok-{h.uid}-4",
            emitted_at=received,
            received_at=received,
        )
        await h.settled(app, 4)

    for reason, mid in (
        ("malformed_json", f"bad-{h.uid}-1"),
        ("schema_violation", f"bad-{h.uid}-2"),
        ("factory_mismatch", f"bad-{h.uid}-3"),
    ):
        letter = await _dead_letter(h, reason)
        assert letter.reason == reason
        assert RawArchived.model_validate_json(letter.payload_bytes()).message_id == mid
    assert "factory-b" in (await _dead_letter(h, "factory_mismatch")).detail
    assert all(f"ok-{h.uid}-4" in k or "/state_snapshot/" in k for k in await h.processed_keys())
    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None and "infra_state" not in latest
    assert len(await h.history()) == 1
    dead = {
        s.labels["reason"]: s.value
        for fam in app.metrics.dead_letters_total.collect()
        for s in fam.samples
        if s.name.endswith("_total")
    }
    assert dead == {"malformed_json": 1, "schema_violation": 1, "factory_mismatch": 1}


OVERFLOWING = {
    # values that parse as JSON but overflow what comes after: Python's int reader, DynamoDB's
    # number range, datetime's last year
    "digits": ('{"co_ppm": %s}' % ("9" * 4301), "malformed_json", "4,300 digits"),
    "huge": ('{"co_ppm": 1e300}', "schema_violation", "sensors.co_ppm"),
    "tiny": ('{"co_ppm": 1e-200}', "schema_violation", "sensors.co_ppm"),
    "year": (None, "schema_violation", "emitted_at"),
}


@pytest.mark.parametrize("case", sorted(OVERFLOWING))
async def test_values_that_overflow_downstream_are_refused_at_once_and_write_nothing(
    harness: Harness, run_app: Callable[..., Any], case: str
) -> None:
    h = harness
    received = now_ms()
    sensors, reason, where = OVERFLOWING[case]
    emitted = '"9999-12-31T23:59:59-05:00"' if case == "year" else f'"{received.isoformat()}"'
    body = (
        f'{{"message_id": "o-{h.uid}", "factory_id": "{h.f}", "device_id": "edge-1", '
        f'"emitted_at": {emitted}, "schema_version": "1.0", '
        f'"sensors": {sensors or "{}"}}}'
    )
    async with run_app() as app:
        await h.raw(
            "factory_state",
            body.encode(),
            mid=f"o-{h.uid}",
            emitted_at=None,
            received_at=received,
            inline=True,
        )
        await h.settled(app, 1)
    letter = await _dead_letter(h, reason)
    assert letter.deliveries == 1  # refused, never retried as if transient
    assert where in letter.detail
    assert await h.processed_keys() == []
    assert await h.readmodel.get_latest(h.f) is None


async def test_an_event_whose_raw_object_is_missing_is_dead_lettered_at_once(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    mid = f"gone-{h.uid}-1"
    async with run_app() as app:
        event = await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 1}},
            mid=mid,
            emitted_at=received,
            received_at=received,
        )
        await h.store.delete_many([event.key])
        await h.send(event)  # the object is gone now: this delivery cannot read it
        await h.settled(app, 2)
    letter = await _dead_letter(h, "raw_object_missing")
    assert letter.deliveries == 1  # no retries: a missing object never appears by itself
    assert event.key in letter.detail


async def test_forged_events_are_dead_lettered_and_write_nothing(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    """Anyone who can publish on the raw subjects tries to make the processor believe a factory
    reported CO at 9,999 ppm: by an inline payload that is not the archived object's, by naming
    another factory's archived object, another bucket, and an object ingest never wrote."""
    h = harness
    received = now_ms()
    quiet = {"sensors": {"co_ppm": 1}}
    async with run_app() as app:
        real = await h.raw(
            "factory_state", quiet, mid=f"real-{h.uid}", emitted_at=received, received_at=received
        )
        await h.settled(app, 1)
        before = await h.readmodel.get_latest(h.f)
        forged_text = real.payload_text or (await h.store.get_bytes(real.key)).decode()
        forged_text = forged_text.replace('"co_ppm": 1', '"co_ppm": 9999')
        assert "9999" in forged_text
        attacks = {
            # the real key, a payload of the attacker's
            "event_payload_mismatch": real.model_copy(update={"payload_text": forged_text}),
            # another message's object under this event's ids
            "event_not_archived": real.model_copy(
                update={"message_id": f"forged-{h.uid}", "payload_text": forged_text}
            ),
        }
        for event in attacks.values():
            await h.send(event)
        # another bucket, and the attacker's own key layout: both not the archive's
        await h.send(real.model_copy(update={"bucket": "attacker-bucket"}))
        await h.send(real.model_copy(update={"key": f"raw/{h.f}/evil.json"}))
        await h.settled(app, 5)
        # an object archived before S3 kept checksums is read and compared the same way
        old_key = keys.raw_key(h.f, "factory_state", received, f"old-{h.uid}")
        old_body = json.dumps(
            {
                "message_id": f"old-{h.uid}",
                "factory_id": h.f,
                "device_id": "edge-1",
                "emitted_at": received.isoformat(),
                "schema_version": "1.0",
                **quiet,
            }
        )
        await h.store._s3.put_object(Bucket=h.store.bucket, Key=old_key, Body=old_body.encode())
        old = real.model_copy(
            update={"message_id": f"old-{h.uid}", "key": old_key, "payload_text": old_body}
        )
        await h.send(old.model_copy(update={"payload_text": old_body.replace(": 1}", ": 9999}")}))
        await h.send(old)
        await h.settled(app, 7)

    assert await h.store.kept_sha256(real.key) is not None  # ingest's put keeps a SHA-256
    assert await h.store.kept_sha256(old_key) is None
    for reason in ("event_payload_mismatch", "event_not_archived"):
        letter = await _dead_letter(h, reason)
        assert letter.reason == reason and letter.deliveries == 1
    dead = {
        s.labels["reason"]: s.value
        for fam in app.metrics.dead_letters_total.collect()
        for s in fam.samples
        if s.name.endswith("_total")
    }
    assert dead == {"event_payload_mismatch": 2, "event_not_archived": 3}
    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None and before is not None
    assert latest["factory_state"]["sensors"]["co_ppm"] == 1  # never 9999
    assert f"forged-{h.uid}" not in json.dumps(await h.processed_keys())
    assert any(f"old-{h.uid}" in k for k in await h.processed_keys())  # the honest old one


# -- event time ---------------------------------------------------------------------------------


async def test_clock_skew_is_filed_under_arrival_and_late_data_keeps_its_time(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    skewed = received + timedelta(hours=3)
    late = received - timedelta(days=2)
    report = keys.report_key(kst_report_date(late), h.f, ReportArtifact.REPORT)
    await h.store.put_bytes(report, b"# report", content_type="text/markdown")
    async with run_app() as app:
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 1}},
            mid=f"skew-{h.uid}",
            emitted_at=skewed,
            received_at=received,
        )
        await h.settled(app, 1)
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 2}},
            mid=f"late-{h.uid}",
            emitted_at=late,
            received_at=received,
        )
        await h.settled(app, 2)

    skew_obj = await h.store.get_json(
        keys.processed_key(h.f, Dataset.FACTORY_STATE, received, f"skew-{h.uid}")
    )
    assert skew_obj["meta"]["flags"] == ["clock_skew"]
    assert skew_obj["meta"]["event_time"] == format_ts(received)
    assert skew_obj["meta"]["emitted_at"] == format_ts(skewed)
    late_obj = await h.store.get_json(
        keys.processed_key(h.f, Dataset.RISK_SCORE, late, f"late-{h.uid}")
    )
    assert late_obj["meta"]["flags"] == ["late"]
    assert late_obj["meta"]["event_time"] == format_ts(late)
    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None
    assert latest["factory_state"]["meta"]["message_id"] == f"skew-{h.uid}"
    # the late message's hour was folded long ago: it is marked for the aggregator, once; the
    # message filed under its arrival (an hour not over) marks nothing
    marked = await h.readmodel.late_hours(now=now_ms())
    assert [(m["factory_id"], m["hour_start"], m["marks"]) for m in marked] == [
        (h.f, format_ts(late.replace(minute=0, second=0, microsecond=0)), 1)
    ]
    assert app.metrics.registry.get_sample_value("aegis_processor_late_marks_total") == 1


# -- the 1-minute refresh -----------------------------------------------------------------------


async def test_staleness_turns_stale_then_offline(
    harness: Harness, events: Events, run_app: Callable[..., Any]
) -> None:
    h = harness
    start = now_ms()
    clock = FakeClock(start)
    async with run_app(
        clock, refresh_enabled=True, refresh_interval_s=0.2, stale_after_s=2, offline_after_s=5
    ) as app:
        await h.raw(
            "factory_state",
            {"sensors": {"co_ppm": 1}},
            mid=f"m-{h.uid}",
            emitted_at=start,
            received_at=start,
        )
        await h.settled(app, 1)

        async def latest_is(status: str, code: str | None) -> bool:
            latest = await h.readmodel.get_latest(h.f)
            assert latest is not None
            reasons = {r["code"] for r in latest["risk"]["reasons"]}
            return latest["pipeline_status"]["status"] == status and (
                code in reasons if code else not reasons
            )

        assert await latest_is("OK", None)
        clock.now = start + timedelta(seconds=3)
        await eventually(lambda: latest_is("STALE", "STALE_DATA"), what="STALE_DATA")
        latest = await h.readmodel.get_latest(h.f)
        assert latest is not None and latest["risk"]["level"] == "WARNING"
        clock.now = start + timedelta(seconds=6)
        await eventually(lambda: latest_is("OFFLINE", "FACTORY_OFFLINE"), what="FACTORY_OFFLINE")
        latest = await h.readmodel.get_latest(h.f)
        assert latest is not None and latest["risk"]["level"] == "CRITICAL"
        assert latest["updated_at"] == format_ts(clock.now)

    history = await h.history()
    assert [i["pipeline_status"]["status"] for i in history] == ["OK", "STALE", "OFFLINE"]
    snaps = [k for k in await h.processed_keys() if "/state_snapshot/" in k]
    assert len(snaps) == 3
    await events.until(lambda: len([o for o in events.objects if "/state_snapshot/" in o.key]) == 3)
    await events.until(lambda: len(events.changes) >= 3)  # one per committed state


async def test_image_snapshot_updates_its_own_group(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    h = harness
    received = now_ms()
    captured = received - timedelta(seconds=1)
    filename = f"cam-1-{h.uid}.jpg"
    body = {
        "camera_id": "cam-1",
        "filename": filename,
        "content_type": "image/jpeg",
        "size_bytes": 2048,
        "captured_at": captured.isoformat(),
        "s3_key": keys.image_snapshot_key(h.f, captured, filename),
    }
    async with run_app() as app:
        await h.raw(
            "image_snapshot",
            body,
            mid=f"img-{h.uid}",
            emitted_at=captured,
            received_at=received,
            inline=True,
        )
        await h.settled(app, 1)

    obj = await h.store.get_json(
        keys.processed_key(h.f, Dataset.IMAGE_SNAPSHOT, captured, f"img-{h.uid}")
    )
    assert obj["s3_key"] == body["s3_key"]
    latest = await h.readmodel.get_latest(h.f)
    assert latest is not None
    assert latest["latest_image_snapshot"]["filename"] == filename
    assert latest["last_image_snapshot_at"] == format_ts(captured)
    assert latest["pipeline_status"]["status"] == "NO_DATA"
    assert latest["risk"]["level"] == "NORMAL"
    assert len(await h.history()) == 1


async def test_the_processor_gives_index_keys_to_latest_items_written_before_the_index(
    harness: Harness, run_app: Callable[..., Any]
) -> None:
    """A LATEST item of a version before the fleet index, then bootstrap asking for a
    backfill: the processor does it at start, and the factory is listed."""
    h = harness
    ddb, table = h.foundation.clients.dynamodb, h.foundation.table
    await ddb.put_item(
        TableName=table,
        Item={"pk": {"S": keys.factory_pk(h.f)}, "sk": {"S": "LATEST"}, "factory_id": {"S": h.f}},
    )
    assert h.f not in await h.readmodel.fleet_ids()
    arn = (await ddb.describe_table(TableName=table))["Table"]["TableArn"]
    await fleetindex.ask_for_backfill(ddb, table, arn)
    async with run_app():

        async def listed() -> bool:
            return h.f in await h.readmodel.fleet_ids()

        await eventually(listed, what="the factory in the fleet index")
    assert await fleetindex.done_generation(ddb, table, fleetindex.FACTORIES) == 1
