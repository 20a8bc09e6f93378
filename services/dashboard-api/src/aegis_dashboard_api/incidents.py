"""Incidents for the people who answer them: the open ones, one incident, acknowledge and resolve
(``/api/incidents``, behind the dashboard's token), and the Acknowledge button of a Slack alert
(``POST /slack/interactions``).

Slack signs every interaction request with the app's signing secret (``X-Slack-Signature`` over
``v0:{timestamp}:{body}``, ``X-Slack-Request-Timestamp``); the route checks it with Slack's own
SDK, refuses a timestamp more than five minutes from the dashboard's clock, and takes each signed
request once: its signature is recorded (``SLACK#{digest}``, a conditional put that expires with
the window), so a captured request sent again changes nothing. Only then is the incident
acknowledged, by the Slack user who clicked, and the message updated through the request's
``response_url`` (only a URL under ``AEGIS_SLACK_RESPONSE_URL_PREFIX``) to show who did.
"""

from __future__ import annotations

import functools
import hashlib
import json
from datetime import datetime, timedelta
from typing import Annotated, Any
from urllib.parse import parse_qs

import structlog
from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from slack_sdk.models.blocks import ContextBlock, MarkdownTextObject
from slack_sdk.signature import Clock as SlackClock
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook.async_client import AsyncWebhookClient

from aegis_contracts import incidents, keys
from aegis_contracts.audit import Action
from aegis_contracts.errors import ContractError
from aegis_contracts.items import Incident
from aegis_contracts.people import FLEET, Act, Identity, Role, decide, factory_of
from aegis_contracts.times import Clock, format_ts
from aegis_dashboard_api import audit
from aegis_dashboard_api.authz import Permission, identity_of, public
from aegis_dashboard_api.models import Problem
from aegis_dashboard_api.selects import announce_select
from aegis_storage.errors import Conflict, NotFound
from aegis_storage.incidents import IncidentStore, Transition
from aegis_storage.readmodel import ReadModel

log = structlog.get_logger(__name__)

ACK_ACTION = "aegis_ack"  # the action_id prefix of the dispatcher's Acknowledge buttons
SLACK_WINDOW = timedelta(minutes=5)  # Slack's own: a request older than this is refused
SLACK_NONCE_PREFIX = "SLACK#"
MAX_BODY = 64 * 1024

router = APIRouter()
slack_router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON."},
    401: {"model": Problem},
    403: {"model": Problem},
    404: {"model": Problem},
    409: {"model": Problem},
}
# reads are filtered to the identity's factories; an incident of another factory is as unknown
# as one that does not exist (404), acting on one needs the responder role
READ = Depends(Permission(Act.READ, "resource"))
ACK = Depends(Permission(Act.RESPOND, "resource", "incident_id", audit="incident.acknowledge"))
RESOLVE = Depends(Permission(Act.RESPOND, "resource", "incident_id", audit="incident.resolve"))


class IncidentList(BaseModel):
    incidents: list[Incident]


class Acknowledgement(BaseModel):
    note: str | None = Field(default=None, max_length=incidents.MAX_NOTE)


class Resolution(BaseModel):
    note: str = Field(min_length=1, max_length=incidents.MAX_NOTE)


class Outcome(BaseModel):
    changed: bool = Field(description="false: it was so already (the first answer stands)")
    incident: Incident


def _store(request: Request) -> IncidentStore:
    store: IncidentStore = request.app.state.reader.incidents
    return store


def _clock(request: Request) -> Clock:
    clock: Clock = request.app.state.reader.clock
    return clock


def person(request: Request) -> str:
    """Who a dashboard request is, as records name them (``token:NAME``, ``oidc:NAME``)."""
    return identity_of(request).who


def _may(request: Request, act: Act, found: Incident | None, who: Identity | None = None) -> bool:
    """``found`` exists and ``who`` (default: the request's identity) may ``act`` on its
    factory."""
    who = who or identity_of(request)
    return found is not None and bool(decide(who, act, factory_of(found.scope)))


def slack_user(user: dict[str, Any]) -> Identity:
    """Whoever clicks in the alerts channel answers for the fleet: the channel is the audience
    the alert went to, and Slack's signature vouches for the click."""
    name = str(user.get("username") or user.get("name") or user.get("id"))
    return Identity(
        subject=f"slack:{user.get('id') or name}",
        name=name,
        via="slack",
        role=Role.RESPONDER,
        scope=(FLEET,),
    )


