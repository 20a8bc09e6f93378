"""``aegis audit raw``: check a raw partition (either layout: the contract's, or a dataset
partition) against its seal and supplements.

One listing of the partition (size and ETag of every object) against the manifests, which names
every object missing, added (in no manifest: a late arrival not sealed yet is one) or changed.
``deep`` also reads every manifest object again and compares the SHA-256 of its bytes: one GET
per object, what the listing cannot prove (it trusts S3's ETag).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from typing import Any

import structlog

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType
from aegis_contracts.seal import PartitionDiff, compare, covered
from aegis_storage.errors import StorageError
from aegis_storage.s3 import ObjectStore
from aegis_storage.tasks import map_bounded
from aegis_storage_tools.seal import (
    Partition,
    RawPartition,
    find_partitions,
    raw_sources,
    read_documents,
)

log = structlog.get_logger("aegis_storage_tools.audit")


class AuditStatus(StrEnum):
    INTACT = "intact"
    NOT_SEALED = "not sealed"
    DIFFERS = "differs"
    ERROR = "error"


# the exit code of a run: the worst partition's (an error first: nothing could be verified)
EXIT_CODES = {
    AuditStatus.INTACT: 0,
    AuditStatus.NOT_SEALED: 3,
    AuditStatus.DIFFERS: 4,
    AuditStatus.ERROR: 1,
}
_WORST_FIRST = (AuditStatus.ERROR, AuditStatus.DIFFERS, AuditStatus.NOT_SEALED)


@dataclass(frozen=True, slots=True)
class PartitionAudit:
    partition: Partition
    status: AuditStatus
    objects: int = 0  # objects listed (seal documents not counted)
    documents: int = 0  # the seal and its supplements
    diff: PartitionDiff | None = None
    deep: bool = False
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        diff = self.diff
        return self.partition.as_dict() | {
            "status": self.status.value,
            "objects": self.objects,
            "documents": self.documents,
            "deep": self.deep,
            "missing": diff.missing if diff else [],
            "added": diff.added if diff else [],
            "changed": [{"key": c.key, "what": list(c.what)} for c in diff.changed] if diff else [],
            "error": self.error,
        }


def exit_code(audits: Sequence[PartitionAudit]) -> int:
    """0 intact, 1 error, 3 not sealed, 4 differs; nothing found at all is "not sealed"."""
    statuses = {a.status for a in audits} or {AuditStatus.NOT_SEALED}
    for status in _WORST_FIRST:
        if status in statuses:
            return EXIT_CODES[status]
    return EXIT_CODES[AuditStatus.INTACT]


def _found(audits: Sequence[PartitionAudit]) -> list[PartitionAudit]:
    return [a for a in audits if a.objects or a.documents or a.status is AuditStatus.ERROR]


@dataclass(slots=True)
class Auditor:
    store: ObjectStore
    deep: bool = False
    concurrency: int = 32
    _reads: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._reads = asyncio.Semaphore(self.concurrency)

    async def audit(
        self, factory_id: str, day: date, source_types: Sequence[SourceType] | None = None
    ) -> list[PartitionAudit]:
        """The partitions of ``factory_id`` on ``day``: of ``source_types``, or of every source
        type it has under raw/ (then a source type with nothing on that day is left out)."""
        if source_types is None:
            sources = [s for _, s in await raw_sources(self.store, [factory_id])]
            audits = [await self.partition(RawPartition(factory_id, s, day)) for s in sources]
            return _found(audits)
        return [await self.partition(RawPartition(factory_id, s, day)) for s in source_types]

    async def audit_under(self, under: str, day: date | None = None) -> list[PartitionAudit]:
        """Every partition under the folder ``under`` (below raw/; either layout: a dataset's
        ``raw/country=us/`` or a factory's ``raw/factory-a/``), of ``day`` or of every day;
        partitions with nothing on that day are left out."""
        parts = await find_partitions(self.store, None if day is None else [day], under=under)
        return _found([await self.partition(p) for p in parts])

    async def partition(self, part: Partition) -> PartitionAudit:
        try:
            audit = await self._partition(part)
        except (StorageError, ContractError) as err:
            audit = PartitionAudit(part, AuditStatus.ERROR, deep=self.deep, error=str(err))
        diff = audit.diff
        log.info(
            "raw_partition_audited",
            prefix=part.prefix,
            status=audit.status.value,
            objects=audit.objects,
            documents=audit.documents,
            deep=self.deep,
            missing=len(diff.missing) if diff else 0,
            added=len(diff.added) if diff else 0,
            changed=len(diff.changed) if diff else 0,
            error=audit.error,
        )
        return audit

    async def _partition(self, part: Partition) -> PartitionAudit:
        listing = [info async for info in self.store.list_objects(part.prefix)]
        documents = await read_documents(self.store, listing)
        objects = len(listing) - len(documents)
        if not documents:
            return PartitionAudit(part, AuditStatus.NOT_SEALED, objects, deep=self.deep)
        sha256s = None
        if self.deep:
            expected = covered(documents)
            again = [info.key for info in listing if info.key in expected]
            sha256s = dict(
                zip(again, await map_bounded(self._sha256, again, self.concurrency), strict=True)
            )
        diff = compare(documents, listing, sha256s)
        status = AuditStatus.INTACT if diff.intact else AuditStatus.DIFFERS
        return PartitionAudit(part, status, objects, len(documents), diff, self.deep)

    async def _sha256(self, key: str) -> str:
        async with self._reads:
            return await self.store.sha256(key)
