"""Silences through the dashboard's API (``/api/silences``): list them, create one (checked by
the guard: a silence that could hide a CRITICAL needs a reason, at most 8 hours and a named
factory or reason), end one early. Who acts is the request's identity, as for incidents."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import AwareDatetime, BaseModel, Field

from aegis_contracts.errors import ContractError
from aegis_contracts.silences import Silence, SilenceRefused, new_silence
from aegis_contracts.times import parse_duration
from aegis_dashboard_api.incidents import person
from aegis_dashboard_api.models import Problem
from aegis_storage.errors import NotFound
from aegis_storage.silences import SilenceStore

router = APIRouter()

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON."},
    401: {"model": Problem},
    404: {"model": Problem},
}


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


class Invalid(BaseModel):
    """A body that is not a new silence at all (FastAPI's own validation answer)."""

    detail: list[dict[str, Any]]


def _store(request: Request) -> SilenceStore:
    return SilenceStore(request.app.state.reader.readmodel)


def _now(request: Request) -> datetime:
    now: datetime = request.app.state.reader.clock()
    return now


@router.get("/silences", response_model=SilenceList, responses=ERRORS)
async def silences(request: Request, ended: bool = False) -> SilenceList:
    """The silences in force or to come (``?ended=true``: also those ended in the last 30
    days), by start."""
    now = _now(request)
    found = await _store(request).listed(now=now)
    return SilenceList(silences=[s for s in found if ended or s.ends > now])


@router.post(
    "/silences",
    response_model=Silence,
    status_code=201,
    responses=ERRORS | {422: {"model": Refused | Invalid}},
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
        return JSONResponse(
            {"error": "silence_refused", "message": str(err), "problems": err.problems},
            status_code=422,
        )
    except ValueError as err:
        return JSONResponse(
            {"error": "silence_refused", "message": str(err), "problems": [str(err)]},
            status_code=422,
        )
    await _store(request).add(silence)
    return silence


@router.delete("/silences/{silence_id}", response_model=Silence, responses=ERRORS)
async def end(silence_id: str, request: Request) -> Silence | JSONResponse:
    """End a silence now (who and when are kept); the incidents it held back notify."""
    try:
        return await _store(request).end(silence_id, by=person(request), at=_now(request))
    except (NotFound, ContractError):
        return JSONResponse(
            {"error": "unknown_silence", "message": f"no silence {silence_id!r}"}, status_code=404
        )
