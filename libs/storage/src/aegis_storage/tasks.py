"""Running storage calls together: when one fails, the others are cancelled and awaited (none is
left running, nor a paginator half-read), and the caller sees that call's own error, not an
ExceptionGroup, so the usual translation and classification of storage errors applies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

_T = TypeVar("_T")
_I = TypeVar("_I")


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
        # its own cause stays (the botocore error behind a StorageError): `from None` clears it
        raise first from first.__cause__
    return [t.result() for t in tasks]


async def map_bounded(
    fn: Callable[[_I], Awaitable[_T]], items: Iterable[_I], limit: int
) -> list[_T]:
    """``fn`` over ``items``, at most ``limit`` calls at a time, results in order. ``limit``
    workers take the items one after the other, so a million items never make a million tasks;
    as with :func:`all_of`, the first failure cancels the rest and is raised."""
    work = list(enumerate(items))
    results: dict[int, _T] = {}
    pending = iter(work)

    async def worker() -> None:
        for index, item in pending:  # one iterator shared by the workers: each item taken once
            results[index] = await fn(item)

    await all_of(*(worker() for _ in range(min(max(limit, 1), len(work)))))
    return [results[index] for index in range(len(work))]
