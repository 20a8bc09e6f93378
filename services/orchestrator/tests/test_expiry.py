"""The TTL-expiry announcer (aegis_orchestrator.expiry).

Unit: which stream records are TTL removals, as AWS documents their shape.

Integration, on the session's emulator and NATS: the emulator (moto_server) has DynamoDB Streams
but never deletes an expired item, so it never produces a TTL removal. These tests give the
announcer a predicate accepting every REMOVE and delete items themselves: what they prove is the
reading of the stream (images, entity naming, checkpoints, leases, msg ids), not that AWS's TTL
records pass :func:`ttl_removal` (the unit tests hold that against the documented shape).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.events import ChangeEvent
from aegis_contracts.subjects import CHANGES
from aegis_devstack.testing.builders import FakeClock
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_orchestration.model import Job
from aegis_orchestrator.app import OrchestratorApp
from aegis_orchestrator.expiry import ExpiryAnnouncer, position, ttl_removal
from aegis_orchestrator.settings import OrchestratorSettings
from aegis_runtime import natsio
from aegis_runtime.bus import command_broker, ensure_streams
from aegis_runtime.metrics import Metrics
from aegis_storage.clients import AwsConfig, open_client

# -- unit: the predicate --------------------------------------------------------------------------


def aws_record(**overrides: Any) -> dict[str, Any]:
    """A stream record as AWS documents it (GetRecords, NEW_AND_OLD_IMAGES) for an expired item:
    the TTL process's deletes carry ``userIdentity`` {type Service, principalId
    dynamodb.amazonaws.com} (Developer Guide, "DynamoDB Streams and Time to Live")."""
    record: dict[str, Any] = {
        "eventID": "c81e728d9d4c2f636f067f89cc14862c",
        "eventName": "REMOVE",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "ap-south-1",
        "dynamodb": {
            "ApproximateCreationDateTime": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
            "Keys": {"pk": {"S": "ALERT#f-1"}, "sk": {"S": "CRITICAL#CO_HIGH#FIRING"}},
            "OldImage": {
                "pk": {"S": "ALERT#f-1"},
                "sk": {"S": "CRITICAL#CO_HIGH#FIRING"},
                "ttl": {"N": "1767323045"},
            },
            "SequenceNumber": "111100000000012345678901",
            "SizeBytes": 120,
            "StreamViewType": "NEW_AND_OLD_IMAGES",
        },
        "userIdentity": {"type": "Service", "principalId": "dynamodb.amazonaws.com"},
    }
    record.update(overrides)
    return record


def test_a_ttl_deletion_is_a_ttl_removal() -> None:
    assert ttl_removal(aws_record())


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"userIdentity": None}, id="a user's delete: no userIdentity"),
        pytest.param({"eventName": "MODIFY"}, id="not a delete"),
        pytest.param(
            {"userIdentity": {"type": "Service", "principalId": "other.amazonaws.com"}},
            id="another service",
        ),
        pytest.param(
            {"userIdentity": {"type": "User", "principalId": "dynamodb.amazonaws.com"}},
            id="not a service",
        ),
    ],
)
def test_other_records_are_refused(overrides: dict[str, Any]) -> None:
    record = aws_record(**overrides)
    if record.get("userIdentity") is None:
        del record["userIdentity"]
    assert not ttl_removal(record)


def test_positions_sort_like_sequence_numbers_and_keys_are_checked() -> None:
    assert position("99") < position("100") < position("1" * 40)
    with pytest.raises(ValueError, match="not a stream sequence number"):
        position("12a")
    assert keys.stream_lease_sk("shardId-0001-ab") == "LEASE#shardId-0001-ab"
    assert keys.stream_checkpoint_sk("shardId-0001-ab") == "CHECKPOINT#shardId-0001-ab"
    assert keys.change_entity(keys.stream_reader_pk("orch-expiry"), "LEASE#x") is None
    with pytest.raises(ContractError):
        keys.stream_lease_sk("shard/../x")


# -- integration ------------------------------------------------------------------------------------


def every_remove(record: Mapping[str, Any]) -> bool:
    """The emulator's stand-in for :func:`ttl_removal`: it never expires anything itself."""
    return record.get("eventName") == "REMOVE"


@dataclass
class Recorder:
    """The announcer's publish: JetStream with the msg id, each call noted with its ack."""

    js: JetStreamContext
    calls: list[tuple[str, str, bool]] = field(default_factory=list)  # subject, msg id, duplicate

    async def __call__(self, subject: str, event: ChangeEvent, *, msg_id: str) -> bool:
        ack = await self.js.publish(
            subject, event.model_dump_json().encode(), headers={"Nats-Msg-Id": msg_id}
        )
        self.calls.append((subject, msg_id, bool(ack.duplicate)))
        return bool(ack.duplicate)

    def stored(self) -> list[str]:
        return [msg_id for _, msg_id, duplicate in self.calls if not duplicate]


