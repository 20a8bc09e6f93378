"""Reads of one entity through the API, announced as system events ``select``
(``aegis.events.select``, producer ``dashboard-api``): what the orchestrator's Automation jobs
with the sub type ``Select`` start from, e.g. a job that tells the security desk when a token
made for a wall screen reads a factory's camera images.

``detail``: the ``entity`` (``factory``, ``incident``, ``job``), its ``id``, the ``view`` read
(a factory's ``latest``, ``history`` or ``images``; else the entity itself), its ``factory``
(None for a job), who (``actor``, ``subject``, ``via``) and from where (``source``, ``agent``).

A screen polling one entity reads it again and again; one event per person, entity, view and
minute is announced (the message id of the others repeats that minute's, and JetStream drops
them as duplicates), so the stream and the jobs see who read what, not how often a browser
refreshed. The read is answered whatever happens to its announcement: one that cannot be made
(NATS away) is logged and counted (``dashboard_select_events_lost_total``).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Literal

import structlog
from fastapi import Request

from aegis_contracts.events import SystemEvent
from aegis_contracts.people import Identity
from aegis_contracts.times import truncate_ms

log = structlog.get_logger(__name__)

SELECT = "select"
Entity = Literal["factory", "incident", "job"]


def select_event(
    request: Request, entity: Entity, entity_id: str, *, view: str, factory: str | None
) -> SystemEvent:
    app = request.app
    found = getattr(request.state, "identity", None)
    who = found if isinstance(found, Identity) else None
    return SystemEvent(
        kind=SELECT,
        producer=app.state.settings.service,
        at=truncate_ms(app.state.clock()),
        detail={
            "entity": entity,
            "id": entity_id,
            "view": view,
            "factory": factory,
            "actor": who.who if who is not None else "unknown",
            "subject": who.subject if who is not None else None,
            "via": who.via if who is not None else None,
            "source": request.client.host if request.client else None,
            "agent": (request.headers.get("user-agent") or "")[:300] or None,
        },
    )


def select_msg_id(event: SystemEvent) -> str:
    """The same for every read of one entity's view by one person within a minute."""
    d = event.detail
    minute = event.at.strftime("%Y%m%dT%H%M")
    who = f"{d.get('via')}:{d.get('subject') or d.get('actor')}"
    digest = hashlib.sha256(f"{who}|{d['entity']}|{d['id']}|{d['view']}".encode()).hexdigest()
    return f"select:{digest[:32]}:{minute}"


def announce_select(
    request: Request,
    entity: Entity,
    entity_id: str,
    *,
    view: str | None = None,
    factory: str | None = None,
) -> None:
    """Announce a successful read of one entity beside the answer (never delays or fails it)."""
    app = request.app
    if not (app.state.settings.dashboard_live and app.state.settings.dashboard_select_events):
        return
    event = select_event(request, entity, entity_id, view=view or entity, factory=factory)
    task = asyncio.create_task(_announce(app, event), name=f"select-{entity}-{entity_id}")
    pending: set[asyncio.Task[None]] = app.state.audit_writes
    pending.add(task)
    task.add_done_callback(pending.discard)


async def _announce(app: Any, event: SystemEvent) -> None:
    try:
        await app.state.feed.announce_event(event, msg_id=select_msg_id(event))
    except Exception as err:  # the read stands; a job that would have started is told
        app.state.metrics.select_events_lost.inc()
        log.warning("select_event_not_announced", error=str(err), entity=event.detail["entity"])
