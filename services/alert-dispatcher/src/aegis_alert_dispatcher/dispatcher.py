"""One ObjectCreated event -> the alerts it causes (the I/O around :mod:`decide`).

1. Only keys under the trigger prefixes count (default: ``processed/*/state_snapshot/``,
   ``processed/cloud_infra/fast/``, ``processed/cloud_infra/slow/``); others are ignored.
2. The snapshot's scope (factory or ``cloud-infra``), stream, time and reasons: from the event
   when the processor carried them (``alert``), else read from S3. A state snapshot with no
   reason whose predecessor had none (routine traffic, most events) stops here: counted as
   ``routine``, no request made, so a change of level never waits behind routine snapshots.
3. The scope's ALERT# items are read in one query. A snapshot older than the stream's cursor
   (``CURSOR#{stream}``) is stale and ignored; otherwise the cursor moves to it (conditionally).
4. :func:`decide` says what to do. Everything one decision sends (fire, escalate, resolve) goes
   out as ONE Slack message listing every alert in it, worst first.
5. Recorded intent. Before posting, one DynamoDB transaction writes the message's intent
   (``INTENT#{stream}#{snapshot_at}``, state ``sending``, with the Slack body, a stable attempt id,
   an owner and a lease) and marks each alert ``pending`` on the version read: N replicas write
   it once, and a failure writes nothing. Then the post, then a second transaction confirms it
   (intent ``sent``; each alert's ``last_sent_at``/``sent_count``: cooldown counts confirmed sends
   only). If Slack cannot be reached within the retries and the lease, the message goes to
   ``aegis.dlq.alert-dispatcher.undeliverable`` (``aegis alerts resend``); the alerts it fired
   are released, so a later snapshot still reporting them tries again, and those it resolved
   stay resolved.
6. The service posts beside the handler (``post_in_background``): the event is settled once its
   intent is recorded, so a Slack that is slow or refusing holds back no other event (another
   scope's fire). An intent left ``sending`` (a crash, a DynamoDB error, a kill) is completed by
   any replica's sweep once its owner's heartbeat or its lease has run out, by the next handler
   of that scope and stream that finds its lease over, or by a redelivery of the very message
   that recorded it: it posts the recorded body and confirms. A post in progress is not
   abandoned when the service stops: the stop waits for the post and its confirmation.
7. Every decision is logged with its reason and counted; a sent alert is announced as a system
   event (``aegis.events.alert_sent``) for the orchestrator.
8. Incidents. Each reason that fires opens an incident (``INCIDENT#{id}``), written in the same
   transaction as the message's intent; WARNING -> CRITICAL raises it; a RESOLVE resolves it.
   Each settled message is a line of its incidents' timelines; a resolved incident's record is
   then written to S3 once. While an incident is open, a reason still firing after its cooldown
   sends nothing of its own: an acknowledged incident needs no reminder, and an open one gets
   its reminders from its escalation policy (:mod:`aegis_alert_dispatcher.escalator`).
9. Silences. Before a message is recorded, the silences covering its incidents are read (at most
   every few seconds): what they cover is recorded without a message (the incident marked
   silenced, the alert's cooldown running) and notified by the sweep once they end.
10. A post that fails while the incident's policy has another receiver is not dead-lettered: its
   alerts count as notified and the sweep hands the incident to the fallback receiver at once.
   Each replica says it is alive (:meth:`Dispatcher.heartbeat`); the sweep finishes the message
   of a replica that stopped saying so (:meth:`Dispatcher.complete_abandoned`), long before the
   message's lease would let a handler of its scope take it over.

Guarantee: every decided message is confirmed once or dead-lettered. Slack's incoming webhook has
no idempotency key, so delivery to Slack is at-least-once: a second copy (same attempt id, shown in
the message) is possible only if the process dies, or DynamoDB stays unwritable through the confirm
retries, after Slack took the post and before the confirmation was written. A cancelled handler
does not open that window; a SIGKILL during the post does, for the length of one post.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import hashlib
import json
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import anyio
import pydantic
import structlog

from aegis_alert_dispatcher.decide import (
    Action,
    AlertKey,
    Decision,
    Policy,
    Severity,
    Stream,
    decide,
)
from aegis_alert_dispatcher.escalation import EscalationConfig, dead_lettered, policy_for
from aegis_alert_dispatcher.slack import AlertEntry, AlertMessage, Delivery, Undeliverable
from aegis_contracts import incidents, keys, msgids
from aegis_contracts.backoff import exponential_s
from aegis_contracts.cloud import CloudSnapshot
from aegis_contracts.errors import ContractError
from aegis_contracts.events import AlertBasis, ObjectCreated
from aegis_contracts.items import (
    AlertCursor,
    AlertIntent,
    AlertObservation,
    AlertState,
    Incident,
    IntentAlert,
)
from aegis_contracts.keys import KeyFamily
from aegis_contracts.silences import Silence, silenced_by
from aegis_contracts.state import Reason
from aegis_contracts.times import Clock, format_ts, parse_ts
from aegis_contracts.ttl import TtlSettings
from aegis_runtime.bus import current_message, delivery
from aegis_storage.errors import Conflict, NotFound, StorageError, Transient
from aegis_storage.incidents import IncidentStore
from aegis_storage.items import Items, Put
from aegis_storage.objects import Objects
from aegis_storage.silences import SilenceStore

log = structlog.get_logger(__name__)

DEFAULT_TRIGGERS = (
    "processed/*/state_snapshot/",
    "processed/cloud_infra/fast/",
    "processed/cloud_infra/slow/",
)
SERVICE = "alert-dispatcher"
# concurrent snapshots of one stream racing to move its cursor (a handful at most)
CURSOR_ATTEMPTS = 20
UNDELIVERABLE = "undeliverable"
# a post that failed while the policy has another receiver: the sweep fails over to it
FAILING_OVER = "failing_over"


def triggered(key: str, patterns: Sequence[str]) -> bool:
    """``key`` lies under one of ``patterns``: prefixes whose ``*`` matches one path segment."""
    parts = key.split("/")
    for pattern in patterns:
        wanted = pattern.rstrip("/").split("/")
        if len(parts) > len(wanted) and all(
            fnmatch.fnmatchcase(part, want) for part, want in zip(parts, wanted, strict=False)
        ):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Snapshot:
    scope: str
    stream: Stream
    at: datetime
    reasons: tuple[Reason, ...]


def snapshot_of(key: str, basis: AlertBasis) -> Snapshot | None:
    """A state snapshot as its ObjectCreated describes it (no read); None for an event whose
    key is not a state snapshot's (it is read instead)."""
    info = keys.parse_key(key)
    if info.family is not KeyFamily.STATE_SNAPSHOT or info.factory_id is None:
        return None
    return Snapshot(info.factory_id, Stream.STATE, basis.at, tuple(basis.reasons))


