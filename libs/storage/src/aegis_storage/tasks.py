"""Running storage calls together: when one fails, the others are cancelled and awaited (none is
left running, nor a paginator half-read), and the caller sees that call's own error, not an
ExceptionGroup, so the usual translation and classification of storage errors applies."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")


async def all_of(*coros: Coroutine[Any, Any, _T]) -> list[_T]:
    """The results of ``coros`` run concurrently, in order; the first failure is raised."""
    tasks: list[asyncio.Task[_T]] = []
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as eg:
        first = eg.exceptions[0]
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None
    return [t.result() for t in tasks]
