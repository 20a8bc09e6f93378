"""The dispatcher over the real S3/DynamoDB emulator and a local HTTP server standing in for Slack,
time driven by an injected clock (snapshot times); then the service on a real NATS JetStream:
two replicas on one durable, the dead-letter subject and ``aegis alerts resend``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
from aiodynamo.errors import InternalDynamoError
from faststream.nats import NatsBroker

from aegis_alert_dispatcher.app import DispatcherApp
from aegis_alert_dispatcher.decide import Policy
from aegis_alert_dispatcher.dispatcher import AlertBusy, Dispatcher, Result
from aegis_alert_dispatcher.escalation import default_escalation_text as load_escalation_text
from aegis_alert_dispatcher.escalation import load_escalation
from aegis_alert_dispatcher.escalator import Escalator
from aegis_alert_dispatcher.receivers import SlackWebhookReceiver
from aegis_alert_dispatcher.settings import DispatcherSettings
from aegis_alert_dispatcher.slack import SlackWebhook
from aegis_contracts import incidents, keys
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.events import AlertBasis, ChangeEvent, ObjectCreated
from aegis_contracts.silences import new_silence
from aegis_contracts.state import Level, Reason
from aegis_contracts.subjects import change_subject, object_created_subject
from aegis_contracts.times import format_ts, utc_now
from aegis_contracts.ttl import TtlSettings
from aegis_devstack.localservers import free_port
from aegis_devstack.testing.builders import FakeClock, clock_moved, fire_reason
from aegis_devstack.testing.cli import invoke_in_thread
from aegis_devstack.testing.emulator import arequest_counts
from aegis_devstack.testing.processes import process_ready
from aegis_devstack.testing.storage import Foundation
from aegis_devstack.testing.waiting import eventually
from aegis_devstack.testing.webhook import ABANDONED, FakeWebhook, Unanswered
from aegis_runtime.bus import create_broker, ensure_streams, publish
from aegis_runtime.logging import configure
from aegis_storage import fleetindex
from aegis_storage.dynamo import DynamoItems
from aegis_storage.errors import Conflict
from aegis_storage.incidents import IncidentStore
from aegis_storage.silences import SilenceStore

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FIRE = fire_reason()


def risk_body(factory: str, at: datetime, reasons: list[dict[str, Any]]) -> dict[str, Any]:
    level = (
        "CRITICAL"
        if any(r["severity"] == "CRITICAL" for r in reasons)
        else ("WARNING" if reasons else "NORMAL")
    )
    return {
        "pk": keys.factory_pk(factory),
        "sk": "LATEST",
        "factory_id": factory,
        "updated_at": format_ts(at),
        "risk": {"score": 90 if reasons else 0, "level": level, "reasons": reasons},
    }


async def put_state(
    f: Foundation, factory: str, at: datetime, reasons: list[dict[str, Any]]
) -> ObjectCreated:
    key = keys.state_snapshot_key(factory, at)
    put = await f.store.put_json(key, risk_body(factory, at, reasons))
    return ObjectCreated(
        bucket=f.bucket, key=key, size_bytes=put.size_bytes, producer="test", created_at=at
    )


async def put_cloud(
    f: Foundation, tier: str, at: datetime, checks: list[CloudCheck]
) -> ObjectCreated:
    key = keys.cloud_infra_key(tier, at)
    put = await f.store.put_json(key, CloudSnapshot.of(tier, at, checks))  # type: ignore[arg-type]
    return ObjectCreated(
        bucket=f.bucket, key=key, size_bytes=put.size_bytes, producer="test", created_at=at
    )


@dataclass
class Recorded:
    dead: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)
    announced: list[dict[str, Any]] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)

    async def dead_letter(self, record: dict[str, Any], detail: str, message_id: str) -> None:
        self.dead.append((record, detail, message_id))

    async def announce(self, detail: dict[str, Any], msg_id: str) -> None:
        self.announced.append(detail)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def make(
    f: Foundation,
    webhook: FakeWebhook,
    session: aiohttp.ClientSession,
    rec: Recorded,
    **sender: Any,
) -> Dispatcher:
    return Dispatcher(
        store=f.store,
        readmodel=f.readmodel,
        sender=SlackWebhook(
            webhook.url, session, **({"first_delay": 0.01, "max_attempts": 4} | sender)
        ),
        dead_letter=rec.dead_letter,
        announce=rec.announce,
        policy=Policy(),
        ttl=TtlSettings(),
        dashboard_url="http://dash.example",
        clock=FakeClock(T0),
        on_result=rec.results.append,
    )


def headlines(webhook: FakeWebhook) -> list[str]:
    return [str(body["text"]).split(" AEGIS ", 1)[1].split(" at ")[0] for body in webhook.delivered]


async def test_fire_sends_once_then_cooldown_then_again_then_one_resolved(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED"]
    # 20 more critical snapshots inside the 5-minute cooldown
    for i in range(1, 21):
        await d.handle(
            await put_state(foundation, "factory-a", T0 + timedelta(seconds=10 * i), [FIRE])
        )
    assert len(webhook.delivered) == 1
    assert sum(r.outcome == "suppressed_cooldown" for r in rec.results) == 20
    # after the cooldown it sends again
    await d.handle(await put_state(foundation, "factory-a", T0 + timedelta(minutes=5), [FIRE]))
    assert len(webhook.delivered) == 2
    # recovery: one RESOLVED, and nothing for the normal snapshots after it
    for i in range(3):
        await d.handle(
            await put_state(foundation, "factory-a", T0 + timedelta(minutes=6, seconds=i), [])
        )
    assert headlines(webhook)[2:] == ["RESOLVED · factory-a · FIRE_DETECTED"]
    body = webhook.delivered[0]
    assert "measured 0.93, threshold 0.8" in json.dumps(body)
    assert body["blocks"][3]["elements"][-1]["url"] == "http://dash.example/factories/factory-a"
    assert [a["action"] for a in rec.announced] == ["fire", "fire", "resolve"]
    item = await foundation.readmodel.get_item(
        keys.alert_pk("factory-a"), keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE")
    )
    assert item is not None and item["firing"] is False and item["sent_count"] == 2
    assert (
        item["ttl"] == int((T0 + timedelta(minutes=6)).timestamp()) + 604_800
    )  # 7 days from the last change


async def test_cloud_warning_three_observations_and_critical_at_once(
    foundation, webhook, session
) -> None:
    d = make(foundation, webhook, session, Recorded())
    lag = CloudCheck(
        name="jetstream_consumer:AEGIS_RAW/processor",
        status=Level.WARNING,
        reason="CONSUMER_LAG",
        value=2500,
        threshold=1000,
    )
    for i in range(2):
        await d.handle(await put_cloud(foundation, "fast", T0 + timedelta(minutes=i), [lag]))
    assert webhook.delivered == []
    # a slow run in between does not reset the fast stream's count
    await d.handle(
        await put_cloud(
            foundation,
            "slow",
            T0 + timedelta(minutes=2),
            [CloudCheck.ok("foundation:bucket_versioning")],
        )
    )
    await d.handle(await put_cloud(foundation, "fast", T0 + timedelta(minutes=3), [lag]))
    assert headlines(webhook) == ["WARNING · cloud infrastructure · CONSUMER_LAG"]
    down = CloudCheck(
        name="service:processor", status=Level.CRITICAL, reason="SERVICE_DOWN", value=95
    )
    await d.handle(await put_cloud(foundation, "fast", T0 + timedelta(minutes=4), [lag, down]))
    assert headlines(webhook)[1:] == ["CRITICAL · cloud infrastructure · SERVICE_DOWN"]


async def test_a_cloud_warning_not_seen_in_a_run_starts_counting_again(
    foundation, webhook, session
) -> None:
    d = make(foundation, webhook, session, Recorded())
    lag = CloudCheck(
        name="jetstream_consumer:AEGIS_RAW/processor",
        status=Level.WARNING,
        reason="CONSUMER_LAG",
        value=2500,
    )
    runs = [[lag], [lag], [], [lag], [lag]]
    for i, checks in enumerate(runs):
        await d.handle(await put_cloud(foundation, "fast", T0 + timedelta(minutes=i), checks))
    assert webhook.delivered == []


async def test_500_then_200_delivers_once_and_429_retry_after_is_honoured(
    foundation, webhook, session
) -> None:
    d = make(foundation, webhook, session, Recorded())
    webhook.script(500, 200)
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    assert [r.status for r in webhook.requests] == [500, 200] and len(webhook.delivered) == 1

    webhook.script((429, {"Retry-After": "1"}), 200)
    gas = {
        "code": "CO_HIGH",
        "severity": "WARNING",
        "detail": "co 60 ppm",
        "value": 60,
        "threshold": 50,
    }
    await d.handle(await put_state(foundation, "factory-b", T0, [gas]))
    limited, accepted = webhook.requests[-2:]
    assert (limited.status, accepted.status) == (429, 200)
    assert accepted.at - limited.at >= 1.0  # waited what Retry-After asked, not the 10 ms backoff


async def test_a_webhook_down_for_good_dead_letters_and_a_later_snapshot_retries(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec, max_attempts=3)
    webhook.down()
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    assert len(webhook.requests) == 3 and webhook.delivered == []
    ((record, detail, _),) = rec.dead
    assert record["reason"] == "FIRE_DETECTED" and record["slack_payload"]["blocks"]
    assert "503" in detail and rec.results[-1].outcome == "undeliverable"
    # the claim was released: the next snapshot (inside what would be the cooldown) sends
    webhook.up()
    await d.handle(await put_state(foundation, "factory-a", T0 + timedelta(seconds=5), [FIRE]))
    assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED"]
    # a permanent refusal (404: the webhook was deleted) is not retried
    webhook.script(404)
    gas = {"code": "CO_HIGH", "severity": "WARNING", "detail": "co", "value": 60}
    before = len(webhook.requests)
    await d.handle(await put_state(foundation, "factory-c", T0, [gas]))
    assert len(webhook.requests) == before + 1 and len(rec.dead) == 2


async def test_out_of_order_and_replayed_snapshots_send_nothing_extra(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    old_fire = await put_state(foundation, "factory-a", T0, [FIRE])
    calm = await put_state(foundation, "factory-a", T0 + timedelta(seconds=30), [])
    await d.handle(calm)
    await d.handle(old_fire)  # arrives late: older than the newest handled
    assert webhook.delivered == [] and rec.results[-1].outcome == "stale"
    fire = await put_state(foundation, "factory-a", T0 + timedelta(seconds=60), [FIRE])
    await d.handle(fire)
    for event in (fire, calm, old_fire, fire):  # the queue replays everything
        await d.handle(event)
    assert len(webhook.delivered) == 1


def carried(
    f: Foundation,
    factory: str,
    at: datetime,
    reasons: list[dict[str, Any]],
    before: list[dict[str, Any]] | None,
) -> ObjectCreated:
    """The ObjectCreated the processor publishes for a state snapshot, risk carried; the object
    itself is never written, so a dispatcher that read it would find nothing."""
    basis = AlertBasis(
        at=at,
        reasons=[Reason.model_validate(r) for r in reasons],
        previous_reasons=None if before is None else [Reason.model_validate(r) for r in before],
    )
    key = keys.state_snapshot_key(factory, at)
    return ObjectCreated(
        bucket=f.bucket, key=key, size_bytes=1, producer="processor", created_at=at, alert=basis
    )


async def test_a_routine_snapshot_costs_no_request_and_a_carried_change_reads_no_object(
    foundation, webhook, session, aws_endpoint
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    counted = await arequest_counts(aws_endpoint)
    for n in range(20):
        [result] = await d.handle(
            carried(foundation, "factory-r", T0 + timedelta(seconds=n), [], [])
        )
        assert result.outcome == "routine"
    spent = await arequest_counts(aws_endpoint) - counted
    assert spent.total("s3") == 0 and spent.total("dynamodb") == 0
    # a fire, its resolve and a calm state whose predecessor is unknown are decided from the
    # event alone (their objects do not exist)
    await d.handle(carried(foundation, "factory-r", T0 + timedelta(seconds=30), [FIRE], []))
    await d.handle(carried(foundation, "factory-r", T0 + timedelta(seconds=40), [], [FIRE]))
    counted = await arequest_counts(aws_endpoint)
    unknown = await d.handle(carried(foundation, "factory-r", T0 + timedelta(seconds=50), [], None))
    spent = await arequest_counts(aws_endpoint) - counted
    assert unknown == [] and spent.total("dynamodb") > 0 and spent.total("s3") == 0
    assert headlines(webhook) == [
        "CRITICAL · factory-r · FIRE_DETECTED",
        "RESOLVED · factory-r · FIRE_DETECTED",
    ]
    assert await foundation.store.list_keys(keys.processed_prefix("factory-r")) == []


async def test_a_resolve_nobody_could_receive_stays_resolved_and_is_dead_lettered(
    foundation, webhook, session
) -> None:
    """The snapshots after a resolve are routine and read by nobody: a resolve that Slack
    refused is not left to them (its message waits in the dead letters)."""
    rec = Recorded()
    d = make(foundation, webhook, session, rec, max_attempts=2)
    await d.handle(await put_state(foundation, "factory-q", T0, [FIRE]))
    webhook.down()
    await d.handle(await put_state(foundation, "factory-q", T0 + timedelta(seconds=10), []))
    ((record, _, _),) = rec.dead
    assert record["action"] == "resolve"
    webhook.up()
    [calm] = await d.handle(carried(foundation, "factory-q", T0 + timedelta(seconds=20), [], []))
    assert calm.outcome == "routine"
    await d.handle(await put_state(foundation, "factory-q", T0 + timedelta(seconds=30), [FIRE]))
    # the fire after it is a new fire, not a reason still firing
    assert headlines(webhook) == [
        "CRITICAL · factory-q · FIRE_DETECTED",
        "CRITICAL · factory-q · FIRE_DETECTED",
    ]


async def test_objects_under_other_prefixes_are_ignored(foundation, webhook, session) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    key = keys.processed_key("factory-a", "risk_score", T0, "m-00000001")
    await foundation.store.put_json(key, risk_body("factory-a", T0, [FIRE]))
    results = await d.handle(
        ObjectCreated(bucket=foundation.bucket, key=key, size_bytes=1, producer="t", created_at=T0)
    )
    assert [r.outcome for r in results] == ["ignored"] and webhook.requests == []


async def test_two_dispatchers_racing_on_the_same_snapshots_send_once(
    foundation, webhook, session
) -> None:
    one, two = (make(foundation, webhook, session, Recorded()) for _ in range(2))
    events = [await put_state(foundation, f"factory-{c}", T0, [FIRE]) for c in "abc"]
    await asyncio.gather(*(d.handle(e) for e in events for d in (one, two)))
    assert sorted(headlines(webhook)) == [f"CRITICAL · factory-{c} · FIRE_DETECTED" for c in "abc"]


# -- the service on a real queue ------------------------------------------------------------


def settings_for(
    foundation: Foundation, aws_endpoint: str, nats_url: str, webhook: FakeWebhook, uid: str
) -> DispatcherSettings:
    return DispatcherSettings(
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        nats_url=nats_url,
        slack_webhook_url=webhook.url,
        alert_durable=f"alerts-{uid}",
        slack_first_delay_s=0.01,
        slack_max_attempts=2,
        alert_fetch_timeout_s=0.5,
    )


@contextlib.asynccontextmanager
async def replicas(s: DispatcherSettings) -> AsyncIterator[tuple[list[DispatcherApp], NatsBroker]]:
    """Two dispatcher replicas on one durable, and a client broker to publish with."""
    apps = [DispatcherApp(s), DispatcherApp(s)]
    client = create_broker(s, name="alerts-test-client")
    try:
        for app in apps:
            await app.start()
        await ensure_streams(client)
        yield apps, client
    finally:
        for app in apps:
            await app.stop()
        await client.stop()


async def test_two_replicas_on_one_durable_send_each_alert_once_and_resend_recovers_reporting_held_letters(
    foundation: Foundation,
    aws_endpoint: str,
    private_nats,
    webhook: FakeWebhook,
    unique_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = settings_for(foundation, aws_endpoint, private_nats.url, webhook, unique_id)
    # no escalation sweep while the test runs: the fires are at T0, long before the wall clock,
    # so a sweep would escalate factory-z's incident, and the resend would find its alert
    # notified since (superseded) instead of still undeliverable
    s = s.model_copy(update={"escalation_tick_s": 300.0})
    async with replicas(s) as (_, client):
        events = [await put_state(foundation, f"factory-{i}", T0, [FIRE]) for i in range(6)]
        for e in events:
            for _ in range(2):  # every event twice, as a redelivering queue may
                await publish(client, object_created_subject("state_snapshot"), e, msg_id=None)
        await eventually(lambda: len(webhook.delivered) >= 6, within=20, what="six alerts")
        await asyncio.sleep(0.5)  # and no seventh
        assert sorted(headlines(webhook)) == sorted(
            f"CRITICAL · factory-{i} · FIRE_DETECTED" for i in range(6)
        )

        # the webhook goes down for good: the alert is dead-lettered
        webhook.down()
        late = await put_state(foundation, "factory-z", T0, [FIRE])
        await publish(client, object_created_subject("state_snapshot"), late, msg_id=None)
        await eventually(
            lambda: sum(1 for r in webhook.requests if r.status == 503) >= 2,
            within=20,
            what="retries",
        )

    for name, value in {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": foundation.bucket,
        "AEGIS_TABLE": foundation.table,
        "AEGIS_NATS_URL": private_nats.url,
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url,
    }.items():
        monkeypatch.setenv(name, value)
    listed = await invoke_in_thread("alerts", "resend", "--dry-run")
    assert listed.exit_code == 0, listed.output
    assert "pending" in listed.output and "factory-z" in listed.output
    still_down = await invoke_in_thread("alerts", "resend", "--attempts", "1")
    assert still_down.exit_code == 1 and "failed=1" in still_down.output
    webhook.up()
    # another run holds the letter (read, not settled): this run sees it waiting, cannot read
    # it within --wait, and says so instead of "nothing to resend"
    holder = await nats.connect(private_nats.url)
    try:
        held = await holder.jetstream().pull_subscribe_bind(
            durable="alerts-resend", stream="AEGIS_DLQ"
        )
        [letter] = await held.fetch(1, timeout=10)
        assert b"factory-z" in letter.data
        sent_before = len(webhook.delivered)
        blocked = await invoke_in_thread("alerts", "resend", "--wait", "1")
        assert blocked.exit_code == 1, blocked.output
        assert "delivered=0" in blocked.output and "unread=1" in blocked.output
        assert len(webhook.delivered) == sent_before
        await letter.nak()
    finally:
        await holder.close()
    resent = await invoke_in_thread("alerts", "resend")
    assert resent.exit_code == 0, resent.output
    assert "delivered=1" in resent.output
    assert headlines(webhook)[-1] == "CRITICAL · factory-z · FIRE_DETECTED"
    again = await invoke_in_thread("alerts", "resend")
    assert "delivered=0" in again.output  # resent once, not twice


async def test_a_newer_snapshot_racing_an_older_one_is_never_taken_for_stale(
    foundation, webhook, session
) -> None:
    """Snapshots of one factory handled at once (one fetched batch): the older may move the
    cursor first; the newer must still be handled, so the recovery is not lost."""
    d = make(foundation, webhook, session, Recorded())
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    fires = [
        await put_state(foundation, "factory-a", T0 + timedelta(seconds=i), [FIRE])
        for i in range(1, 6)
    ]
    calm = await put_state(foundation, "factory-a", T0 + timedelta(seconds=10), [])
    await asyncio.gather(*(d.handle(e) for e in fires), d.handle(calm))
    assert headlines(webhook) == [
        "CRITICAL · factory-a · FIRE_DETECTED",
        "RESOLVED · factory-a · FIRE_DETECTED",
    ]


async def test_a_mistyped_webhook_url_never_reaches_the_logs_or_the_dead_letter(
    foundation, webhook, session
) -> None:
    """aiohttp names the whole URL when it cannot parse it; the path of a Slack webhook is its
    secret. The dispatcher's log lines (captured as a deployment renders them) and the dead
    letter show the host, never the path."""
    secret = "T0AEGIS/B0AEGIS/Xq9SecretPart"
    rec = Recorded()
    d = make(foundation, webhook, session, rec, max_attempts=1)
    assert isinstance(d.sender, SlackWebhook)
    d.sender.url = f"https://hooks.slack.com:99999/services/{secret}"  # a port typo
    out = io.StringIO()
    configure("json", stream=out)
    try:
        await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    finally:
        configure("json")
    ((_, detail, _),) = rec.dead
    assert "hooks.slack.com:99999/services/" in detail and secret not in detail
    logged = out.getvalue()
    assert "undeliverable" in logged and "hooks.slack.com:99999/services/" in logged
    assert secret not in logged and "Xq9SecretPart" not in logged


# -- one message per decision; a decided message is never lost --------------------------------

TEMPERATURE = {
    "code": "TEMPERATURE_HIGH",
    "severity": "CRITICAL",
    "detail": "temperature 71 °C <hot>",
    "value": 71,
    "threshold": 60,
}
GAS = {"code": "CO_HIGH", "severity": "WARNING", "detail": "co 60 ppm", "value": 60}


async def intent_items(f: Foundation, scope: str) -> list[dict[str, Any]]:
    items = await f.readmodel.partition(keys.alert_pk(scope), now=T0)
    return [i for i in items if str(i["sk"]).startswith(keys.INTENT_PREFIX)]


async def test_one_snapshot_with_three_reasons_is_one_message_and_a_later_reason_its_own(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE, TEMPERATURE, GAS]))
    for i in range(1, 9):
        await d.handle(
            await put_state(
                foundation, "factory-a", T0 + timedelta(seconds=10 * i), [FIRE, TEMPERATURE, GAS]
            )
        )
    assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED, TEMPERATURE_HIGH, CO_HIGH"]
    body = json.dumps(webhook.delivered[0], ensure_ascii=False)
    assert "temperature 71 °C &lt;hot&gt;" in body and "<hot>" not in body  # escaped as before
    assert "measured 0.93, threshold 0.8" in body and "co 60 ppm" in body
    # per-reason state as before: each alert sent once, then in its cooldown
    for severity, code in (("CRITICAL", "FIRE_DETECTED"), ("WARNING", "CO_HIGH")):
        item = await foundation.readmodel.get_item(
            keys.alert_pk("factory-a"), keys.alert_sk(severity, code, "STATE")
        )
        assert item is not None and item["sent_count"] == 1 and item["pending"] is None
    assert sum(r.outcome == "suppressed_cooldown" for r in rec.results) == 8 * 3
    # a reason that starts later, in the others' cooldown, gets a message of its own
    smoke = {"code": "SMOKE_DETECTED", "severity": "CRITICAL", "detail": "smoke on cam-2"}
    await d.handle(
        await put_state(
            foundation, "factory-a", T0 + timedelta(seconds=100), [FIRE, TEMPERATURE, GAS, smoke]
        )
    )
    assert headlines(webhook)[1:] == ["CRITICAL · factory-a · SMOKE_DETECTED"]
    assert [i["state"] for i in await intent_items(foundation, "factory-a")] == ["sent", "sent"]


class DynamoFaults(DynamoItems):
    """The read model's DynamoDB calls with errors injected (a call fails as one that failed on
    its last attempt does, with a 500): after the claim transaction of ``table`` goes out, the
    next ``count`` calls of that table fail. ``seen`` records what the Slack stand-in had at
    each fault."""

    def __init__(
        self, items: DynamoItems, table: str, webhook: FakeWebhook, count: int, *, on_claim: bool
    ) -> None:
        super().__init__(items.client)
        self.table, self.webhook, self.count, self.on_claim = table, webhook, count, on_claim
        self.armed = 0
        self.seen: list[int] = []

    async def call(self, action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        body = json.dumps(payload).encode()
        if self.table.encode() in body:
            claim = action == "TransactWriteItems" and b'"sending"' in body and b"INTENT#" in body
            if claim and self.on_claim and self.count > len(self.seen):
                self._fail()
            if self.armed:
                self.armed -= 1
                self._fail()
            if claim and not self.on_claim and not self.seen:
                self.armed = self.count
        return await super().call(action, payload)

    def _fail(self) -> None:
        self.seen.append(len(self.webhook.delivered))
        raise InternalDynamoError("injected by the test")


@pytest.mark.parametrize("on_claim", [False, True], ids=["after-the-claim", "in-the-claim"])
async def test_a_dynamodb_error_after_or_in_the_claim_still_sends_exactly_one_message(
    foundation, webhook, session, on_claim: bool
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    items = foundation.readmodel._ddb
    faults = DynamoFaults(items, foundation.table, webhook, count=3, on_claim=on_claim)
    foundation.readmodel._ddb = faults
    try:
        event = await put_state(foundation, "factory-a", T0, [FIRE, TEMPERATURE])
        errors = []
        for _ in range(4):  # the handler, then the queue's redeliveries while it fails
            try:
                await d.handle(event)
                break
            except Exception as err:
                errors.append(err)
    finally:
        foundation.readmodel._ddb = items
    # a failed claim wrote nothing and is redelivered; a failed confirmation is retried in place
    assert len(errors) == (3 if on_claim else 0), errors
    assert len(faults.seen) == 3  # the faults hit ...
    # ... after Slack had the message (the confirmation) or before anything was sent (the claim)
    assert faults.seen == ([1, 1, 1] if not on_claim else [0, 0, 0])
    assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED, TEMPERATURE_HIGH"]
    assert [i["state"] for i in await intent_items(foundation, "factory-a")] == ["sent"]
    # cooldown counts the confirmed send: the next snapshot sends nothing
    await d.handle(
        await put_state(foundation, "factory-a", T0 + timedelta(seconds=5), [FIRE, TEMPERATURE])
    )
    assert len(webhook.requests) == 1
    assert [r.outcome for r in rec.results[-2:]] == ["suppressed_cooldown"] * 2


def sample(app: DispatcherApp, name: str, **labels: str) -> float:
    return app.metrics.total(name, **labels)


async def test_a_post_slack_holds_keeps_no_other_scope_waiting_and_a_stop_waits_for_it(
    foundation: Foundation,
    aws_endpoint: str,
    private_nats,
    webhook: FakeWebhook,
    unique_id: str,
) -> None:
    """One replica. Slack holds every post: the fire of factory-a is being posted, and the
    fire of factory-b, published after it, reaches Slack too (its event did not wait behind
    the held post). The replica is then stopped while both are held, with a graceful timeout
    shorter than Slack's answer: it waits for the posts and their confirmations; nothing is
    redelivered or sent twice."""
    s = settings_for(foundation, aws_endpoint, private_nats.url, webhook, unique_id).model_copy(
        update={"graceful_timeout_s": 0.2}
    )
    app = DispatcherApp(s)
    client = create_broker(s, name="alerts-test-client")
    try:
        await app.start()
        await ensure_streams(client)
        webhook.hold()
        # the replica runs on the real clock, whose leases pass as time does: a state of now
        for factory in ("factory-a", "factory-b"):
            event = await put_state(foundation, factory, utc_now(), [FIRE])
            await publish(client, object_created_subject("state_snapshot"), event, msg_id=None)
            await eventually(
                lambda f=factory: any(f in str(r.body) for r in webhook.waiting),
                within=10,
                what=f"the post of {factory} at Slack",
            )
        assert len(webhook.waiting) == 2  # both at once: the second did not queue behind
        stopping = asyncio.ensure_future(app.stop())
        await asyncio.sleep(0.5)  # well past the graceful timeout: the posts are still held
        assert not stopping.done()
        for factory in ("factory-a", "factory-b"):
            (intent,) = await intent_items(foundation, factory)
            assert intent["state"] == "sending"
        webhook.release()
        await stopping
        assert sorted(headlines(webhook)) == [
            "CRITICAL · factory-a · FIRE_DETECTED",
            "CRITICAL · factory-b · FIRE_DETECTED",
        ]
        for factory in ("factory-a", "factory-b"):
            (intent,) = await intent_items(foundation, factory)
            assert intent["state"] == "sent"
        assert sample(app, "alert_decisions_total", outcome="sent", action="fire") == 2
        # a replica on the same durable finds nothing left to deliver: the events were settled
        again = DispatcherApp(s)
        await again.start()
        await asyncio.sleep(1.5)  # three fetches of the durable
        await again.stop()
        assert len(webhook.requests) == 2
    finally:
        webhook.release()
        await client.stop()


# how the survivor learns of the death: the message's lease runs out (a short lease), or, with
# the defaults (lease 120 s), the killed replica's heartbeat runs out and the survivor's sweep
# takes its message over long before the lease would. (The event itself was settled once the
# message was recorded: it is not redelivered.)
TAKEOVERS = {
    "lease": {"AEGIS_ALERT_ACK_WAIT_S": "3", "AEGIS_ALERT_SEND_LEASE_S": "2.5"},
    "heartbeat": {"AEGIS_ESCALATION_TICK_S": "1"},
}


@pytest.mark.parametrize("takeover", sorted(TAKEOVERS))
async def test_a_replica_killed_while_slack_is_slow_is_completed_by_the_other_exactly_once(
    foundation: Foundation,
    aws_endpoint: str,
    private_nats,
    webhook: FakeWebhook,
    unique_id: str,
    tmp_path: Path,
    takeover: str,
) -> None:
    """Two real dispatcher processes. The one posting is SIGKILLed while Slack holds its post and
    the intent item says ``sending``; the other's sweep completes the intent (its lease ran
    out, or the sender's heartbeat did): one message. The killed post
    never got an answer; the stand-in counts it as abandoned (a real Slack might still show it:
    then as a second copy with the same alert id, which is the at-least-once window the module
    docstring names, and which this asserts)."""
    env = process_env(
        foundation, aws_endpoint, private_nats.url, webhook, unique_id, **TAKEOVERS[takeover]
    )
    script = Path(sys.executable).parent / "aegis-alert-dispatcher"
    ports = [free_port(), free_port()]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        logs = [tmp_path / f"d{i}.log" for i in range(len(ports))]
        for port, log in zip(ports, logs, strict=True):
            proc = spawn(script, env | {"AEGIS_HEALTH_PORT": str(port)}, log)
            procs[proc.pid] = proc
        for proc, port, log in zip(procs.values(), ports, logs, strict=True):
            await process_ready(proc, port, log, within=30, what=f"replica {log.stem}")
        client = create_broker(
            settings_for(foundation, aws_endpoint, private_nats.url, webhook, unique_id),
            name="alerts-test-client",
        )
        try:
            await ensure_streams(client)
            webhook.hold()
            # real processes on the real clock: a state of now
            event = await put_state(foundation, "factory-a", utc_now(), [FIRE, TEMPERATURE])
            await publish(client, object_created_subject("state_snapshot"), event, msg_id=None)
            await eventually(lambda: len(webhook.waiting) == 1, within=15, what="the held post")
        finally:
            await client.stop()
        (intent,) = await intent_items(foundation, "factory-a")
        assert intent["state"] == "sending"
        victim = int(intent["owner"].split("|")[0].rsplit(":", 1)[1])
        assert victim in procs
        procs[victim].send_signal(signal.SIGKILL)
        await asyncio.to_thread(procs.pop(victim).wait, 10)
        (held,) = webhook.waiting
        await eventually(
            lambda: not held.connected, within=5, what="the killed post's socket closed"
        )
        webhook.release()

        async def sent() -> bool:
            found = await intent_items(foundation, "factory-a")
            return [i["state"] for i in found] == ["sent"]

        await eventually(sent, within=30, what="the intent completed by the survivor")
        lease_until = intent["lease_until"]
        (intent,) = await intent_items(foundation, "factory-a")
        if takeover == "heartbeat":  # taken over because the sender died, not for its lease
            assert intent["settled_at"] < lease_until
        (survivor,) = procs
        assert intent["owner"].split("|")[0].endswith(f":{survivor}")
        assert [r.status for r in webhook.requests] == [ABANDONED, 200]
        assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED, TEMPERATURE_HIGH"]
        # the completion posted the recorded message: the same alert id as the killed post
        killed, completed = (json.dumps(r.body) for r in webhook.requests)
        assert killed == completed and intent["attempt_id"] in completed
        item = await foundation.readmodel.get_item(
            keys.alert_pk("factory-a"), keys.alert_sk("CRITICAL", "FIRE_DETECTED", "STATE")
        )
        assert item is not None and item["sent_count"] == 1 and item["pending"] is None
    finally:
        webhook.release()
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            await asyncio.to_thread(proc.wait, 30)


def process_env(
    f: Foundation,
    aws_endpoint: str,
    nats_url: str,
    webhook: FakeWebhook,
    unique_id: str,
    **more: str,
) -> dict[str, str]:
    """The environment of a real dispatcher process of a test (no AEGIS_* of the caller's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AEGIS_")} | {
        "AEGIS_AWS_ENDPOINT_URL": aws_endpoint,
        "AEGIS_BUCKET": f.bucket,
        "AEGIS_TABLE": f.table,
        "AEGIS_NATS_URL": nats_url,
        "AEGIS_SLACK_WEBHOOK_URL": webhook.url,
        "AEGIS_ALERT_DURABLE": f"alerts-{unique_id}",
        "AEGIS_ALERT_FETCH_TIMEOUT_S": "0.5",
        "AEGIS_LOG_FORMAT": "json",
        **more,
    }


