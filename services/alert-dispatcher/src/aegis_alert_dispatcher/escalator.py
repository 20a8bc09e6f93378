"""The sweep over open incidents: escalation on time, reminders, fallback receivers, archiving.

Every replica runs it every ``AEGIS_ESCALATION_TICK_S``. It holds no timer of its own: what is due
is read from the incidents themselves (their level, when they were triggered and last notified,
what their policy says), so a replica killed while an escalation was pending loses nothing; the
next sweep of any replica finds it due.

One notification of an incident is sent once because it is claimed before it is sent: the claim
writes an **outbox** on the incident (the receivers, the level, an attempt id, the owner and a
short lease) on the version read, so of two replicas one wins and the other moves on. After the
sends, the outbox is cleared with a timeline line per receiver. An outbox whose lease is over,
or whose owner's heartbeat ran out (it died mid-send), is taken over and sent by whichever
replica sees it first; only a process killed during the post itself can make a receiver see one
notification twice.

Per incident, in order:

- resolved and not archived for ``archive_after``: its S3 record is written;
- an outbox: taken over when its lease is over, else left to its owner;
- acknowledged: nothing more (escalation stops, reminders end);
- a silence covers it: what would be sent now is held back and the incident marked silenced;
  once no silence covers it any more, the receivers of the levels it reached hear of it once;
- a receiver of a level it reached has not been sent it at all (the first message goes out
  with the snapshot through Slack, and the dispatcher asks for this step at the same moment,
  :meth:`Escalator.notify_now`, so a pager of level 0 hears of it then, not a sweep later);
- its last notification failed at every receiver tried since the last one delivered: the
  policy's fallback receivers at once (:func:`escalation.failover`), then the others; when every
  receiver of the policy has failed, all of them again with back-off (never parked);
- else the policy's next step when it is due: an escalation to the next level, or a level's
  reminder (``repeat``). Level 0 is the first message, sent by the snapshot that fired it.
  Before either, a factory's incident is checked against the factory's LATEST
  (``still_reported``): one whose reason is gone there (its resolve was never handled, and the
  snapshots after it are routine, read by nobody) is resolved from LATEST instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog

from aegis_alert_dispatcher import escalation
from aegis_alert_dispatcher.delivery import Undeliverable
from aegis_alert_dispatcher.escalation import EscalationConfig, StepKind
from aegis_alert_dispatcher.receivers import Notification, NotificationKind, Receiver
from aegis_alert_dispatcher.slack import dashboard_link, incident_headline, incident_payload
from aegis_contracts import incidents
from aegis_contracts.backoff import exponential_s
from aegis_contracts.items import Incident, IncidentOutbox
from aegis_contracts.silences import Silence, silenced_by
from aegis_contracts.times import Clock, format_ts
from aegis_storage.errors import Conflict
from aegis_storage.incidents import IncidentStore
from aegis_storage.silences import SilenceStore

log = structlog.get_logger(__name__)

DELIVERED = ("sent", "logged_only")
# the receivers' word for what an outbox sends (a fallback's or a silence's copy is a reminder)
NOTIFICATION_KIND: dict[str, NotificationKind] = {
    "escalate": "escalate",
    "acknowledge": "acknowledge",
}
# every receiver of a policy failed: all of them again after this, doubling, at most the cap
RETRY_FIRST = timedelta(seconds=15)
RETRY_CAP = timedelta(minutes=1)
# how often notify_now decides again on an incident that changed under its claim
NOTIFY_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class Swept:
    """What one sweep did to one incident (``outcome``: archived, escalate, renotify,
    failover, unsilenced, silenced, taken_over, claimed_elsewhere, no_longer_reported)."""

    incident_id: str
    outcome: str
    level: int = 0
    receivers: tuple[str, ...] = ()
    results: tuple[tuple[str, str], ...] = ()


def failed_since_delivered(incident: Incident) -> tuple[list[str], int, datetime | None]:
    """The receivers whose notifications failed since the last one delivered (in order), how
    many attempts that was, and when the last was."""
    failed: list[str] = []
    attempts = 0
    last: datetime | None = None
    for event in reversed(incident.timeline):
        if event.kind != "notified" or event.receiver is None:
            continue
        if event.outcome in DELIVERED:
            break
        attempts += 1
        last = last or event.at
        if event.receiver not in failed:
            failed.insert(0, event.receiver)
    return failed, attempts, last


OwnerDead = Callable[[str, datetime], Awaitable[bool]]


class Escalator:
    def __init__(
        self,
        *,
        store: IncidentStore,
        config: EscalationConfig,
        receivers: Mapping[str, Receiver | None],
        clock: Clock,
        dashboard_url: str,
        instance: str | None = None,
        lease: timedelta = timedelta(seconds=30),
        archive_after: timedelta = timedelta(minutes=2),
        on_swept: Callable[[Swept], None] | None = None,
        owner_dead: OwnerDead | None = None,
        first_receiver: str | None = "slack",
        still_reported: Callable[[Incident], Awaitable[bool]] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.receivers = receivers
        self.clock = clock
        self.dashboard_url = dashboard_url
        self.instance = instance or f"{socket.gethostname()}:0"
        self.lease = lease
        self.archive_after = archive_after
        self.on_swept = on_swept
        # whether a claim's owner has stopped (its heartbeat ran out): taken over before its lease
        self.owner_dead = owner_dead
        self.silences = SilenceStore(store.readmodel)
        # the receiver of the dispatcher's own first message (its Slack webhook): the others of
        # level 0 are this sweep's to tell, at once
        self.first_receiver = first_receiver
        # asked before an escalation or a reminder: is the reason still what its scope reports?
        # (False: it was resolved meanwhile, by the data, and nothing is sent)
        self.still_reported = still_reported

    async def sweep(self, members: Sequence[tuple[str, str]] | None = None) -> list[Swept]:
        """One pass over the open incidents (``members``: the index entries, when the caller
        read them already)."""
        now = self.clock()
        done: list[Swept] = []
        listed = await self.store.listed(now=now, members=members)
        silences = await self.silences.listed(now=now) if listed else []
        for incident in listed:
            swept = await self._one(incident, now, silences)
            if swept is not None:
                done.append(swept)
                self._report(swept)
        return done

    async def notify_now(self, incident_ids: Sequence[str]) -> list[Swept]:
        """The receivers of the levels these incidents reached that have not heard of them
        (:meth:`_unreached`), or the fallback when their last notification failed
        (:meth:`_failover`), now: the dispatcher calls it with the incidents a message fires, so
        the policy's other level-0 receivers hear of them at the same time as the message is
        posted, and again when that post failed, so the fallback hears of them at once, not at
        the next sweep. Everything else stays the sweep's."""
        now = self.clock()
        silences = await self.silences.listed(now=now)
        done: list[Swept] = []
        for incident_id in incident_ids:
            if (swept := await self._notify_one(incident_id, silences, now)) is not None:
                done.append(swept)
                self._report(swept)
        return done

    async def _notify_one(
        self, incident_id: str, silences: list[Silence], now: datetime
    ) -> Swept | None:
        """:meth:`notify_now` for one incident. It is called as the message is posted, so the
        incident often changes between the read and the claim (the dispatcher noting its own
        post): a claim refused for that is decided again on the incident as it is now; another
        replica's claim then shows as the incident's outbox, and is left to it."""
        swept: Swept | None = None
        for _ in range(NOTIFY_ATTEMPTS):
            incident = await self.store.get(incident_id)
            if incident is None or incident.state != "triggered" or incident.outbox is not None:
                return swept
            if silenced_by(silences, incidents.labels(incident), now):
                return swept  # held back: the dispatcher marked it, the sweep tells it when it ends
            policy = escalation.policy_for(self.config, incident.scope, incident.severity)
            outbox = self._failover(policy, incident, now) or self._unreached(policy, incident, now)
            if outbox is None:
                return swept
            swept = await self._claim(incident, outbox, now)
            if swept.outcome != "claimed_elsewhere":
                return swept
        return swept  # it kept changing: the next sweep decides

    def _report(self, swept: Swept) -> None:
        log.info(
            "incident_swept",
            incident_id=swept.incident_id,
            outcome=swept.outcome,
            level=swept.level,
            receivers=list(swept.receivers),
            results=dict(swept.results),
        )
        if self.on_swept:
            self.on_swept(swept)

    async def _one(
        self, incident: Incident, now: datetime, silences: list[Silence]
    ) -> Swept | None:
        if incident.state == "resolved":
            return await self._archive(incident, now)
        if incident.outbox is not None:
            return await self._take_over(incident, now)
        policy = escalation.policy_for(self.config, incident.scope, incident.severity)
        if incident.state == "acknowledged":
            told = self._acknowledgement(policy, incident, now)
            return None if told is None else await self._claim(incident, told, now)
        covering = silenced_by(silences, incidents.labels(incident), now)
        if incident.silenced_since is not None and not covering:
            outbox: IncidentOutbox | None = self._unsilenced(policy, incident, now)
        else:
            outbox = (
                self._failover(policy, incident, now)
                or self._unreached(policy, incident, now)
                or self._due(policy, incident, now)
            )
        if outbox is None:
            return None
        if covering:  # due, but a silence holds it back: recorded, not sent
            return await self._hold(incident, outbox, [s.id for s in covering], now)
        return await self._claim(incident, outbox, now)

    async def _hold(
        self, incident: Incident, outbox: IncidentOutbox, silence_ids: list[str], now: datetime
    ) -> Swept | None:
        if incident.silenced_since is not None:
            return None  # held back already
        held = incidents.silenced(incident, at=now, by=silence_ids)
        try:
            await self.store.save(held, incident)
        except Conflict:
            return Swept(incident.incident_id, "claimed_elsewhere", incident.level)
        return Swept(incident.incident_id, "silenced", incident.level, tuple(outbox.receivers))

    async def _claim(self, incident: Incident, outbox: IncidentOutbox, now: datetime) -> Swept:
        if (
            outbox.kind in ("escalate", "renotify")
            and self.still_reported is not None
            and not await self.still_reported(incident)
        ):
            return Swept(incident.incident_id, "no_longer_reported", incident.level)
        claimed = incident
        if outbox.kind == "escalate" or outbox.level > incident.level:
            detail = f"unacknowledged {self._minutes(incident, now)} min"
            claimed = incidents.escalated(incident, level=outbox.level, at=now, detail=detail)
        claimed = claimed.model_copy(update={"outbox": outbox, "version": incident.version + 1})
        try:
            await self.store.save(claimed, incident)
        except Conflict:  # another replica claimed it, or a person acknowledged it meanwhile
            return Swept(incident.incident_id, "claimed_elsewhere", incident.level)
        return await self._deliver(claimed, outbox.kind)

    async def _archive(self, incident: Incident, now: datetime) -> Swept | None:
        if incident.resolved_at is None or now - incident.resolved_at < self.archive_after:
            return None  # the dispatcher archives it itself once the RESOLVED message is settled
        await self.store.archive(incident.incident_id, now=now)
        return Swept(incident.incident_id, "archived", incident.level)

    @staticmethod
    def _minutes(incident: Incident, now: datetime) -> int:
        return int((now - incident.triggered_at).total_seconds() // 60)

    def _outbox(
        self, incident: Incident, kind: str, level: int, receivers: list[str], now: datetime
    ) -> IncidentOutbox:
        seed = f"{incident.incident_id}|{kind}|{level}|{incident.version}"
        return IncidentOutbox(
            attempt_id=hashlib.sha256(seed.encode()).hexdigest()[:16],
            kind=kind,
            level=level,
            receivers=receivers,
            owner=self.instance,
            lease_until=now + self.lease,
        )

    def _failover(
        self, policy: escalation.Policy, incident: Incident, now: datetime
    ) -> IncidentOutbox | None:
        failed, attempts, last = failed_since_delivered(incident)
        if not failed:
            return None
        others = escalation.failover(policy, failed=failed)
        if others:
            return self._outbox(incident, "failover", incident.level, others, now)
        # every receiver of the policy failed: all again, with back-off
        wait = timedelta(
            seconds=exponential_s(
                attempts - len(policy.receivers) + 1,
                first=RETRY_FIRST.total_seconds(),
                cap=RETRY_CAP.total_seconds(),
            )
        )
        if last is not None and now - last < wait:
            return None
        return self._outbox(incident, "failover", incident.level, list(policy.receivers), now)

    def _acknowledgement(
        self, policy: escalation.Policy, incident: Incident, now: datetime
    ) -> IncidentOutbox | None:
        """The receivers reached hear once that someone is on it (``ack_notify``); a Slack
        webhook is left out when the acknowledgement came from Slack (the message itself was
        updated there)."""
        if incident.ack_notified_at is not None or incident.notifications == 0:
            return None
        receivers = escalation.update_receivers(
            policy, level_reached=incident.level, update=escalation.Update.ACKNOWLEDGED
        )
        if incident.acknowledged_via == "slack":
            receivers = [
                name
                for name in receivers
                if getattr(self.receivers.get(name), "kind", "") != "slack_webhook"
            ]
        if not receivers:
            return None
        return self._outbox(incident, "acknowledge", incident.level, receivers, now)

    def _unreached(
        self, policy: escalation.Policy, incident: Incident, now: datetime
    ) -> IncidentOutbox | None:
        """Receivers of the levels reached that have not been sent this incident at all: the
        first message goes out through the dispatcher's own Slack sender with the snapshot; the
        other receivers of level 0 (a pager) at the same time (:meth:`notify_now`), or from the
        next sweep when that did not happen."""
        tried = {e.receiver for e in incident.timeline if e.kind == "notified" and e.receiver}
        if incident.notifications == 0 and self.first_receiver is not None:
            tried.add(self.first_receiver)  # the first message is on its way there
        reached = policy.levels[: min(incident.level, len(policy.levels) - 1) + 1]
        missing = [
            name
            for name in dict.fromkeys(r for level in reached for r in level.receivers)
            if name not in tried
        ]
        if not missing:
            return None
        return self._outbox(incident, "failover", incident.level, missing, now)

    def _unsilenced(
        self, policy: escalation.Policy, incident: Incident, now: datetime
    ) -> IncidentOutbox:
        """A silence held a notification back and covers it no more: the receivers of every
        level it has reached, or is due to reach by now, hear of it once (not the level it
        had, then at once the escalation the silence held back)."""
        due = escalation.due_levels(
            policy, triggered_at=incident.triggered_at, level_reached=incident.level, now=now
        )
        target = max(incident.level, *due) if due else incident.level
        reached = policy.levels[: min(target, len(policy.levels) - 1) + 1]
        receivers = list(dict.fromkeys(r for level in reached for r in level.receivers))
        return self._outbox(incident, "unsilenced", target, receivers, now)

    def _due(
        self, policy: escalation.Policy, incident: Incident, now: datetime
    ) -> IncidentOutbox | None:
        step = escalation.next_step(
            policy,
            triggered_at=incident.triggered_at,
            level_reached=incident.level,
            last_notified_at=incident.last_notified_at,
            acknowledged=False,
            resolved=False,
            now=now,
        )
        if step is None or step.due_at > now or step.kind is StepKind.NOTIFY:
            return None
        kind = "escalate" if step.kind is StepKind.ESCALATE else "renotify"
        return self._outbox(incident, kind, step.level, list(step.receivers), now)

    async def _take_over(self, incident: Incident, now: datetime) -> Swept | None:
        outbox = incident.outbox
        assert outbox is not None
        if outbox.lease_until > now and not (
            self.owner_dead is not None and await self.owner_dead(outbox.owner, now)
        ):
            return None
        taken = incident.model_copy(
            update={
                "version": incident.version + 1,
                "outbox": outbox.model_copy(
                    update={"owner": self.instance, "lease_until": now + self.lease}
                ),
            }
        )
        try:
            await self.store.save(taken, incident)
        except Conflict:
            return Swept(incident.incident_id, "claimed_elsewhere", incident.level)
        log.warning(
            "incident_notification_taken_over",
            incident_id=incident.incident_id,
            previous_owner=outbox.owner,
            attempt_id=outbox.attempt_id,
        )
        swept = await self._deliver(taken, outbox.kind)
        return Swept(swept.incident_id, "taken_over", swept.level, swept.receivers, swept.results)

    def _notification(
        self, incident: Incident, outbox: IncidentOutbox, now: datetime
    ) -> Notification:
        minutes = self._minutes(incident, now)
        acked = incident.acknowledged_by if outbox.kind == "acknowledge" else None
        headline = incident_headline(
            kind=outbox.kind,
            level=outbox.level,
            severity=incident.severity,
            scope=incident.scope,
            reason=incident.reason,
        )
        return Notification(
            incident_id=incident.incident_id,
            scope=incident.scope,
            severity=incident.severity,
            kind=NOTIFICATION_KIND.get(outbox.kind, "renotify"),
            level=outbox.level,
            title=f"AEGIS {headline}",
            text=(
                f"Triggered {format_ts(incident.triggered_at)}, acknowledged by {acked}. "
                if acked
                else f"Triggered {format_ts(incident.triggered_at)}, unacknowledged for "
                f"{minutes} min. "
            )
            + incident.detail,
            slack_payload=incident_payload(
                incident_id=incident.incident_id,
                kind=outbox.kind,
                level=outbox.level,
                severity=incident.severity,
                scope=incident.scope,
                reason=incident.reason,
                triggered_at=incident.triggered_at,
                now=now,
                detail=incident.detail,
                dashboard_url=self.dashboard_url,
                acknowledged_by=acked,
            ),
            link=dashboard_link(self.dashboard_url, incident.scope),
            attempt_id=outbox.attempt_id,
            at=now,
        )

    async def _deliver(self, incident: Incident, kind: str) -> Swept:
        """Send the incident's outbox to each of its receivers, then clear it with a timeline
        line per receiver (only if it is still this outbox)."""
        outbox = incident.outbox
        assert outbox is not None
        now = self.clock()
        notification = self._notification(incident, outbox, now)
        loop = asyncio.get_running_loop()
        left = (outbox.lease_until - now).total_seconds()
        deadline = loop.time() + left - min(5.0, left * 0.2)
        results: list[tuple[str, str, str]] = []
        for name in outbox.receivers:
            receiver = self.receivers.get(name)
            if receiver is None:
                log.warning("incident_not_sent_no_receiver", receiver=name, text=notification.title)
                results.append((name, "logged_only", "receiver not configured: logged only"))
                continue
            try:
                await receiver.send(notification, deadline=deadline)
            except Undeliverable as err:
                results.append((name, "undeliverable", err.detail))
            else:
                results.append((name, "sent", ""))
        done = self.clock()

        def settle(current: Incident) -> Incident | None:
            if current.outbox is None or current.outbox.attempt_id != outbox.attempt_id:
                return None  # settled already (a takeover that finished first)
            new = current
            for name, outcome, detail in results:
                new = incidents.notified(
                    new,
                    at=done,
                    receiver=name,
                    outcome=outcome,
                    detail=f"{kind} level {outbox.level}" + (f": {detail}" if detail else ""),
                )
            cleared: dict[str, Any] = {"outbox": None}
            if outbox.kind == "acknowledge":
                cleared["ack_notified_at"] = done
            return new.model_copy(update=cleared)

        await self.store.change(incident.incident_id, settle)
        return Swept(
            incident.incident_id,
            kind,
            outbox.level,
            tuple(outbox.receivers),
            tuple((name, outcome) for name, outcome, _ in results),
        )
