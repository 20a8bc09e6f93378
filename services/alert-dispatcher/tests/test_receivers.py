"""Notification receivers against real HTTP servers on 127.0.0.1 standing in for Slack's Web API,
PagerDuty and a webhook receiver that verifies our signature, and SNS on a real moto_server (its
messages read back from an SQS queue subscribed to the topic). Waits between attempts go to an
injected sleep; time comes from fixed instants, never the calendar."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from aegis_alert_dispatcher.delivery import RetryPolicy, Undeliverable
from aegis_alert_dispatcher.receivers import (
    RECEIVER_CONFIG,
    Notification,
    PagerDutyConfig,
    PagerDutyReceiver,
    Receiver,
    ReceiverConfig,
    ReceiverConfigError,
    SlackBotConfig,
    SlackBotReceiver,
    SlackWebhookConfig,
    SlackWebhookReceiver,
    SnsClientPool,
    SnsConfig,
    SnsReceiver,
    WebhookConfig,
    WebhookReceiver,
    build_receiver,
    parse_receiver_config,
    sign_webhook,
    sms_text,
    sns_subject,
    verify_webhook_signature,
)
from aegis_devstack.testing.webhook import FakeWebhook, serving
from aegis_runtime.redact import REDACTED
from aegis_storage.clients import AwsConfig, open_client

T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
EPOCH0 = T0.timestamp()
TOKEN = "xoxb-1111-2222-SECRETBOTTOKEN"
ROUTING_KEY = "R0UTINGKEYSECRET0123456789abcdef"
SECRET = "whsec-shared-0123456789"
SLACK_OK = {"Content-Type": "application/json"}
REGION = "ap-south-1"


def notification(**changes: Any) -> Notification:
    base: dict[str, Any] = {
        "incident_id": "inc-factory-a-0001",
        "scope": "factory-a",
        "severity": "CRITICAL",
        "kind": "trigger",
        "level": 0,
        "title": "CRITICAL · factory-a · FIRE_DETECTED",
        "text": "FIRE_DETECTED (CRITICAL): fire on cam-1 — measured 0.93, threshold 0.8\nline 2",
        "slack_payload": {"text": "AEGIS CRITICAL", "blocks": [{"type": "divider"}]},
        "link": "http://dash.example/factories/factory-a",
        "attempt_id": "att-0001",
        "at": T0,
    }
    return Notification(**(base | changes))


@dataclass
class Sleeps:
    """The injected sleep: records each wait and returns at once."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def base_of(fake: FakeWebhook) -> str:
    return fake.url.removesuffix("/hook")


