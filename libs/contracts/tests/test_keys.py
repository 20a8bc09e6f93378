"""Every key builder against the contract's exact S3 and DynamoDB layouts, partition edges included."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aegis_contracts import keys
from aegis_contracts.errors import ContractError
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import CloudTier, Dataset, KeyFamily, ReportArtifact


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


MID = "msg-0001-abcd"
LAST_MS = utc(2026, 12, 31, 23, 59, 59, 999_999)

S3_CASES = [
    # (builder call, expected key)
    (
        lambda: keys.raw_key("factory-a", "factory_state", utc(2026, 11, 30, 10, 1, 2), MID),
        "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-0001-abcd.json",
    ),
    (  # the last millisecond of a year stays in that year's partition (no hh under raw/)
        lambda: keys.raw_key("factory-a", SourceType.INFRA_STATE, LAST_MS, MID),
        "raw/factory-a/infra_state/yyyy=2026/mm=12/dd=31/msg-0001-abcd.json",
    ),
    (  # one millisecond later is the next year
        lambda: keys.raw_key("f1", "image_snapshot", utc(2027, 1, 1), MID),
        "raw/f1/image_snapshot/yyyy=2027/mm=01/dd=01/msg-0001-abcd.json",
    ),
    (  # a non-UTC instant is filed under its UTC date (KST 08:59 on the 1st is the 31st UTC)
        lambda: keys.raw_key(
            "f1",
            "factory_state",
            datetime.fromisoformat("2027-01-01T08:59:59.999+09:00"),
            MID,
        ),
        "raw/f1/factory_state/yyyy=2026/mm=12/dd=31/msg-0001-abcd.json",
    ),
    (
        lambda: keys.processed_key("factory-a", "factory_state", utc(2026, 2, 28, 23, 59, 59), MID),
        "processed/factory-a/factory_state/yyyy=2026/mm=02/dd=28/hh=23/msg-0001-abcd.json",
    ),
    (  # leap day, month end
        lambda: keys.processed_key("factory-a", Dataset.RISK_SCORE, utc(2028, 2, 29, 0, 0), MID),
        "processed/factory-a/risk_score/yyyy=2028/mm=02/dd=29/hh=00/msg-0001-abcd.json",
    ),
    (
        lambda: keys.processed_key("factory-b", "infra_state", utc(2026, 4, 30, 23, 0), MID),
        "processed/factory-b/infra_state/yyyy=2026/mm=04/dd=30/hh=23/msg-0001-abcd.json",
    ),
    (
        lambda: keys.processed_key("factory-c", "image_snapshot", utc(2026, 5, 1, 0, 0), MID),
        "processed/factory-c/image_snapshot/yyyy=2026/mm=05/dd=01/hh=00/msg-0001-abcd.json",
    ),
    (
        lambda: keys.state_snapshot_key("factory-a", LAST_MS),
        "processed/factory-a/state_snapshot/yyyy=2026/mm=12/dd=31/hh=23/"
        "2026-12-31T23:59:59.999Z.json",
    ),
    (
        lambda: keys.cloud_infra_key("fast", utc(2026, 11, 30, 15, 0, 0, 1_000)),
        "processed/cloud_infra/fast/yyyy=2026/mm=11/dd=30/hh=15/2026-11-30T15:00:00.001Z.json",
    ),
    (
        lambda: keys.cloud_infra_key(CloudTier.SLOW, utc(2026, 11, 30, 14, 55)),
        "processed/cloud_infra/slow/yyyy=2026/mm=11/dd=30/hh=14/2026-11-30T14:55:00.000Z.json",
    ),
    (
        lambda: keys.processed_agg_key("factory-a", utc(2026, 11, 30, 23, 55)),
        "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=23/mm=55.json",
    ),
    (
        lambda: keys.image_snapshot_key("factory-a", utc(2026, 11, 30, 9, 30), "cam-01_0930.jpg"),
        "image_snapshot/factory_id=factory-a/yyyy=2026/mm=11/dd=30/hh=09/cam-01_0930.jpg",
    ),
    (
        lambda: keys.report_key(date(2026, 11, 30), "factory-a", ReportArtifact.REPORT),
        "reports/daily/yyyy=2026/mm=11/dd=30/factory-a/report.md",
    ),
    (
        lambda: keys.report_key(date(2026, 1, 1), "cloud-infra", "cloud-infra-daily-summary.json"),
        "reports/daily/yyyy=2026/mm=01/dd=01/cloud-infra/cloud-infra-daily-summary.json",
    ),
    (
        lambda: keys.report_fleet_key(date(2026, 11, 30)),
        "reports/daily/yyyy=2026/mm=11/dd=30/fleet-incidents-summary.json",
    ),
    (
        lambda: keys.report_hourly_key(date(2026, 11, 30), "factory-b", 0),
        "reports/daily/yyyy=2026/mm=11/dd=30/factory-b/intermediate/hourly/hh=00.json",
    ),
    (
        lambda: keys.raw_metadata_key("factory-a", "factory_state", date(2026, 11, 30)),
        "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/raw_metadata.json",
    ),
    (
        lambda: keys.raw_metadata_late_key("factory-a", "infra_state", date(2026, 12, 31), 1),
        "raw/factory-a/infra_state/yyyy=2026/mm=12/dd=31/raw_metadata.late-0001.json",
    ),
    (
        lambda: keys.raw_metadata_late_key("f1", SourceType.IMAGE_SNAPSHOT, date(2027, 1, 1), 9999),
        "raw/f1/image_snapshot/yyyy=2027/mm=01/dd=01/raw_metadata.late-9999.json",
    ),
]


@pytest.mark.parametrize(("build", "expected"), S3_CASES, ids=[c[1] for c in S3_CASES])
def test_s3_key_layouts(build, expected):
    key = build()
    assert key == expected
    # every key the builders make is recognised as canonical by the parser
    assert keys.parse_key(key).family in set(KeyFamily)


DYNAMO_CASES = [
    (lambda: keys.factory_pk("factory-a"), "FACTORY#factory-a"),
    (lambda: keys.LATEST_SK, "LATEST"),
    (
        lambda: keys.history_state_sk(utc(2026, 11, 30, 23, 59, 59, 999_999)),
        "HISTORY#STATE#2026-11-30T23:59:59.999Z",
    ),
    (lambda: keys.graph_5m_sk(utc(2026, 12, 31, 23, 55)), "GRAPH#5M#2026-12-31T23:55:00.000Z"),
    (lambda: keys.CLOUD_PK, "CLOUD#infra"),
    (
        lambda: keys.cloud_history_sk("fast", utc(2026, 11, 30, 1, 2, 3, 4_000)),
        "HISTORY#FAST#2026-11-30T01:02:03.004Z",
    ),
    (
        lambda: keys.cloud_history_sk("slow", utc(2026, 11, 30, 1, 5)),
        "HISTORY#SLOW#2026-11-30T01:05:00.000Z",
    ),
    (lambda: keys.alert_pk("factory-b"), "ALERT#factory-b"),
    (lambda: keys.alert_pk("cloud-infra"), "ALERT#cloud-infra"),
    (lambda: keys.alert_sk("CRITICAL", "GAS_HIGH", "FIRING"), "CRITICAL#GAS_HIGH#FIRING"),
    (
        lambda: keys.observation_sk("WARNING", "S3_LATENCY_HIGH", "FIRING"),
        "OBSERVATION#WARNING#S3_LATENCY_HIGH#FIRING",
    ),
]


@pytest.mark.parametrize(("build", "expected"), DYNAMO_CASES, ids=[c[1] for c in DYNAMO_CASES])
def test_dynamodb_key_layouts(build, expected):
    assert build() == expected


def test_sort_keys_sort_in_time_order():
    times = [
        utc(2026, 11, 30, 9, 59, 59, 999_000),
        utc(2026, 11, 30, 10, 0),
        utc(2026, 11, 30, 10, 0, 0, 1_000),
        utc(2027, 1, 1),
    ]
    sks = [keys.history_state_sk(t) for t in times]
    assert sks == sorted(sks)
    assert len({len(s) for s in sks}) == 1


HOSTILE_IDS = [
    "",  # empty
    "..",
    "../etc",
    "factory-a/../b",
    "a/b",
    "factory+",
    "factory#",
    "+",
    "#",
    "*",
    ">",
    "factory.a",  # a NATS token separator
    "Factory-A",  # upper case is outside the pattern
    "-leading-dash",
    "fаctory-a",  # Cyrillic а (U+0430)
    "factory-ａ",  # fullwidth a (U+FF41)
    "factory\u200b-a",  # zero-width space
    "factory-a\n",
    " factory-a",
    "factory a",
    "f" * 64,  # one over the 63-character limit
    "factory%2e%2e",
    "factory-a\x00",
]


@pytest.mark.parametrize("bad", HOSTILE_IDS, ids=[repr(b) for b in HOSTILE_IDS])
@pytest.mark.parametrize(
    "builder",
    [
        lambda f: keys.raw_key(f, "factory_state", utc(2026, 1, 1), MID),
        lambda f: keys.processed_key(f, "risk_score", utc(2026, 1, 1), MID),
        lambda f: keys.state_snapshot_key(f, utc(2026, 1, 1)),
        lambda f: keys.processed_agg_key(f, utc(2026, 1, 1)),
        lambda f: keys.image_snapshot_key(f, utc(2026, 1, 1), "a.jpg"),
        lambda f: keys.report_key(date(2026, 1, 1), f, "report.md"),
        keys.factory_pk,
        keys.alert_pk,
    ],
    ids=["raw", "processed", "snapshot", "agg", "image", "report", "pk", "alert"],
)
def test_hostile_factory_ids_are_refused(builder, bad):
    with pytest.raises(ContractError) as info:
        builder(bad)
    assert info.value.code == "invalid_factory_id"
    assert "factory_id" in str(info.value)


def test_the_longest_valid_factory_id_is_accepted():
    fid = "f" * 63
    assert keys.factory_pk(fid) == f"FACTORY#{fid}"


def test_cloud_infra_is_reserved_as_factory_id():
    with pytest.raises(ContractError) as info:
        keys.factory_pk("cloud-infra")
    assert info.value.code == "reserved_factory_id"


HOSTILE_MESSAGE_IDS = [
    "",
    "short",  # under 8 characters
    "raw_metadata",  # '_' is outside the alphabet, so no reserved name can be built
    "raw_metadata.late-0001",  # nor a seal's supplement ('.' is outside it too)
    "../../../../x",
    "abc/defgh",
    "abcdefgh.json",
    "abcdefg+",
    "abcdefg#",
    "abcdefgh\u0430",
    "a" * 65,
]


@pytest.mark.parametrize("bad", HOSTILE_MESSAGE_IDS, ids=[repr(b) for b in HOSTILE_MESSAGE_IDS])
def test_hostile_message_ids_are_refused(bad):
    with pytest.raises(ContractError) as info:
        keys.raw_key("factory-a", "factory_state", utc(2026, 1, 1), bad)
    assert info.value.code == "invalid_message_id"


@pytest.mark.parametrize("bad", ["../x.jpg", ".hidden", "a/b.jpg", "a b.jpg", "x" * 201, "ｘ.jpg"])
def test_hostile_filenames_are_refused(bad):
    with pytest.raises(ContractError):
        keys.image_snapshot_key("factory-a", utc(2026, 1, 1), bad)


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda: keys.raw_key("f1", "factory_stat", utc(2026, 1, 1), MID), "invalid_source_type"),
        (lambda: keys.raw_key("f1", "+", utc(2026, 1, 1), MID), "invalid_source_type"),
        (lambda: keys.processed_key("f1", "../x", utc(2026, 1, 1), MID), "invalid_dataset"),
        (
            lambda: keys.processed_key("f1", "state_snapshot", utc(2026, 1, 1), MID),
            "invalid_dataset",
        ),
        (lambda: keys.cloud_infra_key("medium", utc(2026, 1, 1)), "invalid_tier"),
        (lambda: keys.processed_agg_key("f1", utc(2026, 1, 1, 0, 3)), "unaligned_bucket"),
        (lambda: keys.graph_5m_sk(utc(2026, 1, 1, 0, 5, 1)), "unaligned_bucket"),
        (lambda: keys.report_key(date(2026, 1, 1), "f1", "../secret"), "invalid_artifact"),
        (lambda: keys.report_hourly_key(date(2026, 1, 1), "f1", 24), "invalid_hour"),
        (lambda: keys.alert_sk("HIGH", "GAS", "FIRING"), "invalid_severity"),
        (lambda: keys.alert_sk("CRITICAL", "gas#x", "FIRING"), "invalid_reason"),
        (lambda: keys.alert_sk("CRITICAL", "GAS", "A#B"), "invalid_status"),
        (lambda: keys.raw_key("f1", "factory_state", datetime(2026, 1, 1), MID), "naive_timestamp"),
    ],
)
def test_other_refusals(call, code):
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.code == code


def test_parse_key_round_trip():
    info = keys.parse_key(
        "processed/factory-a/state_snapshot/yyyy=2026/mm=11/dd=30/hh=10/"
        "2026-11-30T10:00:00.123Z.json"
    )
    assert info.family is KeyFamily.STATE_SNAPSHOT
    assert info.factory_id == "factory-a"
    assert info.at == utc(2026, 11, 30, 10, 0, 0, 123_000)
    info = keys.parse_key(
        "processed/cloud_infra/slow/yyyy=2026/mm=11/dd=30/hh=10/2026-11-30T10:05:00.000Z.json"
    )
    assert (info.family, info.tier) == (KeyFamily.CLOUD_INFRA, CloudTier.SLOW)
    info = keys.parse_key("raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-0001-abcd.json")
    assert (info.family, info.source_type, info.message_id) == (
        KeyFamily.RAW,
        SourceType.FACTORY_STATE,
        MID,
    )


def test_a_raw_partition_seal_and_its_supplements_parse_as_their_own_families():
    day = "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/"
    seal = keys.parse_key(f"{day}raw_metadata.json")
    assert (seal.family, seal.supplement, seal.message_id) == (KeyFamily.RAW_METADATA, None, None)
    late = keys.parse_key(f"{day}raw_metadata.late-0012.json")
    assert (late.family, late.factory_id, late.source_type, late.day, late.supplement) == (
        KeyFamily.RAW_METADATA_LATE,
        "factory-a",
        SourceType.FACTORY_STATE,
        date(2026, 11, 30),
        12,
    )
    # they sort after nothing a message could be named, and the seal before its supplements
    assert sorted([f"{day}raw_metadata.late-0002.json", f"{day}raw_metadata.json"]) == [
        f"{day}raw_metadata.json",
        f"{day}raw_metadata.late-0002.json",
    ]


@pytest.mark.parametrize("n", [0, -1, 10_000, True, "1", 1.0])
def test_a_supplement_number_outside_1_to_9999_is_refused(n):
    with pytest.raises(ContractError) as info:
        keys.raw_metadata_late_key("factory-a", "factory_state", date(2026, 11, 30), n)
    assert info.value.code == "invalid_supplement"


@pytest.mark.parametrize(
    "bad",
    [
        "raw_metadata.late-0000.json",  # supplements count from 1
        "raw_metadata.late-1.json",  # fixed width
        "raw_metadata.late-10000.json",
        "raw_metadata.LATE-0001.json",
        "raw_metadata.late-0001.json.tmp",
        "raw_metadata.json.late-0001",
    ],
)
def test_parse_key_refuses_what_is_no_seal_supplement(bad):
    with pytest.raises(ContractError):
        keys.parse_key(f"raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/{bad}")


@given(mid=st.from_regex(r"[A-Za-z0-9-]{8,64}", fullmatch=True))
def test_no_message_id_names_a_seal_or_a_supplement(mid):
    info = keys.parse_key(keys.raw_key("factory-a", "factory_state", utc(2026, 11, 30), mid))
    assert info.family is KeyFamily.RAW
    assert not mid.startswith(keys.RAW_METADATA_STEM)


@pytest.mark.parametrize(
    "bad",
    [
        "latest/factory-a/state.json",  # legacy prefix
        "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=30/hh=10/msg-0001-abcd.json",  # hh in raw
        "raw/factory-a/factory_state/yyyy=2026/mm=11/dd=31/msg-0001-abcd.json",  # no such day
        "processed/factory-a/state_snapshot/yyyy=2026/mm=11/dd=30/hh=11/"
        "2026-11-30T10:00:00.123Z.json",  # hour partition disagrees with the timestamp
        "processed/factory-a/weather/yyyy=2026/mm=11/dd=30/hh=10/msg-0001-abcd.json",
        "processed/cloud-infra/risk_score/yyyy=2026/mm=11/dd=30/hh=10/msg-0001-abcd.json",
        "processed_agg/factory-a/metrics_5m/yyyy=2026/mm=11/dd=30/hh=10/mm=03.json",
        "raw/../factory-a/factory_state/yyyy=2026/mm=11/dd=30/msg-0001-abcd.json",
        "reports/daily/yyyy=2026/mm=11/dd=30/factory-a/notes.txt",
        "reports/daily/yyyy=2026/mm=11/dd=30/notes.json",
        "",
    ],
)
def test_parse_key_refuses_what_is_not_canonical(bad):
    with pytest.raises(ContractError):
        keys.parse_key(bad)


@given(
    fid=st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True).filter(
        lambda f: f != "cloud-infra"
    ),
    mid=st.from_regex(r"[A-Za-z0-9-]{8,64}", fullmatch=True),
    at=st.datetimes(
        min_value=datetime(2000, 1, 1), max_value=datetime(2099, 12, 31), timezones=st.just(UTC)
    ),
    source=st.sampled_from(list(SourceType)),
)
def test_builders_and_parser_agree_for_any_valid_input(fid, mid, at, source):
    raw = keys.raw_key(fid, source, at, mid)
    info = keys.parse_key(raw)
    assert (info.factory_id, info.source_type, info.message_id) == (fid, source, mid)
    snap = keys.state_snapshot_key(fid, at)
    assert keys.parse_key(snap).at == at.replace(microsecond=at.microsecond // 1000 * 1000)
    assert raw.startswith(f"raw/{fid}/") and ".." not in raw


@given(text=st.text(max_size=80))
def test_no_string_escapes_the_factory_prefix(text):
    try:
        key = keys.processed_key(text, "factory_state", datetime(2026, 1, 1, tzinfo=UTC), MID)
    except ContractError:
        return
    assert key.split("/")[1] == text
    assert text.isascii() and "/" not in text and ".." not in text


# -- the fleet index ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pk", "sk", "firing", "kind"),
    [
        ("FACTORY#factory-a", "LATEST", None, keys.FLEET_LATEST),
        ("FACTORY#factory-a", "HISTORY#STATE#2026-11-30T10:00:00.000Z", None, None),
        ("FACTORY#factory-a", "GRAPH#5M#2026-11-30T10:00:00.000Z", None, None),
        ("CLOUD#infra", "LATEST", None, None),
        ("ALERT#factory-a", "CRITICAL#FIRE_DETECTED#STATE", True, keys.FLEET_FIRING),
        ("ALERT#cloud-infra", "WARNING#S3_SLOW#FAST", True, keys.FLEET_FIRING),
        ("ALERT#factory-a", "CRITICAL#FIRE_DETECTED#STATE", False, None),
        ("ALERT#factory-a", "CRITICAL#FIRE_DETECTED#STATE", None, None),
        ("ALERT#factory-a", "CRITICAL#FIRE_DETECTED#STATE", "true", None),  # only a real True
        ("ALERT#factory-a", "OBSERVATION#WARNING#CO_HIGH#STATE", True, None),
        ("ALERT#factory-a", "CURSOR#STATE", True, None),
        ("ALERT#factory-a", "INTENT#STATE#2026-11-30T10:00:00.000Z", True, None),
        ("CLAIM#refresh", "2026-11-30T10:00:00.000Z", True, None),
    ],
)
def test_only_factory_latest_and_firing_alert_states_enter_the_fleet_index(pk, sk, firing, kind):
    found = keys.fleet_index_keys(pk, sk, firing=firing)
    if kind is None:
        assert found is None
        return
    assert found is not None
    partition = found[keys.FLEET_PK]
    assert partition in keys.fleet_partitions(kind)
    assert found[keys.FLEET_SK].startswith(pk)


@given(fid=st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True))
def test_a_factory_always_lands_in_the_same_shard(fid):
    pk = keys.factory_pk(fid)
    first = keys.fleet_index_keys(pk, "LATEST")
    assert first == keys.fleet_index_keys(pk, "LATEST")
    assert first is not None
    assert first[keys.FLEET_PK] == f"LATEST#{keys.fleet_shard(pk)}"
    assert 0 <= keys.fleet_shard(pk) < keys.FLEET_SHARDS


def test_shards_spread_a_fleet_evenly():
    counts = [0] * keys.FLEET_SHARDS
    for i in range(8000):
        counts[keys.fleet_shard(keys.factory_pk(f"factory-{i:04d}"))] += 1
    assert min(counts) > 0.9 * 1000 and max(counts) < 1.1 * 1000


def test_a_fleet_partition_outside_the_shards_is_refused():
    with pytest.raises(ContractError):
        keys.fleet_partition(keys.FLEET_LATEST, keys.FLEET_SHARDS)
    with pytest.raises(ContractError):
        keys.fleet_partition("HISTORY", 0)


def test_an_active_execution_names_its_log_item_and_never_shares_a_job_partition() -> None:
    started = datetime(2026, 12, 1, 6, 30, 1, 250_000, tzinfo=UTC)
    sk = keys.exec_active_sk("gas-leak", started, "20261201T063001-ab12cd34")
    assert sk == "gas-leak#2026-12-01T06:30:01.250Z#20261201T063001-ab12cd34"
    assert keys.parse_exec_active_sk(sk) == (
        "gas-leak",
        keys.exec_sk(started, "20261201T063001-ab12cd34"),
    )
    # a job may be called "active": its log partition is EXEC#active, not the lease partition
    assert keys.exec_pk("active") != keys.EXEC_ACTIVE_PK
    with pytest.raises(ContractError):
        keys.parse_exec_active_sk("gas-leak#yesterday#x")