def read_snapshot(key: str, body: Any) -> Snapshot:
    """The scope, stream, time and reasons of a state or cloud snapshot object."""
    info = keys.parse_key(key)
    if not isinstance(body, dict):
        raise ContractError("schema_violation", "a snapshot must be a JSON object")
    try:
        if info.family is KeyFamily.STATE_SNAPSHOT:
            assert info.factory_id is not None
            risk = body.get("risk") or {}
            reasons = tuple(Reason.model_validate(r) for r in risk.get("reasons") or [])
            return Snapshot(
                info.factory_id, Stream.STATE, parse_ts(str(body["updated_at"])), reasons
            )
        if info.family is KeyFamily.CLOUD_INFRA:
            cloud = CloudSnapshot.model_validate(body)
            return Snapshot(
                keys.CLOUD_INFRA_TARGET,
                Stream(cloud.tier.upper()),
                cloud.updated_at,
                tuple(cloud.reasons),
            )
    except (pydantic.ValidationError, KeyError, ValueError) as err:
        raise ContractError("schema_violation", f"snapshot {key}: {err}") from None
    raise ContractError("not_a_snapshot", f"{key} is not a state or cloud snapshot")


class Sender(Protocol):
    async def send(self, payload: dict[str, Any], *, deadline: float | None = None) -> Delivery: ...


@dataclass(frozen=True, slots=True)
class Result:
    """What happened to one decision (``outcome``: sent, suppressed_cooldown, waiting_observations,
    in_flight, downgraded, claimed_elsewhere, undeliverable, logged_only; ``completed_sent`` and
    the like for an intent an earlier handler left) or to the whole snapshot (stale, ignored,
    replayed)."""

    outcome: str
    action: Action | None = None
    severity: str | None = None
    code: str | None = None
    why: str = ""


DeadLetterFn = Callable[[dict[str, Any], str, str], Awaitable[None]]
SystemEventFn = Callable[[dict[str, Any], str], Awaitable[None]]


class AlertBusy(Exception):
    """The decision would change an alert whose message another handler is still sending: the
    message is retried (nacked with a delay), and its last delivery is held back until
    ``retry_after_s``, when that send's lease is over (it is confirmed by then, or the retry
    takes it over), so a slow Slack never uses up the queue's redeliveries."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


# a message held back by a send in progress is retried at least this long after, and that long
# after the send's lease is over
BUSY_MIN_RETRY_S = 1.0
# the confirmation after a post: retried this often on DynamoDB errors (a redelivery would post
# the message again, so it is worth a few seconds)
CONFIRM_ATTEMPTS = 6
CONFIRM_FIRST_DELAY = 0.05
# a message whose incidents a person changes while it is being recorded is decided again this
# many times before the event is retried
SEND_ATTEMPTS = 5
SILENCES_CACHE_S = 5.0
QUIET_RESOLVE = "its policy does not tell of resolutions (resolve_notify = false)"
# a settled intent is kept this long (a duplicate of its snapshot finds it), not the alert TTL
SETTLED_INTENT_KEPT = timedelta(hours=1)


def attempt_id(scope: str, stream: Stream, at: datetime) -> str:
    """The stable id of one decision's message: the same on every replica and redelivery."""
    digest = hashlib.sha256(f"{scope}|{stream.value}|{format_ts(at)}".encode())
    return digest.hexdigest()[:16]


