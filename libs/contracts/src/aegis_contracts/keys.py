"""The one module of key builders: every S3 prefix and every DynamoDB pk/sk of the contract.

Every service builds keys here and nowhere else. Each builder validates the ids it is given
before it puts them in a key, so a hostile id cannot escape its prefix or collide with a
reserved name.
:func:`parse_key` does the reverse for keys that arrive from outside (events, listings, migration).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum

from aegis_contracts.errors import ContractError
from aegis_contracts.ids import (
    SourceType,
    validate_factory_id,
    validate_filename,
    validate_message_id,
    validate_source_type,
)
from aegis_contracts.times import Partition, day_path, ensure_utc, format_ts, parse_ts

# ---------------------------------------------------------------------------------------------
# S3

RAW_PREFIX = "raw/"
PROCESSED_PREFIX = "processed/"
PROCESSED_AGG_PREFIX = "processed_agg/"
IMAGE_SNAPSHOT_PREFIX = "image_snapshot/"
REPORTS_DAILY_PREFIX = "reports/daily/"
INCIDENTS_PREFIX = "incidents/"
AUDIT_PREFIX = "audit/"
LEGACY_LATEST_PREFIX = "latest/"
CLOUD_INFRA = "cloud_infra"
# the report target and alert scope of the cloud infrastructure; refused as a factory id
CLOUD_INFRA_TARGET = "cloud-infra"
# the seal of a raw partition and its late-arrival supplements (raw_metadata.late-0001.json, …):
# message ids have no '_' or '.', so no message can ever be named like them
RAW_METADATA_NAME = "raw_metadata.json"
RAW_METADATA_STEM = "raw_metadata"
RAW_METADATA_LATE_MAX = 9999
GRAPH_BUCKET = timedelta(minutes=5)


class Dataset(StrEnum):
    """processed/{factory_id}/{dataset}/ families."""

    FACTORY_STATE = "factory_state"
    RISK_SCORE = "risk_score"
    INFRA_STATE = "infra_state"
    IMAGE_SNAPSHOT = "image_snapshot"
    STATE_SNAPSHOT = "state_snapshot"


# datasets keyed by message_id; state_snapshot is keyed by updated_at
MESSAGE_DATASETS = frozenset(
    {Dataset.FACTORY_STATE, Dataset.RISK_SCORE, Dataset.INFRA_STATE, Dataset.IMAGE_SNAPSHOT}
)


class CloudTier(StrEnum):
    FAST = "fast"
    SLOW = "slow"


class ReportArtifact(StrEnum):
    FACTORY_SUMMARY = "factory-daily-summary.json"
    CLOUD_SUMMARY = "cloud-infra-daily-summary.json"
    CONTEXT = "report-context.json"
    REPORT = "report.md"
    METADATA = "generation-metadata.json"


def factory(factory_id: str) -> str:
    """A factory id fit for keys: the contract pattern, and not a reserved target name."""
    fid = validate_factory_id(factory_id)
    if fid == CLOUD_INFRA_TARGET:
        raise ContractError("reserved_factory_id", f"factory_id {fid!r} is reserved")
    return fid


def raw_key(
    factory_id: str, source_type: SourceType | str, received_at: datetime, message_id: str
) -> str:
    """``raw/{f}/{source_type}/yyyy=/mm=/dd=/{message_id}.json``, partitioned by arrival (no hh)."""
    st = validate_source_type(source_type)
    return (
        f"{raw_prefix(factory_id, st)}{Partition.of(received_at).day_path}/"
        f"{validate_message_id(message_id)}.json"
    )


def raw_prefix(factory_id: str, source_type: SourceType | str | None = None) -> str:
    prefix = f"{RAW_PREFIX}{factory(factory_id)}/"
    return prefix if source_type is None else f"{prefix}{validate_source_type(source_type).value}/"


def raw_day_prefix(factory_id: str, source_type: SourceType | str, day: date) -> str:
    return f"{raw_prefix(factory_id, source_type)}{day_path(day)}/"


def raw_metadata_key(factory_id: str, source_type: SourceType | str, day: date) -> str:
    """The sealer's manifest at the root of one raw partition."""
    return f"{raw_day_prefix(factory_id, source_type, day)}{RAW_METADATA_NAME}"


