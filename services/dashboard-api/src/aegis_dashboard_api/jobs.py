"""Orchestration jobs through the dashboard's API (``/api/jobs``): read them and their recent
executions (the whole fleet's readers: a job may read and act on any factory), and, for
administrators only, register, replace, delete (soft), enable and disable them.

A job is checked as ``aegis jobs register`` checks a jobs file (:func:`check_jobs`): a job that
is not valid is answered ``422 application/problem+json`` naming every problem and where it is
(``field``: a dotted path such as ``steps.0.step_type``, or the step, param or condition a tree
check names), as is a job of a tenant the tenants file (``AEGIS_ORCHESTRATOR_TENANTS_FILE``) does
not declare. Each change is kept in the read model with a new version and announced on
``aegis.changes.orch_job`` (the read model's change sink), so running orchestrators take it at
once; a write with ``If-Match: "<version>"`` is refused (412) when the job changed meanwhile.
Every change, and every refusal, is on the audit record."""

from __future__ import annotations

import asyncio
import difflib
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from aegis_contracts.audit import Action
from aegis_contracts.people import Act
from aegis_dashboard_api import audit
from aegis_dashboard_api.authz import Permission, identity_of
from aegis_dashboard_api.errors import ApiError
from aegis_dashboard_api.models import Invalid, Problem
from aegis_dashboard_api.selects import announce_select
from aegis_orchestration.model import Job, valid_id
from aegis_orchestration.store import DuplicateJob, JobNotFound, JobStore
from aegis_orchestration.tenants import TenantsFileError, load_tenants
from aegis_orchestration.yamlio import JobProblem, check_jobs, job_document
from aegis_storage.errors import Conflict

router = APIRouter()

PROBLEM_JSON = "application/problem+json"
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "The body is not JSON."},
    401: {"model": Problem},
    403: {"model": Problem},
    404: {"model": Problem},
}
# jobs belong to no factory: reading them takes the whole fleet's scope, changing them an admin
READ = Depends(Permission(Act.READ, "platform"))
READ_ONE = Depends(Permission(Act.READ, "platform", "job_id"))
REGISTER = Depends(Permission(Act.ADMINISTER, "platform", audit="job.register"))
REPLACE = Depends(Permission(Act.ADMINISTER, "platform", "job_id", audit="job.replace"))
DELETE = Depends(Permission(Act.ADMINISTER, "platform", "job_id", audit="job.delete"))
ENABLE = Depends(Permission(Act.ADMINISTER, "platform", "job_id", audit="job.enable"))
DISABLE = Depends(Permission(Act.ADMINISTER, "platform", "job_id", audit="job.disable"))
IfMatch = Annotated[
    str | None,
    Header(description='The version the change is based on ("3"); refused (412) when stale.'),
]
JobBody = Annotated[
    dict[str, Any],
    Body(description="A job document, as one entry of a jobs file (`aegis jobs export`)."),
]


class JobSummary(BaseModel):
    id: str
    job_name: str
    state: str = Field(description="enabled, disabled or deleted")
    trigger_type: str
    trigger: str = Field(description="object / sub type, or the cron and its time zone")
    trigger_condition_expr: str | None
    steps: int
    version: int
    updated_at: str | None


class JobList(BaseModel):
    jobs: list[JobSummary]


class Executions(BaseModel):
    job_id: str
    executions: list[dict[str, Any]] = Field(description="newest last")


class JobProblemOut(BaseModel):
    job: str | None
    field: str | None
    reason: str


class JobInvalid(BaseModel):
    """``application/problem+json`` (RFC 9457) with every problem of the job."""

    type: str
    title: str
    status: int
    detail: str
    error: str
    message: str
    problems: list[JobProblemOut]


def state_of(job: Job) -> str:
    if not job.is_active:
        return "deleted"
    return "enabled" if job.is_enabled else "disabled"


