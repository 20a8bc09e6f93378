"""Seals of raw partitions, decided without I/O: the manifest ``aegis seal raw`` writes once at the
root of a raw/ day partition (``raw_metadata.json``), the supplements that record late arrivals
(``raw_metadata.late-NNNN.json``), and how ``aegis audit raw`` compares a partition with them.

A partition is one factory, one source type, one UTC arrival day
(``raw/{f}/{source_type}/yyyy=/mm=/dd=/``, whose objects are messages), or a dataset partition,
the two-tier layout legacy datasets migrate into (``raw/country=us/category=news/date=2026-01-28/``,
whose objects may have any name). Its seal is written once the day is over plus a grace period,
with If-None-Match, and never rewritten: objects that arrive later go into the next supplement,
which lists only keys no earlier document of the partition lists. A manifest entry holds what a
listing shows (size, ETag) and what only the bytes show (SHA-256), so an audit can check the
partition with a listing, or re-read it (``--deep``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import MESSAGE_ID_PATTERN, FactoryId, SourceType
from aegis_contracts.keys import (
    RAW_METADATA_LATE_MAX,
    RAW_METADATA_NAME,
    RAW_METADATA_STEM,
    KeyFamily,
    dataset_partition,
    dataset_partition_of,
    parse_key,
    raw_day_prefix,
    raw_metadata_late_name,
)
from aegis_contracts.payloads import SCHEMA_VERSION_PATTERN
from aegis_contracts.times import Timestamp, ensure_utc, parse_ts

# schema_versions counts these for payloads without a usable one (raw/ keeps what was sent)
NO_SCHEMA_VERSION = "(none)"
INVALID_SCHEMA_VERSION = "(invalid)"
SEAL_FAMILIES = frozenset({KeyFamily.RAW_METADATA, KeyFamily.RAW_METADATA_LATE})
_SCHEMA_VERSION = re.compile(SCHEMA_VERSION_PATTERN)
_SHA256 = r"^[0-9a-f]{64}$"
_MESSAGE_NAME = re.compile(rf"(?:{MESSAGE_ID_PATTERN.pattern})\.json")
_SEAL_NAME = re.compile(rf"{re.escape(RAW_METADATA_STEM)}(?:\.late-(?!0000)\d{{4}})?\.json")


class ManifestEntry(BaseModel):
    """One message object as the sealer read it."""

    model_config = ConfigDict(frozen=True)

    key: str
    size_bytes: int = Field(ge=0)
    etag: str  # as S3 lists it, without the quotes
    sha256: str = Field(pattern=_SHA256)  # hex, of the bytes


class PartitionSeal(BaseModel):
    """What the seal (``supplement`` 0) and each supplement (1..9999) of a partition hold, in
    either layout; its ``key`` is a name at the partition's root (:func:`seal_name`)."""

    model_config = ConfigDict(frozen=True)

    format: Literal[1] = 1  # of this document; a reader refuses one it does not know
    day: date
    supplement: int = Field(default=0, ge=0, le=RAW_METADATA_LATE_MAX)
    sealed_at: Timestamp
    message_count: int = Field(ge=0)
    total_bytes: int = Field(ge=0)
    # the objects' arrival: the received_at ingest stored with each, else S3's LastModified
    first_arrival: Timestamp | None
    last_arrival: Timestamp | None
    schema_versions: dict[str, int]
    manifest: list[ManifestEntry]

    @property
    def prefix(self) -> str:
        """The partition's folder."""
        raise NotImplementedError

    def holds(self, key: str) -> bool:
        """Whether ``key`` is an object of the partition the manifest may list."""
        raise NotImplementedError

    @model_validator(mode="after")
    def _consistent(self) -> PartitionSeal:
        if self.message_count != len(self.manifest):
            raise ValueError(f"message_count {self.message_count} != {len(self.manifest)} entries")
        if self.total_bytes != sum(e.size_bytes for e in self.manifest):
            raise ValueError("total_bytes is not the sum of the entries' sizes")
        if sum(self.schema_versions.values()) != self.message_count:
            raise ValueError("schema_versions do not count every message")
        if len({e.key for e in self.manifest}) != len(self.manifest):
            raise ValueError("a key is listed twice")
        for entry in self.manifest:
            if not self.holds(entry.key):
                raise ValueError(f"{entry.key} is no message of this partition")
        return self

    @property
    def key(self) -> str:
        """Where this document lives."""
        return self.prefix + seal_name(self.supplement)


class RawPartitionSeal(PartitionSeal):
    """A partition of the contract: one factory, one source type, one UTC arrival day
    (``raw/{f}/{source_type}/yyyy=/mm=/dd=/``), whose objects are messages."""

    factory_id: FactoryId
    source_type: SourceType

    @property
    def prefix(self) -> str:
        return raw_day_prefix(self.factory_id, self.source_type, self.day)

    def holds(self, key: str) -> bool:
        return is_message_of(self.prefix, key)


