"""A service run in the test's own event loop for the length of a block: started as a task,
awaited until it says it serves, stopped gracefully (and awaited, bounded) when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol


class Service(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


@contextlib.asynccontextmanager
async def serving(
    app: Service, ready: asyncio.Event, *, start_within: float = 15, stop_within: float = 20
) -> AsyncIterator[None]:
    """``app.run(stop)`` until the block ends; the block begins once ``ready`` is set (what broke
    start-up is raised instead)."""
    stop = asyncio.Event()
    task = asyncio.create_task(app.run(stop))
    try:
        waiter = asyncio.ensure_future(ready.wait())
        done, _ = await asyncio.wait(
            [task, waiter], timeout=start_within, return_when="FIRST_COMPLETED"
        )
        waiter.cancel()
        if task in done:
            task.result()  # raises what broke start-up
        assert ready.is_set(), f"the service was not ready within {start_within} s"
        yield
    finally:
        stop.set()
        async with asyncio.timeout(stop_within):
            await task
