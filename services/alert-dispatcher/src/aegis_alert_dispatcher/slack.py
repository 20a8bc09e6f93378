"""Slack: the Block Kit message of an alert (pure) and the incoming-webhook sender (aiohttp).

The sender retries 429 and 5xx answers and network errors with exponential backoff and full
jitter, waiting at least what ``Retry-After`` asks; other 4xx answers are permanent (a revoked or
mistyped webhook). After the last attempt it raises :class:`Undeliverable`, and the caller
dead-letters the alert with everything needed to send it again. The retry loop is the one every
receiver shares (:mod:`aegis_alert_dispatcher.delivery`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp

from aegis_alert_dispatcher.decide import Action, Stream
from aegis_alert_dispatcher.delivery import (
    Delivery,
    JsonPoster,
    OnAttempt,
    RetryPolicy,
    Sleep,
    Undeliverable,
)
from aegis_contracts.keys import CLOUD_INFRA_TARGET
from aegis_contracts.state import Reason
from aegis_contracts.times import KST

ICON = {
    "CRITICAL": ":red_circle:",
    "WARNING": ":large_orange_circle:",
    "RESOLVED": ":white_check_mark:",
}
TITLE = {
    Action.FIRE: "{severity}",
    Action.ESCALATE: "{severity} (escalated from WARNING)",
    Action.RESOLVE: "RESOLVED",
}
MAX_REASONS = 10
# Block Kit: an actions block holds at most 25 elements; the dashboard link is one of them
MAX_ACK_BUTTONS = 20
ACTIONS_BLOCK = "aegis_actions"
ACK_ACTION = "aegis_ack"
OPEN_ACTION = "aegis_open"

# the outcome types live with the retry loop every receiver shares; importable from here as before
__all__ = [
    "ICON",
    "MAX_REASONS",
    "TITLE",
    "AlertEntry",
    "AlertMessage",
    "Delivery",
    "SlackWebhook",
    "Undeliverable",
    "dashboard_link",
    "reason_line",
]


def _escape(text: str) -> str:
    """Slack mrkdwn control characters (``&``, ``<``, ``>``) as entities."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _number(value: float) -> str:
    return f"{value:g}"


def dashboard_link(base: str, scope: str) -> str:
    base = base.rstrip("/")
    return f"{base}/cloud" if scope == CLOUD_INFRA_TARGET else f"{base}/factories/{scope}"


def reason_line(reason: Reason) -> str:
    line = f"• *{reason.code}* ({reason.severity}): {_escape(reason.detail)}"
    if reason.value is not None:
        measured = f"measured {_number(reason.value)}"
        if reason.threshold is not None:
            measured += f", threshold {_number(reason.threshold)}"
        line += f" — {measured}"
    if reason.source:
        line += f" `{_escape(reason.source)}`"
    return line


@dataclass(frozen=True, slots=True)
class AlertEntry:
    """One alert of a message: what happens to it and the snapshot's reasons behind it."""

    action: Action
    severity: str
    code: str
    reasons: tuple[Reason, ...] = ()
    # the incident it speaks for: its Acknowledge button names it
    incident_id: str | None = None

    @property
    def rank(self) -> tuple[bool, bool, str]:
        # firing before resolved, CRITICAL before WARNING, then by code
        return (self.action is Action.RESOLVE, self.severity != "CRITICAL", self.code)


