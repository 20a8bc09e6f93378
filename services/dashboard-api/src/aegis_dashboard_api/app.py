"""Composition root of the dashboard: settings, storage clients (opened in the lifespan unless
given), the read-only API, the web page and its live updates (one NATS listener per process,
fanned out to every browser), token access, CORS, and ``main()`` under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any, NoReturn

import structlog
import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from aegis_contracts.people import Act
from aegis_contracts.times import Clock, utc_now
from aegis_dashboard_api import audit, incidents, jobs, pages, signin, silences
from aegis_dashboard_api.access import QueryTokenMiddleware, TokenSet, request_token
from aegis_dashboard_api.authz import Permission, identity_of, public, session_of
from aegis_dashboard_api.errors import ApiError
from aegis_dashboard_api.feed import LiveFeed
from aegis_dashboard_api.live import Hub, Listener, stream
from aegis_dashboard_api.observe import DashboardMetrics
from aegis_dashboard_api.routes import Reader, router
from aegis_dashboard_api.settings import DashboardSettings
from aegis_runtime import logging as aegis_logging
from aegis_runtime.bus import log_bus_identity
from aegis_runtime.envcheck import report_environment
from aegis_runtime.health import HealthServer, PromptServer
from aegis_runtime.process import exit_process
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.errors import StorageError
from aegis_storage.readmodel import ReadModel
from aegis_storage.sessions import SessionStore
from aegis_storage.tokens import TokenStore

log = structlog.get_logger(__name__)

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


live_router = APIRouter()
READ_LIVE = Permission(Act.READ, "listed")  # each event cut to what the identity may read


@live_router.get("/api/live", include_in_schema=False, dependencies=[Depends(READ_LIVE)])
async def live(request: Request) -> EventSourceResponse:
    """Server-sent events: a snapshot, then every change (see aegis_dashboard_api.feed)."""
    hub: Hub = request.app.state.hub
    settings: DashboardSettings = request.app.state.settings
    if len(hub.listeners) >= settings.dashboard_live_max_listeners:
        # a bound on what clients can hold open in one process; the page's EventSource retries
        raise ApiError(503, "too_many_streams", "this server has all the live streams it takes")
    # first, so nothing published during the snapshot is missed
    listener = hub.listen(identity_of(request), request_token(request), session_of(request))
    try:
        snapshot = await request.app.state.feed.snapshot()
    except BaseException:
        hub.forget(listener)
        raise
    return EventSourceResponse(
        stream(hub, listener, snapshot, resumed_from=request.headers.get("last-event-id")),
        ping=settings.dashboard_live_ping_s,
        sep="\n",  # as the frames are encoded (once for all browsers)
        send_timeout=30,
    )


async def _watch_tokens(
    tokens: TokenSet,
    readmodel: ReadModel,
    hub: Hub,
    *,
    clock: Clock,
    every_s: float,
    stop: asyncio.Event,
) -> None:
    """Every ``every_s``: read the tokens file again (when there is one) and the kept tokens;
    end the live streams of tokens revoked, expired or now giving someone else, and of sign-in
    sessions that ended (signed out on another replica, or expired)."""
    store, sessions = TokenStore(readmodel), SessionStore(readmodel)
    while not stop.is_set():
        changed = tokens.reload()
        try:
            changed |= tokens.take_stored(await store.listed(now=clock()), clock())
            signed_in = {x.session for x in hub.listeners if x.session is not None}
            ended = {s for s in signed_in if await sessions.get(s, now=clock()) is None}
        except StorageError as err:  # keep what was allowed; the next look tries again
            log.warning("dashboard_tokens_unreadable", error=str(err))
            ended = set()
        if changed:
            log.info("dashboard_tokens_reloaded", tokens=len(tokens.grants))
        if changed or ended:
            hub.revoke(functools.partial(_still_allowed, tokens, ended, clock()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def _still_allowed(tokens: TokenSet, ended: set[str], now: datetime, listener: Listener) -> bool:
    """A live stream goes on while its session has not ended, or its token still gives the
    identity it was opened with."""
    if listener.session is not None:
        return listener.session not in ended
    return listener.token is None or tokens.identify(listener.token, now) == listener.who


def _lifespan(
    s: DashboardSettings, clients: AwsClients | None, clock: Clock, hub: Hub
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if clients is None:
                opened = await stack.enter_async_context(open_clients(s.aws()))
            else:
                opened = clients
            reader = app.state.reader = Reader(opened, s, clock)
            feed = app.state.feed = LiveFeed(
                reader, hub, on_lost=app.state.metrics.change_events_lost.inc
            )
            if s.dashboard_live:  # incidents changed here are announced like the dispatcher's
                reader.readmodel.changes = feed.announce
            # /metrics (and /healthz, /readyz) on the health port, apart from the public API
            health = HealthServer(app.state.metrics.metrics, s.health_host, s.health_port)
            health.add_check("storage", reader.ready)
            await health.start()
            stack.push_async_callback(health.stop)
            app.state.health = health
            stop = asyncio.Event()
            background = []
            if clients is None:  # tests that bring their clients count the fleet reads
                background.append(asyncio.create_task(reader.keep_fleet_warm(stop), name="fleet"))
            if s.dashboard_live:
                log_bus_identity(s)
                background.append(asyncio.create_task(feed.run(stop), name="live-feed"))
            watch = _watch_tokens(
                app.state.tokens,
                reader.readmodel,
                hub,
                clock=clock,
                every_s=s.dashboard_tokens_reload_s,
                stop=stop,
            )
            background.append(asyncio.create_task(watch, name="tokens"))
            try:
                yield
            finally:
                await audit.settled(app)
                stop.set()
                hub.close()
                for task in background:
                    try:
                        await task
                    except Exception as err:
                        log.warning("background_task_failed", task=task.get_name(), error=str(err))

    return lifespan


def create_app(
    settings: DashboardSettings | None = None,
    *,
    clients: AwsClients | None = None,
    clock: Clock = utc_now,
) -> FastAPI:
    """The API and the page. With ``clients`` (tests) the caller owns them; else they open in
    the lifespan, which also starts the live feed (NATS) when ``dashboard_live`` is on."""
    s = settings or DashboardSettings()
    hub = Hub(s.dashboard_live_queue)
    app = FastAPI(
        title="AEGIS dashboard API",
        version="0.1.0",
        summary="Views of the AEGIS read model, images and reports, and the incident and "
        "silence actions of the people allowed them.",
        lifespan=_lifespan(s, clients, clock, hub),
    )
    app.state.settings = s
    app.state.hub = hub
    app.state.metrics = DashboardMetrics(s.service, hub)
    app.state.clock = clock
    app.state.audit_writes = set()
    app.state.tokens = TokenSet(s.token_grants, s.dashboard_tokens_file)
    app.state.signin_limiter = pages.SignInLimiter(
        s.dashboard_signin_attempts, s.dashboard_signin_window_s
    )
    if clients is not None:  # reachable before the lifespan too (ASGITransport runs none)
        app.state.reader = Reader(clients, s, clock)
        app.state.feed = LiveFeed(
            app.state.reader, hub, on_lost=app.state.metrics.change_events_lost.inc
        )
    if s.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=s.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": exc.error, "message": exc.message}, status_code=exc.status, headers=headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette names the methods of the first route of the path only; a path with a
            # route per method (GET and POST /api/silences) must name them all
            allowed = [
                method
                for method in HTTP_METHODS
                if any(
                    route.matches({**request.scope, "method": method})[0] is Match.FULL
                    for route in request.app.routes
                )
            ]
            if allowed:
                headers = dict(exc.headers or {}) | {"Allow": ", ".join(allowed)}
                exc = StarletteHTTPException(405, exc.detail, headers=headers)
        return await http_exception_handler(request, exc)

    @app.exception_handler(StorageError)
    async def storage_error(_: Request, exc: StorageError) -> JSONResponse:
        log.warning("storage_failed", error=str(exc))
        return JSONResponse(
            {"error": "storage_unavailable", "message": "the read model could not be read"},
            status_code=503,
        )

    @app.get("/healthz", include_in_schema=False, dependencies=[Depends(public)])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False, dependencies=[Depends(public)])
    async def readyz(request: Request) -> JSONResponse:
        reader: Reader | None = getattr(request.app.state, "reader", None)
        ok = reader is not None and await reader.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    pages.install(app)
    signin.install(app)
    app.include_router(live_router)
    # each route names what it does with a Permission (aegis_dashboard_api.authz)
    app.include_router(router, prefix="/api")
    app.include_router(incidents.router, prefix="/api")
    app.include_router(silences.router, prefix="/api")
    app.include_router(jobs.router, prefix="/api")
    app.include_router(incidents.slack_router)  # Slack's signature, not a token
    app.include_router(pages.router)
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")
    # counted under the route the router matched, whatever the middlewares around it do
    app.add_middleware(_Observed, metrics=app.state.metrics)
    # outermost: ?token= leaves the query string before anything (or any log) sees it
    app.add_middleware(QueryTokenMiddleware)
    return app


class _Observed:
    """:meth:`DashboardMetrics.middleware` in the shape ``add_middleware`` takes."""

    def __init__(self, app: Any, *, metrics: DashboardMetrics) -> None:
        self._app = metrics.middleware(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


def main() -> NoReturn:
    settings = DashboardSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    report_environment()  # AEGIS_* variables nobody reads, deprecated names (uvicorn, not run_service)
    log.info(
        "dashboard_started",
        url=f"http://{settings.dashboard_host}:{settings.dashboard_port}",
        tokens=len(settings.token_grants),
        tokens_file=str(settings.dashboard_tokens_file or ""),
    )
    server = PromptServer(server_config(create_app(settings), settings))
    server.run()
    exit_process(0 if server.started else 1)  # not finalized: see exit_process


def server_config(app: FastAPI, settings: DashboardSettings) -> uvicorn.Config:
    """uvicorn for ``app``: forwarded headers (client address, https) believed only from
    ``AEGIS_DASHBOARD_TRUSTED_PROXIES`` (uvicorn's own default trusts 127.0.0.1)."""
    return uvicorn.Config(
        app,
        host=settings.dashboard_host,
        port=settings.dashboard_port,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        forwarded_allow_ips=settings.trusted_proxies,
        timeout_graceful_shutdown=5,  # open event streams end; browsers reconnect elsewhere
    )