def trigger_of(job: Job) -> str:
    if job.trigger_cron:
        return f"{job.trigger_cron} ({job.time_zone})"
    return f"{job.object_id or '*'} / {job.trigger_sub_type or '*'}"


def summary(job: Job) -> JobSummary:
    return JobSummary(
        id=job.id,
        job_name=job.job_name,
        state=state_of(job),
        trigger_type=job.trigger_type.value,
        trigger=trigger_of(job),
        trigger_condition_expr=job.trigger_condition_expr,
        steps=len(job.steps),
        version=job.version,
        updated_at=job.updated_at,
    )


def store_of(request: Request) -> JobStore:
    reader = request.app.state.reader
    return JobStore(reader.readmodel, reader.clock)


def _known(job_id: str) -> str:
    if not valid_id(job_id):
        raise ApiError(404, "unknown_job", f"no job {job_id!r}")
    return job_id


async def _current(store: JobStore, job_id: str) -> Job:
    job = await store.get(_known(job_id))
    if job is None:
        raise ApiError(404, "unknown_job", f"no job {job_id!r}")
    return job


def _expect(current: Job | None, if_match: str | None) -> None:
    """Refuse a write based on another version than the stored one (``If-Match``)."""
    if if_match is None:
        return
    wanted = if_match.strip().removeprefix("W/").strip('"')
    have = str(current.version) if current is not None else "0"
    if wanted != have:
        raise ApiError(
            412, "version_changed", f"the job is at version {have}, not {wanted}: read it again"
        )


def invalid(problems: list[JobProblem]) -> JSONResponse:
    message = f"{len(problems)} problem(s): " + "; ".join(str(p) for p in problems[:5])
    return JSONResponse(
        {
            "type": "about:blank",
            "title": "The job is not valid",
            "status": 422,
            "detail": message,
            "error": "job_invalid",
            "message": message,
            "problems": [{"job": p.job, "field": p.field, "reason": p.reason} for p in problems],
        },
        status_code=422,
        media_type=PROBLEM_JSON,
    )


def _etag(response: Response, job: Job) -> Job:
    response.headers["ETag"] = f'"{job.version}"'
    return job


@router.get("/jobs", response_model=JobList, responses=ERRORS, dependencies=[READ])
async def jobs(
    request: Request,
    deleted: Annotated[bool, Query(description="also the deleted (soft) ones")] = False,
) -> JobList:
    """The registered jobs by id: state, trigger, steps, version."""
    found = sorted(await store_of(request).all(), key=lambda j: j.id)
    return JobList(jobs=[summary(j) for j in found if deleted or j.is_active])


@router.get("/jobs/{job_id}", response_model=Job, responses=ERRORS, dependencies=[READ_ONE])
async def job(job_id: str, request: Request, response: Response) -> Job:
    """One job, whole (its ``ETag`` is its version, for ``If-Match``)."""
    found = await _current(store_of(request), job_id)
    announce_select(request, "job", job_id)
    return _etag(response, found)


