"""Notification receivers: where an incident's escalation policy sends its notifications.

The dispatcher hands every receiver the same :class:`Notification` and awaits
:meth:`Receiver.send`; a receiver answers a :class:`~aegis_alert_dispatcher.delivery.Delivery` or
raises :class:`~aegis_alert_dispatcher.delivery.Undeliverable` (``permanent`` when the far end
refused it for good: a revoked token, a 4xx other than 429). Every receiver retries through the one
loop of :func:`~aegis_alert_dispatcher.delivery.deliver` (full jitter, ``Retry-After``, nothing past
the deadline), and no secret reaches an error text.

Kinds (``type`` in a ``[receivers.NAME]`` table, validated by :data:`RECEIVER_CONFIG`):

* ``slack_webhook``: a Slack incoming webhook; posts ``Notification.slack_payload`` as is.
* ``slack_bot``: a bot token and a channel, through ``slack_sdk``'s ``AsyncWebClient``:
  ``chat.postMessage``, or ``chat.update`` of the earlier post named by ``slack_ref`` (a new post
  when that message is gone); the delivery's ``ref`` is ``{"channel", "ts"}``.
* ``pagerduty``: PagerDuty Events API v2, ``dedup_key`` the incident id (trigger, renotify and
  escalate are ``trigger`` events; acknowledge and resolve their own actions).
* ``sns``: an AWS SNS topic (e-mail and SMS subscribers): ``MessageStructure="json"`` gives e-mail
  the whole text and SMS one short line; the subject is ASCII and under 100 characters.
* ``webhook``: any HTTPS endpoint, POSTed the JSON document of :func:`webhook_document`, signed
  (see :func:`sign_webhook` and :func:`verify_webhook_signature`).

Secrets never sit in the configuration: it names the environment variable that holds each one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import os
import time
import unicodedata
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Annotated, Any, Literal, Protocol
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from aegis_alert_dispatcher.delivery import (
    Delivery,
    JsonPoster,
    OnAttempt,
    Refused,
    Retryable,
    RetryingSender,
    RetryPolicy,
    Sleep,
    retry_after,
)
from aegis_alert_dispatcher.slack import SlackWebhook
from aegis_contracts.times import format_ts
from aegis_storage.clients import AwsConfig, open_client
from aegis_storage.errors import StorageError, Transient, translated

NotificationKind = Literal["trigger", "renotify", "escalate", "acknowledge", "resolve"]
Severity = Literal["WARNING", "CRITICAL"]
KINDS: tuple[NotificationKind, ...] = ("trigger", "renotify", "escalate", "acknowledge", "resolve")
SEVERITIES: tuple[Severity, ...] = ("WARNING", "CRITICAL")
LABEL: dict[str, str] = {
    "trigger": "ALERT",
    "renotify": "REMINDER",
    "escalate": "ESCALATED",
    "acknowledge": "ACKNOWLEDGED",
    "resolve": "RESOLVED",
}

PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
SLACK_API_URL = "https://slack.com/api/"
SIGNATURE_VERSION = "v1"
SIGNATURE_TOLERANCE_S = 300.0
SNS_SUBJECT_MAX = 99  # SNS: "less than 100 characters"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification of one incident, the same for every receiver.

    ``attempt_id`` is the same on every retry and replica (the idempotency key where an API has
    one); ``slack_ref`` (``{"channel", "ts"}``) names an earlier bot post of this incident, which a
    ``slack_bot`` receiver updates instead of posting anew; ``at`` is timezone-aware (UTC)."""

    incident_id: str
    scope: str
    severity: Severity
    kind: NotificationKind
    level: int
    title: str
    text: str
    slack_payload: dict[str, Any]
    link: str
    attempt_id: str
    at: datetime
    slack_ref: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, not {self.severity!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.level < 0:
            raise ValueError(f"level must be 0 or more, not {self.level}")
        if "\n" in self.title or "\r" in self.title:
            raise ValueError("title must be one line")
        if self.at.tzinfo is None:
            raise ValueError("at must be timezone-aware (UTC)")
        if not self.incident_id or not self.attempt_id:
            raise ValueError("incident_id and attempt_id must not be empty")


class Receiver(Protocol):
    """Where notifications go. ``send`` raises ``Undeliverable`` when it cannot deliver;
    ``deadline`` (``loop.time()``): no attempt runs past it."""

    name: str
    kind: str

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery: ...


# -- slack_webhook ----------------------------------------------------------------------------


class SlackWebhookReceiver:
    """A Slack incoming webhook (:class:`~aegis_alert_dispatcher.slack.SlackWebhook`): posts the
    notification's Block Kit payload as is."""

    kind: str = "slack_webhook"

    def __init__(self, name: str, webhook: SlackWebhook) -> None:
        self.name = name
        self.webhook = webhook

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        return await self.webhook.send(n.slack_payload, deadline=deadline)


# -- slack_bot --------------------------------------------------------------------------------

# answers that another attempt may change; everything else Slack says with ok=false is final
_SLACK_TRANSIENT = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# chat.update of a message that cannot be updated any more: post a new one instead
_SLACK_GONE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})