@dataclass(frozen=True, slots=True)
class AlertMessage:
    """The one Slack message of one decision for one scope: every alert it fires, escalates or
    resolves (as Alertmanager groups a notification), the worst first. ``attempt_id`` names the
    decision, so two copies of one message (possible only after a crash mid-post) are recognisable."""

    scope: str
    stream: Stream
    snapshot_at: datetime
    entries: tuple[AlertEntry, ...]
    attempt_id: str = ""

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a message needs at least one alert")
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: e.rank)))

    @property
    def lead(self) -> AlertEntry:
        return self.entries[0]

    @property
    def headline(self) -> str:
        lead = self.lead
        what = TITLE.get(lead.action, "{severity}").format(severity=lead.severity)
        target = "cloud infrastructure" if self.scope == CLOUD_INFRA_TARGET else self.scope
        return f"{what} · {target} · {', '.join(e.code for e in self.entries)}"

    def _body(self) -> str:
        lines: list[str] = []
        for entry in self.entries:
            if entry.action is Action.RESOLVE:
                lines.append(f"*{entry.code}* ({entry.severity}) is no longer reported.")
                continue
            lines.extend(reason_line(r) for r in entry.reasons[:MAX_REASONS])
            if len(entry.reasons) > MAX_REASONS:
                lines.append(f"… and {len(entry.reasons) - MAX_REASONS} more")
            if not entry.reasons:
                lines.append(f"*{entry.code}*")
        return "\n".join(lines)

    def _ack_buttons(self) -> list[dict[str, Any]]:
        """One Acknowledge button per incident still firing in the message (Slack sends the
        click, signed, to the dashboard's ``/slack/interactions``)."""
        seen: list[AlertEntry] = []
        for entry in self.entries:
            if entry.action is Action.RESOLVE or not entry.incident_id:
                continue
            if any(e.incident_id == entry.incident_id for e in seen):
                continue
            seen.append(entry)
        many = len(seen) > 1
        return [
            {
                "type": "button",
                "text": {
                    "type": "plain_text",
                    "text": f"Acknowledge {e.code}"[:75] if many else "Acknowledge",
                },
                "style": "primary",
                "action_id": f"{ACK_ACTION}:{e.incident_id}",
                "value": e.incident_id,
            }
            for e in seen[:MAX_ACK_BUTTONS]
        ]

    def payload(self, dashboard_url: str) -> dict[str, Any]:
        """The webhook body: Block Kit blocks, and ``text`` for notifications and old clients."""
        lead = self.lead
        resolved = lead.action is Action.RESOLVE  # the worst is a recovery: all of them are
        icon = ICON["RESOLVED" if resolved else lead.severity]
        utc = self.snapshot_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        kst = self.snapshot_at.astimezone(KST).strftime("%Y-%m-%d %H:%M:%S KST")
        link = dashboard_link(dashboard_url, self.scope)
        scope_label = "Scope" if self.scope == CLOUD_INFRA_TARGET else "Factory"
        keys = ", ".join(f"`{e.severity}#{e.code}#{self.stream.value}`" for e in self.entries)
        context = f"{self.stream.value.lower()} stream · alert key{'s' * (len(self.entries) > 1)} "
        context += keys + (f" · alert id `{self.attempt_id}`" if self.attempt_id else "")
        return {
            "text": f"{icon} AEGIS {self.headline} at {kst}",
            "blocks": [
                {
                    "type": "header",
                    "text": {"type": "plain_text", "text": f"AEGIS {self.headline}"[:150]},
                },
                {
                    "type": "section",
                    "fields": [
                        {"type": "mrkdwn", "text": f"*{scope_label}*\n{_escape(self.scope)}"},
                        {
                            "type": "mrkdwn",
                            "text": f"*Severity*\n{icon} {lead.severity}"
                            + (" (resolved)" if resolved else ""),
                        },
                        {"type": "mrkdwn", "text": f"*Time (KST)*\n{kst}"},
                        {"type": "mrkdwn", "text": f"*Time (UTC)*\n{utc}"},
                    ],
                },
                {"type": "section", "text": {"type": "mrkdwn", "text": self._body()[:3000]}},
                {
                    "type": "actions",
                    "block_id": ACTIONS_BLOCK,
                    "elements": [
                        *self._ack_buttons(),
                        {
                            "type": "button",
                            "text": {"type": "plain_text", "text": "Open in the AEGIS dashboard"},
                            "url": link,
                            "action_id": OPEN_ACTION,
                        },
                    ],
                },
                {"type": "context", "elements": [{"type": "mrkdwn", "text": context[:3000]}]},
            ],
        }