def raw_metadata_late_name(n: int) -> str:
    """``raw_metadata.late-NNNN.json``: the ``n``-th supplement (1..9999) of a sealed partition."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= RAW_METADATA_LATE_MAX:
        raise ContractError(
            "invalid_supplement", f"supplement {n!r} is not 1..{RAW_METADATA_LATE_MAX}"
        )
    return f"{RAW_METADATA_STEM}.late-{n:04d}.json"


def raw_metadata_late_key(factory_id: str, source_type: SourceType | str, day: date, n: int) -> str:
    """A sealed partition's ``n``-th supplement: the objects that arrived after the seal (and
    after the earlier supplements), recorded beside it, never by rewriting it."""
    return f"{raw_day_prefix(factory_id, source_type, day)}{raw_metadata_late_name(n)}"


# Dataset partitions under raw/: the two-tier layout of seed-style datasets
# (``raw/country={cc}/category={cat}/date=YYYY-MM-DD/raw_0001.json``, where the
# ``datasets-processing`` migration puts ``datasets/``): folders of ``name=value`` labels ending in
# one ``date=YYYY-MM-DD`` folder, which is the partition (everything under it, whatever its name,
# except the seal documents at its root). A factory id has no ``=``, so the two layouts never
# share a folder under raw/.
DATASET_DATE_LABEL = "date"
DATASET_MAX_LABELS = 8  # label folders above the date one; deeper trees are not partitions
_LABEL = re.compile(r"(?P<k>[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})=(?P<v>[^/\x00-\x1f]{1,256})")
_DATE_LABEL = re.compile(rf"{DATASET_DATE_LABEL}=(?P<d>\d{{4}}-\d{{2}}-\d{{2}})")


def dataset_label(segment: str) -> tuple[str, str] | None:
    """``(name, value)`` of a folder name ``name=value`` that is not the ``date=`` one."""
    match = _LABEL.fullmatch(segment)
    if match is None or match["k"] == DATASET_DATE_LABEL:
        return None
    return match["k"], match["v"]


def dataset_date(segment: str) -> date | None:
    """The day of a ``date=YYYY-MM-DD`` folder name; ``None`` for any other name."""
    match = _DATE_LABEL.fullmatch(segment)
    if match is None:
        return None
    try:
        return date.fromisoformat(match["d"])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class DatasetPartitionInfo:
    prefix: str  # raw/{label=value/...}date=YYYY-MM-DD/
    labels: tuple[tuple[str, str], ...]
    day: date


def dataset_partition(prefix: str) -> DatasetPartitionInfo:
    """Check that ``prefix`` is a dataset partition folder: ``raw/``, 1 to
    :data:`DATASET_MAX_LABELS` ``name=value`` folders, one ``date=YYYY-MM-DD`` folder, ``/``."""
    if not prefix.startswith(RAW_PREFIX) or not prefix.endswith("/"):
        raise ContractError("invalid_partition", f"{prefix!r:.120} is no folder under raw/")
    *names, last = prefix[len(RAW_PREFIX) : -1].split("/")
    labels = [dataset_label(n) for n in names]
    day = dataset_date(last)
    if day is None or not 1 <= len(labels) <= DATASET_MAX_LABELS or None in labels:
        raise ContractError(
            "invalid_partition",
            f"{prefix!r:.120} is no dataset partition (raw/name=value/.../date=YYYY-MM-DD/)",
        )
    return DatasetPartitionInfo(prefix, tuple(label for label in labels if label), day)


def dataset_partition_of(key: str) -> DatasetPartitionInfo | None:
    """The dataset partition ``key`` lies in (below its ``date=`` folder), if it lies in one."""
    if not key.startswith(RAW_PREFIX):
        return None
    segments = key[len(RAW_PREFIX) :].split("/")
    for depth, segment in enumerate(segments[: DATASET_MAX_LABELS + 1]):
        if dataset_date(segment) is not None:
            if depth == 0 or depth == len(segments) - 1:  # no label above, or a file named so
                return None
            try:
                return dataset_partition(RAW_PREFIX + "/".join(segments[: depth + 1]) + "/")
            except ContractError:
                return None
        if dataset_label(segment) is None:
            return None
    return None


def processed_key(
    factory_id: str, dataset: Dataset | str, event_time: datetime, message_id: str
) -> str:
    """``processed/{f}/{dataset}/yyyy=/mm=/dd=/hh=/{message_id}.json``, by event time."""
    ds = _dataset(dataset)
    if ds not in MESSAGE_DATASETS:
        raise ContractError("invalid_dataset", f"{ds.value} is not keyed by message_id")
    return (
        f"{processed_prefix(factory_id, ds)}{Partition.of(event_time).hour_path}/"
        f"{validate_message_id(message_id)}.json"
    )


def state_snapshot_key(factory_id: str, updated_at: datetime) -> str:
    """``processed/{f}/state_snapshot/yyyy=/mm=/dd=/hh=/{updated_at}.json``."""
    return (
        f"{processed_prefix(factory_id, Dataset.STATE_SNAPSHOT)}"
        f"{Partition.of(updated_at).hour_path}/{format_ts(updated_at)}.json"
    )


def processed_prefix(factory_id: str, dataset: Dataset | str | None = None) -> str:
    prefix = f"{PROCESSED_PREFIX}{factory(factory_id)}/"
    return prefix if dataset is None else f"{prefix}{_dataset(dataset).value}/"


def processed_hour_prefix(factory_id: str, dataset: Dataset | str, hour: datetime) -> str:
    return f"{processed_prefix(factory_id, dataset)}{Partition.of(hour).hour_path}/"


def cloud_infra_key(tier: CloudTier | str, updated_at: datetime) -> str:
    """``processed/cloud_infra/{fast|slow}/yyyy=/mm=/dd=/hh=/{updated_at}.json``."""
    hour = Partition.of(updated_at).hour_path
    return f"{cloud_infra_prefix(tier)}{hour}/{format_ts(updated_at)}.json"


def cloud_infra_prefix(tier: CloudTier | str) -> str:
    return f"{PROCESSED_PREFIX}{CLOUD_INFRA}/{_tier(tier).value}/"


def cloud_infra_hour_prefix(tier: CloudTier | str, hour: datetime) -> str:
    return f"{cloud_infra_prefix(tier)}{Partition.of(hour).hour_path}/"


def processed_agg_key(factory_id: str, bucket_start: datetime) -> str:
    """``processed_agg/{f}/metrics_5m/yyyy=/mm=/dd=/hh=/mm=MM.json`` for an aligned start."""
    start = graph_bucket_start(bucket_start)
    return (
        f"{PROCESSED_AGG_PREFIX}{factory(factory_id)}/metrics_5m/"
        f"{Partition.of(start).hour_path}/mm={start.minute:02d}.json"
    )


def processed_agg_hour_prefix(factory_id: str, hour: datetime) -> str:
    """``processed_agg/{f}/metrics_5m/yyyy=/mm=/dd=/hh=/``: the windows of one hour."""
    return f"{PROCESSED_AGG_PREFIX}{factory(factory_id)}/metrics_5m/{Partition.of(hour).hour_path}/"


def image_snapshot_key(factory_id: str, captured_at: datetime, filename: str) -> str:
    """``image_snapshot/factory_id={f}/yyyy=/mm=/dd=/hh=/{filename}``."""
    return (
        f"{IMAGE_SNAPSHOT_PREFIX}factory_id={factory(factory_id)}/"
        f"{Partition.of(captured_at).hour_path}/{validate_filename(filename)}"
    )


def image_snapshot_day_prefix(factory_id: str, day: date) -> str:
    """``image_snapshot/factory_id={f}/yyyy=/mm=/dd=/``: one UTC day of a factory's images."""
    return f"{IMAGE_SNAPSHOT_PREFIX}factory_id={factory(factory_id)}/{day_path(day)}/"


