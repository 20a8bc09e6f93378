"""The HTTP side of every service: ``/healthz`` (liveness), ``/readyz`` (readiness checks) and
``/metrics`` (Prometheus), served by uvicorn inside the service's own event loop.

Errors: :class:`HealthServerError` when the server cannot start (port taken, bad host).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Self

import structlog
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from aegis_runtime.metrics import Metrics

ReadinessCheck = Callable[[], Awaitable[bool]]

log = structlog.get_logger(__name__)


class HealthServerError(Exception):
    """The health server could not start."""


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopped at once by :meth:`exit`. uvicorn looks at ``should_exit`` every
    0.1 s, and once stopping waits 0.1 s for the connections it asked to close even when none is
    open: ~0.15 s of every stop (a service's, each step of a rolling restart's), now none when
    nothing is open. With connections open, uvicorn's own shutdown asks each to close and waits
    for them, bounded by ``timeout_graceful_shutdown``."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    def exit(self) -> None:
        """Stop serving (from the server's own event loop; a signal sets ``should_exit``)."""
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        # uvicorn's loop (a tick every 0.1 s: the Date header, max requests, should_exit), woken
        # by exit() instead of finishing its sleep
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.server_state.connections or self.server_state.tasks:
            await super().shutdown(sockets)
            return
        # nothing to ask to close or wait for: uvicorn's steps without its pause
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


class _Server(PromptServer):
    # The service owns SIGTERM/SIGINT (aegis_runtime.lifecycle); uvicorn must not take them over.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HealthServer:
    """``await start()`` binds (``port=0``: an ephemeral port, then read ``.port``); ``await stop()``.

    ``/readyz`` is 200 only when every check added with :meth:`add_check` returns True within
    ``check_timeout`` seconds; a check that raises or times out counts as failed. The body lists
    each check: ``{"ready": false, "checks": {"nats": true, "storage": false}}``.
    """

    def __init__(
        self,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        check_timeout: float = 2.0,
        start_timeout: float = 10.0,
    ) -> None:
        self.metrics = metrics
        self.host = host
        self._requested_port = port
        self.check_timeout = check_timeout
        self.start_timeout = start_timeout
        self._checks: dict[str, ReadinessCheck] = {}
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.app = Starlette(
            routes=[
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/readyz", self._readyz, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    def add_check(self, name: str, check: ReadinessCheck) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        self._checks[name] = check

    async def readiness(self) -> dict[str, bool]:
        """Run every check concurrently; name -> passed."""
        names = list(self._checks)
        results = await asyncio.gather(*(self._run_check(n) for n in names))
        return dict(zip(names, results, strict=True))

    async def _run_check(self, name: str) -> bool:
        try:
            async with asyncio.timeout(self.check_timeout):
                return bool(await self._checks[name]())
        except Exception as exc:  # a broken check means "not ready", never a 500
            log.warning("readiness_check_failed", check=name, error=repr(exc))
            return False

    @property
    def port(self) -> int:
        """The port actually bound (differs from the requested one when that was 0)."""
        if self._server is None or not self._server.started:
            raise RuntimeError("the health server is not running")
        sockets = self._server.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("the health server is already started")
        config = uvicorn.Config(
            self.app,
            host=self.host,
            port=self._requested_port,
            log_config=None,  # keep aegis_runtime.logging's handlers
            access_log=False,  # probes and scrapes every few seconds are not news
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        server = self._server = _Server(config)
        task = self._task = asyncio.create_task(self._serve(server), name="health-server")
        deadline = time.monotonic() + self.start_timeout
        # uvicorn has no "started" event to await; poll its flag, bounded.
        while not server.started:
            if task.done():
                self._task = None
                await task  # raises HealthServerError
                raise HealthServerError("the health server stopped while starting")
            if time.monotonic() > deadline:
                await self.stop()
                raise HealthServerError(f"the health server did not start in {self.start_timeout}s")
            await asyncio.sleep(0.005)
        log.info("health_server_started", host=self.host, port=self.port)

    async def _serve(self, server: _Server) -> None:
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits the process when it cannot bind
            raise HealthServerError(
                f"cannot serve health endpoints on {self.host}:{self._requested_port}"
            ) from exc

    async def stop(self) -> None:
        task, server = self._task, self._server
        self._task = None
        if task is None or server is None:
            return
        server.exit()
        await task

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _healthz(self, _: Request) -> Response:
        return JSONResponse({"status": "ok", "service": self.metrics.service})

    async def _readyz(self, _: Request) -> Response:
        checks = await self.readiness()
        ready = all(checks.values())
        return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)

    async def _metrics(self, _: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)


# A probe waits longer than the checks may take (``HealthServer``'s ``check_timeout``, 2 s by
# default): a service whose storage answers slowly says "not ready" itself, and a probe that
# gave up first would read a slow "ready" as a refusal forever.
PROBE_TIMEOUT_S = 5.0


def probe_ready(
    port: int, host: str = "127.0.0.1", timeout: float = PROBE_TIMEOUT_S
) -> tuple[bool, str]:
    """Ask the service whose health server listens on ``port`` for ``/readyz`` (blocking: call it
    in a thread from async code): whether it answered 200, and what it said (its checks) or why
    it could not be asked."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/readyz", timeout=timeout) as resp:
            return bool(resp.status == 200), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:  # 503: the body names the failing checks
        with exc:
            return False, f"{exc.code} {exc.read().decode(errors='replace')}"
    except OSError as exc:
        return False, repr(exc)


def answers_ready(port: int, host: str = "127.0.0.1") -> bool:
    """The service whose health server listens on ``port`` answers ``/readyz`` with 200
    (blocking, see :func:`probe_ready`)."""
    return probe_ready(port, host)[0]