@router.get(
    "/jobs/{job_id}/executions",
    response_model=Executions,
    responses=ERRORS,
    dependencies=[READ_ONE],
)
async def executions(
    job_id: str,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Executions:
    """The job's latest executions (kept 30 days), each with its steps' records."""
    store = store_of(request)
    await _current(store, job_id)
    found = await store.executions(job_id, limit=limit)
    return Executions(job_id=job_id, executions=found)


class JobVersion(BaseModel):
    version: int
    at: str | None
    by: str | None = Field(description="who made it: oidc:NAME, token:NAME, cli:LOGIN")


class JobVersions(BaseModel):
    job_id: str
    versions: list[JobVersion] = Field(description="oldest first")


class JobDiff(BaseModel):
    job_id: str
    from_version: int
    to_version: int
    diff: str = Field(description="a unified diff of the two versions as jobs-file YAML")


async def _versions(request: Request, job_id: str) -> list[dict[str, Any]]:
    store = store_of(request)
    await _current(store, job_id)
    return await store.versions(job_id)


async def _version(request: Request, job_id: str, version: int) -> dict[str, Any]:
    """One version of a job, by its key (a job deleted since keeps its versions)."""
    found = await store_of(request).version(_known(job_id), version)
    if found is None:
        await _current(store_of(request), job_id)  # an unknown job: 404 unknown_job
        raise ApiError(404, "unknown_version", f"job {job_id!r} has no version {version}")
    return found


def _document(version: dict[str, Any]) -> str:
    job = Job.model_validate(version["job"])
    return yaml.safe_dump(job_document(job), sort_keys=False, allow_unicode=True)


@router.get(
    "/jobs/{job_id}/versions",
    response_model=JobVersions,
    responses=ERRORS,
    dependencies=[READ_ONE],
)
async def versions(job_id: str, request: Request) -> JobVersions:
    """Every version the job had: when, by whom (the whole of each at ``/versions/{n}``)."""
    found = await _versions(request, job_id)
    return JobVersions(
        job_id=job_id,
        versions=[JobVersion(version=int(v["version"]), at=v["at"], by=v["by"]) for v in found],
    )


@router.get(
    "/jobs/{job_id}/versions/{version}",
    response_model=Job,
    responses=ERRORS,
    dependencies=[READ_ONE],
)
async def job_version(job_id: str, version: int, request: Request) -> Job:
    """The job as it was at ``version``."""
    return Job.model_validate((await _version(request, job_id, version))["job"])


@router.get(
    "/jobs/{job_id}/diff", response_model=JobDiff, responses=ERRORS, dependencies=[READ_ONE]
)
async def diff(
    job_id: str,
    request: Request,
    from_version: Annotated[int, Query(alias="from", ge=1)],
    to_version: Annotated[int, Query(alias="to", ge=1)],
) -> JobDiff:
    """What changed from one version to another, as a unified diff of the jobs-file YAML."""
    old, new = [await _version(request, job_id, n) for n in (from_version, to_version)]
    lines = difflib.unified_diff(
        _document(old).splitlines(keepends=True),
        _document(new).splitlines(keepends=True),
        fromfile=f"{job_id} v{from_version}",
        tofile=f"{job_id} v{to_version}",
    )
    return JobDiff(
        job_id=job_id, from_version=from_version, to_version=to_version, diff="".join(lines)
    )


async def _checked(
    request: Request, action: Action, body: dict[str, Any], job_id: str | None
) -> Job | JSONResponse:
    """The job of ``body`` as ``aegis jobs register`` checks it; every problem refused."""
    if job_id is not None:
        given = body.get("id", job_id)
        if given != job_id:
            problem = JobProblem(str(given), "id", f"the path names job {job_id!r}")
            await audit.record(request, action, "refused", target=job_id, detail=str(problem))
            return invalid([problem])
        body = {**body, "id": job_id}
    found, problems = check_jobs({"jobs": [body]})
    if not problems and (undeclared := await _undeclared(request, found[0])):
        problems = [JobProblem(found[0].id, "tenant", undeclared)]
    if problems:
        target = str(body.get("id")) if isinstance(body.get("id"), str) else None
        detail = "; ".join(str(p) for p in problems)
        await audit.record(request, action, "refused", target=target, detail=detail)
        return invalid(problems)
    return found[0]


async def _undeclared(request: Request, job: Job) -> str | None:
    """Why ``job``'s tenant cannot be registered: the tenants file does not declare it (read at
    each write, so an edit of the file counts at once); None when it can, or it has none."""
    if job.tenant is None:
        return None
    path = request.app.state.settings.orchestrator_tenants_file
    try:
        tenants = await asyncio.to_thread(load_tenants, path)
    except TenantsFileError as err:
        raise ApiError(503, "tenants_file_invalid", str(err)) from None
    return tenants.refusal(job)


async def _stored(request: Request, action: Action, job_id: str, write: Any) -> Job:
    """Run the store's ``write``; its refusals answered (409) and recorded, its success too."""
    try:
        job: Job = await write
    except (DuplicateJob, Conflict) as err:
        await audit.record(request, action, "refused", target=job_id, detail=str(err))
        raise ApiError(409, "job_conflict", str(err)) from None
    except JobNotFound:
        raise ApiError(404, "unknown_job", f"no job {job_id!r}") from None
    await audit.record(request, action, "ok", target=job_id, detail=f"version {job.version}")
    return job


@router.post(
    "/jobs",
    response_model=Job,
    status_code=201,
    responses=ERRORS | {409: {"model": Problem}, 422: {"model": JobInvalid | Invalid}},
    dependencies=[REGISTER],
)
async def register(body: JobBody, request: Request, response: Response) -> Job | JSONResponse:
    """Register a new job (409 when one with its id exists, or another active job has the
    same trigger: object, sub type, condition and schedule)."""
    checked = await _checked(request, "job.register", body, None)
    if isinstance(checked, JSONResponse):
        return checked
    store = store_of(request)
    by = identity_of(request).who
    stored = await _stored(request, "job.register", checked.id, store.register(checked, by=by))
    response.headers["Location"] = f"/api/jobs/{stored.id}"
    return _etag(response, stored)


@router.put(
    "/jobs/{job_id}",
    response_model=Job,
    responses=ERRORS
    | {409: {"model": Problem}, 412: {"model": Problem}, 422: {"model": JobInvalid | Invalid}},
    dependencies=[REPLACE],
)
async def replace(
    job_id: str, body: JobBody, request: Request, response: Response, if_match: IfMatch = None
) -> Job | JSONResponse:
    """Register ``job_id`` as ``body`` says: a new version of it, or the job when there is none."""
    checked = await _checked(request, "job.replace", body, _known(job_id))
    if isinstance(checked, JSONResponse):
        return checked
    store = store_of(request)
    _expect(await store.get(job_id), if_match)
    write = store.register(checked, replace=True, by=identity_of(request).who)
    stored = await _stored(request, "job.replace", job_id, write)
    return _etag(response, stored)


async def _flag(
    request: Request,
    response: Response,
    action: Action,
    job_id: str,
    if_match: str | None,
    **changes: Any,
) -> Job:
    store = store_of(request)
    _expect(await _current(store, job_id), if_match)
    write = store.update(job_id, by=identity_of(request).who, **changes)
    return _etag(response, await _stored(request, action, job_id, write))


@router.delete(
    "/jobs/{job_id}",
    response_model=Job,
    responses=ERRORS | {412: {"model": Problem}},
    dependencies=[DELETE],
)
async def delete(
    job_id: str, request: Request, response: Response, if_match: IfMatch = None
) -> Job:
    """Delete the job (soft: it stops firing, and ``?deleted=true`` still lists it)."""
    return await _flag(request, response, "job.delete", job_id, if_match, is_active=False)


@router.post(
    "/jobs/{job_id}/enable",
    response_model=Job,
    responses=ERRORS | {409: {"model": Problem}, 412: {"model": Problem}},
    dependencies=[ENABLE],
)
async def enable(
    job_id: str, request: Request, response: Response, if_match: IfMatch = None
) -> Job:
    """Let the job's trigger fire again (409 when an active job now has its trigger)."""
    return await _flag(request, response, "job.enable", job_id, if_match, is_enabled=True)


@router.post(
    "/jobs/{job_id}/disable",
    response_model=Job,
    responses=ERRORS | {412: {"model": Problem}},
    dependencies=[DISABLE],
)
async def disable(
    job_id: str, request: Request, response: Response, if_match: IfMatch = None
) -> Job:
    """Stop the job's trigger (it stays registered)."""
    return await _flag(request, response, "job.disable", job_id, if_match, is_enabled=False)
