"""``aegis seal raw``: write each raw partition's seal once its day is over plus grace, and a
supplement for the objects that arrived after it (:mod:`aegis_contracts.seal` decides what they
hold).

Partitions are found with one delimited LIST per level (``raw/`` -> factories -> source types)
and the day prefixes of the days asked for; nothing lists the bucket without a prefix. Per
partition and run: its listing (one LIST per 1,000 objects), one GET per seal document already
there, and one GET per object no document lists yet. So each raw object is read once in its
life by the sealer: when its day is sealed, or when the supplement that takes it is written.
Documents are put with If-None-Match: when two runs seal a partition at once, the first put
wins and the other run reports the partition as already sealed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import StrEnum
from typing import Any, TypeVar

import structlog

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType, validate_source_type
from aegis_contracts.keys import RAW_PREFIX, raw_day_prefix, raw_prefix
from aegis_contracts.keys import factory as key_factory
from aegis_contracts.seal import (
    RawPartitionSeal,
    SealedObject,
    is_message_of,
    is_seal_key,
    late_keys,
    next_supplement,
    read_document,
    seal_document,
    sealed_object,
)
from aegis_contracts.times import utc_now
from aegis_storage.errors import Conflict, StorageError
from aegis_storage.s3 import ObjectInfo, ObjectStore, PutOutcome
from aegis_storage.tasks import map_bounded

log = structlog.get_logger("aegis_storage_tools.seal")

# partitions worked on at once; the objects read at once are bounded by ``concurrency``
PARTITIONS_IN_FLIGHT = 8
_N = TypeVar("_N")


class Outcome(StrEnum):
    SEALED = "sealed"
    ALREADY_SEALED = "already sealed"  # another run put the document first
    SUPPLEMENT = "supplement written"
    NOTHING_NEW = "nothing new"
    EMPTY = "empty"  # no object: nothing to seal
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RawPartition:
    factory_id: str
    source_type: SourceType
    day: date

    @property
    def prefix(self) -> str:
        return raw_day_prefix(self.factory_id, self.source_type, self.day)

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "factory_id": self.factory_id,
            "source_type": self.source_type.value,
            "day": self.day.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class SealResult:
    partition: RawPartition
    outcome: Outcome
    key: str | None = None  # the document this run wrote
    objects: int = 0  # the objects it lists
    bytes: int = 0
    ignored: int = 0  # objects of the partition that are no message (the audit names them)
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return self.partition.as_dict() | {
            "outcome": self.outcome.value,
            "key": self.key,
            "objects": self.objects,
            "bytes": self.bytes,
            "ignored": self.ignored,
            "error": self.error,
        }


async def raw_sources(
    store: ObjectStore, factories: Sequence[str] | None = None
) -> list[tuple[str, SourceType]]:
    """The (factory, source type) pairs under raw/, of ``factories`` or of every factory found;
    prefixes that are no factory or source type of the contract are logged and left alone."""
    if factories is None:
        factories = _names(await store.child_prefixes(RAW_PREFIX), RAW_PREFIX, key_factory)
    found = await map_bounded(
        lambda f: store.child_prefixes(raw_prefix(f)), factories, PARTITIONS_IN_FLIGHT
    )
    return [
        (f, source)
        for f, children in zip(factories, found, strict=True)
        for source in _names(children, raw_prefix(f), validate_source_type)
    ]


def _names(prefixes: Sequence[str], parent: str, validate: Callable[[str], _N]) -> list[_N]:
    names = []
    for prefix in prefixes:
        try:
            names.append(validate(prefix.removeprefix(parent).removesuffix("/")))
        except ContractError:
            log.warning("raw_prefix_skipped", prefix=prefix, why="not a contract name")
    return names


async def read_documents(
    store: ObjectStore, listing: Sequence[ObjectInfo]
) -> list[RawPartitionSeal]:
    """The seal and supplements among a partition's ``listing``, seal first."""
    documents = [
        read_document(info.key, await store.get_bytes(info.key))
        for info in listing
        if is_seal_key(info.key)
    ]
    documents.sort(key=lambda d: d.supplement)
    if documents and documents[0].supplement != 0:
        raise ContractError("invalid_seal", f"{documents[0].key} is a supplement without a seal")
    return documents


@dataclass(slots=True)
class Sealer:
    store: ObjectStore
    clock: Callable[[], datetime] = utc_now
    concurrency: int = 32
    _reads: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._reads = asyncio.Semaphore(self.concurrency)

    async def seal(
        self, days: Sequence[date], factories: Sequence[str] | None = None
    ) -> list[SealResult]:
        """Seal every partition of ``days`` (due days only: the caller checks) of ``factories``,
        or of every factory under raw/."""
        parts = [
            RawPartition(f, source, day)
            for f, source in await raw_sources(self.store, factories)
            for day in days
        ]
        return await map_bounded(self.partition, parts, PARTITIONS_IN_FLIGHT)

    async def partition(self, part: RawPartition) -> SealResult:
        try:
            result = await self._partition(part)
        except (StorageError, ContractError) as err:
            result = SealResult(part, Outcome.FAILED, error=str(err))
        if result.outcome is not Outcome.EMPTY:
            log.info(
                "raw_partition_sealed" if result.error is None else "raw_partition_seal_failed",
                prefix=part.prefix,
                outcome=result.outcome.value,
                key=result.key,
                objects=result.objects,
                bytes=result.bytes,
                ignored=result.ignored,
                error=result.error,
            )
        return result

    async def _partition(self, part: RawPartition) -> SealResult:
        listing = [info async for info in self.store.list_objects(part.prefix)]
        messages = {info.key: info for info in listing if is_message_of(part.prefix, info.key)}
        documents = await read_documents(self.store, listing)
        ignored = len(listing) - len(messages) - len(documents)
        new = late_keys(documents, messages)
        if not new:
            return SealResult(
                part, Outcome.NOTHING_NEW if documents else Outcome.EMPTY, ignored=ignored
            )
        objects = await map_bounded(self._read, [messages[k] for k in new], self.concurrency)
        document = seal_document(
            part.factory_id,
            part.source_type,
            part.day,
            objects,
            sealed_at=self.clock(),
            supplement=next_supplement(documents),
        )
        try:
            put = await self.store.put_immutable(document.key, document.model_dump_json().encode())
        except Conflict:  # another run put it first (other sealed_at, other late arrivals)
            put = None
        if put is None or put.outcome is PutOutcome.DUPLICATE:
            return SealResult(part, Outcome.ALREADY_SEALED, ignored=ignored)
        return SealResult(
            part,
            Outcome.SUPPLEMENT if document.supplement else Outcome.SEALED,
            key=document.key,
            objects=document.message_count,
            bytes=document.total_bytes,
            ignored=ignored,
        )

    async def _read(self, info: ObjectInfo) -> SealedObject:
        async with self._reads:
            stored = await self.store.get_object(info.key)
        return sealed_object(
            info.key, stored.body, stored.etag, stored.metadata, info.last_modified
        )