class DatasetPartitionSeal(PartitionSeal):
    """A dataset partition (``raw/name=value/.../date=YYYY-MM-DD/``, the two-tier layout legacy
    datasets migrate into): every object under the folder but the seal documents at its root."""

    layout: Literal["dataset"] = "dataset"
    partition: str
    labels: dict[str, str]

    @model_validator(mode="after")
    def _its_folder(self) -> DatasetPartitionSeal:
        try:
            info = dataset_partition(self.partition)
        except ContractError as err:
            raise ValueError(str(err)) from None
        if info.day != self.day or dict(info.labels) != self.labels:
            raise ValueError(f"day or labels differ from the folder {self.partition}")
        return self

    @property
    def prefix(self) -> str:
        return self.partition

    def holds(self, key: str) -> bool:
        return is_object_of(self.partition, key)


@dataclass(frozen=True, slots=True)
class SealedObject:
    """What the sealer keeps of one object it read (the bytes are hashed and dropped)."""

    entry: ManifestEntry
    arrival: datetime
    schema_version: str


class Listed(Protocol):
    """One object of a listing (``aegis_storage.s3.ObjectInfo`` is one)."""

    @property
    def key(self) -> str: ...
    @property
    def size_bytes(self) -> int: ...
    @property
    def etag(self) -> str: ...


def bare_etag(etag: str) -> str:
    """S3 quotes ETags (``"9e1…"``); manifests keep them bare."""
    return etag.strip('"')


def schema_version_of(payload: bytes) -> str:
    """The top-level ``schema_version`` of a JSON object payload; :data:`NO_SCHEMA_VERSION` when
    there is none (not JSON, not an object, no such field), :data:`INVALID_SCHEMA_VERSION` when it
    is not a version (so a hostile payload cannot flood the counts with names of its own)."""
    if payload.lstrip()[:1] != b"{":
        return NO_SCHEMA_VERSION
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return NO_SCHEMA_VERSION
    version = value.get("schema_version") if isinstance(value, dict) else None
    if version is None:
        return NO_SCHEMA_VERSION
    if isinstance(version, str) and _SCHEMA_VERSION.fullmatch(version):
        return version
    return INVALID_SCHEMA_VERSION


def sealed_object(
    key: str, body: bytes, etag: str, metadata: Mapping[str, str], last_modified: datetime
) -> SealedObject:
    """One object read for a seal: its entry, arrival and schema version."""
    try:
        arrival = parse_ts(metadata.get("received_at", ""))
    except ValueError:  # not written by ingest (a migration, a hand): S3's own time
        arrival = ensure_utc(last_modified)
    entry = ManifestEntry(
        key=key,
        size_bytes=len(body),
        etag=bare_etag(etag),
        sha256=hashlib.sha256(body).hexdigest(),
    )
    return SealedObject(entry, arrival, schema_version_of(body))


def seal_document(
    factory_id: str,
    source_type: SourceType,
    day: date,
    objects: Iterable[SealedObject],
    *,
    sealed_at: datetime,
    supplement: int = 0,
) -> RawPartitionSeal:
    """The seal (``supplement`` 0) or a supplement of a partition, entries in key order."""
    return RawPartitionSeal(
        factory_id=factory_id,
        source_type=source_type,
        day=day,
        **_summary(objects, sealed_at, supplement),
    )


def dataset_seal_document(
    partition: str,
    objects: Iterable[SealedObject],
    *,
    sealed_at: datetime,
    supplement: int = 0,
) -> DatasetPartitionSeal:
    """The seal or a supplement of the dataset partition ``partition`` (its folder)."""
    info = dataset_partition(partition)
    return DatasetPartitionSeal(
        partition=info.prefix,
        labels=dict(info.labels),
        day=info.day,
        **_summary(objects, sealed_at, supplement),
    )


def _summary(
    objects: Iterable[SealedObject], sealed_at: datetime, supplement: int
) -> dict[str, Any]:
    found = sorted(objects, key=lambda o: o.entry.key)
    arrivals = [o.arrival for o in found]
    return {
        "supplement": supplement,
        "sealed_at": sealed_at,
        "message_count": len(found),
        "total_bytes": sum(o.entry.size_bytes for o in found),
        "first_arrival": min(arrivals, default=None),
        "last_arrival": max(arrivals, default=None),
        "schema_versions": dict(sorted(Counter(o.schema_version for o in found).items())),
        "manifest": [o.entry for o in found],
    }


def read_document(key: str, data: bytes) -> PartitionSeal:
    """A seal document read back from ``key`` (a dataset partition's or a contract one's, as the
    key says); :class:`ContractError` when it is not one, or describes another partition or
    number than its key says."""
    model: type[PartitionSeal] = (
        RawPartitionSeal if dataset_partition_of(key) is None else DatasetPartitionSeal
    )
    try:
        document = model.model_validate_json(data)
    except ValidationError as err:
        raise ContractError("invalid_seal", f"{key} is no seal document: {err}") from None
    if document.key != key:
        raise ContractError("invalid_seal", f"{key} describes {document.key}")
    return document