class SlackBotReceiver(RetryingSender):
    """A Slack app's bot token and a channel, through ``slack_sdk``'s ``AsyncWebClient`` (its own
    retry handlers off: :func:`deliver` retries). ``chat.postMessage`` for a new incident,
    ``chat.update`` when the notification carries ``slack_ref``; the delivery's ``ref`` is where
    the message is (``{"channel", "ts"}``), for the next update."""

    kind: str = "slack_bot"

    def __init__(
        self,
        name: str,
        token: str,
        channel: str,
        *,
        session: aiohttp.ClientSession,
        base_url: str | None = None,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        from slack_sdk.web.async_client import AsyncWebClient  # noqa: PLC0415 (only when used)

        super().__init__(policy=policy, sleep=sleep, on_attempt=on_attempt)
        self.name = name
        self.channel = channel
        self._token = token
        self.client = AsyncWebClient(
            token=token, base_url=base_url or SLACK_API_URL, session=session, retry_handlers=[]
        )

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        async def attempt(within: float) -> Delivery:
            return await self._call(n)

        return await self._deliver(attempt, deadline, (self._token,))

    async def _call(self, n: Notification) -> Delivery:
        from slack_sdk.errors import SlackApiError  # noqa: PLC0415

        message: dict[str, Any] = {
            "text": n.slack_payload.get("text") or n.title,
            "blocks": n.slack_payload.get("blocks"),
            "metadata": {
                "event_type": "aegis_notification",
                "event_payload": {
                    "incident_id": n.incident_id,
                    "attempt_id": n.attempt_id,
                    "kind": n.kind,
                    "level": n.level,
                },
            },
        }
        method = "chat.update" if n.slack_ref else "chat.postMessage"
        try:
            try:
                if n.slack_ref:
                    resp = await self.client.chat_update(
                        channel=str(n.slack_ref["channel"]), ts=str(n.slack_ref["ts"]), **message
                    )
                else:
                    resp = await self._post(message)
            except SlackApiError as err:
                if not n.slack_ref or _slack_error(err) not in _SLACK_GONE:
                    raise
                method = "chat.postMessage"  # the message to update is gone: a new one
                resp = await self._post(message)
        except SlackApiError as err:
            raise _slack_failure(err, method) from None
        except (aiohttp.ClientError, TimeoutError) as err:
            raise Retryable(f"Slack {method}: {type(err).__name__}: {err}") from None
        return Delivery(0, resp.status_code, {"channel": resp["channel"], "ts": resp["ts"]})

    async def _post(self, message: dict[str, Any]) -> Any:
        return await self.client.chat_postMessage(
            channel=self.channel, unfurl_links=False, unfurl_media=False, **message
        )


def _slack_error(err: Any) -> str | None:
    data = getattr(err.response, "data", None)
    return str(data.get("error")) if isinstance(data, dict) and data.get("error") else None


def _slack_failure(err: Any, method: str) -> Retryable | Refused:
    """A ``SlackApiError`` as what the retry loop needs: its ``response`` is slack_sdk's
    (``status_code``, ``data``) or, for a body that is not JSON, aiohttp's (``status``)."""
    response = err.response
    status = getattr(response, "status_code", None) or getattr(response, "status", None)
    error = _slack_error(err)
    detail = f"Slack {method}: {error or 'no error code'} (HTTP {status})"
    if status == 429 or error == "ratelimited":
        headers = getattr(response, "headers", None) or {}
        return Retryable(detail, status=status, retry_after=retry_after(headers.get("Retry-After")))
    if (status is not None and status >= 500) or error in _SLACK_TRANSIENT:
        return Retryable(detail, status=status)
    return Refused(detail, status=status)


# -- pagerduty --------------------------------------------------------------------------------


def pagerduty_event(n: Notification, routing_key: str) -> dict[str, Any]:
    """The Events API v2 body of ``n``: trigger, renotify and escalate are ``trigger`` events on
    the incident's ``dedup_key`` (PagerDuty adds them to the open alert); acknowledge and resolve
    carry only the key and the action."""
    if n.kind in ("acknowledge", "resolve"):
        return {"routing_key": routing_key, "event_action": n.kind, "dedup_key": n.incident_id}
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": n.incident_id,
        "payload": {
            "summary": n.title[:1024],
            "source": n.scope,
            "severity": n.severity.lower(),
            "timestamp": format_ts(n.at),
            "component": "aegis",
            "class": n.kind,
            "custom_details": {
                "incident_id": n.incident_id,
                "scope": n.scope,
                "level": n.level,
                "kind": n.kind,
                "text": n.text,
                "attempt_id": n.attempt_id,
            },
        },
        "links": [{"href": n.link, "text": "Open in the AEGIS dashboard"}],
        "client": "AEGIS",
        "client_url": n.link,
    }


