"""``all_of`` and ``map_bounded``: results in order, never more than ``limit`` calls at once,
the first failure raised and the other calls cancelled."""

from __future__ import annotations

import asyncio

import pytest

from aegis_storage.tasks import all_of, map_bounded


async def test_results_come_in_order_with_at_most_limit_calls_at_once() -> None:
    running, most = 0, 0

    async def double(n: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001 * (n % 3))
        running -= 1
        return 2 * n

    assert await map_bounded(double, range(50), 4) == [2 * n for n in range(50)]
    assert most == 4
    assert await map_bounded(double, [], 4) == []


async def test_the_first_failure_is_raised_and_the_rest_cancelled() -> None:
    started: list[int] = []

    async def call(n: int) -> int:
        started.append(n)
        if n == 2:
            raise ValueError("two")
        await asyncio.sleep(1)
        return n

    with pytest.raises(ValueError, match="two"):
        await map_bounded(call, range(100), 3)
    assert started == [0, 1, 2]  # nothing was started after the failure


async def test_all_of_cancels_and_awaits_the_calls_still_running_when_one_fails() -> None:
    running = asyncio.Event()
    finished: list[str] = []

    async def slow() -> int:
        try:
            running.set()
            await asyncio.sleep(3600)
        finally:
            finished.append("slow")
        return 1

    async def failing() -> int:
        await running.wait()
        raise ValueError("failed")

    with pytest.raises(ValueError, match="failed"):
        await all_of(slow(), failing())
    assert finished == ["slow"]  # over before all_of raised, not left running behind it


async def test_the_failure_keeps_its_own_cause() -> None:
    """A StorageError raised ``from`` a botocore error still names it: the CLI tells an endpoint
    that never answered from other failures by that cause."""

    async def call(n: int) -> int:
        raise RuntimeError("storage") from ConnectionRefusedError(n)

    with pytest.raises(RuntimeError, match="storage") as caught:
        await map_bounded(call, range(3), 2)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)
