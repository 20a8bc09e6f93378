"""Silences through the dashboard's API (``/api/silences``): list them, create one (checked by
the guard: a silence that could hide a CRITICAL needs a reason, at most 8 hours and a named
factory or reason), end one early. Who acts is the request's identity, as for incidents."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, Field

from aegis_contracts.errors import ContractError
from aegis_contracts.people import Act, decide, factory_of
from aegis_contracts.silences import Silence, SilenceRefused, new_silence, silenced_factory
from aegis_contracts.times import parse_duration
from aegis_dashboard_api import audit
from aegis_dashboard_api.authz import Permission, identity_of, refuse
from aegis_dashboard_api.incidents import person
from aegis_dashboard_api.models import Invalid, Problem
from aegis_storage.errors import NotFound
from aegis_storage.silences import SilenceStore

router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON."},
    401: {"model": Problem},
    403: {"model": Problem},
    404: {"model": Problem},
}
# a silence belongs to the factory its factory=ID matcher names; one that can reach more (no
# such matcher, a pattern) belongs to the fleet: only a fleet-wide responder sees, makes or
# ends it
READ = Depends(Permission(Act.READ, "listed"))
CREATE = Depends(Permission(Act.SILENCE, "resource", audit="silence.create"))
END = Depends(Permission(Act.SILENCE, "resource", "silence_id", audit="silence.end"))


def _may(request: Request, act: Act, silence: Silence) -> bool:
    return bool(decide(identity_of(request), act, _factory(silence)))


def _factory(silence: Silence) -> str | None:
    named = silenced_factory(list(silence.matchers))
    return None if named is None else factory_of(named)


class SilenceList(BaseModel):
    silences: list[Silence]


class NewSilence(BaseModel):
    matchers: list[str] = Field(
        min_length=1, max_length=20, description="e.g. factory=plant-a-1, reason=~CO_.*"
    )
    reason: str = Field(default="", max_length=1024)
    starts_at: AwareDatetime | None = Field(default=None, description="default: now")
    ends_at: AwareDatetime | None = None
    duration: str | None = Field(default=None, description="instead of ends_at: 30m, 2h, 1d")


class Refused(BaseModel):
    error: str
    message: str
    problems: list[str]


def _store(request: Request) -> SilenceStore:
    return SilenceStore(request.app.state.reader.readmodel)


def _now(request: Request) -> datetime:
    now: datetime = request.app.state.reader.clock()
    return now


@router.get("/silences", response_model=SilenceList, responses=ERRORS, dependencies=[READ])
async def silences(request: Request, ended: bool = False) -> SilenceList:
    """The silences in force or to come (``?ended=true``: also those ended in the last 30
    days), by start."""
    now = _now(request)
    found = await _store(request).listed(now=now)
    shown = [s for s in found if (ended or s.ends > now) and _may(request, Act.READ, s)]
    return SilenceList(silences=shown)


@router.post(
    "/silences",
    response_model=Silence,
    status_code=201,
    responses=ERRORS | {422: {"model": Refused | Invalid}},
    dependencies=[CREATE],
)
async def create(body: NewSilence, request: Request) -> Silence | JSONResponse:
    """A new silence; refused (422, every problem listed) when the guard says no."""
    now = _now(request)
    try:
        duration = parse_duration(body.duration) if body.duration is not None else None
        silence = new_silence(
            matchers=body.matchers,
            by=person(request),
            now=now,
            reason=body.reason,
            starts_at=body.starts_at,
            ends_at=body.ends_at,
            duration=duration,
        )
    except SilenceRefused as err:
        await audit.record(request, "silence.create", "refused", detail=str(err))
        return JSONResponse(
            {"error": "silence_refused", "message": str(err), "problems": err.problems},
            status_code=422,
        )
    except ValueError as err:
        await audit.record(request, "silence.create", "refused", detail=str(err))
        return JSONResponse(
            {"error": "silence_refused", "message": str(err), "problems": [str(err)]},
            status_code=422,
        )
    decision = decide(identity_of(request), Act.SILENCE, _factory(silence))
    matchers = ", ".join(str(m) for m in silence.matchers)
    if not decision:  # a factory out of scope: 404, as for one that does not exist
        await audit.record(
            request,
            "silence.create",
            "refused",
            factory=_factory(silence),
            detail=f"{matchers}: {decision.reason}",
        )
        raise refuse(decision)
    await _store(request).add(silence)
    await audit.record(
        request,
        "silence.create",
        "ok",
        target=silence.id,
        factory=_factory(silence),
        detail=matchers,
    )
    return silence


@router.delete(
    "/silences/{silence_id}", response_model=Silence, responses=ERRORS, dependencies=[END]
)
async def end(silence_id: str, request: Request) -> Silence | JSONResponse:
    """End a silence now (who and when are kept); the incidents it held back notify."""
    store = _store(request)
    unknown = JSONResponse(
        {"error": "unknown_silence", "message": f"no silence {silence_id!r}"}, status_code=404
    )
    try:
        current = await store.get(silence_id)
    except ContractError:
        return unknown
    if current is None or not _may(request, Act.SILENCE, current):
        await audit.record(
            request, "silence.end", "refused", target=silence_id, detail="no such silence in scope"
        )
        return unknown  # one out of the caller's scope is as unknown as one that never was
    try:
        ended = await store.end(silence_id, by=person(request), at=_now(request))
    except (NotFound, ContractError):
        return unknown
    await audit.record(request, "silence.end", "ok", target=silence_id, factory=_factory(current))
    return ended