class PagerDutyReceiver(JsonPoster):
    """PagerDuty Events API v2: 202 is taken, 429 and 5xx retried, 400 (a bad event or routing
    key) is final."""

    kind: str = "pagerduty"

    def __init__(
        self,
        name: str,
        routing_key: str,
        *,
        session: aiohttp.ClientSession,
        url: str = PAGERDUTY_URL,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        super().__init__(url, session, policy=policy, sleep=sleep, on_attempt=on_attempt)
        self.name = name
        self._routing_key = routing_key

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        body = json.dumps(pagerduty_event(n, self._routing_key)).encode()
        return await self._post(body, deadline, (self._routing_key,))


# -- sns --------------------------------------------------------------------------------------


class SnsPublisher(Protocol):
    """What a receiver needs of an aiobotocore SNS client."""

    async def publish(self, **kwargs: Any) -> Mapping[str, Any]: ...


SnsClients = Callable[[str], Awaitable[SnsPublisher]]
"""An open SNS client for a region (see :class:`SnsClientPool`)."""


class SnsClientPool:
    """SNS clients opened on first use, one per region, closed with the pool::

        async with SnsClientPool(settings.aws) as sns:
            receiver = build_receiver(name, config, session=session, sns_clients=sns)

    They are made as every AEGIS AWS client is (:func:`aegis_storage.clients.open_client`), but
    with no retries of botocore's own: a receiver's retries are :func:`deliver`'s, which keeps to
    the send's deadline."""

    def __init__(self, config: AwsConfig) -> None:
        self.config = config
        self._clients: dict[str, SnsPublisher] = {}
        self._stack = AsyncExitStack()
        self._lock = asyncio.Lock()

    async def __call__(self, region: str) -> SnsPublisher:
        async with self._lock:
            if region not in self._clients:
                cfg = replace(self.config, region=region, max_attempts=1)
                self._clients[region] = await self._stack.enter_async_context(
                    open_client("sns", cfg)
                )
            return self._clients[region]

    async def __aenter__(self) -> SnsClientPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._clients.clear()
        await self._stack.aclose()


def _ascii(text: str) -> str:
    """``text`` folded to printable ASCII on one line (accents dropped, other scripts removed)."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return " ".join("".join(c if c.isprintable() else " " for c in folded).split())


def sns_subject(title: str) -> str:
    """An SNS subject (e-mail): ASCII, one line, starting with a letter, digit or punctuation
    mark, under 100 characters."""
    subject = _ascii(f"[AEGIS] {title}")
    if len(subject) > SNS_SUBJECT_MAX:
        subject = subject[: SNS_SUBJECT_MAX - 3].rstrip() + "..."
    return subject


# typography of our titles that SMS's 7-bit alphabet lacks: one non-GSM character makes the
# whole message UCS-2, 70 characters a segment instead of 160
_SMS_PLAIN = str.maketrans(
    {
        "\u00b7": "-",  # middle dot
        "\u2014": "-",  # em dash
        "\u2013": "-",  # en dash
        "\u2026": "...",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
    }
)


def sms_text(n: Notification) -> str:
    """One SMS: 160 characters when ASCII, else 70 (one UCS-2 segment); the link when it fits."""
    short = f"AEGIS {LABEL[n.kind]}: {n.title}".translate(_SMS_PLAIN)
    limit = 160 if short.isascii() else 70
    with_link = f"{short} {n.link}"
    if len(with_link) <= limit:
        return with_link
    return short if len(short) <= limit else short[: limit - 3] + "..."


def email_text(n: Notification) -> str:
    return (
        f"{n.title}\n\n{n.text}\n\nOpen in the AEGIS dashboard: {n.link}\n\n"
        f"{LABEL[n.kind]} · incident {n.incident_id} · {n.scope} · {n.severity} · "
        f"level {n.level} · {format_ts(n.at)}\nnotification {n.attempt_id}\n"
    )


def sns_publish_request(topic_arn: str, n: Notification) -> dict[str, Any]:
    """The Publish arguments: e-mail (and any other protocol) the long text, SMS the short one;
    on a FIFO topic the notification's ``attempt_id`` deduplicates."""
    long = email_text(n)
    request: dict[str, Any] = {
        "TopicArn": topic_arn,
        "Subject": sns_subject(n.title),
        "MessageStructure": "json",
        "Message": json.dumps({"default": long, "email": long, "sms": sms_text(n)}),
        "MessageAttributes": {
            f"aegis.{key}": {"DataType": "String", "StringValue": value}
            for key, value in (
                ("incident_id", n.incident_id),
                ("scope", n.scope),
                ("severity", n.severity),
                ("kind", n.kind),
                ("attempt_id", n.attempt_id),
            )
        },
    }
    if topic_arn.endswith(".fifo"):
        request["MessageGroupId"] = n.incident_id
        request["MessageDeduplicationId"] = hashlib.sha256(n.attempt_id.encode()).hexdigest()
    return request


# botocore error codes that another attempt may change (throttling, AWS's own failures)
_SNS_TRANSIENT = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "KMSThrottling",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "RequestTimeout",
    }
)


