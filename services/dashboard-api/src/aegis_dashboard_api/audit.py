"""What people do through the dashboard, recorded (:mod:`aegis_contracts.audit`): acknowledging
and resolving incidents, silences, jobs, signing in and out, each with its outcome, refusals too.

Every sign-in, and every one that did not succeed (with its ``failure``), is also announced as
a system event ``login`` (``aegis.events.login``, producer ``dashboard-api``): what the
orchestrator's Automation jobs with the sub type ``Login`` start from, e.g. a job that warns
the security desk after failed sign-ins (``StringEQ([$.detail.outcome], "refused")``).

The record is written after the action (or the refusal) it tells of, beside the answer (a stop
waits for the records still being written). One that cannot be written
does not undo the action: it is logged (``audit_not_written``, with the whole event) and
counted (``dashboard_audit_failures_total``), for an operator to alert on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from fastapi import Request

from aegis_contracts.audit import Action, AuditEvent, Outcome, SignInFailure, new_event_id
from aegis_contracts.events import SystemEvent
from aegis_contracts.people import Identity
from aegis_contracts.times import truncate_ms
from aegis_storage.audit import AuditLog

log = structlog.get_logger(__name__)


def event_of(
    request: Request,
    action: Action,
    outcome: Outcome,
    *,
    who: Identity | None,
    target: str | None = None,
    factory: str | None = None,
    detail: str = "",
    failure: SignInFailure | None = None,
) -> AuditEvent:
    at = truncate_ms(request.app.state.clock())
    return AuditEvent(
        id=new_event_id(at),
        at=at,
        action=action,
        outcome=outcome,
        actor=who.who if who is not None else "unknown",
        subject=who.subject if who is not None else None,
        via=who.via if who is not None else None,
        target=target,
        factory=factory,
        detail=detail[:2000],
        failure=failure,
        source=request.client.host if request.client else None,
        agent=(request.headers.get("user-agent") or "")[:300] or None,
    )


async def record(
    request: Request,
    action: Action,
    outcome: Outcome,
    *,
    who: Identity | None = None,
    target: str | None = None,
    factory: str | None = None,
    detail: str = "",
    failure: SignInFailure | None = None,
) -> AuditEvent:
    """Record what ``who`` (default: the request's identity) did; never raises."""
    if who is None:
        found = getattr(request.state, "identity", None)
        who = found if isinstance(found, Identity) else None
    event = event_of(
        request,
        action,
        outcome,
        who=who,
        target=target,
        factory=factory,
        detail=detail,
        failure=failure,
    )
    # written beside the answer, not before it: the change is visible to every reader already,
    # and a person waiting on S3 for the record would see the list move under their click
    app = request.app
    task = asyncio.create_task(_write(app, event), name=f"audit-{event.id}")
    pending: set[asyncio.Task[None]] = app.state.audit_writes
    pending.add(task)
    task.add_done_callback(pending.discard)
    return event


async def _write(app: Any, event: AuditEvent) -> None:
    try:
        await AuditLog(app.state.reader.store).record(event)
    except Exception as err:  # the action stands; the record's loss is said and counted
        app.state.metrics.audit_failures.inc()
        log.exception("audit_not_written", error=str(err), event=event.model_dump(mode="json"))
    if event.action == "sign_in" and app.state.settings.dashboard_live:
        await _announce_login(app, event)


LOGIN = "login"


def login_event(event: AuditEvent, producer: str) -> SystemEvent:
    """The system event of a sign-in (its audit record's id, so a job can find the record)."""
    return SystemEvent(
        kind=LOGIN,
        producer=producer,
        at=event.at,
        detail={
            "outcome": event.outcome,
            "exception": event.failure,
            "actor": event.actor,
            "subject": event.subject,
            "via": event.via,
            "source": event.source,
            "agent": event.agent,
            "audit_id": event.id,
        },
    )


async def _announce_login(app: Any, event: AuditEvent) -> None:
    try:
        await app.state.feed.announce_event(
            login_event(event, app.state.settings.service), msg_id=f"login:{event.id}"
        )
    except Exception as err:  # the sign-in stands; a job that would have started is told
        app.state.metrics.login_events_lost.inc()
        log.warning("login_event_not_announced", error=str(err), audit_id=event.id)


async def settled(app: Any) -> None:
    """Wait for the audit records being written (a stop, or a read of the record that must
    see this replica's own)."""
    pending: set[asyncio.Task[None]] = app.state.audit_writes
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
