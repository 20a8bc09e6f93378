"""Seals of raw partitions without I/O: the document, when a day is due, which keys a supplement
takes, and the audit's comparison of a listing with the seal and its supplements."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType
from aegis_contracts.seal import (
    INVALID_SCHEMA_VERSION,
    NO_SCHEMA_VERSION,
    Change,
    DatasetPartitionSeal,
    RawPartitionSeal,
    compare,
    dataset_seal_document,
    days_to_seal,
    is_message_of,
    is_object_of,
    is_seal_key,
    is_seal_name,
    late_keys,
    next_supplement,
    read_document,
    schema_version_of,
    seal_document,
    seal_due,
    sealed_object,
)

DAY = date(2026, 11, 30)
F, ST = "factory-a", SourceType.FACTORY_STATE
SEALED_AT = datetime(2026, 12, 1, 2, 30, tzinfo=UTC)
LAST_MODIFIED = datetime(2026, 12, 1, 0, 0, 5, tzinfo=UTC)


@dataclass(frozen=True)
class Obj:
    key: str
    size_bytes: int
    etag: str


def key(n: int) -> str:
    return keys.raw_key(F, ST, datetime(2026, 11, 30, 10, tzinfo=UTC), f"msg-{n:08d}")


def body(n: int, version: str = "1.0") -> bytes:
    return b'{"message_id":"msg-%08d","schema_version":"%s"}' % (n, version.encode())


def etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


def seal(numbers: list[int], supplement: int = 0) -> RawPartitionSeal:
    objects = [
        sealed_object(
            key(n),
            body(n),
            etag(body(n)),
            {"received_at": f"2026-11-30T10:00:{n % 60:02d}.000Z"},
            LAST_MODIFIED,
        )
        for n in numbers
    ]
    return seal_document(F, ST, DAY, objects, sealed_at=SEALED_AT, supplement=supplement)


def listing(numbers: list[int]) -> list[Obj]:
    return [Obj(key(n), len(body(n)), etag(body(n))) for n in numbers]


def test_a_seal_counts_sums_and_lists_every_object_in_key_order() -> None:
    doc = seal([3, 1, 2])
    assert doc.key == keys.raw_metadata_key(F, ST, DAY)
    assert [e.key for e in doc.manifest] == [key(1), key(2), key(3)]
    assert doc.message_count == 3
    assert doc.total_bytes == sum(len(body(n)) for n in (1, 2, 3))
    assert (doc.first_arrival, doc.last_arrival) == (
        datetime(2026, 11, 30, 10, 0, 1, tzinfo=UTC),
        datetime(2026, 11, 30, 10, 0, 3, tzinfo=UTC),
    )
    assert doc.schema_versions == {"1.0": 3}
    assert doc.manifest[0].sha256 == hashlib.sha256(body(1)).hexdigest()
    assert doc.manifest[0].etag == etag(body(1)).strip('"')  # kept bare
    assert read_document(doc.key, doc.model_dump_json().encode()) == doc


def test_an_object_without_ingest_metadata_arrived_when_s3_says() -> None:
    obj = sealed_object(key(1), b"not json", '"x"', {}, LAST_MODIFIED)
    assert obj.arrival == LAST_MODIFIED
    assert obj.schema_version == NO_SCHEMA_VERSION


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"schema_version":"1.0"}', "1.0"),
        (b'  {"schema_version":"2"}', "2"),
        (b'{"schema_version":"1.2.3"}', "1.2.3"),
        (b'{"schema_version":1.0}', INVALID_SCHEMA_VERSION),
        (b'{"schema_version":"DROP TABLE; 1.0"}', INVALID_SCHEMA_VERSION),
        (b'{"other":1}', NO_SCHEMA_VERSION),
        (b"[1,2]", NO_SCHEMA_VERSION),
        (b"\xff\xfe binary", NO_SCHEMA_VERSION),
        (b'{"schema_version":', NO_SCHEMA_VERSION),
        (b"", NO_SCHEMA_VERSION),
    ],
)
def test_schema_versions_are_counted_by_name_and_junk_is_lumped(
    payload: bytes, expected: str
) -> None:
    assert schema_version_of(payload) == expected


def test_a_supplement_is_named_by_its_number_and_takes_only_new_keys() -> None:
    assert next_supplement([]) == 0  # the seal itself
    first = seal([1, 2])
    late = seal([3], supplement=next_supplement([first]))
    assert late.key == keys.raw_metadata_late_key(F, ST, DAY, 1)
    assert next_supplement([first, late]) == 2
    assert late_keys([first, late], [key(n) for n in (2, 1, 3, 5, 4)]) == [key(4), key(5)]
    assert late_keys([first, late], [key(1), key(3)]) == []


def test_a_document_must_describe_the_key_it_was_read_from() -> None:
    doc = seal([1])
    other = keys.raw_metadata_key(F, SourceType.INFRA_STATE, DAY)
    with pytest.raises(ContractError, match="describes"):
        read_document(other, doc.model_dump_json().encode())
    with pytest.raises(ContractError, match="no seal document"):
        read_document(doc.key, b'{"factory_id": "factory-a"}')
    tampered = doc.model_dump(mode="json") | {"message_count": 7}
    with pytest.raises(ContractError, match="message_count"):
        read_document(doc.key, json.dumps(tampered).encode())


def test_a_manifest_lists_only_messages_of_its_own_partition() -> None:
    stray = sealed_object(
        keys.raw_key("factory-b", ST, datetime(2026, 11, 30, tzinfo=UTC), "msg-00000009"),
        b"{}",
        '"e"',
        {},
        LAST_MODIFIED,
    )
    with pytest.raises(ValueError, match="no message of this partition"):
        seal_document(F, ST, DAY, [stray], sealed_at=SEALED_AT)


@pytest.mark.parametrize(
    ("now", "due"),
    [
        (datetime(2026, 12, 1, 1, 59, 59, tzinfo=UTC), False),  # the day is over, grace is not
        (datetime(2026, 12, 1, 2, 0, tzinfo=UTC), True),
        (datetime(2026, 11, 30, 23, 0, tzinfo=UTC), False),
        (datetime(2026, 12, 8, tzinfo=UTC), True),
    ],
)
def test_a_day_is_due_once_it_is_over_plus_grace(now: datetime, due: bool) -> None:
    assert seal_due(DAY, now, timedelta(hours=2)) is due


def test_the_lookback_ends_at_the_newest_due_day() -> None:
    at_0230 = datetime(2026, 12, 1, 2, 30, tzinfo=UTC)
    assert days_to_seal(at_0230, timedelta(hours=2), 3) == [
        date(2026, 11, 28),
        date(2026, 11, 29),
        date(2026, 11, 30),
    ]
    at_0130 = datetime(2026, 12, 1, 1, 30, tzinfo=UTC)  # 30 Nov is still in its grace period
    assert days_to_seal(at_0130, timedelta(hours=2), 1) == [date(2026, 11, 29)]
    assert all(
        seal_due(d, at_0130, timedelta(hours=2))
        for d in days_to_seal(at_0130, timedelta(hours=2), 7)
    )


def test_an_intact_partition_compares_clean() -> None:
    docs = [seal([1, 2]), seal([3], supplement=1)]
    seals = [Obj(d.key, 1, '"x"') for d in docs]
    diff = compare(docs, listing([1, 2, 3]) + seals)
    assert diff.intact and diff.checked == 3


def test_missing_added_and_changed_objects_are_each_named() -> None:
    docs = [seal([1, 2, 3, 4]), seal([5], supplement=1)]
    found = listing([1, 3, 4, 5, 6])  # 2 is gone, 6 is new
    found[1] = Obj(key(3), len(body(3)) + 1, etag(b"other"))  # 3 rewritten, longer
    found[2] = Obj(key(4), len(body(4)), etag(b"same length"))  # 4 rewritten, same length
    stray = keys.raw_day_prefix(F, ST, DAY) + "notes.txt"  # no message, in no manifest
    found.append(Obj(stray, 3, '"n"'))
    diff = compare(docs, found)
    assert not diff.intact
    assert diff.missing == [key(2)]
    assert diff.added == [key(6), stray]
    assert diff.changed == [Change(key(3), ("size", "etag")), Change(key(4), ("etag",))]


def test_re_read_bytes_are_checked_against_the_manifest_hash() -> None:
    docs = [seal([1, 2])]
    rehashed = {
        key(1): hashlib.sha256(body(1)).hexdigest(),
        key(2): hashlib.sha256(b"x" * len(body(2))).hexdigest(),  # same size and listed ETag
    }
    diff = compare(docs, listing([1, 2]), rehashed)
    assert diff.changed == [Change(key(2), ("sha256",))]
    assert compare(docs, listing([1, 2])).intact  # a listing alone cannot see that


def test_messages_and_seal_documents_are_told_apart_by_name() -> None:
    prefix = keys.raw_day_prefix(F, ST, DAY)
    assert is_message_of(prefix, key(1))
    assert not is_message_of(prefix, keys.raw_metadata_key(F, ST, DAY))
    assert not is_message_of(prefix, keys.raw_metadata_late_key(F, ST, DAY, 3))
    assert not is_message_of(prefix, f"{prefix}notes.txt")
    assert not is_message_of(prefix, f"{prefix}sub/msg-00000001.json")
    assert not is_message_of(keys.raw_day_prefix(F, ST, date(2026, 11, 29)), key(1))
    assert is_seal_key(keys.raw_metadata_key(F, ST, DAY))
    assert is_seal_key(keys.raw_metadata_late_key(F, ST, DAY, 3))
    assert not is_seal_key(f"{prefix}raw_metadata.late-0000.json")  # no such supplement
    assert not is_seal_key(key(1))


# -- dataset partitions (raw/name=value/.../date=YYYY-MM-DD/) -----------------------------------

PART = "raw/country=us/category=news/date=2026-01-28/"


@pytest.mark.parametrize(
    ("key", "partition"),
    [
        (f"{PART}raw_0001.json", PART),
        (f"{PART}sub/page.html", PART),
        (f"{PART}raw_metadata.json", PART),
        ("raw/country=us/date=2026-01-28/x.json", "raw/country=us/date=2026-01-28/"),
        ("raw/country=us/category=news/x.json", None),  # no date= folder
        ("raw/date=2026-01-28/x.json", None),  # no label above it
        ("raw/country=us/date=2026-02-30/x.json", None),  # no such day
        ("raw/country=us/date=2026-01-28", None),  # a file, not a folder
        ("raw/country=us/notes/date=2026-01-28/x.json", None),  # a folder of no label
        ("raw/factory-a/factory_state/yyyy=2026/mm=01/dd=28/m-00000001.json", None),
        ("prod/country=us/date=2026-01-28/x.json", None),
    ],
)
def test_a_key_lies_in_the_dataset_partition_of_its_first_date_folder(
    key: str, partition: str | None
) -> None:
    found = keys.dataset_partition_of(key)
    assert (found.prefix if found else None) == partition


def test_a_dataset_partition_is_labels_then_a_date_folder() -> None:
    info = keys.dataset_partition(PART)
    assert (info.labels, info.day) == (
        (("country", "us"), ("category", "news")),
        date(2026, 1, 28),
    )
    deep = "raw/" + "".join(f"l{i}=v/" for i in range(keys.DATASET_MAX_LABELS + 1))
    for bad in (
        "raw/country=us/",
        "raw/date=2026-01-28/",
        PART.rstrip("/"),
        deep + "date=2026-01-28/",
    ):
        with pytest.raises(ContractError, match=r"no dataset partition|no folder"):
            keys.dataset_partition(bad)


def dataset_seal(names: list[str], supplement: int = 0) -> DatasetPartitionSeal:
    objects = [
        sealed_object(f"{PART}{n}", n.encode(), etag(n.encode()), {}, LAST_MODIFIED) for n in names
    ]
    return dataset_seal_document(PART, objects, sealed_at=SEALED_AT, supplement=supplement)


def test_a_dataset_seal_lists_every_object_under_its_folder_and_reads_back() -> None:
    doc = dataset_seal(["raw_0002.json", "raw_0001.json", "raw_0001.json.success", "sub/a.html"])
    assert doc.key == f"{PART}raw_metadata.json"
    assert doc.labels == {"country": "us", "category": "news"}
    assert [e.key.removeprefix(PART) for e in doc.manifest] == [
        "raw_0001.json",
        "raw_0001.json.success",
        "raw_0002.json",
        "sub/a.html",
    ]
    assert doc.first_arrival == LAST_MODIFIED  # no ingest metadata: S3's time
    assert read_document(doc.key, doc.model_dump_json().encode()) == doc
    late = dataset_seal(["raw_0003.json"], supplement=1)
    assert late.key == f"{PART}raw_metadata.late-0001.json"
    assert read_document(late.key, late.model_dump_json().encode()) == late


def test_a_dataset_seal_refuses_other_folders_objects_and_labels_not_its_own() -> None:
    with pytest.raises(ValueError, match="no message of this partition"):
        dataset_seal_document(
            PART,
            [sealed_object("raw/country=kr/date=2026-01-28/x", b"x", '"e"', {}, LAST_MODIFIED)],
            sealed_at=SEALED_AT,
        )
    with pytest.raises(ValueError, match="no message of this partition"):
        dataset_seal(["raw_metadata.json"])  # the seal's own name
    doc = dataset_seal(["raw_0001.json"]).model_dump(mode="json")
    with pytest.raises(ContractError, match="differ from the folder"):
        read_document(f"{PART}raw_metadata.json", json.dumps(doc | {"labels": {}}).encode())
    with pytest.raises(ContractError, match="describes"):
        read_document(
            "raw/country=us/date=2026-01-28/raw_metadata.json",
            json.dumps(doc).encode(),
        )


def test_dataset_objects_and_their_seal_documents_are_told_apart_by_name() -> None:
    assert is_object_of(PART, f"{PART}raw_0001.json")
    assert is_object_of(PART, f"{PART}sub/raw_metadata.json")  # not at the root: an object
    assert not is_object_of(PART, PART)  # a folder marker
    assert not is_object_of(PART, f"{PART}raw_metadata.late-0002.json")
    assert is_seal_key(f"{PART}raw_metadata.json")
    assert is_seal_key(f"{PART}raw_metadata.late-0002.json")
    assert not is_seal_key(f"{PART}raw_metadata.late-0000.json")
    assert not is_seal_key(f"{PART}sub/raw_metadata.json")
    assert is_seal_name("raw_metadata.json") and not is_seal_name("raw_metadata.json.success")
