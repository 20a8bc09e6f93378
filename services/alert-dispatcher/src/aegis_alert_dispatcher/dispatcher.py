"""One ObjectCreated event -> the alerts it causes (the I/O around :mod:`decide`).

1. Only keys under the trigger prefixes count (default: ``processed/*/state_snapshot/``,
   ``processed/cloud_infra/fast/``, ``processed/cloud_infra/slow/``); others are ignored.
2. The snapshot is read from S3; its scope (factory or ``cloud-infra``), stream and time found.
3. The scope's ALERT# items are read in one query. A snapshot older than the stream's cursor
   (``CURSOR#{stream}``) is stale and ignored; otherwise the cursor moves to it (conditionally).
4. :func:`decide` says what to do. A send first claims its alert item by a conditional write on
   the version read (so N replicas send once), then posts to Slack. If Slack cannot be reached
   after the retries, the claim is released (a later snapshot tries again) and the message goes
   to ``aegis.dlq.alert-dispatcher.undeliverable`` with everything ``aegis alerts resend`` needs.
5. Every decision is logged with its reason and counted; a sent alert is announced as a system
   event (``aegis.events.alert_sent``) for the orchestrator.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pydantic
import structlog

from aegis_alert_dispatcher.decide import (
    Action,
    AlertKey,
    Decision,
    Policy,
    Stream,
    decide,
)
from aegis_alert_dispatcher.slack import AlertMessage, Delivery, Undeliverable
from aegis_contracts import keys
from aegis_contracts.cloud import CloudSnapshot
from aegis_contracts.errors import ContractError
from aegis_contracts.events import ObjectCreated
from aegis_contracts.items import AlertCursor, AlertObservation, AlertState
from aegis_contracts.keys import KeyFamily
from aegis_contracts.state import Reason
from aegis_contracts.times import Clock, format_ts, parse_ts
from aegis_contracts.ttl import TtlSettings
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.readmodel import ReadModel
from aegis_storage.s3 import ObjectStore

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
    async def send(self, payload: dict[str, Any]) -> Delivery: ...


@dataclass(frozen=True, slots=True)
class Result:
    """What happened to one decision (``outcome``: sent, suppressed_cooldown, waiting_observations,
    downgraded, claimed_elsewhere, undeliverable, logged_only) or to the whole snapshot (stale,
    ignored, replayed)."""

    outcome: str
    action: Action | None = None
    severity: str | None = None
    code: str | None = None
    why: str = ""


DeadLetterFn = Callable[[dict[str, Any], str, str], Awaitable[None]]
SystemEventFn = Callable[[dict[str, Any], str], Awaitable[None]]


class Dispatcher:
    def __init__(
        self,
        *,
        store: ObjectStore,
        readmodel: ReadModel,
        sender: Sender | None,
        dead_letter: DeadLetterFn,
        announce: SystemEventFn,
        policy: Policy,
        ttl: TtlSettings,
        dashboard_url: str,
        clock: Clock,
        triggers: Sequence[str] = DEFAULT_TRIGGERS,
        on_result: Callable[[Result], None] | None = None,
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
        try:
            body = await self.store.get_json(event.key)
        except NotFound:
            return [self._record(Result("ignored", why="object no longer exists"), key=event.key)]
        snapshot = read_snapshot(event.key, body)
        return await self.handle_snapshot(snapshot, key=event.key)

    async def handle_snapshot(self, snapshot: Snapshot, *, key: str = "") -> list[Result]:
        now = self.clock()
        scope_items = await self.readmodel.partition(keys.alert_pk(snapshot.scope), now=now)
        states, observations, cursor = _split(scope_items, snapshot.stream)
        if cursor is not None and cursor.last_snapshot_at > snapshot.at:
            why = f"older than {format_ts(cursor.last_snapshot_at)}, the newest handled"
            return [self._record(Result("stale", why=why), snapshot, key=key)]
        if not await self._advance_cursor(snapshot, cursor):
            return [
                self._record(
                    Result("stale", why="a newer snapshot was handled meanwhile"), snapshot, key=key
                )
            ]

        outcome = decide(
            stream=snapshot.stream,
            snapshot_at=snapshot.at,
            reasons=snapshot.reasons,
            states=states,
            observations=observations,
            policy=self.policy,
        )
        await self._observe(snapshot, outcome.observed, outcome.reset, observations)
        results = []
        for decision in outcome.decisions:
            results.append(self._record(await self._act(snapshot, decision), snapshot, key=key))
        return results

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
            if old is None:
                await self.readmodel.put_item(new, if_absent=True)
            else:
                await self.readmodel.put_item(new, expected={"version": old.version})
        except Conflict:
            return False
        return True

    # -- actions --------------------------------------------------------------------------------

    async def _act(self, snapshot: Snapshot, d: Decision) -> Result:
        if d.action in (Action.COOLDOWN, Action.WAITING):
            return Result(d.action.value, d.action, d.severity, d.code, d.why)
        old = d.state
        if d.action is Action.DOWNGRADE:
            assert old is not None
            done = await self._swap(self._state(snapshot, d, firing=False), old)
            return Result(
                "downgraded" if done else "claimed_elsewhere", d.action, d.severity, d.code, d.why
            )
        if d.action is Action.RESOLVE:
            assert old is not None
            claimed = self._state(snapshot, d, firing=False, resolved_at=snapshot.at)
        else:
            claimed = self._state(
                snapshot,
                d,
                firing=True,
                fired_at=old.fired_at if old and old.firing and old.fired_at else snapshot.at,
                last_sent_at=snapshot.at,
                resolved_at=None,
                sent_count=(old.sent_count if old else 0) + 1,
            )
        if not await self._swap(claimed, old):
            return Result(
                "claimed_elsewhere", d.action, d.severity, d.code, "another replica has it"
            )
        for other in d.also_clears:  # the lower severities of a resolved reason
            quiet = Decision(Action.DOWNGRADE, other.severity, other.reason, state=other)
            await self._swap(
                self._state(snapshot, quiet, firing=False, resolved_at=snapshot.at), other
            )

        message = AlertMessage(
            scope=snapshot.scope,
            stream=snapshot.stream,
            action=d.action,
            severity=d.severity,
            code=d.code,
            snapshot_at=snapshot.at,
            reasons=d.reasons,
        )
        payload = message.payload(self.dashboard_url)
        if self.sender is None:
            log.warning("alert_not_sent_no_webhook", text=payload["text"])
            outcome = "logged_only"
        else:
            try:
                await self.sender.send(payload)
            except Undeliverable as err:
                await self._release(claimed, old)
                await self.dead_letter(
                    {
                        "scope": snapshot.scope,
                        "stream": snapshot.stream.value,
                        "action": d.action.value,
                        "severity": d.severity,
                        "reason": d.code,
                        "snapshot_at": format_ts(snapshot.at),
                        "alert_sk": claimed.sk,
                        "slack_payload": payload,
                    },
                    err.detail,
                    f"{snapshot.scope}:{claimed.sk}:{format_ts(snapshot.at)}",
                )
                return Result(UNDELIVERABLE, d.action, d.severity, d.code, err.detail)
            outcome = "sent"
        await self.announce(
            {
                "scope": snapshot.scope,
                "severity": d.severity,
                "reason": d.code,
                "action": d.action.value,
                "stream": snapshot.stream.value,
                "snapshot_at": format_ts(snapshot.at),
                "delivered": outcome == "sent",
            },
            f"alert:{claimed.pk}:{claimed.sk}:{claimed.version}",
        )
        return Result(outcome, d.action, d.severity, d.code, d.why)

    async def _release(self, claimed: AlertState, old: AlertState | None) -> None:
        """Undo a claim whose message could not be sent, so a later snapshot tries again."""
        restored = (
            old.model_dump()
            if old
            else claimed.model_dump()
            | {"firing": False, "fired_at": None, "last_sent_at": None, "sent_count": 0}
        ) | {"version": claimed.version + 1, "last_snapshot_at": claimed.last_snapshot_at}
        if not await self._swap(AlertState.model_validate(restored), claimed):
            log.warning("alert_release_lost", pk=claimed.pk, sk=claimed.sk)


def _split(
    items: list[dict[str, Any]], stream: Stream
) -> tuple[dict[AlertKey, AlertState], dict[AlertKey, AlertObservation], AlertCursor | None]:
    states: dict[AlertKey, AlertState] = {}
    observations: dict[AlertKey, AlertObservation] = {}
    cursor: AlertCursor | None = None
    for item in items:
        sk = str(item["sk"])
        try:
            if sk.startswith(keys.CURSOR_PREFIX):
                if sk == keys.alert_cursor_sk(stream.value):
                    cursor = AlertCursor.model_validate(item)
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
    return states, observations, cursor


def dead_letter_body(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