def report_target(target: str) -> str:
    """A report target: a factory id, or ``cloud-infra``."""
    return CLOUD_INFRA_TARGET if target == CLOUD_INFRA_TARGET else factory(target)


def report_prefix(report_date: date, target: str | None = None) -> str:
    prefix = f"{REPORTS_DAILY_PREFIX}{day_path(report_date)}/"
    return prefix if target is None else f"{prefix}{report_target(target)}/"


# the fleet's alert incidents of one KST day, across every target: beside the targets' folders
REPORT_FLEET_INCIDENTS = "fleet-incidents-summary.json"


def report_fleet_key(report_date: date) -> str:
    """``reports/daily/yyyy=/mm=/dd=/fleet-incidents-summary.json``: the day's alert incidents
    of the whole fleet (counts, MTTA and MTTR per target and in total)."""
    return f"{report_prefix(report_date)}{REPORT_FLEET_INCIDENTS}"


def report_key(report_date: date, target: str, artifact: ReportArtifact | str) -> str:
    """``reports/daily/yyyy=/mm=/dd=/{target}/{artifact}``; the date is the KST report date."""
    try:
        art = ReportArtifact(artifact)
    except ValueError:
        raise ContractError("invalid_artifact", f"{artifact!r} is not a report artifact") from None
    return f"{report_prefix(report_date, target)}{art.value}"


def report_hourly_key(report_date: date, target: str, kst_hour: int) -> str:
    """``…/{target}/intermediate/hourly/hh=HH.json`` for KST hour ``kst_hour`` (0-23)."""
    if not isinstance(kst_hour, int) or isinstance(kst_hour, bool) or not 0 <= kst_hour <= 23:
        raise ContractError("invalid_hour", f"KST hour {kst_hour!r} is not 0..23")
    return f"{report_prefix(report_date, target)}intermediate/hourly/hh={kst_hour:02d}.json"


_INCIDENT_ID = re.compile(r"\d{8}-[0-9a-f]{8}")


def incident_id(value: str) -> str:
    """An incident id: ``{yyyymmdd}-{8 hex}``, the UTC day it was triggered and a hash."""
    return _word(_INCIDENT_ID, value, "incident_id")


def incident_record_key(scope: str, triggered_at: datetime, incident: str) -> str:
    """``incidents/{scope}/yyyy=/mm=/dd=/{incident_id}.json``: the closed incident's record,
    written once (if-none-match) and never expired; the day is the UTC day it was triggered."""
    return (
        f"{INCIDENTS_PREFIX}{report_target(scope)}/{Partition.of(triggered_at).day_path}/"
        f"{incident_id(incident)}.json"
    )


_AUDIT_ID = re.compile(r"\d{8}T\d{9}-[0-9a-f]{8}")


def audit_id(value: str) -> str:
    """An audit event id: ``{yyyymmdd}T{hhmmssmmm}-{8 hex}``, its UTC time and a random part,
    so a day's events list in time order."""
    return _word(_AUDIT_ID, value, "audit_id")


def audit_key(at: datetime, event: str) -> str:
    """``audit/yyyy=/mm=/dd=/{audit_id}.json``: one thing a person did (or tried), written once
    (if-none-match) and never expired; the day is its UTC day."""
    return f"{AUDIT_PREFIX}{Partition.of(at).day_path}/{audit_id(event)}.json"


def audit_day_prefix(day: date) -> str:
    return f"{AUDIT_PREFIX}{day_path(day)}/"


def incident_day_prefix(scope: str, day: date) -> str:
    return f"{INCIDENTS_PREFIX}{report_target(scope)}/{day_path(day)}/"


def graph_bucket_start(value: datetime) -> datetime:
    """A 5-minute window start; anything not on the grid is refused rather than silently moved."""
    v = ensure_utc(value)
    if v.second or v.microsecond or v.minute % 5:
        raise ContractError("unaligned_bucket", f"{v.isoformat()} is not a 5-minute window start")
    return v