class SnsReceiver(RetryingSender):
    """An AWS SNS topic (e-mail and SMS subscribers)."""

    kind: str = "sns"

    def __init__(
        self,
        name: str,
        topic_arn: str,
        *,
        clients: SnsClients,
        region: str | None = None,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        super().__init__(policy=policy, sleep=sleep, on_attempt=on_attempt)
        self.name = name
        self.topic_arn = topic_arn
        self.region = region or topic_arn.split(":")[3]
        self.clients = clients

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        request = sns_publish_request(self.topic_arn, n)

        async def attempt(within: float) -> Delivery:
            return await self._publish(request)

        return await self._deliver(attempt, deadline)

    async def _publish(self, request: dict[str, Any]) -> Delivery:
        try:
            client = await self.clients(self.region)
            with translated("SNS Publish"):
                answer = await client.publish(**request)
        except Transient as err:  # throttled, AWS's own failure, no connection or no answer
            raise Retryable(str(err)) from None
        except StorageError as err:
            if any(f": {code}" in str(err) for code in _SNS_TRANSIENT):
                raise Retryable(str(err)) from None
            raise Refused(str(err)) from None
        status = int(answer.get("ResponseMetadata", {}).get("HTTPStatusCode", 200))
        return Delivery(0, status, {"message_id": answer.get("MessageId")})


# -- webhook ----------------------------------------------------------------------------------


def webhook_document(n: Notification) -> dict[str, Any]:
    """The JSON a ``webhook`` receiver POSTs (``at``: ``YYYY-MM-DDTHH:MM:SS.mmmZ``)."""
    return {
        "incident_id": n.incident_id,
        "scope": n.scope,
        "severity": n.severity,
        "kind": n.kind,
        "level": n.level,
        "title": n.title,
        "text": n.text,
        "link": n.link,
        "at": format_ts(n.at),
        "attempt_id": n.attempt_id,
    }


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def sign_webhook(secret: str | bytes, timestamp: str, body: bytes) -> str:
    """``X-Aegis-Signature``: ``v1=`` and the hex HMAC-SHA256 of ``{timestamp}.{body}``."""
    mac = hmac.new(_key(secret), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def verify_webhook_signature(
    secret: str | bytes,
    timestamp: str,
    body: bytes,
    signature: str,
    now: float,
    *,
    tolerance_s: float = SIGNATURE_TOLERANCE_S,
) -> bool:
    """Whether a webhook request is ours and fresh: ``timestamp`` (``X-Aegis-Timestamp``, Unix
    seconds) within ``tolerance_s`` of ``now`` either way, and one of the ``v1=<hex>`` entries of
    ``signature`` (``X-Aegis-Signature``, comma-separated) the HMAC-SHA256 of ``{timestamp}.``
    followed by the raw body, compared in constant time. ``body`` must be the bytes as received,
    before any JSON parsing. A receiver that also remembers the ``X-Aegis-Delivery`` ids it saw
    within the window refuses replays and retries of a delivery it already acted on."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent_at) > tolerance_s:
        return False
    expected = sign_webhook(secret, timestamp, body)
    return any(
        hmac.compare_digest(expected.encode(), candidate.strip().encode())
        for candidate in signature.split(",")
    )


class WebhookReceiver(JsonPoster):
    """A generic HTTPS webhook: POSTs :func:`webhook_document` as JSON with ``X-Aegis-Timestamp``,
    ``X-Aegis-Signature`` (signed anew, with the current time, on every attempt) and
    ``X-Aegis-Delivery`` (the ``attempt_id``: the same on every retry)."""

    kind: str = "webhook"

    def __init__(
        self,
        name: str,
        url: str,
        secret: str,
        *,
        session: aiohttp.ClientSession,
        policy: RetryPolicy | None = None,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, session, policy=policy, sleep=sleep, on_attempt=on_attempt)
        self.name = name
        self.clock = clock
        self._secret = secret

    async def send(self, n: Notification, *, deadline: float | None = None) -> Delivery:
        body = json.dumps(webhook_document(n), separators=(",", ":"), ensure_ascii=False).encode()

        def headers() -> dict[str, str]:
            timestamp = str(int(self.clock()))
            return {
                "X-Aegis-Timestamp": timestamp,
                "X-Aegis-Signature": sign_webhook(self._secret, timestamp, body),
                "X-Aegis-Delivery": n.attempt_id,
            }

        return await self._post(body, deadline, (self._secret,), headers)


# -- configuration ----------------------------------------------------------------------------


class ReceiverConfigError(ValueError):
    """A receiver cannot be built from its configuration (a secret's variable is unset, …)."""


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: float = Field(
        default=10.0, gt=0, le=120, description="Seconds one attempt may take."
    )
    max_attempts: int = Field(
        default=5, ge=1, le=20, description="Attempts per notification (429 and 5xx retried)."
    )


EnvName = Annotated[str, Field(pattern=_ENV_NAME, description="An environment variable's name.")]


class SlackWebhookConfig(_Common):
    type: Literal["slack_webhook"] = "slack_webhook"
    url_env: EnvName


class SlackBotConfig(_Common):
    type: Literal["slack_bot"] = "slack_bot"
    token_env: EnvName
    channel: str = Field(min_length=1, description="A channel id (C0123…) or name.")
    base_url: str | None = Field(
        default=None, pattern=r"^https?://", description="Slack's Web API (tests: a stand-in)."
    )


class PagerDutyConfig(_Common):
    type: Literal["pagerduty"] = "pagerduty"
    routing_key_env: EnvName
    url: str = Field(default=PAGERDUTY_URL, pattern=r"^https?://")


class SnsConfig(_Common):
    type: Literal["sns"] = "sns"
    topic_arn: str = Field(
        pattern=r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}(\.fifo)?$"
    )
    region: str | None = Field(default=None, description="Unset: the topic ARN's region.")


class WebhookConfig(_Common):
    type: Literal["webhook"] = "webhook"
    url: str
    secret_env: EnvName

    @field_validator("url")
    @classmethod
    def _https(cls, value: str) -> str:
        """HTTPS, or plain HTTP to this machine only (a local receiver, tests)."""
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
            return value
        raise ValueError("a webhook URL must be https:// (http:// only to this machine)")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


ReceiverConfig = Annotated[
    SlackWebhookConfig | SlackBotConfig | PagerDutyConfig | SnsConfig | WebhookConfig,
    Field(discriminator="type"),
]
RECEIVER_CONFIG: TypeAdapter[ReceiverConfig] = TypeAdapter(ReceiverConfig)
"""Validates one ``[receivers.NAME]`` table (a raw dict) into its config model."""


def parse_receiver_config(raw: Mapping[str, Any]) -> ReceiverConfig:
    return RECEIVER_CONFIG.validate_python(dict(raw))


def _secret(name: str, env: Mapping[str, str], variable: str, what: str) -> str:
    value = env.get(variable, "").strip()
    if not value:
        raise ReceiverConfigError(
            f"receiver {name!r}: the environment variable {variable} (its {what}) is not set"
        )
    return value


def build_receiver(
    name: str,
    config: ReceiverConfig,
    *,
    session: aiohttp.ClientSession,
    sns_clients: SnsClients | None = None,
    env: Mapping[str, str] = os.environ,
    sleep: Sleep = asyncio.sleep,
    on_attempt: OnAttempt | None = None,
) -> Receiver:
    """The receiver ``config`` describes, its secret read from ``env``
    (:class:`ReceiverConfigError` naming the variable when it is unset). ``sns_clients`` (an
    :class:`SnsClientPool`) is needed for ``sns`` receivers only."""
    policy = RetryPolicy(max_attempts=config.max_attempts, timeout=config.timeout_s)
    common: dict[str, Any] = {"policy": policy, "sleep": sleep, "on_attempt": on_attempt}
    match config:
        case SlackWebhookConfig():
            url = _secret(name, env, config.url_env, "Slack webhook URL")
            webhook = SlackWebhook(
                url,
                session,
                max_attempts=policy.max_attempts,
                timeout=policy.timeout,
                sleep=sleep,
                on_attempt=on_attempt,
            )
            return SlackWebhookReceiver(name, webhook)
        case SlackBotConfig():
            token = _secret(name, env, config.token_env, "Slack bot token")
            return SlackBotReceiver(
                name, token, config.channel, session=session, base_url=config.base_url, **common
            )
        case PagerDutyConfig():
            key = _secret(name, env, config.routing_key_env, "PagerDuty routing key")
            return PagerDutyReceiver(name, key, session=session, url=config.url, **common)
        case SnsConfig():
            if sns_clients is None:
                raise ReceiverConfigError(f"receiver {name!r}: sns needs AWS clients (none given)")
            return SnsReceiver(
                name, config.topic_arn, clients=sns_clients, region=config.region, **common
            )
        case WebhookConfig():
            secret = _secret(name, env, config.secret_env, "webhook signing secret")
            return WebhookReceiver(name, config.url, secret, session=session, **common)
    raise AssertionError(f"unknown receiver config {config!r}")  # pragma: no cover
