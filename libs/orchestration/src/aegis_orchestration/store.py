"""Jobs and executions in the read model (keys in :mod:`aegis_contracts.keys`):

- ``JOB#registry`` / ``JOB#{id}``: one job document with a ``version`` (optimistic concurrency);
- ``JOB#registry`` / ``VERSION#{id}#{n}``: every version the job had, who made it and when;
- ``JOB#registry`` / ``TRIGGER#{digest}``: the active job that holds a trigger (the digest of its
  duplicate key), written in the same transaction as the job, so that two jobs that would both
  fire for one event cannot both be registered, even by two registrations at the same moment;
- ``JOB#{id}`` / ``RUNNING#{n}``: the ``overlap_allowed`` run slots, leased per execution;
- ``EXEC#{id}`` / ``{started_at}#{execution_id}``: the execution log, ttl 30 days; while it
  runs, also its state (each step's record as it completes) and which replica runs it;
- ``EXEC-ACTIVE`` / ``{job_id}#{started_at}#{execution_id}``: the lease on an execution in
  progress, renewed by the replica running it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog

from aegis_contracts import keys
from aegis_contracts.times import format_ts
from aegis_orchestration.model import Job
from aegis_storage.errors import Conflict
from aegis_storage.items import Items, Put

log = structlog.get_logger(__name__)


class DuplicateJob(ValueError):
    """Another active job has the same object, trigger type, sub type and condition."""


class JobNotFound(KeyError):
    pass


class JobStore:
    def __init__(self, readmodel: Items, clock: Callable[[], datetime]) -> None:
        self.readmodel = readmodel
        self.clock = clock

    async def all(self) -> list[Job]:
        """Every stored job; one that is no longer valid (a rule added since it was stored, such
        as a trigger that can never fire) is logged and left out, not loaded."""
        items = await self.readmodel.partition(
            keys.JOB_REGISTRY_PK, now=self.clock(), prefix=keys.JOB_SK_PREFIX
        )
        jobs = []
        for item in items:
            try:
                jobs.append(_job(item))
            except ValueError as err:  # pydantic's ValidationError, JobError
                log.warning("stored_job_invalid", sk=item["sk"], error=str(err))
        return jobs

    async def get(self, job_id: str) -> Job | None:
        item = await self.readmodel.get_item(keys.JOB_REGISTRY_PK, keys.job_sk(job_id))
        return _job(item) if item else None

    async def register(self, job: Job, *, replace: bool = False, by: str | None = None) -> Job:
        """Store ``job`` (a new one, or with ``replace`` a new version of it). Refused with
        :class:`DuplicateJob` when another active job has its duplicate key, and with
        ``Conflict`` when it exists and ``replace`` is not set (or changed meanwhile)."""
        existing = await self.all()
        current = next((j for j in existing if j.id == job.id), None)
        if current is not None and not replace:
            raise Conflict(f"job {job.id} exists (replace it to change it)")
        if job.is_active:
            # jobs stored before trigger claims existed hold none: they are found here
            twin = self._twin(job, existing)
            if twin is not None:
                raise DuplicateJob(_duplicates(job.id, twin))
        return await self._put(job, current, by=by)

    async def update(self, job_id: str, *, by: str | None = None, **changes: Any) -> Job:
        current = await self.get(job_id)
        if current is None:
            raise JobNotFound(job_id)
        job = Job.model_validate({**current.model_dump(), **changes})
        if changes.get("is_active") or changes.get("is_enabled"):
            return await self.register(job, replace=True, by=by)  # coming back: no twin may exist
        return await self._put(job, current, by=by)

    @staticmethod
    def _twin(job: Job, existing: list[Job]) -> str | None:
        key = job.duplicate_key()
        return next(
            (j.id for j in existing if j.id != job.id and j.is_active and j.duplicate_key() == key),
            None,
        )

    async def _put(self, job: Job, current: Job | None, *, by: str | None) -> Job:
        """The job, its version record and its trigger claim, in one transaction."""
        now = format_ts(self.clock())
        stored = job.model_copy(
            update={
                "version": (current.version if current else 0) + 1,
                "created_at": current.created_at if current else now,
                "updated_at": now,
            }
        )
        document = stored.model_dump(mode="json")
        registry = {
            "pk": keys.JOB_REGISTRY_PK,
            "sk": keys.job_sk(job.id),
            "job": document,
            "version": stored.version,
        }
        version = {
            "pk": keys.JOB_REGISTRY_PK,
            "sk": keys.job_version_sk(job.id, stored.version),
            "job_id": job.id,
            "version": stored.version,
            "job": document,
            "by": by,
            "at": now,
        }
        before = _registry_item(current) if current is not None else None
        puts = [
            Put(
                registry,
                if_absent=current is None,
                expected=None if current is None else {"version": current.version},
                before=before,
            ),
            Put(version, if_absent=True),
            *_claims(stored, current),
        ]
        try:
            await self.readmodel.put_items(puts)
        except Conflict:
            held = await self._claimed_by(stored) if stored.is_active else None
            if held is not None and held != job.id:
                raise DuplicateJob(_duplicates(job.id, held)) from None
            raise Conflict(f"job {job.id} changed meanwhile: read it again") from None
        return stored

    async def _claimed_by(self, job: Job) -> str | None:
        item = await self.readmodel.get_item(keys.JOB_REGISTRY_PK, _claim_sk(job))
        holder = item.get("job_id") if item else None
        return str(holder) if holder else None

    async def versions(self, job_id: str) -> list[dict[str, Any]]:
        """Every version of the job, oldest first: ``version``, ``at``, ``by``, ``job``."""
        items = await self.readmodel.partition(
            keys.JOB_REGISTRY_PK,
            now=self.clock(),
            prefix=f"{keys.JOB_VERSION_SK_PREFIX}{keys.job_sk(job_id).removeprefix('JOB#')}#",
        )
        return sorted(
            ({k: i.get(k) for k in ("version", "at", "by", "job")} for i in items),
            key=lambda v: int(v["version"] or 0),
        )

    async def version(self, job_id: str, version: int) -> dict[str, Any] | None:
        """One version of the job (``version``, ``at``, ``by``, ``job``), read by its key; None
        when it has none of that number."""
        item = await self.readmodel.get_item(
            keys.JOB_REGISTRY_PK, keys.job_version_sk(job_id, version)
        )
        return {k: item.get(k) for k in ("version", "at", "by", "job")} if item else None

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


def _registry_item(job: Job) -> dict[str, Any]:
    return {
        "pk": keys.JOB_REGISTRY_PK,
        "sk": keys.job_sk(job.id),
        "job": job.model_dump(mode="json"),
        "version": job.version,
    }


def _duplicates(job_id: str, twin: str) -> str:
    return f"job {job_id} duplicates {twin}: same object, trigger type, sub type and condition"


def _claim_sk(job: Job) -> str:
    digest = hashlib.sha256(json.dumps(job.duplicate_key()).encode()).hexdigest()
    return keys.job_trigger_sk(digest)


def _claims(job: Job, current: Job | None) -> list[Put]:
    """The trigger claims a change writes: the new trigger taken (where nobody holds it, or it
    was released), still held when unchanged, the old one released. An inactive job holds none."""
    new = _claim_sk(job) if job.is_active else None
    old = _claim_sk(current) if current is not None and current.is_active else None
    puts = []
    if new is not None:
        claim = {"pk": keys.JOB_REGISTRY_PK, "sk": new, "job_id": job.id}
        if new == old:
            puts.append(Put(claim, expected={"job_id": job.id}))
        else:
            # taken where absent or released ("" is nobody's); a legacy job holds no claim
            puts.append(Put(claim, if_absent=True, expected={"job_id": ""}))
    if old is not None and old != new:
        released = {"pk": keys.JOB_REGISTRY_PK, "sk": old, "job_id": ""}
        puts.append(Put(released, if_absent=True, expected={"job_id": job.id}))
    return puts