def _dataset(value: Dataset | str) -> Dataset:
    try:
        return Dataset(value)
    except ValueError:
        raise ContractError("invalid_dataset", f"{value!r} is not a processed dataset") from None


def _tier(value: CloudTier | str) -> CloudTier:
    try:
        return CloudTier(value)
    except ValueError:
        raise ContractError("invalid_tier", f"{value!r} is not fast or slow") from None


# ---------------------------------------------------------------------------------------------
# Parsing keys that arrive from outside


class KeyFamily(StrEnum):
    RAW = "raw"
    RAW_METADATA = "raw_metadata"
    RAW_METADATA_LATE = "raw_metadata_late"
    PROCESSED = "processed"
    STATE_SNAPSHOT = "state_snapshot"
    CLOUD_INFRA = "cloud_infra"
    PROCESSED_AGG = "processed_agg"
    IMAGE_SNAPSHOT = "image_snapshot"
    REPORT = "report"
    INCIDENT = "incident"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a contract key names. Fields not part of the family are ``None``."""

    family: KeyFamily
    factory_id: str | None = None
    source_type: SourceType | None = None
    dataset: Dataset | None = None
    tier: CloudTier | None = None
    message_id: str | None = None
    at: datetime | None = None
    day: date | None = None
    filename: str | None = None
    target: str | None = None
    artifact: str | None = None
    supplement: int | None = None
    incident_id: str | None = None


_DAY = r"yyyy=(?P<y>\d{4})/mm=(?P<m>\d{2})/dd=(?P<d>\d{2})"
_HOUR = _DAY + r"/hh=(?P<h>\d{2})"
_F = r"(?P<f>[a-z0-9][a-z0-9-]{0,62})"
_TS = r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z)"
_MID = r"(?P<mid>[A-Za-z0-9-]{8,64})"
_PATTERNS: tuple[tuple[KeyFamily, re.Pattern[str]], ...] = (
    (KeyFamily.RAW, re.compile(rf"raw/{_F}/(?P<st>[a-z_]+)/{_DAY}/{_MID}\.json")),
    (KeyFamily.RAW_METADATA, re.compile(rf"raw/{_F}/(?P<st>[a-z_]+)/{_DAY}/raw_metadata\.json")),
    (
        KeyFamily.RAW_METADATA_LATE,
        re.compile(rf"raw/{_F}/(?P<st>[a-z_]+)/{_DAY}/raw_metadata\.late-(?P<n>\d{{4}})\.json"),
    ),
    (
        KeyFamily.CLOUD_INFRA,
        re.compile(rf"processed/cloud_infra/(?P<tier>fast|slow)/{_HOUR}/{_TS}\.json"),
    ),
    (KeyFamily.STATE_SNAPSHOT, re.compile(rf"processed/{_F}/state_snapshot/{_HOUR}/{_TS}\.json")),
    (KeyFamily.PROCESSED, re.compile(rf"processed/{_F}/(?P<ds>[a-z_]+)/{_HOUR}/{_MID}\.json")),
    (
        KeyFamily.PROCESSED_AGG,
        re.compile(rf"processed_agg/{_F}/metrics_5m/{_HOUR}/mm=(?P<mi>\d{{2}})\.json"),
    ),
    (
        KeyFamily.IMAGE_SNAPSHOT,
        re.compile(
            rf"image_snapshot/factory_id={_F}/{_HOUR}/(?P<fn>[A-Za-z0-9][A-Za-z0-9._-]{{0,199}})"
        ),
    ),
    (
        KeyFamily.REPORT,
        re.compile(rf"reports/daily/{_DAY}/(?P<target>[a-z0-9][a-z0-9-]{{0,62}})/(?P<art>.+)"),
    ),
    (KeyFamily.REPORT, re.compile(rf"reports/daily/{_DAY}/(?P<art>fleet-incidents-summary\.json)")),
    (
        KeyFamily.INCIDENT,
        re.compile(
            rf"incidents/(?P<target>[a-z0-9][a-z0-9-]{{0,62}})/{_DAY}/(?P<inc>\d{{8}}-[0-9a-f]{{8}})\.json"
        ),
    ),
)


def parse_key(key: str) -> KeyInfo:
    """Classify an S3 key of the contract and check it is exactly what the builders would make."""
    if not isinstance(key, str) or not key or len(key) > 1024 or not key.isascii():
        raise ContractError("invalid_key", f"{key!r:.80} is not a contract key")
    for family, pattern in _PATTERNS:
        match = pattern.fullmatch(key)
        if match is None:
            continue
        info = _info(family, match)
        if _rebuild(info) != key:
            raise ContractError("invalid_key", f"{key!r:.80} is not canonical for {family.value}")
        return info
    raise ContractError("invalid_key", f"{key!r:.80} matches no prefix of the storage contract")


def _info(family: KeyFamily, m: re.Match[str]) -> KeyInfo:
    g = m.groupdict()
    try:
        day = date(int(g["y"]), int(g["m"]), int(g["d"]))
        hour = int(g["h"]) if g.get("h") else None
        at = (
            parse_ts(g["ts"])
            if g.get("ts")
            else datetime(
                day.year, day.month, day.day, hour or 0, int(g.get("mi") or 0), tzinfo=UTC
            )
        )
    except ValueError as err:
        raise ContractError("invalid_key", f"bad date in key: {err}") from None
    return KeyInfo(
        family=family,
        factory_id=g.get("f"),
        source_type=validate_source_type(g["st"]) if g.get("st") else None,
        dataset=_dataset(g["ds"]) if g.get("ds") else None,
        tier=CloudTier(g["tier"]) if g.get("tier") else None,
        message_id=g.get("mid"),
        at=at,
        day=day,
        filename=g.get("fn"),
        target=g.get("target"),
        artifact=g.get("art"),
        supplement=int(g["n"]) if g.get("n") else None,
        incident_id=g.get("inc"),
    )


def _rebuild_report(info: KeyInfo) -> str:
    assert info.day is not None and info.artifact
    if info.target is None:
        return report_fleet_key(info.day)
    hourly = re.fullmatch(r"intermediate/hourly/hh=(\d{2})\.json", info.artifact)
    if hourly:
        return report_hourly_key(info.day, info.target, int(hourly.group(1)))
    return report_key(info.day, info.target, info.artifact)


def _rebuild(info: KeyInfo) -> str:  # noqa: PLR0911 - one return per family reads best
    assert info.at is not None and info.day is not None
    match info.family:
        case KeyFamily.RAW:
            assert info.factory_id and info.source_type and info.message_id
            return raw_key(info.factory_id, info.source_type, info.at, info.message_id)
        case KeyFamily.RAW_METADATA:
            assert info.factory_id and info.source_type
            return raw_metadata_key(info.factory_id, info.source_type, info.day)
        case KeyFamily.RAW_METADATA_LATE:
            assert info.factory_id and info.source_type and info.supplement is not None
            return raw_metadata_late_key(
                info.factory_id, info.source_type, info.day, info.supplement
            )
        case KeyFamily.CLOUD_INFRA:
            assert info.tier
            return cloud_infra_key(info.tier, info.at)
        case KeyFamily.STATE_SNAPSHOT:
            assert info.factory_id
            return state_snapshot_key(info.factory_id, info.at)
        case KeyFamily.PROCESSED:
            assert info.factory_id and info.dataset and info.message_id
            if info.dataset is Dataset.STATE_SNAPSHOT:
                raise ContractError("invalid_key", "state_snapshot objects are named by updated_at")
            return processed_key(info.factory_id, info.dataset, info.at, info.message_id)
        case KeyFamily.PROCESSED_AGG:
            assert info.factory_id
            return processed_agg_key(info.factory_id, info.at)
        case KeyFamily.IMAGE_SNAPSHOT:
            assert info.factory_id and info.filename
            return image_snapshot_key(info.factory_id, info.at, info.filename)
        case KeyFamily.REPORT:
            return _rebuild_report(info)
        case KeyFamily.INCIDENT:
            assert info.target and info.incident_id
            return incident_record_key(info.target, info.at, info.incident_id)
    raise AssertionError(info.family)  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# DynamoDB

LATEST_SK = "LATEST"
CLOUD_PK = "CLOUD#infra"
HISTORY_STATE_PREFIX = "HISTORY#STATE#"
GRAPH_5M_PREFIX = "GRAPH#5M#"
HISTORY_FAST_PREFIX = "HISTORY#FAST#"
HISTORY_SLOW_PREFIX = "HISTORY#SLOW#"
OBSERVATION_PREFIX = "OBSERVATION#"
CURSOR_PREFIX = "CURSOR#"
# ``FACTORY#{f}`` / ``LATE#{hour}``: the factory-hour got processed/ objects after its windows were
# folded (late data); the aggregator folds the hour's windows again and deletes the marker
LATE_PREFIX = "LATE#"
INTENT_PREFIX = "INTENT#"
# the window-claim family of periodic work (refresh minutes, aggregator windows, report days)
CLAIM_PK_PREFIX = "CLAIM#"

_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_STATUS = re.compile(r"[A-Z][A-Z0-9_]{0,31}")
SEVERITIES = ("INFO", "WARNING", "CRITICAL")


def factory_pk(factory_id: str) -> str:
    return f"FACTORY#{factory(factory_id)}"


def history_state_sk(updated_at: datetime) -> str:
    return f"{HISTORY_STATE_PREFIX}{format_ts(updated_at)}"


def late_hour_sk(hour: datetime) -> str:
    """``LATE#{hour}`` for the UTC hour that starts at ``hour``."""
    if ensure_utc(hour) != ensure_utc(hour).replace(minute=0, second=0, microsecond=0):
        raise ContractError("invalid_hour", f"{hour.isoformat()} is not the start of an hour")
    return f"{LATE_PREFIX}{format_ts(hour)}"