def slack_answer(status: int = 200, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return (status, SLACK_OK | (headers or {}), json.dumps(body).encode())


def policy(**changes: Any) -> RetryPolicy:
    return RetryPolicy(**({"max_attempts": 4, "first_delay": 0.01, "timeout": 5.0} | changes))


# -- slack_webhook ----------------------------------------------------------------------------


async def test_slack_webhook_receiver_posts_the_block_kit_payload_as_is(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    receiver = build_receiver(
        "ops-slack",
        SlackWebhookConfig(url_env="OPS_SLACK_URL"),
        session=session,
        env={"OPS_SLACK_URL": webhook.url},
    )
    assert isinstance(receiver, SlackWebhookReceiver) and receiver.kind == "slack_webhook"
    n = notification()
    delivery = await receiver.send(n)
    assert (delivery.attempts, delivery.status, delivery.ref) == (1, 200, None)
    assert webhook.delivered == [n.slack_payload]


# -- slack_bot --------------------------------------------------------------------------------


def bot(fake: FakeWebhook, session: aiohttp.ClientSession, sleeps: Sleeps, **p: Any) -> Receiver:
    return SlackBotReceiver(
        "ops-bot",
        TOKEN,
        "C0ALERTS",
        session=session,
        base_url=f"{base_of(fake)}/api/",
        policy=policy(**p),
        sleep=sleeps,
    )


async def test_slack_bot_posts_a_new_incident_and_updates_it_with_the_ref(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    receiver = bot(webhook, session, Sleeps())
    webhook.script(
        slack_answer(ok=True, channel="C0ALERTS", ts="1764471600.000100"),
        slack_answer(ok=True, channel="C0ALERTS", ts="1764471600.000100"),
    )
    posted = await receiver.send(notification())
    assert posted.ref == {"channel": "C0ALERTS", "ts": "1764471600.000100"}
    assert posted.attempts == 1

    resolved = notification(
        kind="resolve",
        slack_payload={"text": "AEGIS RESOLVED", "blocks": []},
        attempt_id="att-0002",
        slack_ref=posted.ref,
    )
    updated = await receiver.send(resolved)
    assert updated.ref == posted.ref

    post, update = webhook.requests
    assert post.path == "/api/chat.postMessage" and update.path == "/api/chat.update"
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    assert post.body["channel"] == "C0ALERTS" and post.body["text"] == "AEGIS CRITICAL"
    assert post.body["blocks"] == [{"type": "divider"}]
    assert post.body["metadata"]["event_payload"]["attempt_id"] == "att-0001"
    assert update.body["channel"] == "C0ALERTS" and update.body["ts"] == "1764471600.000100"
    assert update.body["text"] == "AEGIS RESOLVED"


async def test_slack_bot_posts_anew_when_the_message_to_update_is_gone(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    receiver = bot(webhook, session, Sleeps())
    webhook.script(
        slack_answer(ok=False, error="message_not_found"),
        slack_answer(ok=True, channel="C0ALERTS", ts="2.0"),
    )
    delivery = await receiver.send(notification(slack_ref={"channel": "C0ALERTS", "ts": "1.0"}))
    assert delivery.ref == {"channel": "C0ALERTS", "ts": "2.0"} and delivery.attempts == 1
    assert [r.path for r in webhook.requests] == ["/api/chat.update", "/api/chat.postMessage"]


async def test_slack_bot_rate_limit_waits_what_retry_after_asks(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = bot(webhook, session, sleeps)
    webhook.script(
        slack_answer(429, {"Retry-After": "7"}, ok=False, error="ratelimited"),
        slack_answer(ok=True, channel="C0ALERTS", ts="3.0"),
    )
    delivery = await receiver.send(notification())
    assert (delivery.attempts, delivery.status) == (2, 200)
    assert len(sleeps.delays) == 1 and sleeps.delays[0] >= 7


async def test_slack_bot_server_errors_are_retried_then_undeliverable(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = bot(webhook, session, sleeps, max_attempts=3)
    webhook.script(
        (500, {"Content-Type": "text/html"}, b"<html>oops</html>"),
        slack_answer(ok=False, error="internal_error"),
        (503, {}, b"unavailable"),
    )
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    assert caught.value.attempts == 3 and not caught.value.permanent
    assert len(webhook.requests) == 3 and len(sleeps.delays) == 2


async def test_slack_bot_revoked_token_is_permanent_and_the_token_is_never_shown(
    webhook: FakeWebhook, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sleeps = Sleeps()
    receiver = bot(webhook, session, sleeps)
    webhook.script(slack_answer(ok=False, error="token_revoked"))
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    err = caught.value
    assert err.permanent and err.attempts == 1 and sleeps.delays == []
    assert "token_revoked" in err.detail and TOKEN not in str(err)
    assert len(webhook.requests) == 1
    assert TOKEN not in caplog.text  # slack_sdk's own debug log of the request included

    # a stand-in that echoes the token back in what it says still cannot put it in the error
    webhook.script(
        (500, {"Content-Type": "text/plain"}, f"bad token {TOKEN}".encode()),
        slack_answer(400, ok=False, error=f"invalid_auth {TOKEN}"),
    )
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    assert caught.value.permanent and TOKEN not in caught.value.detail
    assert REDACTED in caught.value.detail


# -- pagerduty --------------------------------------------------------------------------------


def pagerduty(fake: FakeWebhook, session: aiohttp.ClientSession, sleeps: Sleeps, **p: Any) -> Any:
    return build_receiver(
        "on-call",
        PagerDutyConfig(routing_key_env="PD_KEY", url=fake.url, **p),
        session=session,
        env={"PD_KEY": ROUTING_KEY},
        sleep=sleeps,
    )


async def test_pagerduty_trigger_carries_the_event_and_acknowledge_resolve_the_key(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    receiver = pagerduty(webhook, session, Sleeps())
    assert isinstance(receiver, PagerDutyReceiver) and receiver.kind == "pagerduty"
    webhook.script(202, 202, 202)
    delivery = await receiver.send(notification(kind="escalate", level=1))
    assert (delivery.attempts, delivery.status) == (1, 202)
    await receiver.send(notification(kind="acknowledge"))
    await receiver.send(notification(kind="resolve"))

    trigger, ack, resolve = (r.body for r in webhook.requests)
    assert trigger == {
        "routing_key": ROUTING_KEY,
        "event_action": "trigger",
        "dedup_key": "inc-factory-a-0001",
        "payload": {
            "summary": "CRITICAL · factory-a · FIRE_DETECTED",
            "source": "factory-a",
            "severity": "critical",
            "timestamp": "2026-11-30T03:00:00.000Z",
            "component": "aegis",
            "class": "escalate",
            "custom_details": {
                "incident_id": "inc-factory-a-0001",
                "scope": "factory-a",
                "level": 1,
                "kind": "escalate",
                "text": notification().text,
                "attempt_id": "att-0001",
            },
        },
        "links": [
            {
                "href": "http://dash.example/factories/factory-a",
                "text": "Open in the AEGIS dashboard",
            }
        ],
        "client": "AEGIS",
        "client_url": "http://dash.example/factories/factory-a",
    }
    assert ack == {
        "routing_key": ROUTING_KEY,
        "event_action": "acknowledge",
        "dedup_key": "inc-factory-a-0001",
    }
    assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == "inc-factory-a-0001"
    assert webhook.requests[0].headers["Content-Type"] == "application/json"


async def test_pagerduty_429_with_retry_after_then_accepted(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = pagerduty(webhook, session, sleeps)
    webhook.script((429, {"Retry-After": "30"}), 202)
    delivery = await receiver.send(notification(severity="WARNING"))
    assert delivery.attempts == 2 and sleeps.delays[0] >= 30
    assert webhook.requests[1].body["payload"]["severity"] == "warning"


async def test_pagerduty_5xx_is_retried_then_undeliverable(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = pagerduty(webhook, session, sleeps, max_attempts=3)
    webhook.script(500, 502, 503)
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    err = caught.value
    assert (err.attempts, err.status, err.permanent) == (3, 503, False)
    assert err.detail.startswith("gave up after 3 attempts: HTTP 503")
    assert len(webhook.requests) == 3 and len(sleeps.delays) == 2


async def test_pagerduty_400_is_permanent_and_the_routing_key_never_in_the_error(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = pagerduty(webhook, session, sleeps)
    webhook.script(
        (400, {}, json.dumps({"status": "invalid event", "errors": [ROUTING_KEY]}).encode())
    )
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    err = caught.value
    assert (err.attempts, err.status, err.permanent) == (1, 400, True)
    assert ROUTING_KEY not in str(err) and REDACTED in err.detail and "invalid event" in err.detail
    assert len(webhook.requests) == 1 and sleeps.delays == []


# -- the deadline -----------------------------------------------------------------------------


async def test_no_attempt_starts_when_the_wait_before_it_ends_past_the_deadline(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = pagerduty(webhook, session, sleeps)
    webhook.script((503, {"Retry-After": "60"}))
    deadline = asyncio.get_running_loop().time() + 5
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification(), deadline=deadline)
    assert caught.value.attempts == 1 and sleeps.delays == []
    assert "lease ends before the next attempt" in caught.value.detail
    assert len(webhook.requests) == 1


async def test_an_attempt_is_cut_at_the_deadline_and_a_deadline_passed_sends_nothing(
    webhook: FakeWebhook, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    receiver = pagerduty(webhook, session, sleeps)
    loop = asyncio.get_running_loop()
    webhook.hold()  # a PagerDuty that does not answer
    started = loop.time()
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification(), deadline=started + 0.3)
    assert loop.time() - started < 2 and caught.value.attempts == 1
    assert caught.value.status is None and len(webhook.requests) == 1
    webhook.release()

    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification(), deadline=loop.time() - 1)
    assert caught.value.attempts == 0 and "lease ran out" in caught.value.detail
    assert len(webhook.requests) == 1


# -- webhook ----------------------------------------------------------------------------------


@dataclass
class SignedReceiver:
    """A receiver of ours: verifies each request's signature (as documented) and keeps it."""

    secret: str
    now: float
    url: str = ""
    seen: list[tuple[dict[str, str], bytes, bool]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        valid = verify_webhook_signature(
            self.secret,
            request.headers.get("X-Aegis-Timestamp", ""),
            body,
            request.headers.get("X-Aegis-Signature", ""),
            self.now,
        )
        self.seen.append((dict(request.headers), body, valid))
        if not valid:
            return web.Response(status=401, text="bad signature")
        return web.Response(status=self.answers.pop(0) if self.answers else 204)


@pytest.fixture
async def signed() -> AsyncIterator[SignedReceiver]:
    receiver = SignedReceiver(SECRET, now=EPOCH0 + 2)
    app = web.Application()
    app.router.add_post("/aegis", receiver.handle)
    async with serving(app) as base:
        receiver.url = f"{base}/aegis"
        yield receiver


def ticking(start: float, step: float) -> Any:
    """A clock that moves ``step`` seconds each time it is read."""
    times = iter(start + i * step for i in range(1000))
    return lambda: next(times)


async def test_webhook_posts_a_signed_document_that_our_receivers_verify(
    signed: SignedReceiver, session: aiohttp.ClientSession
) -> None:
    receiver = WebhookReceiver(
        "plant-ops",
        signed.url,
        SECRET,
        session=session,
        policy=policy(),
        sleep=Sleeps(),
        clock=ticking(EPOCH0, 1),
    )
    signed.answers = [503]
    n = notification(kind="renotify", level=2)
    delivery = await receiver.send(n)
    assert (delivery.attempts, delivery.status) == (2, 204)

    (first_headers, first_body, first_valid), (headers, body, valid) = signed.seen
    assert first_valid and valid and body == first_body
    assert json.loads(body) == {
        "incident_id": "inc-factory-a-0001",
        "scope": "factory-a",
        "severity": "CRITICAL",
        "kind": "renotify",
        "level": 2,
        "title": n.title,
        "text": n.text,
        "link": n.link,
        "at": "2026-11-30T03:00:00.000Z",
        "attempt_id": "att-0001",
    }
    # each attempt is signed anew, with its own time; the delivery id stays the same
    assert first_headers["X-Aegis-Timestamp"] == str(int(EPOCH0))
    assert headers["X-Aegis-Timestamp"] == str(int(EPOCH0) + 1)
    assert headers["X-Aegis-Signature"] == sign_webhook(SECRET, headers["X-Aegis-Timestamp"], body)
    assert headers["X-Aegis-Signature"].startswith("v1=")
    assert first_headers["X-Aegis-Delivery"] == headers["X-Aegis-Delivery"] == "att-0001"
    assert headers["Content-Type"] == "application/json"


async def test_webhook_signed_with_another_secret_is_refused_for_good(
    signed: SignedReceiver, session: aiohttp.ClientSession
) -> None:
    receiver = WebhookReceiver(
        "plant-ops", signed.url, "not-the-secret", session=session, clock=lambda: EPOCH0
    )
    with pytest.raises(Undeliverable) as caught:
        await receiver.send(notification())
    assert caught.value.permanent and caught.value.status == 401 and caught.value.attempts == 1
    assert [valid for *_, valid in signed.seen] == [False]
    assert "not-the-secret" not in str(caught.value)


def test_a_signature_is_refused_for_a_tampered_body_an_old_time_or_another_secret() -> None:
    body = b'{"incident_id":"inc-1","kind":"trigger"}'
    ts = str(int(EPOCH0))
    sig = sign_webhook(SECRET, ts, body)
    assert verify_webhook_signature(SECRET, ts, body, sig, EPOCH0 + 299)
    assert verify_webhook_signature(SECRET.encode(), ts, body, sig, EPOCH0 - 299)
    # rotation: several signatures in one header, any of them valid
    assert verify_webhook_signature(SECRET, ts, body, f"v1=00ff, {sig}", EPOCH0)

    assert not verify_webhook_signature(SECRET, ts, body.replace(b"inc-1", b"inc-2"), sig, EPOCH0)
    assert not verify_webhook_signature(SECRET, ts, body, sig, EPOCH0 + 301)  # replayed late
    assert not verify_webhook_signature(SECRET, ts, body, sig, EPOCH0 - 301)  # from the future
    assert verify_webhook_signature(SECRET, ts, body, sig, EPOCH0 + 900, tolerance_s=1000)
    assert not verify_webhook_signature("another", ts, body, sig, EPOCH0)
    assert not verify_webhook_signature(SECRET, str(int(EPOCH0) + 1), body, sig, EPOCH0)
    assert not verify_webhook_signature(SECRET, "yesterday", body, sig, EPOCH0)
    assert not verify_webhook_signature(SECRET, ts, body, "", EPOCH0)
    assert not verify_webhook_signature(SECRET, ts, body, sig.replace("v1=", "v0="), EPOCH0)


# -- sns --------------------------------------------------------------------------------------


@pytest.fixture
async def topic(private_emulator: str, unique_id: str) -> AsyncIterator[tuple[str, str]]:
    """An SNS topic on moto_server with an SQS queue subscribed: the topic ARN, the queue URL."""
    cfg = AwsConfig(region=REGION, endpoint_url=private_emulator)
    async with open_client("sns", cfg) as sns, open_client("sqs", cfg) as sqs:
        arn = (await sns.create_topic(Name=f"aegis-{unique_id}"))["TopicArn"]
        queue = (await sqs.create_queue(QueueName=f"aegis-{unique_id}"))["QueueUrl"]
        queue_arn = (await sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"]))[
            "Attributes"
        ]["QueueArn"]
        await sns.subscribe(TopicArn=arn, Protocol="sqs", Endpoint=queue_arn)
        yield arn, queue


@pytest.mark.integration
async def test_sns_publishes_the_long_text_with_an_ascii_subject(
    topic: tuple[str, str], private_emulator: str, session: aiohttp.ClientSession
) -> None:
    arn, queue = topic
    cfg = AwsConfig(region="us-east-1", endpoint_url=private_emulator)  # the ARN's region wins
    n = notification(title="CRITICAL · 공장-a · FIRE_DETECTED — ünïcode " + "x" * 120)
    async with SnsClientPool(cfg) as pool:
        receiver = build_receiver(
            "sms-and-mail", SnsConfig(topic_arn=arn), session=session, sns_clients=pool
        )
        assert isinstance(receiver, SnsReceiver) and receiver.kind == "sns"
        delivery = await receiver.send(n)
    assert delivery.attempts == 1 and delivery.status == 200
    assert delivery.ref and delivery.ref["message_id"]

    async with open_client("sqs", AwsConfig(region=REGION, endpoint_url=private_emulator)) as sqs:
        got = await sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)
    (message,) = got["Messages"]
    envelope = json.loads(message["Body"])
    assert envelope["TopicArn"] == arn and envelope["MessageId"] == delivery.ref["message_id"]
    subject = envelope["Subject"]
    assert subject.isascii() and len(subject) < 100 and subject.startswith("[AEGIS] CRITICAL")
    assert subject.endswith("...") and "\n" not in subject
    assert envelope["Message"].startswith(n.title + "\n\n" + n.text)
    assert (
        "Open in the AEGIS dashboard: http://dash.example/factories/factory-a"
        in (envelope["Message"])
    )
    attributes = envelope["MessageAttributes"]
    assert attributes["aegis.attempt_id"]["Value"] == "att-0001"
    assert attributes["aegis.kind"]["Value"] == "trigger"


@pytest.mark.integration
async def test_sns_to_a_missing_topic_is_permanent(
    private_emulator: str, session: aiohttp.ClientSession
) -> None:
    sleeps = Sleeps()
    cfg = AwsConfig(region=REGION, endpoint_url=private_emulator)
    async with SnsClientPool(cfg) as pool:
        receiver = SnsReceiver(
            "sms",
            f"arn:aws:sns:{REGION}:123456789012:no-such-topic",
            clients=pool,
            policy=policy(),
            sleep=sleeps,
        )
        with pytest.raises(Undeliverable) as caught:
            await receiver.send(notification())
    assert caught.value.permanent and caught.value.attempts == 1 and sleeps.delays == []
    assert "NotFound" in caught.value.detail


def test_sms_is_one_short_line_and_the_subject_ascii() -> None:
    short = notification(title="WARNING · factory-a · GAS_LEAK")
    assert sms_text(short) == (
        "AEGIS ALERT: WARNING - factory-a - GAS_LEAK http://dash.example/factories/factory-a"
    )
    long = sms_text(notification(kind="resolve", title="RESOLVED " + "y" * 300))
    assert len(long) == 160 and long.startswith("AEGIS RESOLVED: RESOLVED yyy")
    assert len(sms_text(notification(title="공장 " * 50))) == 70
    assert sns_subject("경보 · 🔥") == "[AEGIS]"
    assert sns_subject("a\tb\x00c") == "[AEGIS] a b c"


# -- configuration ----------------------------------------------------------------------------


def test_receiver_tables_validate_into_their_kind() -> None:
    tables: dict[str, dict[str, Any]] = {
        "slack": {"type": "slack_webhook", "url_env": "AEGIS_SLACK_WEBHOOK_URL"},
        "bot": {"type": "slack_bot", "token_env": "SLACK_BOT_TOKEN", "channel": "C0ALERTS"},
        "pd": {"type": "pagerduty", "routing_key_env": "PD_KEY", "max_attempts": 8},
        "sns": {"type": "sns", "topic_arn": "arn:aws:sns:ap-south-1:123456789012:alerts.fifo"},
        "hook": {"type": "webhook", "url": "https://ops.example/aegis", "secret_env": "HOOK"},
    }
    parsed = {name: parse_receiver_config(raw) for name, raw in tables.items()}
    assert isinstance(parsed["slack"], SlackWebhookConfig)
    assert isinstance(parsed["bot"], SlackBotConfig) and parsed["bot"].base_url is None
    assert isinstance(parsed["pd"], PagerDutyConfig) and parsed["pd"].max_attempts == 8
    assert parsed["pd"].url == "https://events.pagerduty.com/v2/enqueue"
    assert isinstance(parsed["sns"], SnsConfig) and parsed["sns"].region is None
    assert isinstance(parsed["hook"], WebhookConfig) and parsed["hook"].timeout_s == 10.0
    assert RECEIVER_CONFIG.validate_python(tables["hook"]) == parsed["hook"]

    for bad in (
        {"type": "email", "to": "ops@example.com"},  # no such kind
        {"type": "pagerduty", "routing_key": ROUTING_KEY},  # a secret in the file
        {"type": "slack_bot", "token_env": "TOKEN"},  # no channel
        {"type": "webhook", "url": "http://ops.example/aegis", "secret_env": "HOOK"},
        {"type": "sns", "topic_arn": "arn:aws:sqs:ap-south-1:123456789012:alerts"},
        {"type": "slack_webhook", "url_env": "not a variable"},
        {"type": "slack_webhook", "url_env": "URL", "max_attempts": 0},
    ):
        with pytest.raises(ValidationError):
            parse_receiver_config(bad)
    assert parse_receiver_config(
        {"type": "webhook", "url": "http://127.0.0.1:9/aegis", "secret_env": "HOOK"}
    )


async def test_building_a_receiver_names_the_unset_variable_and_no_secret(
    session: aiohttp.ClientSession,
) -> None:
    configs: list[tuple[ReceiverConfig, str]] = [
        (SlackWebhookConfig(url_env="OPS_SLACK_URL"), "OPS_SLACK_URL"),
        (SlackBotConfig(token_env="OPS_BOT_TOKEN", channel="C1"), "OPS_BOT_TOKEN"),
        (PagerDutyConfig(routing_key_env="OPS_PD_KEY"), "OPS_PD_KEY"),
        (WebhookConfig(url="https://ops.example/aegis", secret_env="OPS_HOOK"), "OPS_HOOK"),
    ]
    for config, variable in configs:
        with pytest.raises(ReceiverConfigError, match=f"'ops'.*{variable}.* is not set"):
            build_receiver("ops", config, session=session, env={variable: " "})
    with pytest.raises(ReceiverConfigError, match="sns needs AWS clients"):
        build_receiver(
            "ops",
            SnsConfig(topic_arn="arn:aws:sns:ap-south-1:123456789012:alerts"),
            session=session,
            env={},
        )

    env = {"OPS_BOT_TOKEN": TOKEN, "OPS_HOOK": SECRET}
    built = build_receiver("ops", configs[1][0], session=session, env=env)
    assert isinstance(built, SlackBotReceiver) and built.name == "ops"
    assert TOKEN not in repr(configs[1][0])
    hook = build_receiver("ops", configs[3][0], session=session, env=env)
    assert isinstance(hook, WebhookReceiver) and hook.kind == "webhook"
