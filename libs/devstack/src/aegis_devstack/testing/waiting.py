"""Bounded polling for tests: wait for a condition instead of sleeping a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(
    predicate: Callable[[], Awaitable[bool] | bool],
    within: float = 15,
    what: str = "condition",
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` (sync or async) until it holds; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {within}s")
        await asyncio.sleep(interval)