def graph_5m_sk(bucket_start: datetime) -> str:
    return f"{GRAPH_5M_PREFIX}{format_ts(graph_bucket_start(bucket_start))}"


def cloud_history_sk(tier: CloudTier | str, updated_at: datetime) -> str:
    prefix = HISTORY_FAST_PREFIX if _tier(tier) is CloudTier.FAST else HISTORY_SLOW_PREFIX
    return f"{prefix}{format_ts(updated_at)}"


def alert_scope(scope: str) -> str:
    """An alert scope: a factory id, or ``cloud-infra``."""
    return report_target(scope)


def alert_pk(scope: str) -> str:
    return f"ALERT#{alert_scope(scope)}"


def alert_sk(severity: str, reason: str, status: str) -> str:
    """``{severity}#{reason}#{status}``: the cooldown/dedupe key of one alert."""
    return (
        f"{_severity(severity)}#{_word(_CODE, reason, 'reason')}#{_word(_STATUS, status, 'status')}"
    )


def observation_sk(severity: str, reason: str, status: str) -> str:
    return f"{OBSERVATION_PREFIX}{alert_sk(severity, reason, status)}"


def alert_cursor_sk(status: str) -> str:
    """``CURSOR#{status}``: the newest snapshot handled for one alert stream of a scope; an older
    snapshot (out of order, replayed) is stale and ignored."""
    return f"{CURSOR_PREFIX}{_word(_STATUS, status, 'status')}"


