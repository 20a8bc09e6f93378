"""The runner's executions without servers: the table and the bucket in memory
(:class:`~aegis_storage.items.MemoryTable`, :class:`~aegis_storage.objects.MemoryObjects`, which
refuse what DynamoDB and S3 refuse), time from a clock the test turns. Recording an execution,
its run slots, two replicas recording the same one, an execution a dead replica left; the same
rules run against the servers in test_orchestrator.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aegis_contracts import keys
from aegis_devstack.testing.builders import FakeClock
from aegis_orchestration.engine import Executor
from aegis_orchestration.model import Job, TaskKind
from aegis_orchestration.store import JobStore
from aegis_orchestration.triggers import schedule_trigger
from aegis_orchestrator.runner import Execution, Runner
from aegis_storage.memorytable import MemoryTable
from aegis_storage.objects import MemoryObjects

T0 = datetime(2026, 11, 30, 3, 0, 30, tzinfo=UTC)
LEASE = timedelta(seconds=30)


# two DUMMY steps, one after the other
DUMMY_STEPS = [
    {"id": "first", "step_type": "DUMMY", "next_step_id": "second"},
    {"id": "second", "step_type": "DUMMY"},
]


class NoTasks:
    """The executors of a job of DUMMY steps: none are called."""

    def executors(self, job: Job, execution_id: str) -> dict[TaskKind, Executor]:
        return {}


def runner(table: MemoryTable, clock: FakeClock, owner: str) -> Runner:
    return Runner(
        store=JobStore(table, clock),
        readmodel=table,
        objects=MemoryObjects(),
        tasks=NoTasks(),
        clock=clock,
        environment={},
        owner=owner,
        lease=timedelta(minutes=5),
        inline_limit=64_000,
        log_inline=64_000,
        log_ttl=timedelta(days=7),
        execution_lease=LEASE,
    )


async def begin(r: Runner, job: Job, minute: int = 0, **kwargs: Any) -> Execution | None:
    return await r.begin(job, schedule_trigger(job, T0 + timedelta(minutes=minute)), **kwargs)


async def leases(table: MemoryTable, job: Job) -> list[str]:
    """The execution leases and run slots held now."""
    active = await table.partition(keys.EXEC_ACTIVE_PK, now=T0)
    slots = await table.partition(keys.job_pk(job.id), now=T0, prefix=keys.RUNNING_SK_PREFIX)
    return sorted(str(i["sk"]) for i in (*active, *slots))


async def test_an_execution_runs_to_its_outcome_and_gives_its_lease_and_slot_back(
    every_minute_job: Callable[..., Job],
) -> None:
    table, clock, job = (
        MemoryTable(),
        FakeClock(T0),
        every_minute_job("job", overlap=1, steps=DUMMY_STEPS),
    )
    r = runner(table, clock, "replica-a")
    execution = await begin(r, job)
    assert execution is not None
    assert len(await leases(table, job)) == 2  # the execution's lease and its run slot
    record = await r.start(execution)
    assert record["status"] == "SUCCEEDED"
    assert [s["step_id"] for s in record["steps"]] == ["first", "second"]
    (stored,) = await r.store.executions(job.id)
    assert (stored["status"], stored["runner"]) == ("SUCCEEDED", "replica-a")
    assert await leases(table, job) == []


async def test_an_execution_past_the_jobs_overlap_is_recorded_as_skipped(
    every_minute_job: Callable[..., Job],
) -> None:
    table, clock, job = (
        MemoryTable(),
        FakeClock(T0),
        every_minute_job("job", overlap=2, steps=DUMMY_STEPS),
    )
    r = runner(table, clock, "replica-a")
    first, second = await begin(r, job, 0), await begin(r, job, 1)
    assert first is not None and second is not None
    assert await begin(r, job, 2) is None  # both run slots are held
    statuses = sorted(str(e["status"]) for e in await r.store.executions(job.id))
    assert statuses == ["RUNNING", "RUNNING", "SKIPPED_OVERLAP"]
    await r.start(first)  # a slot is free again
    assert await begin(r, job, 3) is not None


async def test_one_execution_recorded_by_two_replicas_at_once_is_recorded_once(
    every_minute_job: Callable[..., Job],
) -> None:
    table, clock, job = (
        MemoryTable(),
        FakeClock(T0),
        every_minute_job("job", overlap=5, steps=DUMMY_STEPS),
    )
    one, two = runner(table, clock, "replica-a"), runner(table, clock, "replica-b")
    both = await asyncio.gather(
        begin(one, job, execution_id="exec-0001"), begin(two, job, execution_id="exec-0001")
    )
    assert sum(e is not None for e in both) == 1
    assert [e["execution_id"] for e in await one.store.executions(job.id)] == ["exec-0001"]


async def test_an_execution_a_dead_replica_left_is_resumed_by_another_only_after_its_lease(
    every_minute_job: Callable[..., Job],
) -> None:
    table, clock, job = (
        MemoryTable(),
        FakeClock(T0),
        every_minute_job("job", overlap=1, steps=DUMMY_STEPS),
    )
    dead = runner(table, clock, "replica-a")
    assert await begin(dead, job) is not None  # recorded, then the replica died: never run
    other = runner(table, clock, "replica-b")

    async def jobs(job_id: str) -> Job | None:
        return job if job_id == job.id else None

    clock.advance(LEASE / 2)  # the dead replica's lease still holds
    assert await other.resume_abandoned(jobs) == []
    clock.advance(LEASE)  # run out
    (taken,) = await other.resume_abandoned(jobs)
    record = await other.running[next(iter(other.running))]
    assert record["execution_id"] == taken and record["status"] == "SUCCEEDED"
    (stored,) = await other.store.executions(job.id)
    assert (stored["runner"], stored["resumed"], stored["status"]) == ("replica-b", 1, "SUCCEEDED")
    assert await leases(table, job) == []
    assert await other.resume_abandoned(jobs) == []  # nothing left to take over