class SlackWebhook(JsonPoster):
    """A Slack incoming webhook: ``send`` POSTs a Block Kit payload, retried as
    :func:`~aegis_alert_dispatcher.delivery.deliver` does."""

    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        *,
        max_attempts: int = 5,
        first_delay: float = 0.5,
        max_delay: float = 30.0,
        max_retry_after: float = 120.0,
        timeout: float = 10.0,
        sleep: Sleep = asyncio.sleep,
        on_attempt: OnAttempt | None = None,
    ) -> None:
        policy = RetryPolicy(
            max_attempts=max_attempts,
            first_delay=first_delay,
            max_delay=max_delay,
            max_retry_after=max_retry_after,
            timeout=timeout,
        )
        super().__init__(url, session, policy=policy, sleep=sleep, on_attempt=on_attempt)

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, first * 2^(attempt-1))]."""
        return self.policy.backoff(attempt)

    async def send(self, payload: dict[str, Any], *, deadline: float | None = None) -> Delivery:
        """POST ``payload`` until Slack takes it. ``deadline`` (``loop.time()``): no attempt runs
        past it, so whoever holds the alert's lease is done before another may take it over. The
        webhook's URL is its secret: it never shows in an error."""
        return await self._post(json.dumps(payload).encode(), deadline, (self.url,))


INCIDENT_TITLE = {
    "escalate": "ESCALATED to level {level} · {severity}",
    "renotify": "STILL {severity}, unacknowledged",
    "failover": "{severity}",
    "unsilenced": "{severity}, still firing after a silence",
    "acknowledge": "ACKNOWLEDGED · {severity}",
}


def incident_headline(*, kind: str, level: int, severity: str, scope: str, reason: str) -> str:
    what = INCIDENT_TITLE.get(kind, "{severity}").format(level=level, severity=severity)
    target = "cloud infrastructure" if scope == CLOUD_INFRA_TARGET else scope
    return f"{what} · {target} · {reason}"


def incident_payload(
    *,
    incident_id: str,
    kind: str,
    level: int,
    severity: str,
    scope: str,
    reason: str,
    triggered_at: datetime,
    now: datetime,
    detail: str,
    dashboard_url: str,
    acknowledged_by: str | None = None,
) -> dict[str, Any]:
    """The Block Kit message of an incident's later notification (an escalation, a reminder, a
    fallback receiver's copy): how long it has been unacknowledged, its Acknowledge button."""
    headline = incident_headline(
        kind=kind, level=level, severity=severity, scope=scope, reason=reason
    )
    icon = ICON.get(severity, ICON["WARNING"])
    kst = triggered_at.astimezone(KST).strftime("%Y-%m-%d %H:%M:%S KST")
    minutes = max(0, int((now - triggered_at).total_seconds() // 60))
    if acknowledged_by:
        body = f"Triggered {kst}, *acknowledged by {_escape(acknowledged_by)}* after {minutes} min."
    else:
        body = f"Triggered {kst}, *unacknowledged for {minutes} min*."
    if detail:
        body += f"\n{_escape(detail)}"
    ack_button: list[dict[str, Any]] = (
        []
        if acknowledged_by
        else [
            {
                "type": "button",
                "text": {"type": "plain_text", "text": "Acknowledge"},
                "style": "primary",
                "action_id": f"{ACK_ACTION}:{incident_id}",
                "value": incident_id,
            }
        ]
    )
    return {
        "text": f"{icon} AEGIS {headline}",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": f"AEGIS {headline}"[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": body[:3000]}},
            {
                "type": "actions",
                "block_id": ACTIONS_BLOCK,
                "elements": [
                    *ack_button,
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "Open in the AEGIS dashboard"},
                        "url": dashboard_link(dashboard_url, scope),
                        "action_id": OPEN_ACTION,
                    },
                ],
            },
            {
                "type": "context",
                "elements": [
                    {"type": "mrkdwn", "text": f"incident `{incident_id}` · level {level}"}
                ],
            },
        ],
    }
