"""A local HTTP server standing in for a webhook (Slack, an operator's endpoint) in tests.

It records every POST and answers from a script: ``script(500, 200)`` answers 500 once, then 200;
``script((429, {"Retry-After": "1"}))`` sets headers, ``script((200, {}, b"\\xff"))`` the body
too; ``down()`` answers 503 until ``up()``; ``hold()`` keeps requests waiting unanswered (a slow
Slack; ``hold(path)``: only those to that path) until ``release()``: work in flight that a test
can interrupt. A held request whose sender went away meanwhile (its connection closed) is
recorded as :data:`ABANDONED`, not as delivered: the stand-in only counts a message it could
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from aegis_devstack.localservers import free_port

WAITING = 0  # the status of a request that is held, not answered yet
ABANDONED = 499  # a held request whose sender closed the connection before the answer


@dataclass
class Request:
    path: str
    body: Any
    headers: dict[str, str]
    at: float  # time.monotonic() when it arrived
    status: int  # what it was answered (WAITING while held, ABANDONED if the sender left)
    transport: asyncio.BaseTransport | None = field(default=None, repr=False, compare=False)

    @property
    def connected(self) -> bool:
        """The sender still holds the connection (it can still be answered)."""
        return self.transport is not None and not self.transport.is_closing()


@dataclass
class FakeWebhook:
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    _script: deque[tuple[int, dict[str, str], bytes | None]] = field(default_factory=deque)
    _down: bool = False
    _gate: asyncio.Event = field(default_factory=asyncio.Event)
    _held_paths: set[str] | None = None  # None: every path (while the gate is closed)

    def __post_init__(self) -> None:
        self._gate.set()

    def script(
        self, *answers: int | tuple[int, dict[str, str]] | tuple[int, dict[str, str], bytes]
    ) -> None:
        for answer in answers:
            if isinstance(answer, int):
                self._script.append((answer, {}, None))
            else:
                self._script.append((answer[0], answer[1], answer[2] if len(answer) > 2 else None))

    def down(self) -> None:
        self._down = True

    def up(self) -> None:
        self._down = False

    def hold(self, path: str | None = None) -> None:
        """Answer nothing (to ``path``, or to any path) until :meth:`release`; requests are
        recorded as they arrive."""
        if path is None:
            self._held_paths = None
        else:
            self._held_paths = (self._held_paths or set()) | {path}
        self._gate.clear()

    def release(self) -> None:
        self._held_paths = None
        self._gate.set()

    @property
    def waiting(self) -> list[Request]:
        """Requests that arrived and are held, unanswered."""
        return [r for r in self.requests if r.status == WAITING]

    @property
    def delivered(self) -> list[Any]:
        """Bodies answered 2xx, in arrival order."""
        return [r.body for r in self.requests if 200 <= r.status < 300]

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw.decode(errors="replace")
        arrived = Request(
            request.path,
            body,
            dict(request.headers),
            time.monotonic(),
            WAITING,
            request.transport,
        )
        self.requests.append(arrived)
        if self._held_paths is None or request.path in self._held_paths:
            await self._gate.wait()
        if not arrived.connected:
            arrived.status = ABANDONED
            return web.Response(status=ABANDONED)
        status, headers, raw_body = (
            (503, {}, None)
            if self._down
            else (self._script.popleft() if self._script else (200, {}, None))
        )
        arrived.status = status
        if raw_body is not None:
            return web.Response(status=status, body=raw_body, headers=headers)
        return web.Response(status=status, text="ok" if status < 300 else "error", headers=headers)


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` served on a free port of 127.0.0.1 for the block: its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_webhook(path: str = "/hook") -> AsyncIterator[FakeWebhook]:
    """A fake webhook on a free port of 127.0.0.1 for the block; its ``url`` ends in ``path``
    (it answers a POST to any path, and records the path)."""
    fake = FakeWebhook()
    app = web.Application()
    app.router.add_post("/{tail:.*}", fake._handle)
    async with serving(app) as base:
        fake.url = f"{base}{path}"
        try:
            yield fake
        finally:
            fake.release()  # held requests are answered (or abandoned) before the server stops


@pytest.fixture
async def webhook() -> AsyncIterator[FakeWebhook]:
    """A running fake webhook on 127.0.0.1 (its ``url`` ends in /hook)."""
    async with running_webhook() as fake:
        yield fake


class Unanswered:
    """A sender (``await send(payload, deadline=...)``, as the alert dispatcher calls one) that
    never hears back: ``posted`` is set at the first post, which then waits forever, so its
    handler can be killed with the post outstanding."""

    def __init__(self) -> None:
        self.posted = asyncio.Event()

    async def send(self, payload: dict[str, Any], *, deadline: float | None = None) -> Any:
        self.posted.set()
        await asyncio.Event().wait()
