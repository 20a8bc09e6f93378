"""A local HTTP server standing in for a webhook (Slack, an operator's endpoint) in tests.

It records every POST and answers from a script: ``script(500, 200)`` answers 500 once, then 200;
``script((429, {"Retry-After": "1"}))`` sets headers; ``down()`` answers 503 until ``up()``;
``hold(path)`` keeps the requests to a path unanswered (seen at once in ``held``) until
``release()``: work in flight that a test can interrupt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from aegis_runtime.localservers import free_port


@dataclass
class Request:
    path: str
    body: Any
    headers: dict[str, str]
    at: float  # time.monotonic() when it arrived
    status: int  # what it was answered


@dataclass
class FakeWebhook:
    url: str = ""
    requests: list[Request] = field(default_factory=list)
    _script: deque[tuple[int, dict[str, str]]] = field(default_factory=deque)
    _down: bool = False
    held: list[Request] = field(default_factory=list)
    _hold: set[str] = field(default_factory=set)
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def script(self, *answers: int | tuple[int, dict[str, str]]) -> None:
        for answer in answers:
            self._script.append(answer if isinstance(answer, tuple) else (answer, {}))

    def down(self) -> None:
        self._down = True

    def up(self) -> None:
        self._down = False

    def hold(self, path: str) -> None:
        self._hold.add(path)
        self._released.clear()

    def release(self) -> None:
        """Answer the held requests (as scripted) and hold no more."""
        self._hold.clear()
        self._released.set()

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
        if request.path in self._hold:
            self.held.append(
                Request(request.path, body, dict(request.headers), time.monotonic(), 0)
            )
            await self._released.wait()
        status, headers = (
            (503, {}) if self._down else (self._script.popleft() if self._script else (200, {}))
        )
        self.requests.append(
            Request(request.path, body, dict(request.headers), time.monotonic(), status)
        )
        return web.Response(status=status, text="ok" if status < 300 else "error", headers=headers)


@pytest.fixture
async def webhook() -> AsyncIterator[FakeWebhook]:
    """A running fake webhook on 127.0.0.1 (its ``url`` ends in /hook)."""
    fake = FakeWebhook()
    app = web.Application()
    app.router.add_post("/{tail:.*}", fake._handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    fake.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield fake
    finally:
        await runner.cleanup()