def alert_intent_sk(status: str, snapshot_at: datetime) -> str:
    """``INTENT#{status}#{snapshot_at}``: the one Slack message a snapshot of one alert stream of a
    scope decided to send, from the decision until Slack confirmed it or it was dead-lettered."""
    return f"{INTENT_PREFIX}{_word(_STATUS, status, 'status')}#{format_ts(snapshot_at)}"


# ``INCIDENT#{incident_id}`` / ``INCIDENT``: one incident, open or recently closed (the closed
# record lives on in S3, ``incidents/``); the open ones are listed through the fleet index
INCIDENT_PK_PREFIX = "INCIDENT#"
INCIDENT_SK = "INCIDENT"


# ``SILENCE`` / ``{silence_id}``: every silence in one partition (a few hundred at most; the
# dispatcher reads them all in one query when it is about to notify)
SILENCE_PK = "SILENCE"
_SILENCE_ID = re.compile(r"s-[0-9a-f]{12}")


def silence_id(value: str) -> str:
    return _word(_SILENCE_ID, value, "silence_id")


# ``TOKEN`` / ``{name}``: every dashboard token (its digest, role, scope; never the token), in one
# partition the dashboard reads whole every few seconds; a revoked one is kept, as a record
TOKEN_PK = "TOKEN"  # noqa: S105 - a partition key, not a secret
_TOKEN_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")


def token_name(value: str) -> str:
    return _word(_TOKEN_NAME, value, "token_name")


# ``SESSION#{digest}`` / ``SESSION``: one person's dashboard sign-in (OpenID Connect) until it
# expires (``ttl``) or they sign out. The key holds the SHA-256 of the session id the browser's
# cookie carries, never the id: whoever reads the table cannot sign in as anybody.
SESSION_PK_PREFIX = "SESSION#"
SESSION_SK = "SESSION"
_SESSION_DIGEST = re.compile(r"[0-9a-f]{64}")


def session_pk(digest: str) -> str:
    """``SESSION#{digest}``: ``digest`` the SHA-256 hex of the cookie's session id."""
    return f"{SESSION_PK_PREFIX}{_word(_SESSION_DIGEST, digest, 'session_digest')}"


# ``REPLICA#{service}`` / ``{host:pid}``: a replica says it is alive until ``alive_until``; what
# it holds is taken over by another once that has passed
REPLICA_PK_PREFIX = "REPLICA#"


def replica_pk(service: str) -> str:
    return f"{REPLICA_PK_PREFIX}{_word(re.compile(r'[a-z][a-z0-9-]{0,47}'), service, 'service')}"


def incident_pk(incident: str) -> str:
    return f"{INCIDENT_PK_PREFIX}{incident_id(incident)}"


def claim_pk(job: str) -> str:
    """``CLAIM#{job}``: one item per (job, window) so N replicas run each window once."""
    return f"{CLAIM_PK_PREFIX}{_word(re.compile(r'[a-z][a-z0-9_-]{0,63}'), job, 'job')}"


def claim_sk(window_start: datetime) -> str:
    return format_ts(window_start)


# ``CLAIM#{job}`` / ``FIRST``: the oldest window the job may ever run on this table, recorded once
# (no ttl); it sorts after every window start, so window listings never see it
CLAIM_FIRST_SK = "FIRST"


# The fleet index: a sparse global secondary index that holds only FACTORY LATEST items, the
# alert states that are firing and the late-data markers of factory-hours (``LATE#{hour}``), so
# listing the fleet, the open alerts or the hours to fold again reads what it returns,
# however deep each factory's history is. Its entries carry only keys (KEYS_ONLY): a LATEST
# rewrite that keeps the index keys writes nothing to the index (AWS charges an index write only
# when a projected attribute changes), so the per-message write cost stays what it was; readers
# fetch the items themselves with BatchGetItem. The entries are spread over FLEET_SHARDS index
# partitions by a hash of the item's pk, so no index partition runs hot at thousands of factories.
FLEET_INDEX = "fleet"
FLEET_PK = "fleet_pk"
FLEET_SK = "fleet_sk"
FLEET_SHARDS = 8
FLEET_LATEST = "LATEST"
FLEET_FIRING = "FIRING"
FLEET_LATE = "LATE"
FLEET_INCIDENT = "INCIDENT"
FLEET_KINDS = (FLEET_LATEST, FLEET_FIRING, FLEET_LATE, FLEET_INCIDENT)
FLEET_ATTRIBUTES = frozenset({FLEET_PK, FLEET_SK})