@pytest.fixture
async def bus(
    nats_url: str, make_settings: Callable[..., OrchestratorSettings]
) -> AsyncIterator[NatsClient]:
    """A plain connection, the streams made first (the events stream stores the announcements)."""
    broker = await command_broker(make_settings(), name="test-streams")
    try:
        await ensure_streams(broker)
    finally:
        await natsio.close(broker)
    nc = await nats.connect(nats_url)
    yield nc
    await nc.close()


@pytest.fixture
async def streams(aws_endpoint: str) -> AsyncIterator[Any]:
    async with open_client("dynamodbstreams", AwsConfig(endpoint_url=aws_endpoint)) as client:
        yield client


@pytest.fixture
def make_reader(
    foundation: Foundation, streams: Any, bus: NatsClient
) -> Callable[..., ExpiryAnnouncer]:
    def make(owner: str, clock: Any = None, **extra: Any) -> ExpiryAnnouncer:
        return ExpiryAnnouncer(
            clients=foundation.clients,
            streams=streams,
            table=foundation.table,
            publish=extra.pop("publish", None) or Recorder(bus.jetstream()),
            producer="orchestrator",
            owner=owner,
            clock=clock or (lambda: datetime.now(UTC)),
            metrics=Metrics("orchestrator"),
            accept=every_remove,
            **extra,
        )

    return make


async def heard(bus: NatsClient, table: str) -> tuple[list[ChangeEvent], Any]:
    """Every ChangeEvent of ``table`` on the bus from now on (a plain subscription)."""
    events: list[ChangeEvent] = []

    async def on(msg: Any) -> None:
        event = ChangeEvent.model_validate_json(msg.data)
        if event.table == table:
            events.append(event)

    sub = await bus.subscribe(f"{CHANGES}.>", cb=on)
    await bus.flush()
    return events, sub


def alert_item(scope: str, n: int) -> dict[str, Any]:
    return {
        "pk": keys.alert_pk(scope),
        "sk": keys.alert_sk("CRITICAL", f"CODE_{n}", "FIRING"),
        "firing": True,
        "level": "CRITICAL",
        "n": n,
        "ttl": int(datetime.now(UTC).timestamp()) - 60,  # passed: AWS would delete it
    }


