"""Composition root of the dashboard API: settings, storage clients (opened in the lifespan
unless given), the read-only routes, bearer-token access, CORS, and ``main()`` under uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from aegis_contracts.times import Clock, utc_now
from aegis_dashboard_api.access import allowed, bearer_token
from aegis_dashboard_api.routes import ApiError, Reader, router
from aegis_dashboard_api.settings import DashboardSettings
from aegis_runtime import logging as aegis_logging
from aegis_storage.clients import AwsClients, open_clients
from aegis_storage.errors import StorageError

log = structlog.get_logger(__name__)


def create_app(
    settings: DashboardSettings | None = None,
    *,
    clients: AwsClients | None = None,
    clock: Clock = utc_now,
) -> FastAPI:
    """The API. With ``clients`` (tests) the caller owns them; else they open in the lifespan."""
    s = settings or DashboardSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if clients is not None:
            app.state.reader = Reader(clients, s, clock)
            yield
            return
        async with open_clients(s.aws()) as opened:
            reader = app.state.reader = Reader(opened, s, clock)
            stop = asyncio.Event()
            warm = asyncio.create_task(reader.keep_fleet_warm(stop), name="fleet-cache")
            try:
                yield
            finally:
                stop.set()
                await warm

    async def require_token(request: Request) -> None:
        if not allowed(bearer_token(request.headers.get("authorization")), s.token_digests):
            raise ApiError(401, "unauthorized", "a valid read-only bearer token is required")

    app = FastAPI(
        title="AEGIS dashboard API",
        version="0.1.0",
        summary="Read-only views of the AEGIS read model, images and reports.",
        lifespan=lifespan,
    )
    if clients is not None:  # reachable before the lifespan too (ASGITransport runs none)
        app.state.reader = Reader(clients, s, clock)
    if s.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=s.cors_origins,
            allow_methods=["GET"],
            allow_headers=["Authorization"],
        )

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(
            {"error": exc.error, "message": exc.message}, status_code=exc.status, headers=headers
        )

    @app.exception_handler(StorageError)
    async def storage_error(_: Request, exc: StorageError) -> JSONResponse:
        log.warning("storage_failed", error=str(exc))
        return JSONResponse(
            {"error": "storage_unavailable", "message": "the read model could not be read"},
            status_code=503,
        )

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> JSONResponse:
        reader: Reader | None = getattr(request.app.state, "reader", None)
        ok = reader is not None and await reader.ready()
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    app.include_router(router, prefix="/api", dependencies=[Depends(require_token)])
    return app


def main() -> None:
    settings = DashboardSettings()
    aegis_logging.configure(settings.log_format, settings.log_level)
    log.info(
        "dashboard_started",
        url=f"http://{settings.dashboard_host}:{settings.dashboard_port}",
        tokens=len(settings.token_digests),
    )
    uvicorn.run(
        create_app(settings),
        host=settings.dashboard_host,
        port=settings.dashboard_port,
        log_config=None,
        access_log=False,
    )