def fleet_shard(pk: str) -> int:
    """The index partition of an item: a stable hash of its pk (the same on every host)."""
    return zlib.crc32(pk.encode()) % FLEET_SHARDS


def fleet_partition(kind: str, shard: int) -> str:
    """``LATEST#{n}``, ``FIRING#{n}`` or ``LATE#{n}``: one index partition of the fleet, of the
    open alerts or of the late-data markers."""
    if kind not in FLEET_KINDS or not 0 <= shard < FLEET_SHARDS:
        raise ContractError(
            "invalid_index_partition", f"{kind!r}#{shard!r} is not a fleet partition"
        )
    return f"{kind}#{shard}"


def fleet_partitions(kind: str) -> list[str]:
    """Every index partition of ``kind`` (a listing queries them all)."""
    return [fleet_partition(kind, n) for n in range(FLEET_SHARDS)]


def fleet_index_keys(
    pk: str, sk: str, *, firing: object = None, archived: object = None, state: object = None
) -> dict[str, str] | None:
    """The index attributes an item carries, or None when it stays out of the index: a FACTORY
    LATEST always; an alert state (``ALERT#{scope}`` / ``{severity}#{reason}#{status}``) while
    ``firing`` is True; a factory-hour's late-data marker; an incident until its record is
    archived (``archived`` is falsy: open, or resolved and not yet written to S3), and an alert
    message while it is being sent (``state`` is ``sending``), both in the INCIDENT partitions
    the dispatchers' sweep reads; nothing else."""
    if pk.startswith(INCIDENT_PK_PREFIX) and sk == INCIDENT_SK and not archived:
        return {FLEET_PK: fleet_partition(FLEET_INCIDENT, fleet_shard(pk)), FLEET_SK: pk}
    if pk.startswith("ALERT#") and sk.startswith(INTENT_PREFIX) and state == "sending":
        # an alert message being sent: the dispatchers' sweep finds one whose sender died
        return {
            FLEET_PK: fleet_partition(FLEET_INCIDENT, fleet_shard(pk)),
            FLEET_SK: f"{pk}#{sk}",
        }
    if pk.startswith("FACTORY#") and sk == LATEST_SK:
        return {FLEET_PK: fleet_partition(FLEET_LATEST, fleet_shard(pk)), FLEET_SK: pk}
    if pk.startswith("FACTORY#") and sk.startswith(LATE_PREFIX):
        return {FLEET_PK: fleet_partition(FLEET_LATE, fleet_shard(pk)), FLEET_SK: f"{pk}#{sk}"}
    if (
        firing is True
        and pk.startswith("ALERT#")
        and not sk.startswith((OBSERVATION_PREFIX, CURSOR_PREFIX, INTENT_PREFIX))
    ):
        return {FLEET_PK: fleet_partition(FLEET_FIRING, fleet_shard(pk)), FLEET_SK: f"{pk}#{sk}"}
    return None


def _severity(value: str) -> str:
    if value not in SEVERITIES:
        raise ContractError(
            "invalid_severity", f"severity {value!r:.40} is not one of {SEVERITIES}"
        )
    return value


