"""Jobs and executions in the read model (keys in :mod:`aegis_contracts.keys`):

- ``JOB#registry`` / ``JOB#{id}``: one job document with a ``version`` (optimistic concurrency);
- ``JOB#{id}`` / ``RUNNING#{n}``: the ``overlap_allowed`` run slots, leased per execution;
- ``EXEC#{id}`` / ``{started_at}#{execution_id}``: the execution log, ttl 30 days; while it
  runs, also its state (each step's record as it completes) and which replica runs it;
- ``EXEC-ACTIVE`` / ``{job_id}#{started_at}#{execution_id}``: the lease on an execution in
  progress, renewed by the replica running it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_orchestration.model import Job
from aegis_storage.errors import Conflict
from aegis_storage.readmodel import ReadModel

log = structlog.get_logger(__name__)


class DuplicateJob(ValueError):
    """Another active job has the same object, trigger type, sub type and condition."""


class JobNotFound(KeyError):
    pass


class JobStore:
    def __init__(self, readmodel: ReadModel, clock: Callable[[], datetime]) -> None:
        self.readmodel = readmodel
        self.clock = clock

    async def all(self) -> list[Job]:
        """Every stored job; one that is no longer valid (a rule added since it was stored, such
        as a trigger that can never fire) is logged and left out, not loaded."""
        items = await self.readmodel.partition(keys.JOB_REGISTRY_PK, now=self.clock())
        jobs = []
        for item in items:
            if not str(item["sk"]).startswith(keys.JOB_SK_PREFIX):
                continue
            try:
                jobs.append(_job(item))
            except ValueError as err:  # pydantic's ValidationError, JobError
                log.warning("stored_job_invalid", sk=item["sk"], error=str(err))
        return jobs

    async def get(self, job_id: str) -> Job | None:
        item = await self.readmodel.get_item(keys.JOB_REGISTRY_PK, keys.job_sk(job_id))
        return _job(item) if item else None

    async def register(self, job: Job, *, replace: bool = False) -> Job:
        """Store ``job`` (a new one, or with ``replace`` a new version of it). Refused with
        :class:`DuplicateJob` when another active job has its duplicate key, and with
        ``Conflict`` when it exists and ``replace`` is not set (or changed meanwhile)."""
        existing = await self.all()
        current = next((j for j in existing if j.id == job.id), None)
        if current is not None and not replace:
            raise Conflict(f"job {job.id} exists (replace it to change it)")
        if job.is_active:
            key = job.duplicate_key()
            twin = next(
                (
                    j
                    for j in existing
                    if j.id != job.id and j.is_active and j.duplicate_key() == key
                ),
                None,
            )
            if twin is not None:
                raise DuplicateJob(
                    f"job {job.id} duplicates {twin.id}: same object, trigger type, sub type "
                    "and condition"
                )
        return await self._put(job, current)

    async def update(self, job_id: str, **changes: Any) -> Job:
        current = await self.get(job_id)
        if current is None:
            raise JobNotFound(job_id)
        job = Job.model_validate({**current.model_dump(), **changes})
        if changes.get("is_active") or changes.get("is_enabled"):
            return await self.register(job, replace=True)  # coming back: no twin may exist
        return await self._put(job, current)

    async def _put(self, job: Job, current: Job | None) -> Job:
        now = format_ts(self.clock())
        stored = job.model_copy(
            update={
                "version": (current.version if current else 0) + 1,
                "created_at": current.created_at if current else now,
                "updated_at": now,
            }
        )
        item = {
            "pk": keys.JOB_REGISTRY_PK,
            "sk": keys.job_sk(job.id),
            "job": stored.model_dump(mode="json"),
            "version": stored.version,
        }
        if current is None:
            await self.readmodel.put_item(item, if_absent=True)
        else:
            await self.readmodel.put_item(item, expected={"version": current.version})
        return stored

    # -- execution log ----------------------------------------------------------------------

    async def put_execution(
        self, record: dict[str, Any], *, new: bool = False, runner: str | None = None
    ) -> None:
        """Write an execution's log item: ``new`` only if absent; with ``runner`` only while that
        replica runs it (``Conflict`` once another one has taken it over)."""
        await self.readmodel.put_item(
            record, if_absent=new, expected={"runner": runner} if runner is not None else None
        )

    async def executions(self, job_id: str, *, limit: int = 20) -> list[dict[str, Any]]:
        items = await self.readmodel.partition(keys.exec_pk(job_id), now=self.clock())
        return sorted(items, key=lambda i: str(i["sk"]))[-limit:]


def _job(item: dict[str, Any]) -> Job:
    return Job.model_validate(item["job"])
