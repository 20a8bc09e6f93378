"""The web page: server-rendered HTML (Jinja2) over the same reads as the API, a small script
(static/app.js) that keeps it live from ``/api/live``, and uPlot vendored for the charts.

The orchestration jobs (``/jobs``, ``/jobs/{id}``: each job's steps as a graph and as an
outline, and its latest executions, the script reading them again from ``/jobs/{id}/executions``
while the page is open) are read by the whole fleet's readers; an admin enables and disables them
through the JSON API (``/api/jobs/{id}/enable|disable``).

The open incidents (``/incidents``, and a banner per incident on its factory's page) are
rendered here too; the script reads the same list again as an HTML fragment
(``/incidents/list``) every few seconds while the page is visible, and acknowledges and resolves
through the JSON API (``/api/incidents/{id}/ack|resolve``).

Paths are the ones the alert dispatcher links to (``/factories/{f}``, ``/cloud``). A browser
signs in once (the form, or a ``?token=`` link that is turned into the cookie and dropped from
the address); without a valid token every page is the sign-in form with status 401 and no data.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit
from zoneinfo import ZoneInfo

import jinja2
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from limits import RateLimitItemPerSecond
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import MovingWindowRateLimiter
from markdown_it import MarkdownIt
from markupsafe import Markup, escape

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.items import Incident
from aegis_contracts.people import Act, Identity, Role, decide, factory_of
from aegis_contracts.times import format_ts, kst_report_date, parse_ts
from aegis_dashboard_api import audit
from aegis_dashboard_api.access import (
    COOKIE,
    COOKIE_MAX_AGE_S,
    TokenSet,
    query_token,
    request_token,
)
from aegis_dashboard_api.authz import Permission, identity_of, public
from aegis_dashboard_api.errors import ApiError
from aegis_dashboard_api.i18n import LANG_COOKIE, LANGS, Lang, labels, pick_lang
from aegis_dashboard_api.jobs import state_of, store_of, summary, trigger_of
from aegis_dashboard_api.live import alert_scope
from aegis_dashboard_api.routes import Reader, fleet_entry
from aegis_dashboard_api.settings import DashboardSettings
from aegis_orchestration.graph import END, START, Graph, StepState, graph, step_states
from aegis_orchestration.model import Job, JobStep, valid_id
from aegis_storage.audit import AuditLog
from aegis_storage.errors import NotFound

HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
KST = ZoneInfo("Asia/Seoul")
WINDOWS = ("1h", "6h", "12h", "24h")
LEVEL_ORDER = {"CRITICAL": 0, "WARNING": 1, "NORMAL": 2}
# when the page calls a factory's data stale / offline (the processor's STALE_DATA and
# FACTORY_OFFLINE thresholds)
STALE_AFTER_S, OFFLINE_AFTER_S = 60, 300
SEVERITY_ORDER = {"CRITICAL": 0, "WARNING": 1}

templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, auto_reload=False
    )
)


class LoginRequired(Exception):
    """No valid token: the page answers the sign-in form with 401."""

    def __init__(self, *, invalid: bool) -> None:
        super().__init__("sign-in required")
        self.invalid = invalid


class SignedInByLink(Exception):
    """A valid ``?token=``: set the cookie and send the browser to the same page without it."""

    def __init__(self, token: str, who: Identity) -> None:
        super().__init__("signed in by link")
        self.token, self.who = token, who


@cache
def static_version(name: str) -> str:
    """A content hash for ``/static/{name}?v=…``: a new release is never served from a cache."""
    return hashlib.sha256((STATIC_DIR / name).read_bytes()).hexdigest()[:10]


def static_url(name: str) -> str:
    return f"/static/{name}?v={static_version(name)}"


def safe_next(value: str | None) -> str:
    """Where to go after signing in: a path of this site only (no scheme, no host, no ``//``)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return "/"
    return value


def time_tag(value: object) -> Markup:
    """``<time>``: KST shown, UTC in the title (hover) and the datetime attribute."""
    if isinstance(value, datetime):
        at = value
    elif not isinstance(value, str):
        return Markup("&ndash;")
    else:
        try:
            at = parse_ts(value)
        except ValueError:
            return escape(value)
    kst = at.astimezone(KST).strftime("%Y-%m-%d %H:%M:%S KST")
    utc = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Markup(  # noqa: S704 - every value inside is escaped
        f'<time datetime="{escape(utc)}" title="{escape(utc)} UTC" data-ts="{escape(utc)}">'
        f"{escape(kst)}</time>"
    )


def number(value: object) -> str:
    """At most two decimals, thousands separated (as app.js writes them): 1,500 / 98.47."""
    if not isinstance(value, int | float):
        return "\u2013"  # an en dash, as for a missing value elsewhere
    return f"{round(float(value), 2):,}".removesuffix(".0")


def duration(seconds: object, lang: Lang = "en") -> str:
    """A span of time as app.js writes it: ``45 s``, ``12 min``, ``5 h 3 min``, ``3 d 4 h``
    (``45초``, ``12분``, ``5시간 3분``, ``3일 4시간``)."""
    if not isinstance(seconds, int | float):
        return "\u2013"
    s = max(0, int(seconds))
    ko = lang == "ko"
    unit = {"s": "초", "min": "분", "h": "시간", "d": "일"} if ko else {}

    def part(n: int, u: str) -> str:
        return f"{n}{unit[u]}" if ko else f"{n} {u}"

    if s < 60:
        return part(s, "s")
    if s < 3600:
        return part(s // 60, "min")
    if s < 48 * 3600:
        hours, minutes = divmod(s // 60, 60)
        return part(hours, "h") + (" " + part(minutes, "min") if minutes else "")
    days, hours = divmod(s // 3600, 24)
    return part(days, "d") + (" " + part(hours, "h") if hours else "")


def iso(value: object) -> str:
    """A datetime as the page's data attributes hold it (UTC, ``…Z``); '' for anything else."""
    return format_ts(value) if isinstance(value, datetime) else ""


def scope_href(scope: str) -> str:
    """Where an alert or incident scope is shown: its factory's page, or the cloud page."""
    return "/cloud" if scope == keys.CLOUD_INFRA_TARGET else f"/factories/{quote(scope, safe='')}"


# the sign of an execution's or a step's status, next to its words (the page and app.js)
RUN_GLYPHS = {
    "SUCCEEDED": "\u2713",
    "FAILED": "\u2716",
    "RUNNING": "\u25d0",
    "WAITING": "\u23f8",
    "CAUGHT": "\u26a0",
    "REPEAT_LIMIT": "\u26a0",
    "SKIPPED": "\u2013",
    "SKIPPED_OVERLAP": "\u2013",
    "PENDING": "\u25cb",
    "STOPPED": "\u25a0",
    "TIMED_OUT": "\u2716",
    "ABORTED": "\u25a0",
}

templates.env.filters["time"] = time_tag
templates.env.filters["num"] = number
templates.env.filters["iso"] = iso
templates.env.globals["static_url"] = static_url
templates.env.globals["duration"] = duration
templates.env.globals["scope_href"] = scope_href
templates.env.globals["run_glyphs"] = RUN_GLYPHS


def freshness(age_s: float | None) -> str:
    """``fresh``, ``stale`` or ``offline`` by the age of the last factory_state."""
    if age_s is None or age_s >= OFFLINE_AFTER_S:
        return "offline"
    return "stale" if age_s >= STALE_AFTER_S else "fresh"


def image_origin(settings: DashboardSettings) -> str:
    if settings.aws_endpoint_url:
        parts = urlsplit(settings.aws_endpoint_url)
        return f"{parts.scheme}://{parts.netloc}"
    return "https://*.amazonaws.com"


def security_headers(settings: DashboardSettings) -> dict[str, str]:
    csp = (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        f"img-src 'self' data: {image_origin(settings)}; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    )
    return {
        "Content-Security-Policy": csp,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


def lang_of(request: Request) -> Lang:
    return pick_lang(
        request.query_params.get("lang"),
        request.cookies.get(LANG_COOKIE),
        request.headers.get("accept-language"),
    )


def render(
    request: Request, name: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    settings: DashboardSettings = request.app.state.settings
    lang = lang_of(request)
    t = labels(lang)
    config = {
        "lang": lang,
        "labels": t,
        "staleAfterS": STALE_AFTER_S,
        "offlineAfterS": OFFLINE_AFTER_S,
        "incidentsRefreshS": settings.dashboard_incidents_refresh_s,
        **context.pop("config", {}),
    }
    response: Response = templates.TemplateResponse(
        request,
        name,
        {
            "t": t,
            "lang": lang,
            "langs": LANGS,
            "path": request.url.path,
            # the sign-out form ends a sign-in session where the identity came from one
            "signed_in_via": getattr(getattr(request.state, "identity", None), "via", None),
            "is_admin": getattr(getattr(request.state, "identity", None), "role", None)
            is Role.ADMIN,
            # the cloud panel and its link only where the identity may read the platform
            "sees_platform": bool(
                getattr(getattr(request.state, "identity", None), "fleet", False)
            ),
            "oidc": getattr(request.app.state, "signin", None) is not None,
            # JSON in <script type="application/json">: "</" cannot end the element
            "config_json": Markup(  # noqa: S704
                json.dumps(config, ensure_ascii=False).replace("</", "<\\/")
            ),
            **context,
        },
        status_code=status_code,
        headers=security_headers(settings),
    )
    if request.query_params.get("lang") in LANGS:
        response.set_cookie(
            LANG_COOKIE, lang, max_age=365 * 86_400, httponly=True, samesite="strict"
        )
    return response


class PageRefused(Exception):
    """A page the identity may not see: rendered as the "missing" page with its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class PagePermission(Permission):
    """A page's :class:`Permission`: a valid ``?token=`` link signs the browser in first; no
    identity is the sign-in form (401), a refusal the "missing" page (404, 403)."""

    async def __call__(self, request: Request) -> Identity:
        tokens: TokenSet = request.app.state.tokens
        from_link = query_token(request.scope)
        if from_link is not None:
            linked = tokens.identify(from_link, request.app.state.clock())
            if linked is not None:
                raise SignedInByLink(from_link, linked)
        try:
            return await super().__call__(request)
        except ApiError as err:
            if err.status == 401:
                raise LoginRequired(invalid=request_token(request) is not None) from None
            raise PageRefused(err.status, err.message) from None


READ_PAGE = Depends(PagePermission(Act.READ, "listed"))
READ_FACTORY_PAGE = Depends(PagePermission(Act.READ, "path"))
READ_PLATFORM_PAGE = Depends(PagePermission(Act.READ, "platform"))
ADMIN_PAGE = Depends(PagePermission(Act.ADMINISTER, "platform"))
PUBLIC = Depends(public)


def install(app: FastAPI) -> None:
    """The page's answers to a missing token and to a sign-in link."""

    @app.exception_handler(LoginRequired)
    async def login_required(request: Request, exc: LoginRequired) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return login_page(request, invalid=exc.invalid, next_path=path)

    @app.exception_handler(SignedInByLink)
    async def signed_in_by_link(request: Request, exc: SignedInByLink) -> Response:
        await audit.record(request, "sign_in", "ok", who=exc.who, detail="by link")
        return signed_in_redirect(request, exc.token)

    @app.exception_handler(PageRefused)
    async def page_refused(request: Request, exc: PageRefused) -> Response:
        return render(request, "missing.html", {"message": exc.message}, status_code=exc.status)


def set_token_cookie(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )


def login_page(request: Request, *, invalid: bool, next_path: str) -> Response:
    return render(
        request,
        "login.html",
        {"invalid": invalid, "next": safe_next(next_path)},
        status_code=401,
    )


def _reader(request: Request) -> Reader:
    reader: Reader = request.app.state.reader
    return reader


router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse, dependencies=[READ_PAGE])
async def fleet_page(request: Request) -> Response:
    reader = _reader(request)
    who = identity_of(request)
    now = reader.clock()
    entries = sorted(
        (
            e
            for e in (fleet_entry(i, now) for i in await reader.fleet_items())
            if decide(who, Act.READ, e.factory_id)
        ),
        key=lambda e: e.factory_id,
    )
    counts = dict.fromkeys(LEVEL_ORDER, 0)
    for entry in entries:
        if entry.level in counts:
            counts[entry.level] += 1
    alerts = [
        a
        for a in await reader.readmodel.firing_alerts(now=now)
        if decide(who, Act.READ, factory_of(alert_scope(a)))
    ]
    return render(
        request,
        "fleet.html",
        {"entries": entries, "counts": counts, "alerts": alerts, "freshness": freshness},
    )


@router.get(
    "/factories/{factory_id}", response_class=HTMLResponse, dependencies=[READ_FACTORY_PAGE]
)
async def factory_page(request: Request, factory_id: str) -> Response:
    reader = _reader(request)
    try:
        latest = await reader.latest(factory_id)
    except ApiError as err:
        return render(request, "missing.html", {"message": err.message}, status_code=err.status)
    window = request.query_params.get("window", "1h")
    window = window if window in WINDOWS else "1h"
    now = reader.clock()
    entry = fleet_entry(latest, now)
    alerts = [
        a
        for a in await reader.readmodel.firing_alerts(now=now)
        if a.get("pk") == keys.alert_pk(factory_id)
    ]
    return render(
        request,
        "factory.html",
        {
            "entry": entry,
            "latest": latest,
            "alerts": alerts,
            **await incidents_context(request, factory_id, "banners"),
            "window": window,
            "windows": WINDOWS,
            "freshness": freshness,
            "config": {"factoryId": factory_id, "window": window},
        },
    )


def worst_first(found: Iterable[Incident]) -> list[Incident]:
    """CRITICAL before WARNING, then the oldest first."""
    return sorted(
        found,
        key=lambda i: (SEVERITY_ORDER.get(i.severity, len(SEVERITY_ORDER)), i.triggered_at, i.pk),
    )


async def incidents_context(request: Request, factory: str | None, view: str) -> dict[str, Any]:
    """What the incident list (``view`` list) or a factory's banners (``banners``) show: the
    open incidents, worst first, with the time they are counted from."""
    reader = _reader(request)
    now = reader.clock()
    who = identity_of(request)
    found = [
        i
        for i in await reader.incidents.open(now=now)
        if (factory is None or i.scope == factory) and decide(who, Act.READ, factory_of(i.scope))
    ]
    # what this person may do to each (the page shows those buttons only)
    responds = {i.incident_id for i in found if decide(who, Act.RESPOND, factory_of(i.scope))}
    source = "/incidents/list?" + urlencode(
        {"view": view, **({"factory": factory} if factory is not None else {})}
    )
    counts = {sev: sum(1 for i in found if i.severity == sev) for sev in SEVERITY_ORDER}
    return {
        "incidents": worst_first(found),
        "incident_counts": counts,
        "incidents_now": now,
        "incidents_view": view,
        "incidents_src": source,
        "incidents_responds": responds,
    }


@router.get("/incidents", response_class=HTMLResponse, dependencies=[READ_PAGE])
async def incidents_page(request: Request) -> Response:
    factory = request.query_params.get("factory") or None
    return render(request, "incidents.html", await incidents_context(request, factory, "list"))


@router.get("/incidents/list", response_class=HTMLResponse, dependencies=[READ_PAGE])
async def incidents_fragment(request: Request) -> Response:
    """The list (or a factory's banners) alone, for the script to read again: the same HTML as
    in the page, so it is rendered (and escaped) in one place."""
    factory = request.query_params.get("factory") or None
    view = "banners" if request.query_params.get("view") == "banners" else "list"
    context = await incidents_context(request, factory, view)
    return render(request, "incidents_fragment.html", context)


@router.get("/cloud", response_class=HTMLResponse, dependencies=[READ_PLATFORM_PAGE])
async def cloud_page(request: Request) -> Response:
    latest = await _reader(request).readmodel.get_cloud_latest()
    return render(request, "cloud.html", {"latest": latest or {}, "config": {"cloud": True}})


@router.get("/reports", response_class=HTMLResponse, dependencies=[READ_PAGE])
async def reports_page(request: Request) -> Response:
    reader = _reader(request)
    who = identity_of(request)
    default_day = kst_report_date(reader.clock() - timedelta(days=1))
    try:
        day = date.fromisoformat(request.query_params.get("date") or default_day.isoformat())
    except ValueError:
        day = default_day
    prefix = keys.report_prefix(day)
    targets: list[str] = []
    async for info in reader.store.list_objects(prefix):
        target, _, artifact = info.key.removeprefix(prefix).partition("/")
        if (
            artifact == keys.ReportArtifact.REPORT.value
            and target not in targets
            and decide(who, Act.READ, factory_of(target))
        ):
            targets.append(target)
    targets.sort(key=lambda t: (t != keys.CLOUD_INFRA_TARGET, t))
    chosen = request.query_params.get("target")
    html: Markup | None = None
    if chosen in targets:
        try:
            key = keys.report_key(day, chosen, keys.ReportArtifact.REPORT)
            body = await reader.store.get_bytes(key)
        except (ContractError, NotFound):
            body = None
        if body is not None:
            # raw HTML in a report is escaped (html=False), as in the API's ?format=html
            md = MarkdownIt("commonmark", {"html": False}).enable("table")
            html = Markup(md.render(body.decode("utf-8", "replace")))  # noqa: S704
    return render(
        request,
        "reports.html",
        {"day": day, "targets": targets, "chosen": chosen, "report_html": html},
    )


@router.get("/admin/audit", response_class=HTMLResponse, dependencies=[ADMIN_PAGE])
async def audit_page(request: Request) -> Response:
    """The audit record of a UTC day (today by default), newest first: admins only."""
    reader = _reader(request)
    today = reader.clock().date()
    try:
        day = date.fromisoformat(request.query_params.get("date") or today.isoformat())
    except ValueError:
        day = today
    await audit.settled(request.app)  # this replica's own records are in it
    events, total = await AuditLog(reader.store).day(day)
    return render(request, "audit.html", {"day": day, "events": events, "total": total})


@dataclass(frozen=True)
class StepNode:
    """One step of a job's outline: the step, the steps it holds (in the order they run), and
    what its place in the flow says about it."""

    step: JobStep
    children: list[StepNode]
    # its next_step_id goes back to a step of its container that ran before it
    loops_back: bool = False
    # under a CHOICE: "if" (a branch with a condition) or "default"; None elsewhere
    branch: str | None = None


def outline(flow: Graph, parent: str | None = None) -> list[StepNode]:
    """The job's steps (of one container: ``parent``) as a tree in the order they run."""
    return [
        StepNode(n.step, outline(flow, n.id), flow.loops_back(n.id), n.branch)
        for n in flow.children(parent)
    ]


def graph_view(flow: Graph) -> dict[str, Any]:
    """What the page's script draws: every step (its container, what it is, its designer place
    when the designer placed every step) and every edge, as :func:`aegis_orchestration.graph.graph`
    gives them."""
    placed = flow.placed
    nodes = []
    for n in flow.nodes:
        s = n.step
        nodes.append(
            {
                "id": n.id,
                "parent": n.parent,
                "type": s.step_type.value,
                "sub": s.step_sub_type.value if s.step_sub_type is not None else None,
                "name": s.step_name,
                "start": s.is_start_point,
                "container": n.container,
                "branch": n.branch,
                "wait_s": s.wait_seconds,
                "at": list(n.position) if placed and n.position is not None else None,
            }
        )
    edges = [
        {"from": e.source, "to": e.target, "kind": e.kind.value, "back": e.back, "label": e.label}
        for e in flow.edges
    ]
    return {"nodes": nodes, "edges": edges, "placed": placed, "start": START, "end": END}


def error_text(error: object) -> str | None:
    """An execution's or a step's error as one line: ``{"Error": …, "Cause": …}`` or a text."""
    if isinstance(error, Mapping):
        parts = [str(error[k]) for k in ("Error", "Cause") if error.get(k)]
        return ": ".join(parts) or None
    return str(error) if error else None


def seconds_between(start: object, end: object) -> float | None:
    """Seconds from one stored timestamp to another; None when either is missing or unreadable."""
    try:
        return (parse_ts(str(end)) - parse_ts(str(start))).total_seconds() if end else None
    except ValueError:
        return None


def execution_view(job: Job, record: Mapping[str, Any]) -> dict[str, Any]:
    """What the job page shows of one execution log item (as the orchestrator's runner writes
    it): when, how it ended, what triggered it, each step's record, and where each of the job's
    steps stands in it (:func:`aegis_orchestration.graph.step_states`)."""
    trigger = record.get("trigger") or {}
    fired = [str(trigger[k]) for k in ("object_id", "sub_type") if trigger.get(k)]
    logged = [s for s in record.get("steps") or [] if isinstance(s, Mapping)]
    steps = [
        {
            "step_id": str(s.get("step_id", "?")),
            "status": str(s.get("status") or "UNKNOWN"),
            "error": error_text(s.get("error")),
            "attempts": int(s.get("attempts") or 0),
            "branch": s.get("branch"),
        }
        for s in logged
    ]
    status = str(record.get("status") or "UNKNOWN")
    states = step_states(job, status, logged)
    # the last error of each step that failed (not one a later pass of a loop made good)
    failed = {StepState.FAILED, StepState.CAUGHT, StepState.STOPPED}
    errors: dict[str, str] = {}
    for s in steps:
        step_id, error = str(s["step_id"]), s["error"]
        if isinstance(error, str) and states.get(step_id) in failed:
            errors[step_id] = error
    return {
        "execution_id": str(record.get("execution_id", "")),
        "status": status,
        "job_version": record.get("job_version"),
        "started_at": record.get("started_at"),
        "took_s": seconds_between(record.get("started_at"), record.get("finished_at")),
        "trigger_type": str(trigger.get("type") or "\u2013"),
        "trigger": " / ".join(fired),
        "error": error_text(record.get("error")),
        "steps": steps,
        "states": json.dumps({k: v.value for k, v in states.items()}, separators=(",", ":")),
        "step_errors": json.dumps(errors, ensure_ascii=False, separators=(",", ":")),
    }


def param_text(value: object) -> str:
    """A global param's value as written in a jobs file: a text as it is, anything else JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@router.get("/jobs", response_class=HTMLResponse, dependencies=[READ_PLATFORM_PAGE])
async def jobs_page(request: Request) -> Response:
    """Every registered job by id (the deleted ones with ``?deleted=1``)."""
    deleted = request.query_params.get("deleted") in ("1", "true")
    found = sorted(await store_of(request).all(), key=lambda j: j.id)
    shown = [summary(j) for j in found if deleted or j.is_active]
    hidden = sum(1 for j in found if not j.is_active) if not deleted else 0
    return render(request, "jobs.html", {"jobs": shown, "show_deleted": deleted, "hidden": hidden})


async def _job_or_missing(request: Request, job_id: str) -> Job | Response:
    job = await store_of(request).get(job_id) if valid_id(job_id) else None
    if job is None:
        return render(
            request,
            "missing.html",
            {"message": f"no job {job_id!r}", "heading": "unknown_job", "back": "/jobs"},
            status_code=404,
        )
    return job


async def executions_context(request: Request, job: Job) -> dict[str, Any]:
    """The job's latest 20 executions, newest first, and where the page reads them again."""
    records = await store_of(request).executions(job.id, limit=20)  # oldest first
    return {
        "job": job,
        "executions": [execution_view(job, r) for r in reversed(records)],
        "executions_src": f"/jobs/{quote(job.id, safe='')}/executions",
    }


@router.get("/jobs/{job_id}", response_class=HTMLResponse, dependencies=[READ_PLATFORM_PAGE])
async def job_page(request: Request, job_id: str) -> Response:
    """One job: its trigger, its steps as a graph and as an outline, its global params and its
    latest 20 executions, newest first."""
    job = await _job_or_missing(request, job_id)
    if isinstance(job, Response):
        return job
    flow = graph(job)
    settings: DashboardSettings = request.app.state.settings
    return render(
        request,
        "job.html",
        {
            "state": state_of(job),
            "trigger": trigger_of(job),
            "steps": outline(flow),
            "graph_placed": flow.placed,
            "params": [(k, param_text(v)) for k, v in sorted(job.global_params.items())],
            **await executions_context(request, job),
            "config": {
                "jobGraph": graph_view(flow),
                "runGlyphs": RUN_GLYPHS,
                "executionsRefreshS": settings.dashboard_executions_refresh_s,
            },
        },
    )


@router.get(
    "/jobs/{job_id}/executions", response_class=HTMLResponse, dependencies=[READ_PLATFORM_PAGE]
)
async def job_executions_fragment(request: Request, job_id: str) -> Response:
    """The job's executions alone, as the job page shows them, for its script to read again
    while the page is open. Its ``ETag`` names what it shows: asked with ``If-None-Match`` and
    nothing changed, it answers 304 with no body."""
    job = await _job_or_missing(request, job_id)
    if isinstance(job, Response):
        return job
    response = render(request, "job_executions.html", await executions_context(request, job))
    tag = f'"{hashlib.sha256(bytes(response.body)).hexdigest()[:20]}"'
    if tag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
        return Response(
            status_code=304, headers={**security_headers(request.app.state.settings), "ETag": tag}
        )
    response.headers["ETag"] = tag
    return response


@router.get("/login", response_class=HTMLResponse, dependencies=[PUBLIC])
async def login_form(request: Request) -> Response:
    response = login_page(request, invalid=False, next_path=request.query_params.get("next", "/"))
    response.status_code = 200
    return response


SIGN_IN_BODY_MAX = 8192  # a token and a path; the form's body is never read past this


async def form_body(request: Request) -> bytes | None:
    """The request body if it is at most ``SIGN_IN_BODY_MAX`` bytes, else None: a declared
    Content-Length over it is refused unread, and a body without one is read no further than
    the limit."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > SIGN_IN_BODY_MAX):
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > SIGN_IN_BODY_MAX:
            return None
    return bytes(body)


class SignInLimiter:
    """Failed sign-ins per client address in a moving window (the ``limits`` library, in
    memory: per process). A client over the limit is refused before its token is looked at."""

    def __init__(self, attempts: int, window_s: int) -> None:
        self.item = RateLimitItemPerSecond(attempts, window_s)
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    async def wait_s(self, client: str) -> int:
        """0 when ``client`` may try; else the seconds until it may."""
        if await self.limiter.test(self.item, client):
            return 0
        stats = await self.limiter.get_window_stats(self.item, client)
        return max(1, math.ceil(stats.reset_time - time.time()))

    async def failed(self, client: str) -> None:
        await self.limiter.hit(self.item, client)


@router.post("/login", response_class=HTMLResponse, dependencies=[PUBLIC])
async def login(request: Request) -> Response:
    # another site's form posting here would sign this browser in with its token. (The page's
    # own form sends Origin "null" under Referrer-Policy no-referrer: the fetch metadata says
    # same-origin then.)
    origin = request.headers.get("origin")
    foreign = origin not in (None, "null") and urlsplit(origin).netloc != request.headers.get(
        "host"
    )
    if foreign or request.headers.get("sec-fetch-site") == "cross-site":
        return Response("cross-site sign-in refused", status_code=403, media_type="text/plain")
    limiter: SignInLimiter = request.app.state.signin_limiter
    client = request.client.host if request.client else "unknown"
    wait_s = await limiter.wait_s(client)
    if wait_s:
        await audit.record(
            request,
            "sign_in",
            "refused",
            detail=f"too many failed attempts from this address: {wait_s} s to wait",
            failure="locked",
        )
        return Response(
            "too many sign-in attempts; try again later",
            status_code=429,
            media_type="text/plain",
            headers={"Retry-After": str(wait_s)},
        )
    body = await form_body(request)
    if body is None:
        return Response(
            f"a sign-in form is at most {SIGN_IN_BODY_MAX} bytes",
            status_code=413,
            media_type="text/plain",
        )
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    token = form.get("token", "").strip()
    next_path = safe_next(form.get("next"))
    tokens: TokenSet = request.app.state.tokens
    who = tokens.identify(token or None, request.app.state.clock())
    if who is None:
        await limiter.failed(client)
        await audit.record(
            request, "sign_in", "refused", detail="not a valid token", failure="wrong_token"
        )
        return login_page(request, invalid=True, next_path=next_path)
    await audit.record(request, "sign_in", "ok", who=who)
    response = RedirectResponse(next_path, status_code=303)
    set_token_cookie(response, request, token)
    return response


@router.post("/logout", dependencies=[PUBLIC])
async def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


def signed_in_redirect(request: Request, token: str) -> Response:
    """The same page without ``?token=`` (the middleware already took it out of the query)."""
    query = request.url.query
    target = request.url.path + (f"?{query}" if query else "")
    response = RedirectResponse(safe_next(target), status_code=303)
    set_token_cookie(response, request, token)
    return response