def spawn(script: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([str(script)], env=env, stdout=out, stderr=subprocess.STDOUT)


async def test_an_undecodable_slack_answer_is_still_a_delivery(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    webhook.script((200, {"Content-Type": "text/plain; charset=utf-8"}, b"\xff\xfe ok?"))
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    assert [r.outcome for r in rec.results] == ["sent"] and len(webhook.requests) == 1
    assert [i["state"] for i in await intent_items(foundation, "factory-a")] == ["sent"]


async def test_a_recovery_right_behind_a_fire_still_sending_waits_for_it(
    foundation, webhook, session
) -> None:
    """The calm snapshot would resolve an alert whose FIRE message Slack has not answered yet:
    it is retried (the queue's redelivery) until that message is confirmed, then resolves it."""
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    webhook.hold()
    firing = asyncio.ensure_future(d.handle(await put_state(foundation, "factory-a", T0, [FIRE])))
    try:
        await eventually(lambda: len(webhook.waiting) == 1, within=5, what="the held fire")
        calm = await put_state(foundation, "factory-a", T0 + timedelta(seconds=10), [])
        with pytest.raises(AlertBusy) as busy:
            await d.handle(calm)
        # its last delivery waits for the fire's send lease to be over (the queue's retries
        # would otherwise run out while a slow Slack holds the fire)
        lease = d.lease.total_seconds()
        assert lease - 5 < busy.value.retry_after_s <= lease + 1
    finally:
        webhook.release()
        await firing
    await d.handle(calm)  # the redelivery
    assert headlines(webhook) == [
        "CRITICAL · factory-a · FIRE_DETECTED",
        "RESOLVED · factory-a · FIRE_DETECTED",
    ]


async def test_an_intent_left_by_a_dead_replica_is_completed_by_another_after_its_lease(
    foundation, webhook, session
) -> None:
    """Replica A records the message and dies mid-post (its tasks are cancelled outright, no
    confirmation). Replica B handles the scope's next snapshot: inside A's lease it leaves the
    intent alone; after it, B posts the recorded message once and confirms it."""
    dead = make(foundation, webhook, session, Recorded())
    stuck = Unanswered()
    dead.sender = stuck
    handler = asyncio.ensure_future(
        dead.handle(await put_state(foundation, "factory-a", T0, [FIRE, TEMPERATURE]))
    )
    await asyncio.wait_for(stuck.posted.wait(), 10)
    for task in (*dead._settling, handler):  # the process is gone: nothing finishes
        task.cancel()
    await asyncio.gather(*dead._settling, handler, return_exceptions=True)
    (left,) = await intent_items(foundation, "factory-a")
    assert left["state"] == "sending"

    rec = Recorded()
    other = make(foundation, webhook, session, rec)
    clock = other.clock
    assert isinstance(clock, FakeClock)
    clock.advance(timedelta(seconds=60))  # inside the 120 s lease: A may still be posting
    await other.handle(
        await put_state(foundation, "factory-a", T0 + timedelta(seconds=60), [FIRE, TEMPERATURE])
    )
    assert webhook.requests == [] and [r.outcome for r in rec.results] == ["in_flight"] * 2
    clock.advance(timedelta(seconds=61))  # the lease is over
    await other.handle(
        await put_state(foundation, "factory-a", T0 + timedelta(seconds=121), [FIRE, TEMPERATURE])
    )
    assert headlines(webhook) == ["CRITICAL · factory-a · FIRE_DETECTED, TEMPERATURE_HIGH"]
    assert json.dumps(webhook.delivered[0]) == json.dumps(json.loads(left["payload"]))
    outcomes = [r.outcome for r in rec.results[2:]]
    assert outcomes == ["completed_sent"] * 2 + ["suppressed_cooldown"] * 2
    (done,) = await intent_items(foundation, "factory-a")
    assert done["state"] == "sent" and done["version"] == left["version"] + 2


# -- incidents ----------------------------------------------------------------------------------


def ack_buttons(body: dict[str, Any]) -> list[str]:
    actions = next(b for b in body["blocks"] if b["type"] == "actions")
    return [
        e["value"] for e in actions["elements"] if e.get("action_id", "").startswith("aegis_ack")
    ]


async def test_a_fire_opens_one_incident_its_messages_name_and_its_resolve_archives_once(
    foundation, webhook, session
) -> None:
    d = make(foundation, webhook, session, Recorded())
    store = IncidentStore(foundation.readmodel, foundation.store)
    await d.handle(await put_state(foundation, "factory-a", T0, [FIRE]))
    (opened,) = await store.open(now=T0)
    assert (opened.scope, opened.reason, opened.severity, opened.state) == (
        "factory-a",
        "FIRE_DETECTED",
        "CRITICAL",
        "triggered",
    )
    assert ack_buttons(webhook.delivered[0]) == [opened.incident_id]
    # the reminder after the cooldown speaks for the same incident
    await d.handle(await put_state(foundation, "factory-a", T0 + timedelta(minutes=5), [FIRE]))
    assert ack_buttons(webhook.delivered[1]) == [opened.incident_id]
    await d.handle(await put_state(foundation, "factory-a", T0 + timedelta(minutes=6), []))
    assert ack_buttons(webhook.delivered[2]) == []  # a RESOLVED message has nothing to acknowledge
    closed = await store.get(opened.incident_id)
    assert closed is not None and closed.state == "resolved" and closed.resolved_by == "aegis"
    assert closed.archived_key == keys.incident_record_key("factory-a", T0, opened.incident_id)
    assert await store.open(now=T0 + timedelta(minutes=6)) == []
    record = await foundation.store.get_json(closed.archived_key)
    assert [(e["kind"], e.get("outcome")) for e in record["timeline"]] == [
        ("triggered", None),
        ("notified", "sent"),
        ("notified", "sent"),
        ("resolved", None),
        ("notified", "sent"),
    ]
    assert record["time_to_resolve_s"] == 360.0 and record["time_to_acknowledge_s"] is None
    with pytest.raises(Conflict):  # the record is written once
        await foundation.store.put_immutable(closed.archived_key, b"{}")


async def test_an_acknowledged_incident_gets_no_reminder_but_a_worse_severity_speaks(
    foundation, webhook, session
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    store = IncidentStore(foundation.readmodel, foundation.store)
    smoke = FIRE | {"severity": "WARNING", "code": "SMOKE"}
    await d.handle(await put_state(foundation, "factory-b", T0, [smoke]))
    (opened,) = await store.open(now=T0)
    ack = functools.partial(
        incidents.acknowledge, by="kim", via="cli", at=T0 + timedelta(minutes=1)
    )
    acked, changed = await store.change(opened.incident_id, ack)
    assert changed and acked.acknowledged_by == "kim"
    # after the WARNING cooldown: no reminder, twice
    for minutes in (16, 32):
        at = T0 + timedelta(minutes=minutes)
        await d.handle(await put_state(foundation, "factory-b", at, [smoke]))
    assert len(webhook.delivered) == 1
    assert [r.outcome for r in rec.results[-2:]] == ["suppressed_acknowledged"] * 2
    # the same reason turns CRITICAL: that is news, for the same incident
    worse = smoke | {"severity": "CRITICAL"}
    await d.handle(await put_state(foundation, "factory-b", T0 + timedelta(minutes=33), [worse]))
    assert headlines(webhook)[1] == "CRITICAL (escalated from WARNING) · factory-b · SMOKE"
    now = await store.get(opened.incident_id)
    assert now is not None and (now.severity, now.state) == ("CRITICAL", "acknowledged")
    assert ack_buttons(webhook.delivered[1]) == [opened.incident_id]


async def test_aegis_incidents_lists_shows_acknowledges_and_resolves_as_the_cli_user(
    foundation_env, webhook, session, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    foundation = foundation_env  # the aegis command reaches its bucket and table
    d = make(foundation, webhook, session, Recorded())
    await d.handle(await put_state(foundation, "factory-c", T0, [FIRE]))
    monkeypatch.setenv("AEGIS_NATS_URL", nats_url)
    heard: list[ChangeEvent] = []
    streams = create_broker(DispatcherSettings(nats_url=nats_url), name="streams")
    await streams.connect()
    await ensure_streams(streams)
    await streams.stop()
    listener = await nats.connect(nats_url)

    async def on_change(msg: Any) -> None:
        heard.append(ChangeEvent.model_validate_json(msg.data))

    await listener.subscribe(change_subject("incident"), cb=on_change)

    async def aegis(*args: str) -> Any:
        return await invoke_in_thread("incidents", *args)

    listed = await aegis("list", "--json", "--factory", "factory-c")
    assert listed.exit_code == 0, listed.output
    (incident,) = json.loads(listed.output)["incidents"]
    iid = incident["incident_id"]
    assert (await aegis("ack", iid, "--as", "kim", "--note", "on site")).exit_code == 0
    again = await aegis("ack", iid, "--as", "lee")
    assert again.exit_code == 0 and "acknowledged already" in again.output
    assert (await aegis("resolve", iid, "--as", "kim")).exit_code == 2  # the note is required
    assert (await aegis("resolve", iid, "--as", "kim", "--note", "drill")).exit_code == 0
    refused = await aegis("ack", iid)
    assert refused.exit_code == 1 and "resolved" in refused.output
    shown = json.loads((await aegis("show", iid, "--json")).output)
    assert (shown["acknowledged_by"], shown["acknowledged_via"]) == ("cli:kim", "cli")
    assert (shown["resolved_by"], shown["resolution_note"]) == ("cli:kim", "drill")
    assert [e["kind"] for e in shown["timeline"]] == [
        "triggered",
        "notified",
        "acknowledged",
        "resolved",
    ]
    text = (await aegis("show", iid)).output
    assert "acknowledged" in text and "cli:kim via cli" in text
    assert (await aegis("show", "20261130-00000000")).exit_code == 1
    assert (await aegis("show", "nonsense")).exit_code == 2
    # the two changes were announced as the dashboard's are: open screens show them at once
    await listener.flush()
    await eventually(lambda: len(heard) >= 2, within=5, what="the announced changes")
    await listener.close()
    states = [(h.producer, (h.new_image or {}).get("state")) for h in heard]
    assert states == [("alert-dispatcher", "acknowledged"), ("alert-dispatcher", "resolved")]


async def test_a_silence_records_the_incident_without_a_message_and_its_end_notifies_once(
    foundation, webhook, session, aws_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = Recorded()
    d = make(foundation, webhook, session, rec)
    silences = SilenceStore(foundation.readmodel)
    crew = new_silence(
        matchers=["factory=factory-m"],
        by="cli:kim",
        now=T0 - timedelta(minutes=1),
        reason="burner maintenance",
        duration=timedelta(hours=1),
    )
    await silences.add(crew)
    await d.handle(await put_state(foundation, "factory-m", T0, [FIRE]))
    await d.handle(await put_state(foundation, "factory-n", T0, [FIRE]))  # not silenced
    assert headlines(webhook) == ["CRITICAL · factory-n · FIRE_DETECTED"]
    assert [r.outcome for r in rec.results if r.outcome.startswith("suppressed")] == [
        "suppressed_silenced"
    ]
    store = IncidentStore(foundation.readmodel, foundation.store)
    (held,) = [i for i in await store.open(now=T0) if i.scope == "factory-m"]
    (other,) = [i for i in await store.open(now=T0) if i.scope == "factory-n"]
    # acknowledged in Slack, so that it neither escalates meanwhile nor posts its acknowledgement
    ack = functools.partial(incidents.acknowledge, by="lee", via="slack", at=T0)
    await store.change(other.incident_id, ack)
    assert held.silenced_since is not None and held.notifications == 0
    assert [e.kind for e in held.timeline] == ["triggered", "silenced"]
    # still firing after the cooldown: still held back, no second "silenced" line
    await d.handle(await put_state(foundation, "factory-m", T0 + timedelta(minutes=6), [FIRE]))
    assert len(webhook.delivered) == 1
    clock = FakeClock(T0 + timedelta(minutes=7))
    sweep = Escalator(
        store=store,
        config=load_escalation(None),
        receivers={"slack": SlackWebhookReceiver("slack", SlackWebhook(webhook.url, session))},
        clock=clock,
        dashboard_url="http://dash.example",
        instance="host-a:1",
    )
    await sweep.sweep()  # the silence still holds
    assert len(webhook.delivered) == 1
    await silences.end(crew.id, by="cli:kim", at=clock.now)
    await sweep.sweep()
    await sweep.sweep()
    assert headlines(webhook)[1:] == [
        "CRITICAL, still firing after a silence · factory-m · FIRE_DETECTED"
    ]
    now = await store.get(held.incident_id)
    assert now is not None and now.silenced_since is None and now.notifications == 1
    assert now.level == 1  # the escalation due meanwhile is in that one message


async def test_aegis_silences_refuses_an_unbounded_critical_silence_and_ends_one_early(
    foundation_env,
) -> None:

    async def aegis(*args: str) -> Any:
        return await invoke_in_thread("silences", *args)

    no_reason = await aegis("add", "-m", "factory=plant-a-1", "--for", "2h")
    assert no_reason.exit_code == 1 and "reason" in no_reason.output
    too_long = await aegis("add", "-m", "factory=plant-a-1", "--for", "9h", "--reason", "x")
    assert too_long.exit_code == 1 and "8h" in too_long.output.replace(" ", "")
    everything = await aegis("add", "-m", "factory=~.*", "--for", "1h", "--reason", "x")
    assert everything.exit_code == 1
    assert json.loads((await aegis("list", "--json")).output) == {"silences": []}
    made = await aegis(
        "add", "-m", "factory=plant-a-1", "--for", "2h", "--reason", "valve swap", "--json"
    )
    assert made.exit_code == 0, made.output
    silence = json.loads(made.output)
    assert silence["created_by"].startswith("cli:")
    (listed,) = json.loads((await aegis("list", "--json")).output)["silences"]
    assert listed["id"] == silence["id"]
    assert (await aegis("expire", silence["id"], "--as", "lee")).exit_code == 0
    assert json.loads((await aegis("list", "--json")).output) == {"silences": []}
    (ended,) = json.loads((await aegis("list", "--ended", "--json")).output)["silences"]
    assert ended["ended_by"] == "cli:lee"
    assert (await aegis("expire", "s-000000000000")).exit_code == 1


LEVEL_1_AFTER_S = 20


async def test_an_escalation_due_while_its_only_replica_was_killed_is_sent_once_by_the_next(
    foundation: Foundation,
    aws_endpoint: str,
    private_nats,
    webhook: FakeWebhook,
    unique_id: str,
    tmp_path: Path,
) -> None:
    """The escalation timer is the incident itself, not a replica's: the only dispatcher is
    SIGKILLed while an unacknowledged CRITICAL waits for its level 1 (20 s after the trigger, a
    file of the test's: a loaded machine may take seconds to send level 0); the next process
    starts with its wall clock past that (no replica ran while it fell due) and sends it once."""
    policies = tmp_path / "escalation.toml"
    policies.write_text(
        load_escalation_text()
        .replace('after = "5m"', f'after = "{LEVEL_1_AFTER_S}s"')
        .replace('repeat = "30m"', 'repeat = "1h"')
    )
    env = process_env(
        foundation,
        aws_endpoint,
        private_nats.url,
        webhook,
        unique_id,
        AEGIS_ESCALATION_FILE=str(policies),
        AEGIS_ESCALATION_TICK_S="1",
    )
    script = Path(sys.executable).parent / "aegis-alert-dispatcher"
    store = IncidentStore(foundation.readmodel)
    first = spawn(script, env | {"AEGIS_HEALTH_PORT": str(free_port())}, tmp_path / "a.log")
    procs = [first]
    try:
        client = create_broker(
            settings_for(foundation, aws_endpoint, private_nats.url, webhook, unique_id),
            name="alerts-test-client",
        )
        try:
            await ensure_streams(client)
            event = await put_state(foundation, "factory-e", utc_now(), [FIRE])
            await publish(client, object_created_subject("state_snapshot"), event, msg_id=None)
            await eventually(lambda: len(webhook.delivered) == 1, within=30, what="level 0")
        finally:
            await client.stop()
        (waiting,) = await store.open(now=utc_now())
        first.send_signal(signal.SIGKILL)
        await asyncio.to_thread(first.wait, 10)
        # the fault hit with the escalation outstanding: level 0 sent, level 1 not yet due
        now = await store.get(waiting.incident_id)
        assert now is not None and now.level == 0 and now.outbox is None
        due = waiting.triggered_at + timedelta(seconds=LEVEL_1_AFTER_S)
        assert utc_now() < due
        assert len(webhook.delivered) == 1
        # level 1 falls due while no dispatcher runs: the next one's clock starts past it
        ahead = (due - utc_now()).total_seconds() + 1
        second = spawn(
            script,
            clock_moved(env, ahead) | {"AEGIS_HEALTH_PORT": str(free_port())},
            tmp_path / "b.log",
        )
        procs.append(second)
        await eventually(lambda: len(webhook.delivered) == 2, within=30, what="level 1")
        for _ in range(3):  # more sweeps: nothing more
            await asyncio.sleep(1)
        assert headlines_of(webhook.delivered[1:]) == [
            "ESCALATED to level 1 · CRITICAL · factory-e · FIRE_DETECTED"
        ]
        escalated = await store.get(waiting.incident_id)
        assert escalated is not None and escalated.level == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            await asyncio.to_thread(proc.wait, 30)


def headlines_of(bodies: list[dict[str, Any]]) -> list[str]:
    return [str(body["text"]).split(" AEGIS ", 1)[1] for body in bodies]


async def test_the_dispatcher_gives_index_keys_to_firing_alerts_written_before_the_index(
    foundation: Foundation, aws_endpoint: str, private_nats, webhook: FakeWebhook, unique_id: str
) -> None:
    """A firing alert state of a version before the fleet index, then bootstrap asking for a
    backfill: the dispatcher does it at start, and the alert is listed as firing."""
    ddb, table = foundation.clients.dynamodb, foundation.table
    await ddb.put_item(
        TableName=table,
        Item={
            "pk": {"S": "ALERT#factory-old"},
            "sk": {"S": "CRITICAL#FIRE_DETECTED#STATE"},
            "firing": {"BOOL": True},
            "ttl": {"N": str(int(utc_now().timestamp()) + 3600)},
        },
    )
    arn = (await ddb.describe_table(TableName=table))["Table"]["TableArn"]
    await fleetindex.ask_for_backfill(ddb, table, arn)
    app = DispatcherApp(
        settings_for(foundation, aws_endpoint, private_nats.url, webhook, unique_id)
    )
    await app.start()
    try:

        async def listed() -> bool:
            firing = await foundation.readmodel.firing_alerts(now=utc_now())
            return "ALERT#factory-old" in [a["pk"] for a in firing]

        await eventually(listed, what="the alert among the firing ones")
    finally:
        await app.stop()
    assert await fleetindex.done_generation(ddb, table, fleetindex.FIRING_ALERTS) == 1