async def put_and_delete(f: Foundation, scope: str, numbers: range) -> list[dict[str, Any]]:
    items = [alert_item(scope, n) for n in numbers]
    for item in items:
        await f.readmodel.put_item(item)
    for item in items:
        await f.readmodel.delete_item(item["pk"], item["sk"])
    return items


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_deletes_are_announced_with_their_old_images_and_other_records_are_not(
    foundation: Foundation, make_reader: Callable[..., ExpiryAnnouncer], bus: NatsClient
) -> None:
    events, sub = await heard(bus, foundation.table)
    items = await put_and_delete(foundation, "t-scope", range(3))
    # a history item's delete: no entity names it, skipped and counted
    history = {"pk": keys.factory_pk("t-f"), "sk": keys.history_state_sk(datetime.now(UTC))}
    await foundation.readmodel.put_item(history)
    await foundation.readmodel.delete_item(history["pk"], history["sk"])
    reader = make_reader("replica-a")
    assert await reader.poll() == 3
    await eventually(lambda: len(events) == 3, within=10, what="three announcements")
    await sub.unsubscribe()
    assert [(e.pk, e.sk, e.event_name, e.expired) for e in events] == [
        (i["pk"], i["sk"], "REMOVE", True) for i in items
    ]
    # the old image as the read model reads an item: plain values, no fleet index keys
    assert [e.old_image for e in events] == items
    assert all(e.new_image is None and e.producer == "orchestrator" for e in events)
    assert reader.skipped._value.get() == 1  # type: ignore[attr-defined]
    assert reader.read._value.get() >= 8  # type: ignore[attr-defined]  # 4 puts, 4 deletes, its lease
    assert reader.announced.labels(entity="alert")._value.get() == 3  # type: ignore[attr-defined]
    assert await reader.poll() == 0  # caught up: nothing again
    await reader.close()


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_the_checkpoint_survives_a_restart_and_a_record_read_again_is_a_duplicate(
    foundation: Foundation,
    make_reader: Callable[..., ExpiryAnnouncer],
    bus: NatsClient,
    unique_id: str,
) -> None:
    scope = unique_id
    first = make_reader("replica-a")
    await put_and_delete(foundation, scope, range(2))
    assert await first.poll() == 2
    await first.close()  # a clean stop: its shard is free at once
    # a restarted replica starts after the last record announced
    await put_and_delete(foundation, scope, range(2, 3))
    recorder = Recorder(bus.jetstream())
    second = make_reader("replica-b", publish=recorder)
    assert await second.poll() == 1
    [(_, msg_id, duplicate)] = recorder.calls
    assert not duplicate and msg_id.startswith("exp:")
    # a crash after publishing, before the checkpoint: the next reader publishes again, and
    # JetStream stores each of those once (same msg id, within its duplicate window)
    await put_and_delete(foundation, scope, range(3, 5))
    crashing = make_reader("replica-c", publish=(crashed := Recorder(bus.jetstream())))

    async def no_checkpoint(shard_id: str, sequence_number: str) -> None:
        raise RuntimeError("replica died before its checkpoint")

    crashing._checkpoint = no_checkpoint  # type: ignore[method-assign]
    await second.close()
    assert await crashing.poll() == 0  # published, then the shard failed (logged)
    assert [d for _, _, d in crashed.calls] == [False, False]
    await crashing.close()
    third = make_reader("replica-d", publish=(again := Recorder(bus.jetstream())))
    assert await third.poll() == 2
    assert [m for _, m, _ in again.calls] == [m for _, m, _ in crashed.calls]
    assert [d for _, _, d in again.calls] == [True, True]
    assert await third.poll() == 0
    await third.close()


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_two_replicas_announce_each_record_once_and_one_takes_over_a_lapsed_lease(
    foundation: Foundation,
    make_reader: Callable[..., ExpiryAnnouncer],
    bus: NatsClient,
    unique_id: str,
) -> None:
    clock = FakeClock(datetime.now(UTC))
    recorder = Recorder(bus.jetstream())
    a = make_reader("replica-a", clock, publish=recorder, lease=timedelta(seconds=30))
    b = make_reader("replica-b", clock, publish=recorder, lease=timedelta(seconds=30))
    for batch in range(3):
        await put_and_delete(foundation, unique_id, range(batch * 4, batch * 4 + 4))
        for _ in range(2):
            await asyncio.gather(a.poll(), b.poll())
        clock.advance(timedelta(seconds=5))
    assert len(recorder.calls) == 12  # no record read by both
    assert len(set(recorder.stored())) == 12
    assert [a._held != {}, b._held != {}].count(True) == 1
    holder, other = (a, b) if a._held else (b, a)
    # the holder stops renewing (hung, or gone without handing over): once its lease runs out
    # the other takes the shard over and reads on from the checkpoint
    await put_and_delete(foundation, unique_id, range(12, 14))
    assert await other.poll() == 0
    clock.advance(timedelta(seconds=31))
    assert await other.poll() == 2
    assert await holder.poll() == 0 and holder._held == {}
    assert len(recorder.calls) == 14 and len(set(recorder.stored())) == 14
    await a.close()
    await b.close()


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_an_expiry_fires_a_bizobject_delete_job(
    make_settings: Callable[..., OrchestratorSettings], foundation: Foundation, unique_id: str
) -> None:
    app = OrchestratorApp(
        make_settings(orchestrator_expiry_stream=True, orchestrator_expiry_poll_s=0.2),
        environment={},
    )
    await app.start()
    try:
        assert app.store is not None and app.expiry is not None
        app.expiry.accept = every_remove  # the emulator never expires: a delete stands in
        job = Job.model_validate(
            {
                "id": "late-expired",
                "job_name": "late-expired",
                "trigger_type": "BizObject",
                "object_id": "factory_late",
                "trigger_sub_type": "Delete",
                "trigger_condition_expr": (
                    f'AND(StringEQ([$.beforeData.factory_id], "{unique_id}"), Exists([$.expired]))'
                ),
                "steps": [{"id": "mark", "step_type": "DUMMY", "is_start_point": True}],
            }
        )
        await app.store.register(job)
        await app.refresh()
        hour = datetime(2025, 1, 2, 3, tzinfo=UTC)
        now = datetime.now(UTC)
        await foundation.readmodel.mark_late(unique_id, hour, now=now, ttl=int(now.timestamp()))
        await foundation.readmodel.delete_item(keys.factory_pk(unique_id), keys.late_hour_sk(hour))

        async def ran() -> bool:
            assert app.store is not None
            runs = await app.store.executions(job.id, limit=10)
            return any(r["status"] != "RUNNING" for r in runs)

        await eventually(ran, within=30, what="the expiry's execution")
        (run,) = await app.store.executions(job.id, limit=10)
        assert run["trigger"]["sub_type"] == "Delete"
        assert run["input"]["expired"] is True and run["input"]["afterData"] is None
        assert run["input"]["beforeData"]["marks"] == 1
        assert run["input"]["sk"] == keys.late_hour_sk(hour)
    finally:
        await app.stop()