def _word(pattern: re.Pattern[str], value: str, what: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        raise ContractError(
            f"invalid_{what}", f"{what} {value!r:.80} does not match {pattern.pattern}"
        )
    return value


# ---------------------------------------------------------------------------------------------
# Orchestration

# every job in one partition: a replica loads them all with one query; sk JOB#{job_id}
JOB_REGISTRY_PK = "JOB#registry"
JOB_SK_PREFIX = "JOB#"
RUNNING_SK_PREFIX = "RUNNING#"
EXEC_PK_PREFIX = "EXEC#"
# claim-checked execution inputs (over the inline limit); see docs/orchestration.md, "Storage"
ORCHESTRATION_PREFIX = "orchestration/"
_JOB_ID = re.compile(r"[a-z][a-z0-9_-]{0,47}")
_EXECUTION_ID = re.compile(r"[A-Za-z0-9-]{8,64}")


def job_sk(job_id: str) -> str:
    """``JOB#{job_id}`` under ``JOB#registry``: one job definition (steps, params, conditions)."""
    return f"{JOB_SK_PREFIX}{_word(_JOB_ID, job_id, 'job_id')}"


# under JOB#registry too: every version a job had (VERSION#{job_id}#{n:08d}, the whole job as it
# was then), and one claim per active trigger (TRIGGER#{sha256 of its duplicate key}: the job that
# holds it), so two jobs that would fire twice for one event cannot both be registered, even at once
JOB_VERSION_SK_PREFIX = "VERSION#"
JOB_TRIGGER_SK_PREFIX = "TRIGGER#"
_DIGEST = re.compile(r"[0-9a-f]{64}")


def job_version_sk(job_id: str, version: int) -> str:
    if not isinstance(version, int) or not 0 < version < 10**8:
        raise ContractError("invalid_version", f"version {version!r} is not 1..99999999")
    return f"{JOB_VERSION_SK_PREFIX}{_word(_JOB_ID, job_id, 'job_id')}#{version:08d}"


def job_trigger_sk(digest: str) -> str:
    return f"{JOB_TRIGGER_SK_PREFIX}{_word(_DIGEST, digest, 'digest')}"


def job_pk(job_id: str) -> str:
    """``JOB#{job_id}``: the job's run slots (``RUNNING#{n}``, overlap_allowed of them)."""
    return f"{JOB_SK_PREFIX}{_word(_JOB_ID, job_id, 'job_id')}"


def running_sk(slot: int) -> str:
    if not isinstance(slot, int) or not 0 <= slot < 1000:
        raise ContractError("invalid_slot", f"slot {slot!r} is not 0..999")
    return f"{RUNNING_SK_PREFIX}{slot:03d}"


def exec_pk(job_id: str) -> str:
    """``EXEC#{job_id}``: the execution log of one job (ttl 30 days)."""
    return f"{EXEC_PK_PREFIX}{_word(_JOB_ID, job_id, 'job_id')}"


def exec_sk(started_at: datetime, execution_id: str) -> str:
    """``{started_at}#{execution_id}``: newest last; query_range reads a time span."""
    return f"{format_ts(started_at)}#{_word(_EXECUTION_ID, execution_id, 'execution_id')}"


# the executions in progress, one small item each with the lease of the replica running it: a
# replica that stops renewing it is noticed and another one resumes the execution. No '#' in the
# partition key, so no job id can make an EXEC#{job_id} partition collide with it.
EXEC_ACTIVE_PK = "EXEC-ACTIVE"


def exec_active_sk(job_id: str, started_at: datetime, execution_id: str) -> str:
    """``{job_id}#{started_at}#{execution_id}`` under ``EXEC-ACTIVE``: names the execution log
    item (``EXEC#{job_id}`` / the rest) of one execution in progress."""
    return f"{_word(_JOB_ID, job_id, 'job_id')}#{exec_sk(started_at, execution_id)}"


def parse_exec_active_sk(sk: str) -> tuple[str, str]:
    """(job id, execution log sort key) of an ``EXEC-ACTIVE`` item."""
    job_id, _, rest = sk.partition("#")
    started, _, execution_id = rest.partition("#")
    return _word(_JOB_ID, job_id, "job_id"), exec_sk(parse_ts(started), execution_id)


def orchestration_input_key(job_id: str, started_at: datetime, execution_id: str, name: str) -> str:
    """``orchestration/executions/{job_id}/yyyy=/mm=/dd=/{execution_id}/{name}.json``: a claim
    check for an execution input or step value too large to keep inline."""
    return (
        f"{ORCHESTRATION_PREFIX}executions/{_word(_JOB_ID, job_id, 'job_id')}/"
        f"{Partition.of(started_at).day_path}/{_word(_EXECUTION_ID, execution_id, 'execution_id')}/"
        f"{_word(re.compile(r'[a-z][a-z0-9_.-]{0,63}'), name, 'name')}.json"
    )


# The readers of the table's own stream (the orchestrator's TTL-expiry announcer): under
# ``STREAM#{reader}``, per stream shard, the last record handled (``CHECKPOINT#{shard}``) and the
# lease of the one replica reading that shard (``LEASE#{shard}``). Shard ids are unique across a
# table's streams, so a re-enabled stream starts its shards afresh.
STREAM_PK_PREFIX = "STREAM#"
STREAM_CHECKPOINT_PREFIX = "CHECKPOINT#"
STREAM_LEASE_PREFIX = "LEASE#"
_SHARD_ID = re.compile(r"[A-Za-z0-9_.-]{1,65}")


def stream_reader_pk(reader: str) -> str:
    """``STREAM#{reader}``: the bookkeeping of one reader of the table's stream."""
    return f"{STREAM_PK_PREFIX}{_word(re.compile(r'[a-z][a-z0-9_-]{0,47}'), reader, 'reader')}"


def stream_checkpoint_sk(shard_id: str) -> str:
    """``CHECKPOINT#{shard_id}``: the sequence number of the shard's last record handled, and
    whether the shard (a closed one) was read to its end."""
    return f"{STREAM_CHECKPOINT_PREFIX}{_word(_SHARD_ID, shard_id, 'shard_id')}"


def stream_lease_sk(shard_id: str) -> str:
    """``LEASE#{shard_id}``: the replica reading the shard, until its lease runs out."""
    return f"{STREAM_LEASE_PREFIX}{_word(_SHARD_ID, shard_id, 'shard_id')}"


def change_entity(pk: str, sk: str) -> str | None:  # noqa: PLR0911 - one return per entity
    """The entity of ``aegis.changes.{entity}`` an item's change is announced as, or None for
    items nobody announces (histories, claims, leases, execution logs, alert bookkeeping)."""
    if pk.startswith("FACTORY#"):
        if sk == LATEST_SK:
            return "factory_latest"
        if sk.startswith(LATE_PREFIX):
            return "factory_late"
        if sk.startswith(GRAPH_5M_PREFIX):
            return "graph_5m"
        return None
    if pk.startswith("ALERT#"):
        return "alert" if sk.count("#") == 2 and sk.split("#", 1)[0] in SEVERITIES else None
    if pk == CLOUD_PK:
        return "cloud_infra" if sk == LATEST_SK else None
    if pk.startswith(INCIDENT_PK_PREFIX):
        return "incident" if sk == INCIDENT_SK else None
    if pk == JOB_REGISTRY_PK and sk.startswith(JOB_SK_PREFIX):
        return "orch_job"
    return None
