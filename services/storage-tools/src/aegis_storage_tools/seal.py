"""``aegis seal raw``: write each raw partition's seal once its day is over plus grace, and a
supplement for the objects that arrived after it (:mod:`aegis_contracts.seal` decides what they
hold). Both layouts under raw/ are partitions: the contract's (factory, source type, UTC day)
and dataset partitions (``raw/country=us/category=news/date=2026-01-28/``, where migrated legacy
datasets land).

Partitions are found with delimited LISTs: ``raw/`` -> factories -> source types (then the day
prefixes of the days asked for, or the ``yyyy=/mm=/dd=`` folders when every day is asked for),
and ``raw/`` -> ``name=value`` folders -> ... -> ``date=`` folders; nothing lists the bucket
without a prefix. Per partition and run: its listing (one LIST per 1,000 objects), one GET per
seal document already there, and one GET per object no document lists yet. So each raw object is
read once in its life by the sealer: when its day is sealed, or when the supplement that takes it
is written. Documents are put with If-None-Match: when two runs seal a partition at once, the
first put wins and the other run reports the partition as already sealed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

import structlog

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType, validate_source_type
from aegis_contracts.keys import (
    DATASET_MAX_LABELS,
    RAW_PREFIX,
    KeyFamily,
    dataset_date,
    dataset_label,
    dataset_partition,
    dataset_partition_of,
    parse_key,
    raw_day_prefix,
    raw_prefix,
)
from aegis_contracts.keys import factory as key_factory
from aegis_contracts.seal import (
    PartitionSeal,
    SealedObject,
    dataset_seal_document,
    is_message_of,
    is_object_of,
    is_seal_key,
    late_keys,
    next_supplement,
    read_document,
    seal_document,
    seal_due,
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
    """A partition of the contract: one factory, one source type, one UTC arrival day."""

    factory_id: str
    source_type: SourceType
    day: date

    @property
    def prefix(self) -> str:
        return raw_day_prefix(self.factory_id, self.source_type, self.day)

    def holds(self, key: str) -> bool:
        return is_message_of(self.prefix, key)

    def document(
        self, objects: Sequence[SealedObject], *, sealed_at: datetime, supplement: int
    ) -> PartitionSeal:
        return seal_document(
            self.factory_id,
            self.source_type,
            self.day,
            objects,
            sealed_at=sealed_at,
            supplement=supplement,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "layout": "contract",
            "factory_id": self.factory_id,
            "source_type": self.source_type.value,
            "day": self.day.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class DatasetPartition:
    """A dataset partition: the ``date=YYYY-MM-DD`` folder below ``name=value`` folders."""

    prefix: str
    day: date
    labels: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, prefix: str) -> DatasetPartition:
        info = dataset_partition(prefix)
        return cls(info.prefix, info.day, info.labels)

    def holds(self, key: str) -> bool:
        return is_object_of(self.prefix, key)

    def document(
        self, objects: Sequence[SealedObject], *, sealed_at: datetime, supplement: int
    ) -> PartitionSeal:
        return dataset_seal_document(
            self.prefix, objects, sealed_at=sealed_at, supplement=supplement
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "layout": "dataset",
            "labels": dict(self.labels),
            "day": self.day.isoformat(),
        }


Partition = RawPartition | DatasetPartition


def partition_of(key: str) -> Partition | None:
    """The partition an object under raw/ belongs to, in either layout; ``None`` for a key in
    none (a flat legacy key, a folder of another shape)."""
    if (info := dataset_partition_of(key)) is not None:
        return DatasetPartition(info.prefix, info.day, info.labels)
    try:
        found = parse_key(key)
    except ContractError:
        return None
    if found.family not in (KeyFamily.RAW, KeyFamily.RAW_METADATA, KeyFamily.RAW_METADATA_LATE):
        return None
    assert found.factory_id and found.source_type and found.day
    return RawPartition(found.factory_id, found.source_type, found.day)


@dataclass(frozen=True, slots=True)
class SealResult:
    partition: Partition
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


def related(folder: str, under: str) -> bool:
    """Whether the folder ``folder`` lies under ``under`` or on the way to it."""
    return folder.startswith(under) or under.startswith(folder)


async def raw_sources(
    store: ObjectStore, factories: Sequence[str] | None = None, under: str = RAW_PREFIX
) -> list[tuple[str, SourceType]]:
    """The (factory, source type) pairs under raw/, of ``factories`` or of every factory found
    (on the way to ``under``); prefixes that are no factory or source type of the contract, and
    dataset folders (``name=value``, :func:`dataset_partitions`' share), are left alone, the
    former logged."""
    if factories is None:
        top = [p for p in await store.child_prefixes(RAW_PREFIX) if related(p, under)]
        factories = _names(
            [p for p in top if _label_of(p, RAW_PREFIX) is None], RAW_PREFIX, key_factory
        )
    factories = [f for f in factories if related(raw_prefix(f), under)]
    found = await map_bounded(
        lambda f: store.child_prefixes(raw_prefix(f)), factories, PARTITIONS_IN_FLIGHT
    )
    return [
        (f, source)
        for f, children in zip(factories, found, strict=True)
        for source in _names(
            [c for c in children if related(c, under)], raw_prefix(f), validate_source_type
        )
    ]


def _names(prefixes: Sequence[str], parent: str, validate: Callable[[str], _N]) -> list[_N]:
    names = []
    for prefix in prefixes:
        try:
            names.append(validate(prefix.removeprefix(parent).removesuffix("/")))
        except ContractError:
            log.warning("raw_prefix_skipped", prefix=prefix, why="not a contract name")
    return names


def _label_of(folder: str, parent: str) -> tuple[str, str] | None:
    return dataset_label(folder.removeprefix(parent).removesuffix("/"))


_DAY_FOLDER = re.compile(r"yyyy=(\d{4})/mm=(\d{2})/dd=(\d{2})/")


async def contract_days(
    store: ObjectStore, factory_id: str, source: SourceType, under: str = RAW_PREFIX
) -> list[date]:
    """The days a factory's source type has a folder for (three delimited listings deep)."""
    base = raw_prefix(factory_id, source)
    folders = [base]
    for _ in range(3):  # yyyy=, mm=, dd=
        listings = await map_bounded(store.child_prefixes, folders, PARTITIONS_IN_FLIGHT)
        folders = [c for children in listings for c in children if related(c, under)]
    days = []
    for folder in folders:
        match = _DAY_FOLDER.fullmatch(folder, len(base))
        try:
            day = date(*map(int, match.groups())) if match else None
        except ValueError:
            day = None
        if day is None or raw_day_prefix(factory_id, source, day) != folder:
            log.warning("raw_prefix_skipped", prefix=folder, why="not a day folder")
            continue
        days.append(day)
    return days


async def dataset_partitions(
    store: ObjectStore, days: Collection[date] | None = None, under: str = RAW_PREFIX
) -> list[DatasetPartition]:
    """The dataset partitions under raw/ (on the way to ``under``), of ``days`` or of every day:
    one delimited listing per ``name=value`` folder, level by level; the walk stops at the
    ``date=`` folders and at :data:`DATASET_MAX_LABELS` labels."""
    top = [p for p in await store.child_prefixes(RAW_PREFIX) if related(p, under)]
    level = [p for p in top if _label_of(p, RAW_PREFIX) is not None]
    found: list[DatasetPartition] = []
    for depth in range(1, DATASET_MAX_LABELS + 1):
        if not level:
            break
        listings = await map_bounded(store.child_prefixes, level, PARTITIONS_IN_FLIGHT)
        deeper = []
        for folder, children in zip(level, listings, strict=True):
            for child in (c for c in children if related(c, under)):
                name = child.removeprefix(folder).removesuffix("/")
                if (day := dataset_date(name)) is not None:
                    if days is None or day in days:
                        found.append(DatasetPartition.of(child))
                elif dataset_label(name) is not None and depth < DATASET_MAX_LABELS:
                    deeper.append(child)
                else:
                    log.warning("raw_prefix_skipped", prefix=child, why="not a dataset folder")
        level = deeper
    return found


async def find_partitions(
    store: ObjectStore,
    days: Collection[date] | None,
    factories: Sequence[str] | None = None,
    under: str = RAW_PREFIX,
) -> list[Partition]:
    """Every partition of ``days`` (``None``: of every day found) under ``under`` (a folder
    under raw/), in both layouts; with ``factories``, only theirs (the contract's layout). The
    contract's partitions of given days are named without listing their days (an empty one is
    found empty when sealed)."""
    sources = await raw_sources(store, factories, under)
    found: list[Partition] = []
    if days is None:
        listed = await map_bounded(
            lambda fs: contract_days(store, fs[0], fs[1], under), sources, PARTITIONS_IN_FLIGHT
        )
        for (f, source), its_days in zip(sources, listed, strict=True):
            found.extend(RawPartition(f, source, day) for day in its_days)
    else:
        found.extend(
            part
            for f, source in sources
            for day in sorted(days)
            if related((part := RawPartition(f, source, day)).prefix, under)
        )
    if factories is None:
        found.extend(await dataset_partitions(store, days, under))
    return found


async def read_documents(store: ObjectStore, listing: Sequence[ObjectInfo]) -> list[PartitionSeal]:
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
        self,
        days: Sequence[date] | None,
        factories: Sequence[str] | None = None,
        *,
        under: str = RAW_PREFIX,
        grace: timedelta | None = None,
    ) -> list[SealResult]:
        """Seal every partition of ``days`` (due days only: the caller checks) of ``factories``,
        or of every factory and dataset under raw/ (or under ``under``). ``days`` ``None``: every
        day found whose day is over plus ``grace``."""
        parts = await find_partitions(self.store, days, factories, under)
        if days is None:
            parts = self.due(parts, grace or timedelta())
        return await self.partitions(parts)

    def due(self, parts: Sequence[Partition], grace: timedelta) -> list[Partition]:
        """The partitions whose day is over plus ``grace`` by the sealer's clock."""
        now = self.clock()
        return [p for p in parts if seal_due(p.day, now, grace)]

    async def partitions(self, parts: Sequence[Partition]) -> list[SealResult]:
        return await map_bounded(self.partition, parts, PARTITIONS_IN_FLIGHT)

    async def partition(self, part: Partition) -> SealResult:
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

    async def _partition(self, part: Partition) -> SealResult:
        listing = [info async for info in self.store.list_objects(part.prefix)]
        messages = {info.key: info for info in listing if part.holds(info.key)}
        documents = await read_documents(self.store, listing)
        ignored = len(listing) - len(messages) - len(documents)
        new = late_keys(documents, messages)
        if not new:
            return SealResult(
                part, Outcome.NOTHING_NEW if documents else Outcome.EMPTY, ignored=ignored
            )
        objects = await map_bounded(self._read, [messages[k] for k in new], self.concurrency)
        document = part.document(
            objects, sealed_at=self.clock(), supplement=next_supplement(documents)
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