def seal_name(supplement: int) -> str:
    """``raw_metadata.json`` (0), else ``raw_metadata.late-NNNN.json``."""
    return RAW_METADATA_NAME if supplement == 0 else raw_metadata_late_name(supplement)


def is_seal_name(name: str) -> bool:
    """A name the sealer writes at a partition's root, and no migration may put under raw/."""
    return _SEAL_NAME.fullmatch(name) is not None


def is_seal_key(key: str) -> bool:
    """A seal or supplement (what neither the sealer nor the audit treat as a message)."""
    if RAW_METADATA_STEM not in key:  # no message key holds it: most keys stop here
        return False
    if (info := dataset_partition_of(key)) is not None:
        return is_seal_name(key[len(info.prefix) :])
    try:
        return parse_key(key).family in SEAL_FAMILIES
    except ContractError:
        return False


def is_message_of(prefix: str, key: str) -> bool:
    """Whether ``key`` is a message of the raw partition ``prefix`` (``raw_day_prefix``): what
    ``raw_key`` makes there, checked with one regex (a busy day has 86,400 of them)."""
    return key.startswith(prefix) and _MESSAGE_NAME.fullmatch(key, len(prefix)) is not None


def is_object_of(partition: str, key: str) -> bool:
    """Whether ``key`` is an object of the dataset partition ``partition``: anything below its
    folder but the folder itself and the seal documents at its root."""
    if not key.startswith(partition) or len(key) == len(partition):
        return False
    return not is_seal_name(key[len(partition) :])


def covered(documents: Iterable[PartitionSeal]) -> dict[str, ManifestEntry]:
    """Every key the seal and its supplements list."""
    return {e.key: e for d in documents for e in d.manifest}


def late_keys(documents: Sequence[PartitionSeal], message_keys: Iterable[str]) -> list[str]:
    """The message keys that no document of the partition lists yet, in key order."""
    known = covered(documents)
    return sorted(k for k in set(message_keys) if k not in known)


def next_supplement(documents: Sequence[PartitionSeal]) -> int:
    """The number of the partition's next document: 0 (the seal) when it has none yet."""
    return max((d.supplement for d in documents), default=-1) + 1


def seal_due(day: date, now: datetime, grace: timedelta) -> bool:
    """Whether the UTC ``day`` is over plus ``grace`` (late arrivals' time) at ``now``."""
    return ensure_utc(now) >= datetime.combine(day + timedelta(days=1), time(), UTC) + grace


def days_to_seal(now: datetime, grace: timedelta, days: int) -> list[date]:
    """The ``days`` newest UTC days that are due at ``now``, oldest first."""
    newest = (ensure_utc(now) - grace).date() - timedelta(days=1)
    return [newest - timedelta(days=n) for n in reversed(range(days))]


@dataclass(frozen=True, slots=True)
class Change:
    key: str
    what: tuple[str, ...]  # "size", "etag", "sha256": what differs from the manifest


@dataclass(frozen=True, slots=True)
class PartitionDiff:
    """What a partition holds that its documents do not say, and the reverse."""

    missing: list[str]  # listed in a document, gone from the partition
    added: list[str]  # in the partition, in no document (late arrivals not sealed yet included)
    changed: list[Change]
    checked: int  # objects compared with their entries

    @property
    def intact(self) -> bool:
        return not (self.missing or self.added or self.changed)


def compare(
    documents: Sequence[PartitionSeal],
    listing: Iterable[Listed],
    sha256s: Mapping[str, str] | None = None,
) -> PartitionDiff:
    """The partition's ``listing`` against its seal and supplements: size and ETag of every
    object, and its SHA-256 where ``sha256s`` (key -> hex of the bytes read again) has it. The
    documents themselves are skipped; any other object that no document lists is ``added``."""
    expected = covered(documents)
    seen: set[str] = set()
    added: list[str] = []
    changed: list[Change] = []
    for obj in listing:
        if is_seal_key(obj.key):
            continue
        entry = expected.get(obj.key)
        if entry is None:
            added.append(obj.key)
            continue
        seen.add(obj.key)
        what = []
        if obj.size_bytes != entry.size_bytes:
            what.append("size")
        if bare_etag(obj.etag) != entry.etag:
            what.append("etag")
        if sha256s is not None and sha256s.get(obj.key, entry.sha256) != entry.sha256:
            what.append("sha256")
        if what:
            changed.append(Change(obj.key, tuple(what)))
    return PartitionDiff(
        missing=sorted(set(expected) - seen),
        added=sorted(added),
        changed=sorted(changed, key=lambda c: c.key),
        checked=len(seen),
    )