def instance_name() -> str:
    """This process, as an intent's owner shows it (host and pid)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Dispatcher:
    def __init__(
        self,
        *,
        store: Objects,
        readmodel: Items,
        sender: Sender | None,
        dead_letter: DeadLetterFn,
        announce: SystemEventFn,
        policy: Policy,
        ttl: TtlSettings,
        dashboard_url: str,
        clock: Clock,
        triggers: Sequence[str] = DEFAULT_TRIGGERS,
        on_result: Callable[[Result], None] | None = None,
        lease: timedelta = timedelta(seconds=120),
        instance: str | None = None,
        incident_store: IncidentStore | None = None,
        receiver_name: str = "slack",
        alive_for: timedelta = timedelta(seconds=8),
        escalation: EscalationConfig | None = None,
        alongside: Callable[[Sequence[str]], Coroutine[Any, Any, object]] | None = None,
        post_in_background: bool = False,
    ) -> None:
        self.store = store
        self.readmodel = readmodel
        self.sender = sender
        self.dead_letter = dead_letter
        self.announce = announce
        self.policy = policy
        self.ttl = ttl
        self.dashboard_url = dashboard_url
        self.clock = clock
        self.triggers = tuple(triggers)
        self.on_result = on_result
        self.lease = lease
        self.instance = instance or instance_name()
        self.incidents = incident_store or IncidentStore(readmodel, store)
        # read only when a notification is about to go out; a new silence counts within seconds
        self.silences = SilenceStore(readmodel, cache_s=SILENCES_CACHE_S)
        self.receiver_name = receiver_name
        self.alive_for = alive_for
        # the policies: which failed posts another receiver takes (None: every one dead-lettered)
        self.escalation = escalation
        # the policies' other receivers of the incidents a message fires, told at the same time
        # as the message is posted (the sweep's claim makes it once across replicas)
        self.alongside = alongside
        # the service posts beside its handlers (a slow Slack holds back no other event); called
        # directly (tests, tools), a handler returns once its message is settled
        self.post_in_background = post_in_background
        self._alongside: set[asyncio.Task[object]] = set()
        # posts (and their confirmations) in progress: they outlive a cancelled handler
        self._settling: set[asyncio.Task[tuple[str, str]]] = set()
        # handlers cancelled (a shutdown) while their post was in progress, which it outlived
        self.sends_outliving_cancel = 0

    def _record(self, result: Result, snapshot: Snapshot | None = None, **context: Any) -> Result:
        if snapshot is not None:
            context |= {
                "scope": snapshot.scope,
                "stream": snapshot.stream.value,
                "snapshot_at": format_ts(snapshot.at),
            }
        log.info(
            "alert_decision",
            outcome=result.outcome,
            action=result.action.value if result.action else None,
            severity=result.severity,
            reason=result.code,
            why=result.why,
            **context,
        )
        if self.on_result:
            self.on_result(result)
        return result

    async def handle(self, event: ObjectCreated) -> list[Result]:
        if not triggered(event.key, self.triggers):
            return [Result("ignored", why="not under a trigger prefix")]  # not logged: most events
        if event.replayed:  # ``aegis replay`` without --notify: history, not news
            why = "made by a replayed message (aegis replay without --notify)"
            return [self._record(Result("replayed", why=why), key=event.key)]
        basis = event.alert
        snapshot = None if basis is None else snapshot_of(event.key, basis)
        if snapshot is not None and basis is not None and basis.routine:
            # most of the traffic: counted, not logged, nothing read
            result = Result("routine", why="no reason now and none before")
            if self.on_result:
                self.on_result(result)
            return [result]
        if snapshot is None:
            try:
                body = await self.store.get_json(event.key)
            except NotFound:
                why = "object no longer exists"
                return [self._record(Result("ignored", why=why), key=event.key)]
            snapshot = read_snapshot(event.key, body)
        return await self.handle_snapshot(snapshot, key=event.key)

    async def handle_snapshot(self, snapshot: Snapshot, *, key: str = "") -> list[Result]:
        now = self.clock()
        pk = keys.alert_pk(snapshot.scope)
        states, observations, cursor, intents = _split(
            await self.readmodel.partition(pk, now=now), snapshot.stream
        )
        if cursor is not None and cursor.last_snapshot_at > snapshot.at:
            why = f"older than {format_ts(cursor.last_snapshot_at)}, the newest handled"
            return [self._record(Result("stale", why=why), snapshot, key=key)]
        if not await self._advance_cursor(snapshot, cursor):
            return [
                self._record(
                    Result("stale", why="a newer snapshot was handled meanwhile"), snapshot, key=key
                )
            ]
        results = [
            self._record(r, snapshot, key=key) for r in await self._complete(intents, now=now)
        ]
        if results:  # the alerts changed: decide on what they are now
            states, observations, _, _ = _split(
                await self.readmodel.partition(pk, now=now), snapshot.stream
            )

        outcome = decide(
            stream=snapshot.stream,
            snapshot_at=snapshot.at,
            reasons=snapshot.reasons,
            states=states,
            observations=observations,
            policy=self.policy,
        )
        if busy := [d for d in outcome.decisions if d.touches_pending]:
            leases = [i.lease_until for i in intents if i.state == "sending"]
            lease_left = (max(leases) - now).total_seconds() if leases else 0.0
            raise AlertBusy(
                f"{snapshot.scope}: {', '.join(d.code for d in busy)} still sending elsewhere",
                retry_after_s=max(0.0, lease_left) + BUSY_MIN_RETRY_S,
            )
        await self._observe(snapshot, outcome.observed, outcome.reset, observations)
        sends = []
        for d in outcome.decisions:
            if d.sends:
                sends.append(d)
            else:
                results.append(self._record(await self._quiet(snapshot, d), snapshot, key=key))
        if sends:
            for result in await self._send(snapshot, sends, states):
                results.append(self._record(result, snapshot, key=key))
        return results

    async def drain(self) -> None:
        """Wait for the posts in progress (and their confirmations): call before closing the
        Slack session and the storage clients."""
        while self._settling or self._alongside:
            await asyncio.gather(*self._settling, *self._alongside, return_exceptions=True)

    def _tell_alongside(self, intent: AlertIntent) -> None:
        """The incidents the message fires, to the policy's other level-0 receivers now, not at
        the next sweep (a failure there is the sweep's to retry)."""
        fired = sorted(
            {
                a.incident_id
                for a in intent.alerts
                if a.incident_id and a.action != Action.RESOLVE.value
            }
        )
        if self.alongside is None or not fired:
            return
        task = asyncio.create_task(self.alongside(fired))
        self._alongside.add(task)
        task.add_done_callback(self._alongside_done)

    def _alongside_done(self, task: asyncio.Task[object]) -> None:
        self._alongside.discard(task)
        if not task.cancelled() and (err := task.exception()) is not None:
            log.warning("incident_alongside_failed", error=repr(err))

    # -- state ----------------------------------------------------------------------------------

    async def _advance_cursor(self, snapshot: Snapshot, cursor: AlertCursor | None) -> bool:
        item = AlertCursor(
            pk=keys.alert_pk(snapshot.scope),
            sk=keys.alert_cursor_sk(snapshot.stream.value),
            scope=snapshot.scope,
            status=snapshot.stream.value,
            last_snapshot_at=snapshot.at,
            ttl=self.ttl.alert_expiry(snapshot.at),
        )
        seen = None if cursor is None else format_ts(cursor.last_snapshot_at)
        at = format_ts(snapshot.at)
        for _ in range(CURSOR_ATTEMPTS):
            try:
                await self.readmodel.put_item(
                    item,
                    if_absent=seen is None,
                    expected=None if seen is None else {"last_snapshot_at": seen},
                )
            except Conflict:
                # another snapshot of this stream moved it meanwhile: this one is stale if that
                # was newer, a redelivery if the same, and still the newest if older (try again)
                fresh = await self.readmodel.get_item(item.pk, item.sk)
                seen = None if fresh is None else str(fresh["last_snapshot_at"])
                if seen is not None and seen >= at:
                    return seen == at
                continue
            return True
        return False

    async def _observe(
        self,
        snapshot: Snapshot,
        observed: dict[AlertKey, int],
        reset: list[AlertKey],
        previous: dict[AlertKey, AlertObservation],
    ) -> None:
        pk = keys.alert_pk(snapshot.scope)
        for (severity, code), count in observed.items():
            before = previous.get((severity, code))
            await self.readmodel.put_item(
                AlertObservation(
                    pk=pk,
                    sk=keys.observation_sk(severity, code, snapshot.stream.value),
                    scope=snapshot.scope,
                    count=count,
                    first_observed_at=before.first_observed_at if before else snapshot.at,
                    last_observed_at=snapshot.at,
                    ttl=self.ttl.alert_expiry(snapshot.at),
                )
            )
        for severity, code in reset:
            await self.readmodel.delete_item(
                pk, keys.observation_sk(severity, code, snapshot.stream.value)
            )

    def _state(self, snapshot: Snapshot, decision: Decision, **changes: Any) -> AlertState:
        old = decision.state
        base: dict[str, Any] = (
            old.model_dump()
            if old
            else {
                "pk": keys.alert_pk(snapshot.scope),
                "sk": keys.alert_sk(decision.severity, decision.code, snapshot.stream.value),
                "scope": snapshot.scope,
                "severity": decision.severity,
                "reason": decision.code,
                "status": snapshot.stream.value,
                "firing": False,
            }
        )
        base |= {
            "version": (old.version if old else 0) + 1,
            "last_snapshot_at": snapshot.at,
            "ttl": self.ttl.alert_expiry(snapshot.at),
            **changes,
        }
        return AlertState.model_validate(base)

    async def _swap(self, new: AlertState, old: AlertState | None) -> bool:
        """Write ``new`` only if the item is still ``old`` (absent when None)."""
        try:
            await self.readmodel.put_item(new, **_unchanged(old))
        except Conflict:
            return False
        return True

    # -- actions --------------------------------------------------------------------------------

    async def _quiet(self, snapshot: Snapshot, d: Decision) -> Result:
        """A decision that sends nothing: suppressed, waiting, or a silent downgrade."""
        if d.action is not Action.DOWNGRADE:
            return Result(d.action.value, d.action, d.severity, d.code, d.why)
        assert d.state is not None
        done = await self._swap(self._state(snapshot, d, firing=False), d.state)
        return Result(
            "downgraded" if done else "claimed_elsewhere", d.action, d.severity, d.code, d.why
        )

    def _owner(self) -> str:
        """Who posts an intent: this process, and the JetStream message and delivery it handles
        (a handler called directly, without a queue, gets a message of its own)."""
        return f"{self.instance}|{current_message() or uuid.uuid4().hex}|{delivery()}"

    async def _incidents_for(
        self,
        snapshot: Snapshot,
        decisions: list[Decision],
        states: Mapping[AlertKey, AlertState],
    ) -> dict[str, tuple[Incident | None, Incident]]:
        """Per reason code sent: the incident as stored (None: new) and as it will be once the
        message is recorded. A reason that fires with no open incident opens one (the same id on
        every replica); WARNING -> CRITICAL raises its severity; a RESOLVE resolves it."""
        out: dict[str, tuple[Incident | None, Incident]] = {}
        for code in sorted({d.code for d in decisions}):
            mine = [d for d in decisions if d.code == code]
            known = {
                s.incident_id
                for (_, c), s in states.items()
                if c == code and s.incident_id and (s.firing or s.pending)
            }
            current: Incident | None = None
            for incident_id in sorted(known):
                found = await self.incidents.get(incident_id)
                if found is not None and found.state != "resolved":
                    current = found
                    break
            resolving = all(d.action is Action.RESOLVE for d in mine)
            if resolving:
                if current is None:
                    continue  # fired before incidents were kept, or closed by a person
                resolved = incidents.resolve(current, at=snapshot.at)
                if resolved is not None:
                    out[code] = (current, resolved)
                continue
            worst: Severity = (
                "CRITICAL" if any(d.severity == "CRITICAL" for d in mine) else "WARNING"
            )
            if current is None:
                detail = "; ".join(r.detail for d in mine for r in d.reasons)
                opened = incidents.open_incident(
                    scope=snapshot.scope,
                    stream=snapshot.stream.value,
                    reason=code,
                    severity=worst,
                    at=snapshot.at,
                    detail=detail,
                )
                stored = await self.incidents.get(opened.incident_id)  # a redelivery wrote it
                out[code] = (stored, stored or opened)
                continue
            out[code] = (current, incidents.raise_severity(current, worst, snapshot.at))
        return out

    async def _send(
        self,
        snapshot: Snapshot,
        decisions: list[Decision],
        states: Mapping[AlertKey, AlertState],
    ) -> list[Result]:
        """Record the decision's one message as an intent (claiming its alerts and changing
        their incidents in the same transaction), then post it. A conflict that is not another
        replica's intent (a person acknowledged an incident meanwhile) is decided again."""
        intent_sk = keys.alert_intent_sk(snapshot.stream.value, snapshot.at)
        for _ in range(SEND_ATTEMPTS):
            changes = await self._incidents_for(snapshot, decisions, states)
            reminders = [(d, why) for d in decisions if (why := self._reminder(d, changes))]
            sends = [d for d in decisions if all(d is not r for r, _ in reminders)]
            results = [await self._quiet_reminder(snapshot, d, why) for d, why in reminders]
            if not sends:
                return results
            held = await self._silenced(sends, changes)
            if held:
                try:
                    results += await self._hold(snapshot, sends, held, changes)
                except Conflict:
                    continue  # an incident or alert changed meanwhile: decide again
                sends = [d for d in sends if d.code not in held]
                if not sends:
                    return results
            try:
                intent = await self._record_intent(snapshot, sends, changes)
            except Conflict:
                existing = await self.readmodel.get_item(keys.alert_pk(snapshot.scope), intent_sk)
                if existing is not None:
                    return results + [
                        Result(
                            "claimed_elsewhere",
                            d.action,
                            d.severity,
                            d.code,
                            "another replica has it",
                        )
                        for d in sends
                    ]
                continue  # an incident changed under it (an acknowledgement): decide again
            self._tell_alongside(intent)
            if self.post_in_background:
                self._post_in_background(intent, snapshot, sends)
                return results
            outcome, why = await self._settle_outliving_cancel(intent)
            return results + [
                Result(outcome, d.action, d.severity, d.code, why or d.why) for d in sends
            ]
        raise Transient(f"{snapshot.scope}: its incidents kept changing while being notified")

    async def _silenced(
        self, decisions: list[Decision], changes: Mapping[str, tuple[Incident | None, Incident]]
    ) -> dict[str, list[str]]:
        """The reason codes whose notification a silence holds back now, with the silences'
        ids. A RESOLVE is held back when nobody was ever told of the incident, or when its
        policy says resolutions are not told (``resolve_notify = false``)."""
        held: dict[str, list[str]] = {}
        silences: list[Silence] | None = None
        now = self.clock()
        for d in decisions:
            change = changes.get(d.code)
            if change is None or d.code in held:
                continue
            incident = change[1]
            if d.action is Action.RESOLVE:
                if incident.silenced_since is not None and incident.notifications == 0:
                    held[d.code] = ["(silenced while it fired)"]
                elif self.escalation is not None and not (
                    policy_for(self.escalation, incident.scope, incident.severity).resolve_notify
                ):
                    held[d.code] = [QUIET_RESOLVE]
                continue
            if silences is None:
                silences = await self.silences.listed(now=now)
            covering = silenced_by(silences, incidents.labels(incident), now)
            if covering:
                held[d.code] = [s.id for s in covering]
        return held

    async def _hold(
        self,
        snapshot: Snapshot,
        decisions: list[Decision],
        held: Mapping[str, list[str]],
        changes: Mapping[str, tuple[Incident | None, Incident]],
    ) -> list[Result]:
        """Record what a silence holds back as if it had been sent, with no message: the alert
        states (so the cooldown runs) and the incident, marked silenced. One transaction."""
        now = self.clock()
        puts: list[Put] = []
        results: list[Result] = []
        for d in decisions:
            if d.code not in held:
                continue
            state = self._next_state(
                snapshot, d, changes[d.code][1].incident_id, pending=None, sent=True
            )
            puts.append(Put(state, before=d.state, **_unchanged(d.state)))
            puts.extend(self._cleared(snapshot, d))
            if held[d.code] == [QUIET_RESOLVE]:
                results.append(
                    Result("suppressed_policy", d.action, d.severity, d.code, QUIET_RESOLVE)
                )
                continue
            why = f"silenced by {', '.join(held[d.code])}"
            results.append(Result("suppressed_silenced", d.action, d.severity, d.code, why))
        for code, silence_ids in held.items():
            stored, new = changes[code]
            if new.state != "resolved":
                new = incidents.silenced(new, at=now, by=silence_ids)
            if new is not stored:
                puts.append(_incident_put(stored, new))
        await self.readmodel.put_items(puts)
        return results

    def _next_state(
        self,
        snapshot: Snapshot,
        d: Decision,
        incident_id: str | None,
        *,
        pending: str | None,
        sent: bool,
    ) -> AlertState:
        """The alert state a decision leaves: resolved, or firing for its incident (``sent``:
        counted as sent now, for a message a silence held back)."""
        old = d.state
        if d.action is Action.RESOLVE:
            return self._state(snapshot, d, firing=False, resolved_at=snapshot.at, pending=pending)
        extra: dict[str, Any] = {"last_sent_at": snapshot.at} if sent else {}
        return self._state(
            snapshot,
            d,
            firing=True,
            fired_at=old.fired_at if old and old.firing and old.fired_at else snapshot.at,
            resolved_at=None,
            pending=pending,
            incident_id=incident_id or (old.incident_id if old else None),
            **extra,
        )

    def _cleared(self, snapshot: Snapshot, d: Decision) -> list[Put]:
        """The lower severities a RESOLVE clears with it, quietly."""
        puts = []
        for other in d.also_clears:
            quiet = Decision(Action.DOWNGRADE, other.severity, other.reason, state=other)
            new = self._state(snapshot, quiet, firing=False, resolved_at=snapshot.at)
            puts.append(Put(new, before=other, **_unchanged(other)))
        return puts

    def _reminder(
        self, d: Decision, changes: Mapping[str, tuple[Incident | None, Incident]]
    ) -> str | None:
        """Why a reason still firing after its cooldown gets no message from this snapshot, or
        None: its incident is acknowledged (a person is on it), or the escalation policy sends
        its reminders (escalation and ``repeat``: one schedule, not two). A worse severity, or
        a reason whose incident was closed by hand, still speaks."""
        change = changes.get(d.code)
        if d.action is not Action.FIRE or d.state is None or change is None:
            return None
        stored, new = change
        if stored is None or new is not stored:
            return None
        if stored.state == "acknowledged":
            return "its incident is acknowledged"
        if self.escalation is not None and d.state.firing:
            return "its escalation policy sends the reminders"
        return None

    async def _quiet_reminder(self, snapshot: Snapshot, d: Decision, why: str) -> Result:
        """The cooldown starts again as if sent, so the next snapshot does not ask again."""
        assert d.state is not None
        new = self._state(snapshot, d, last_sent_at=snapshot.at)
        done = await self._swap(new, d.state)
        outcome = "suppressed_acknowledged" if "acknowledged" in why else "suppressed_policy"
        return Result(outcome if done else "claimed_elsewhere", d.action, d.severity, d.code, why)

    async def _record_intent(
        self,
        snapshot: Snapshot,
        decisions: list[Decision],
        changes: Mapping[str, tuple[Incident | None, Incident]],
    ) -> AlertIntent:
        now = self.clock()
        pk = keys.alert_pk(snapshot.scope)
        intent_sk = keys.alert_intent_sk(snapshot.stream.value, snapshot.at)
        aid = attempt_id(snapshot.scope, snapshot.stream, snapshot.at)

        def incident_of(code: str) -> str | None:
            change = changes.get(code)
            return change[1].incident_id if change else None

        message = AlertMessage(
            scope=snapshot.scope,
            stream=snapshot.stream,
            snapshot_at=snapshot.at,
            entries=tuple(
                AlertEntry(d.action, d.severity, d.code, d.reasons, incident_of(d.code))
                for d in decisions
            ),
            attempt_id=aid,
        )
        puts: list[Put] = []
        alerts: list[IntentAlert] = []
        for d in decisions:
            old = d.state
            incident = incident_of(d.code)
            claimed = self._next_state(snapshot, d, incident, pending=intent_sk, sent=False)
            puts.append(Put(claimed, before=old, **_unchanged(old)))
            alerts.append(
                IntentAlert(
                    sk=claimed.sk,
                    action=d.action.value,
                    claimed_version=claimed.version,
                    before=old.model_dump(mode="json") if old else None,
                    incident_id=incident,
                )
            )
            puts.extend(self._cleared(snapshot, d))
        for stored, new in changes.values():
            if new is not stored and any(d.code == new.reason for d in decisions):
                puts.append(_incident_put(stored, new))
        intent = AlertIntent(
            pk=pk,
            sk=intent_sk,
            scope=snapshot.scope,
            status=snapshot.stream.value,
            snapshot_at=snapshot.at,
            attempt_id=aid,
            state="sending",
            owner=self._owner(),
            lease_until=now + self.lease,
            alerts=alerts,
            payload=json.dumps(message.payload(self.dashboard_url), ensure_ascii=False),
            ttl=self.ttl.alert_expiry(snapshot.at),
        )
        await self.readmodel.put_items([Put(intent, if_absent=True), *puts])
        return intent

    async def _complete(self, intents: list[AlertIntent], *, now: datetime) -> list[Result]:
        """Finish the intents an earlier handler left ``sending``: those whose lease is over, and
        this message's own from an earlier delivery (that delivery has ended: it failed, or its
        ack wait, longer than the lease, ran out)."""
        message, this_delivery = current_message(), delivery()
        results = []
        for intent in intents:
            if intent.state != "sending":
                continue
            _, owner_message, owner_delivery = intent.owner.rsplit("|", 2)
            redelivered = bool(message) and owner_message == message
            redelivered = redelivered and int(owner_delivery) < this_delivery
            if intent.lease_until > now and not redelivered:
                continue
            results += await self._take_over(intent, now)
        return results

    async def _take_over(self, intent: AlertIntent, now: datetime) -> list[Result]:
        """Own an intent another handler left (on its version: of two takers one wins), then
        post and confirm it."""
        taken = intent.model_copy(
            update={
                "owner": self._owner(),
                "lease_until": now + self.lease,
                "version": intent.version + 1,
            }
        )
        try:
            await self.readmodel.put_item(taken, expected={"version": intent.version})
        except Conflict:
            return []  # another handler took it over first
        log.warning(
            "alert_intent_taken_over",
            intent=intent.sk,
            attempt_id=intent.attempt_id,
            previous_owner=intent.owner,
            lease_over=intent.lease_until <= now,
        )
        outcome, why = await self._settle_outliving_cancel(taken)
        results = []
        for alert in intent.alerts:
            severity, code, _ = alert.sk.split("#")
            results.append(
                Result(
                    f"completed_{outcome}",
                    Action(alert.action),
                    severity,
                    code,
                    why or f"intent {intent.attempt_id} left by {intent.owner}",
                )
            )
        return results

    # -- replicas -------------------------------------------------------------------------------

    async def heartbeat(self) -> None:
        """Say this replica is alive for :attr:`alive_for`; what it holds is taken over by
        another replica soon after it stops saying so (a SIGKILL, a lost node)."""
        now = self.clock()
        await self.readmodel.put_item(
            {
                "pk": keys.replica_pk(SERVICE),
                "sk": self.instance,
                "alive_until": format_ts(now + self.alive_for),
                "ttl": int((now + timedelta(days=1)).timestamp()),
            }
        )

    async def still_reported(self, incident: Incident) -> bool:
        """Whether a factory's incident is still what its factory reports, asked by the sweep
        before it escalates or reminds. Its resolve may never have been handled (the event
        dead-lettered through a long outage), and the snapshots after it are routine, read by
        nobody: then the factory's LATEST is decided as a snapshot, which resolves it the usual
        way (the message, the alert, the incident), and the answer is False."""
        if incident.stream != Stream.STATE.value:
            return True  # the cloud's runs are read from S3 every run: nothing is skipped
        latest = await self.readmodel.get_latest(incident.scope)
        if latest is None or not latest.get("updated_at"):
            return True
        reasons = tuple(
            Reason.model_validate(r) for r in (latest.get("risk") or {}).get("reasons") or []
        )
        if any(r.code == incident.reason for r in reasons):
            return True
        at = parse_ts(str(latest["updated_at"]))
        log.warning(
            "incident_no_longer_reported",
            incident_id=incident.incident_id,
            scope=incident.scope,
            reason=incident.reason,
            latest_at=format_ts(at),
        )
        await self.handle_snapshot(Snapshot(incident.scope, Stream.STATE, at, reasons))
        return False

    async def owner_dead(self, owner: str, now: datetime) -> bool:
        """Whether the replica that wrote ``owner`` (an intent's or a claim's) has stopped."""
        return await self._dead(owner.split("|", 1)[0], now)

    async def _dead(self, instance: str, now: datetime) -> bool:
        """``instance`` has stopped: its last heartbeat ran out. One that never sent a heartbeat
        (a replica of an older version) is judged by its lease alone."""
        if instance == self.instance:
            return False
        item = await self.readmodel.get_item(keys.replica_pk(SERVICE), instance)
        return item is not None and str(item.get("alive_until", "")) <= format_ts(now)

    async def complete_abandoned(self, members: Sequence[tuple[str, str]]) -> list[Result]:
        """Take over and finish the alert messages whose sender stopped mid-send: ``members``
        are the sweep's index entries (those of ALERT# intents are messages being sent). Any
        replica does it within a heartbeat (8 s) and a sweep of the sender's end, not after the
        lease sized for slow posts."""
        now = self.clock()
        wanted = [(pk, sk) for pk, sk in members if pk.startswith("ALERT#")]
        if not wanted:
            return []
        results: list[Result] = []
        for item in await self.readmodel.batch_get(wanted, consistent=True):
            try:
                intent = AlertIntent.model_validate(item)
            except pydantic.ValidationError as err:
                log.warning("alert_item_unreadable", sk=item.get("sk"), error=str(err))
                continue
            if intent.state != "sending":
                continue
            sender = intent.owner.split("|", 1)[0]
            if intent.lease_until > now and not await self._dead(sender, now):
                continue
            for result in await self._take_over(intent, now):
                results.append(self._record(result, scope=intent.scope, intent=intent.sk))
        return results

    def _post_in_background(
        self, intent: AlertIntent, snapshot: Snapshot, sends: Sequence[Decision]
    ) -> None:
        """Post and confirm a recorded intent beside the handler, which returns at once: its
        event is settled, and the next events (another scope's fire) do not wait for a Slack
        that is slow or refusing. The intent is the durable part: a process that dies before the
        confirmation leaves it ``sending``, and the sweep of any replica completes it once its
        owner's heartbeat or its lease has run out; a stopping one waits for it (:meth:`drain`).
        Each decision is logged and counted once its message is settled."""

        async def post() -> tuple[str, str]:
            try:
                outcome, why = await self._settle(intent)
            except Exception as err:  # DynamoDB kept failing through the confirmation's retries
                log.warning(
                    "alert_post_left_to_the_sweep", attempt_id=intent.attempt_id, error=repr(err)
                )
                return "left_to_the_sweep", repr(err)
            for d in sends:
                self._record(Result(outcome, d.action, d.severity, d.code, why or d.why), snapshot)
            if outcome == FAILING_OVER:
                self._tell_alongside(intent)  # the fallback now, not at the next sweep
            return outcome, why

        task = asyncio.ensure_future(post())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_outliving_cancel(self, intent: AlertIntent) -> tuple[str, str]:
        """Post and confirm ``intent``; a cancellation (shutdown) meanwhile waits for both, then
        propagates: abandoning a post Slack may already show would send it twice."""
        task = asyncio.ensure_future(self._settle(intent))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            self.sends_outliving_cancel += 1
            log.warning("alert_send_outlives_cancel", attempt_id=intent.attempt_id)
            # FastStream cancels through an anyio cancel scope, which cancels again at every
            # step: a shielded scope keeps it out while the post and its confirmation finish
            with anyio.CancelScope(shield=True):
                while not task.done():
                    with contextlib.suppress(asyncio.CancelledError):  # a plain task.cancel()
                        await asyncio.wait([task])
            raise

    async def _settle(self, intent: AlertIntent) -> tuple[str, str]:
        """Post the intent's message, then confirm it, or dead-letter it and release its alerts."""
        payload = json.loads(intent.payload)
        if self.sender is None:
            log.warning("alert_not_sent_no_webhook", text=payload["text"])
            return await self._confirm(intent, delivered=True), "no webhook: logged only"
        left = (intent.lease_until - self.clock()).total_seconds()
        deadline = asyncio.get_running_loop().time() + left - min(5.0, left * 0.2)
        try:
            await self.sender.send(payload, deadline=deadline)
        except Undeliverable as err:
            if self._another_receiver_takes(intent):
                # the sweep sends the incidents to the policy's fallback receiver at once; the
                # alerts count as notified (their cooldown runs), nothing is dead-lettered
                outcome = await self._confirm(intent, delivered=True, told=UNDELIVERABLE)
                return FAILING_OVER if outcome == "sent" else outcome, err.detail
            first = intent.alerts[0]
            await self.dead_letter(
                {
                    "scope": intent.scope,
                    "stream": intent.status,
                    "action": first.action,
                    "severity": first.sk.split("#")[0],
                    "reason": ", ".join(a.sk.split("#")[1] for a in intent.alerts),
                    "snapshot_at": format_ts(intent.snapshot_at),
                    "alert_sk": first.sk,
                    "alert_sks": [a.sk for a in intent.alerts],
                    "attempt_id": intent.attempt_id,
                    "slack_payload": payload,
                },
                err.detail,
                f"{intent.scope}:{intent.sk}",
            )
            if self.escalation is not None and any(
                a.incident_id and a.action != Action.RESOLVE.value for a in intent.alerts
            ):
                # the sweep keeps retrying the incidents with back-off: the alerts stay theirs
                # (released, a later snapshot would open a second incident for the same fire)
                await self._confirm(intent, delivered=True, told=UNDELIVERABLE)
            else:
                await self._confirm(intent, delivered=False)
            return UNDELIVERABLE, err.detail
        return await self._confirm(intent, delivered=True), ""

    def _another_receiver_takes(self, intent: AlertIntent) -> bool:
        """The message names incidents still firing and their policy has a receiver besides the
        one that failed: an alert is dead-lettered only when every receiver of its policy has
        failed."""
        if self.escalation is None:
            return False
        for alert in intent.alerts:
            if alert.incident_id is None or alert.action == Action.RESOLVE.value:
                continue
            severity: Severity = "CRITICAL" if alert.sk.startswith("CRITICAL#") else "WARNING"
            policy = policy_for(self.escalation, intent.scope, severity)
            if not dead_lettered(policy, failed={self.receiver_name}):
                return True
        return False

    async def _confirm(
        self, intent: AlertIntent, *, delivered: bool, told: str | None = None
    ) -> str:
        """Settle the intent in one transaction (retried on DynamoDB errors): ``sent`` and each
        alert's confirmed send, or ``undeliverable`` and each alert as it was before the claim."""
        for attempt in range(1, CONFIRM_ATTEMPTS + 1):
            try:
                return await self._write_settled(intent, delivered=delivered, told=told)
            except Transient as err:
                if attempt == CONFIRM_ATTEMPTS:
                    raise
                log.warning("alert_confirm_retried", attempt_id=intent.attempt_id, error=str(err))
                await asyncio.sleep(exponential_s(attempt, first=CONFIRM_FIRST_DELAY, cap=math.inf))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _write_settled(
        self, intent: AlertIntent, *, delivered: bool, told: str | None = None
    ) -> str:
        """``told``: what the incidents' timelines say of the receiver, when it is not what
        ``delivered`` says (a failed post whose incidents another receiver takes)."""
        now = self.clock()
        puts = [
            Put(
                intent.model_copy(
                    update={
                        "state": "sent" if delivered else UNDELIVERABLE,
                        "version": intent.version + 1,
                        "settled_at": now,
                        "ttl": min(intent.ttl, int((now + SETTLED_INTENT_KEPT).timestamp())),
                        "posts": intent.posts + int(self.sender is not None),
                    }
                ),
                expected={"version": intent.version},
            )
        ]
        for alert in intent.alerts:
            item = await self.readmodel.get_item(intent.pk, alert.sk)
            if item is None or item.get("pending") != intent.sk:
                continue  # expired meanwhile, or already settled
            current = AlertState.model_validate(item)
            fires = alert.action != Action.RESOLVE.value
            # a resolve stands even when its message was not delivered (the dead letter keeps
            # the message for ``aegis alerts resend``): the data said the reason is gone, and
            # the snapshots after it are routine, read by nobody, so none would resolve it again
            if delivered or not fires:
                new = current.model_dump() | {
                    "pending": None,
                    "last_sent_at": intent.snapshot_at if fires else current.last_sent_at,
                    "sent_count": current.sent_count + int(fires),
                }
            elif alert.before is not None:
                new = AlertState.model_validate(alert.before).model_dump()
            else:  # never fired before: the claim is undone
                new = current.model_dump() | {
                    "firing": False,
                    "fired_at": None,
                    "last_sent_at": None,
                    "sent_count": 0,
                    "pending": None,
                }
            new |= {
                "version": current.version + 1,
                "last_snapshot_at": current.last_snapshot_at,
                "ttl": current.ttl,
            }
            puts.append(
                Put(
                    AlertState.model_validate(new),
                    expected={"version": current.version},
                    before=current,
                )
            )
        try:
            await self.readmodel.put_items(puts)
        except Conflict:
            log.warning("alert_intent_settled_elsewhere", attempt_id=intent.attempt_id)
            return "claimed_elsewhere"
        outcome = told or (
            UNDELIVERABLE if not delivered else "sent" if self.sender is not None else "logged_only"
        )
        await self._note_incidents(intent, outcome, now=now)
        if not delivered:
            return UNDELIVERABLE
        for alert in intent.alerts:
            severity, code, status = alert.sk.split("#")
            await self.announce(
                {
                    "scope": intent.scope,
                    "severity": severity,
                    "reason": code,
                    "action": alert.action,
                    "stream": status,
                    "snapshot_at": format_ts(intent.snapshot_at),
                    "delivered": self.sender is not None and told is None,
                    "attempt_id": intent.attempt_id,
                },
                msgids.alert_sent(intent.pk, alert.sk, alert.claimed_version),
            )
        return "sent" if self.sender is not None else "logged_only"

    async def _note_incidents(self, intent: AlertIntent, outcome: str, *, now: datetime) -> None:
        """Each incident of a settled message gets a timeline line (who was told, how it went);
        a resolved one then gets its S3 record. A failure here is logged, not retried by
        redelivery: the message itself is settled (the record is written later by
        :mod:`aegis_alert_dispatcher.escalator`'s sweep)."""
        resolved: set[str] = set()
        for incident_id in sorted({a.incident_id for a in intent.alerts if a.incident_id}):
            actions = {a.action for a in intent.alerts if a.incident_id == incident_id}
            if actions == {Action.RESOLVE.value}:
                resolved.add(incident_id)
            what = "resolved" if actions == {Action.RESOLVE.value} else "firing"
            note = functools.partial(
                incidents.notified,
                at=now,
                receiver=self.receiver_name,
                outcome=outcome,
                detail=f"{what} message {intent.attempt_id}",
            )
            try:
                await self.incidents.change(incident_id, note)
            except (StorageError, ContractError) as err:
                log.warning("incident_note_failed", incident_id=incident_id, error=str(err))
        for incident_id in sorted(resolved):
            try:
                await self.incidents.archive(incident_id, now=now)
            except StorageError as err:
                log.warning("incident_archive_failed", incident_id=incident_id, error=str(err))


def _incident_put(stored: Incident | None, new: Incident) -> Put:
    """Write ``new`` only if the incident is still as read (absent when None)."""
    return Put(
        new,
        before=stored,
        if_absent=stored is None,
        expected=None if stored is None else {"version": stored.version},
    )


def _unchanged(old: AlertState | None) -> dict[str, Any]:
    """The put condition "the item is still ``old``" (absent when None)."""
    return {"if_absent": True} if old is None else {"expected": {"version": old.version}}


def _split(
    items: list[dict[str, Any]], stream: Stream
) -> tuple[
    dict[AlertKey, AlertState],
    dict[AlertKey, AlertObservation],
    AlertCursor | None,
    list[AlertIntent],
]:
    states: dict[AlertKey, AlertState] = {}
    observations: dict[AlertKey, AlertObservation] = {}
    cursor: AlertCursor | None = None
    intents: list[AlertIntent] = []
    for item in items:
        sk = str(item["sk"])
        try:
            if sk.startswith(keys.CURSOR_PREFIX):
                if sk == keys.alert_cursor_sk(stream.value):
                    cursor = AlertCursor.model_validate(item)
            elif sk.startswith(keys.INTENT_PREFIX):
                intent = AlertIntent.model_validate(item)
                if intent.status == stream.value:
                    intents.append(intent)
            elif sk.startswith(keys.OBSERVATION_PREFIX):
                severity, code, status = sk.removeprefix(keys.OBSERVATION_PREFIX).split("#")
                if status == stream.value and severity in ("WARNING", "CRITICAL"):
                    observations[(severity, code)] = AlertObservation.model_validate(item)  # type: ignore[index]
            else:
                state = AlertState.model_validate(item)
                if state.status == stream.value:
                    states[(state.severity, state.reason)] = state
        except (pydantic.ValidationError, ValueError) as err:
            log.warning("alert_item_unreadable", sk=sk, error=str(err))
    return states, observations, cursor, intents


def dead_letter_body(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