def _problem(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


def _known(incident_id: str) -> str:
    try:
        return keys.incident_id(incident_id)
    except ContractError:
        return ""


@router.get("/incidents", response_model=IncidentList, responses=ERRORS, dependencies=[READ])
async def open_incidents(request: Request, factory: str | None = None) -> IncidentList:
    """The open incidents (triggered or acknowledged) of the factories the caller may see,
    oldest first; ``?factory=`` one scope."""
    found = await _store(request).open(now=_clock(request)())
    if factory is not None:
        found = [i for i in found if i.scope == factory]
    return IncidentList(incidents=[i for i in found if _may(request, Act.READ, i)])


@router.get(
    "/incidents/{incident_id}", response_model=Incident, responses=ERRORS, dependencies=[READ]
)
async def incident(incident_id: str, request: Request) -> Incident | JSONResponse:
    """One incident with its timeline (open, or closed within the read model's keeping)."""
    found = await _store(request).get(incident_id) if _known(incident_id) else None
    if found is None or not _may(request, Act.READ, found):
        return _problem(404, "unknown_incident", f"no incident {incident_id!r}")
    announce_select(request, "incident", incident_id, factory=found.scope)
    return found


async def _act(
    request: Request,
    incident_id: str,
    transition: Transition,
    action: Action,
    who: Identity | None = None,
) -> Outcome | JSONResponse:
    store = _store(request)
    noted = functools.partial(audit.record, request, action, who=who, target=incident_id)
    # its factory decides (a scope never changes): one out of the caller's scope is unknown
    found = await store.get(incident_id) if _known(incident_id) else None
    if not _may(request, Act.RESPOND, found, who):
        scope = found.scope if found is not None else None
        await noted("refused", factory=scope, detail="no such incident in scope")
        return _problem(404, "unknown_incident", f"no incident {incident_id!r}")
    assert found is not None
    try:
        stored, changed = await store.change(incident_id, transition)
    except NotFound:
        return _problem(404, "unknown_incident", f"no incident {incident_id!r}")
    except ContractError as err:
        await noted("refused", factory=found.scope, detail=str(err))
        return _problem(409, err.code, str(err))
    await noted("ok", factory=found.scope, detail="" if changed else "so already")
    return Outcome(changed=changed, incident=stored)


@router.post(
    "/incidents/{incident_id}/ack", response_model=Outcome, responses=ERRORS, dependencies=[ACK]
)
async def acknowledge(
    incident_id: str,
    request: Request,
    body: Annotated[Acknowledgement | None, Body()] = None,
) -> Outcome | JSONResponse:
    """Someone is on it: escalation stops and reminders end. 409 when it is resolved."""
    ack = functools.partial(
        incidents.acknowledge,
        by=person(request),
        via="dashboard",
        at=_clock(request)(),
        note=body.note if body else None,
    )
    return await _act(request, incident_id, ack, "incident.acknowledge")


@router.post(
    "/incidents/{incident_id}/resolve",
    response_model=Outcome,
    responses=ERRORS,
    dependencies=[RESOLVE],
)
async def resolve(incident_id: str, request: Request, body: Resolution) -> Outcome | JSONResponse:
    """Closed by a person, with a note saying why (a false alarm, handled on site)."""
    close = functools.partial(
        incidents.resolve, by=person(request), via="dashboard", at=_clock(request)(), note=body.note
    )
    return await _act(request, incident_id, close, "incident.resolve")


# -- Slack ------------------------------------------------------------------------------------


class _SlackClock(SlackClock):
    """Slack's verifier on the dashboard's clock (tests move it; production is the wall)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock().timestamp()


def verified(secret: str, clock: Clock, body: bytes, headers: Any) -> bool:
    timestamp = headers.get("x-slack-request-timestamp")
    signature = headers.get("x-slack-signature")
    if not timestamp or not signature or not timestamp.isdigit():
        return False
    return SignatureVerifier(secret, clock=_SlackClock(clock)).is_valid(body, timestamp, signature)


async def first_use(readmodel: ReadModel, signature: str, now: datetime) -> bool:
    """Record a signed request; False when it was recorded before (a replay)."""
    digest = hashlib.sha256(signature.encode()).hexdigest()[:40]
    item = {
        "pk": f"{SLACK_NONCE_PREFIX}{digest}",
        "sk": "REQUEST",
        "seen_at": format_ts(now),
        # kept past the window in both directions: a replay is refused by one check or the other
        "ttl": int((now + 2 * SLACK_WINDOW).timestamp()),
    }
    try:
        await readmodel.put_item(item, if_absent=True)
    except Conflict:
        return False
    return True


def acknowledged_blocks(
    message: dict[str, Any], incident_id: str, who: str, at: datetime
) -> list[dict[str, Any]]:
    """The message's blocks without the incident's Acknowledge button, and a line saying who
    acknowledged it and when."""
    blocks: list[dict[str, Any]] = []
    for block in message.get("blocks") or []:
        if block.get("type") == "actions":
            elements = [e for e in block.get("elements") or [] if e.get("value") != incident_id]
            blocks.append(block | {"elements": elements})
        else:
            blocks.append(block)
    line = ContextBlock(
        elements=[
            MarkdownTextObject(
                text=f":white_check_mark: Acknowledged by {who} at "
                f"{at:%Y-%m-%d %H:%M:%S} UTC · incident `{incident_id}`"
            )
        ]
    )
    return [*blocks, line.to_dict()]


async def _refusal(request: Request, body: bytes) -> JSONResponse | None:
    """Why a request to ``/slack/interactions`` is not taken, or None: not configured, too
    large, not signed by Slack within the window, or a signed request seen before."""
    settings = request.app.state.settings
    if settings.slack_signing_secret is None:
        return _problem(404, "not_configured", "Slack interactivity is not configured")
    if len(body) > MAX_BODY:
        return _problem(413, "too_large", "an interaction is a few kilobytes")
    clock = _clock(request)
    metrics = request.app.state.metrics
    secret = settings.slack_signing_secret.get_secret_value()
    if not verified(secret, clock, body, request.headers):
        metrics.slack_refused("signature")
        log.warning("slack_interaction_refused", why="signature or timestamp")
        return _problem(401, "invalid_signature", "not signed by Slack within five minutes")
    readmodel: ReadModel = request.app.state.reader.readmodel
    if not await first_use(readmodel, request.headers["x-slack-signature"], clock()):
        metrics.slack_refused("replay")
        log.warning("slack_interaction_refused", why="replayed")
        return _problem(409, "replayed", "this signed request was taken already")
    return None


def acknowledgement(body: bytes) -> tuple[dict[str, Any], str, dict[str, Any]] | None:
    """(the payload, the incident id, the Slack user) of an Acknowledge click, or None."""
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
        action = next(
            a for a in payload["actions"] if str(a.get("action_id", "")).startswith(ACK_ACTION)
        )
        user = payload["user"]
        if not isinstance(user, dict):
            return None
        return payload, str(action["value"]), user
    except (KeyError, IndexError, StopIteration, ValueError, TypeError, AttributeError):
        return None


@slack_router.post("/slack/interactions", include_in_schema=False, dependencies=[Depends(public)])
async def slack_interactions(request: Request) -> JSONResponse:
    body = await request.body()
    refused = await _refusal(request, body)
    if refused is not None:
        return refused
    metrics = request.app.state.metrics
    click = acknowledgement(body)
    if click is None:
        metrics.slack_refused("payload")
        return _problem(400, "not_an_acknowledgement", "no Acknowledge action in the payload")
    payload, incident_id, user = click
    clicked = slack_user(user)
    who = clicked.who
    at = _clock(request)()
    ack = functools.partial(incidents.acknowledge, by=who, via="slack", at=at)
    outcome = await _act(request, incident_id, ack, "incident.acknowledge", clicked)
    if isinstance(outcome, JSONResponse):
        metrics.slack_refused("incident")
        return outcome
    log.info(
        "incident_acknowledged",
        incident_id=incident_id,
        by=who,
        via="slack",
        changed=outcome.changed,
    )
    shown = outcome.incident.acknowledged_by or who
    mention = f"<@{user['id']}>" if shown == who and user.get("id") else shown
    await _update_message(
        request.app.state.settings,
        payload,
        incident_id,
        mention,
        outcome.incident.acknowledged_at or at,
    )
    return JSONResponse({"ok": True, "incident_id": incident_id, "changed": outcome.changed})


async def _update_message(
    settings: Any, payload: dict[str, Any], incident_id: str, who: str, at: datetime
) -> None:
    url = str(payload.get("response_url") or "")
    message = payload.get("message")
    if not url.startswith(settings.slack_response_url_prefix) or not isinstance(message, dict):
        log.warning("slack_message_not_updated", why="no response_url of Slack's", url=url[:60])
        return
    client = AsyncWebhookClient(url, timeout=5)
    try:
        resp = await client.send(
            text=str(message.get("text") or ""),
            blocks=acknowledged_blocks(message, incident_id, who, at),
            replace_original=True,
        )
    except Exception as err:  # the acknowledgement stands whatever Slack answers
        log.warning("slack_message_not_updated", error=type(err).__name__)
        return
    if resp.status_code >= 300:
        log.warning("slack_message_not_updated", status=resp.status_code)
