"""What each cloud check decides, as pure functions: facts and ``now`` in, :class:`CloudCheck` out.

The collectors (:mod:`aegis_cloud_collector.probes`) gather the facts from the broker, the queue,
storage and AWS; everything that turns a number into NORMAL/WARNING/CRITICAL lives here, so every
threshold and boundary is unit-tested without a server. "Above" a threshold means strictly above.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_contracts.errors import ContractError
from aegis_contracts.events import Heartbeat
from aegis_contracts.state import Level
from aegis_contracts.subjects import DEAD_LETTER
from aegis_contracts.times import floor_to, parse_ts
from aegis_runtime.heartbeat import freshest_by_service, is_alive
from aegis_storage.bootstrap import drift

CHECK_FAILED = "CHECK_FAILED"
# codes of a check whose subject is starting: information with a NORMAL status, never a reason
SERVICE_STARTING = "SERVICE_STARTING"
MQTT_STARTING = "MQTT_STARTING"
STARTING_CODES = frozenset({SERVICE_STARTING, MQTT_STARTING})
DETAIL_MAX = 512
GRAPH_WINDOW = timedelta(minutes=5)
GRAPH_WINDOWS_SHOWN = 12


def clip_detail(text: str) -> str:
    return text if len(text) <= DETAIL_MAX else text[: DETAIL_MAX - 1] + "…"


def _check(
    name: str,
    status: Level,
    reason: str,
    *,
    value: float | None = None,
    unit: str | None = None,
    threshold: float | None = None,
    detail: str = "",
    measures: Mapping[str, float] | None = None,
) -> CloudCheck:
    return CloudCheck(
        name=name,
        status=status,
        reason=reason,
        value=value,
        unit=unit,
        threshold=threshold,
        detail=clip_detail(detail),
        measures=dict(measures or {}),
    )


def failed_check(name: str, level: Level, error: BaseException | str) -> CloudCheck:
    """A check that raised or timed out: the tick goes on, the failure is reported."""
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    if isinstance(error, TimeoutError):
        text = "timed out"
    return _check(name, level, CHECK_FAILED, detail=f"{name}: {text}")


# -- fast (1): MQTT broker from $SYS ------------------------------------------------------------

SYS_CLIENTS = "$SYS/broker/clients/connected"
SYS_RECEIVED_1MIN = "$SYS/broker/load/messages/received/1min"
SYS_SENT_1MIN = "$SYS/broker/load/messages/sent/1min"
SYS_UPTIME = "$SYS/broker/uptime"


@dataclass(frozen=True, slots=True)
class SysState:
    """What the $SYS subscription has seen: connection, seconds since the last message (None:
    none since the subscription started), the last value of each topic, and for how long the
    subscription has been running (None: unknown)."""

    connected: bool
    silent_for_s: float | None
    values: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    running_for_s: float | None = None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text.split()[0])  # "1234 seconds" -> 1234
    except (ValueError, IndexError):
        return None


def mqtt_check(state: SysState, *, sys_interval_s: float, grace_s: float = 0.0) -> CloudCheck:
    """MQTT_UNREACHABLE (critical) when not connected, MQTT_SYS_SILENT (warning) when no $SYS
    message came for three intervals. Before the first $SYS message, within ``grace_s`` of the
    subscription's start (the collector's, or the broker's own start), MQTT_STARTING instead."""
    name = "mqtt"
    running = state.running_for_s
    if state.silent_for_s is None and running is not None and running <= grace_s:
        return _check(
            name,
            Level.NORMAL,
            MQTT_STARTING,
            value=running,
            unit="s",
            detail=f"no $SYS message yet, {running:.0f} s after the subscription started ("
            + ("connected" if state.connected else f"{state.error or 'not connected yet'}")
            + ")",
        )
    if not state.connected:
        return _check(
            name,
            Level.CRITICAL,
            "MQTT_UNREACHABLE",
            detail=f"not connected to the broker: {state.error or 'no connection yet'}",
        )
    silent_after = 3 * sys_interval_s
    age = state.silent_for_s
    if age is None or age > silent_after:
        return _check(
            name,
            Level.WARNING,
            "MQTT_SYS_SILENT",
            value=age,
            unit="s",
            threshold=silent_after,
            detail="connected, but no $SYS message "
            + ("yet" if age is None else f"for {age:.0f} s"),
        )
    measures = {
        key: number
        for key, topic in (
            ("received_1min", SYS_RECEIVED_1MIN),
            ("sent_1min", SYS_SENT_1MIN),
            ("uptime_s", SYS_UPTIME),
        )
        if (number := _number(state.values.get(topic))) is not None
    }
    return CloudCheck.ok(name, _number(state.values.get(SYS_CLIENTS)), "clients", measures=measures)


# -- fast (2): JetStream streams and consumers --------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamFacts:
    name: str
    messages: int
    bytes: int
    consumers: int


def stream_check(name: str, facts: StreamFacts | None) -> CloudCheck:
    check = f"stream:{name}"
    if facts is None:
        return _check(check, Level.CRITICAL, "STREAM_MISSING", detail=f"stream {name} not found")
    return CloudCheck.ok(
        check,
        facts.messages,
        "messages",
        measures={"bytes": facts.bytes, "consumers": facts.consumers},
    )


@dataclass(frozen=True, slots=True)
class ConsumerFacts:
    stream: str
    durable: str
    pull: bool
    push_bound: bool
    num_pending: int
    num_ack_pending: int
    num_redelivered: int
    num_waiting: int
    ack_floor: int

    @property
    def name(self) -> str:
        return consumer_check_name(self.stream, self.durable)


def _subject(text: str) -> str:
    """Anything as the subject part of a check name (``{component}:{subject}``)."""
    return re.sub(r"[^A-Za-z0-9_.@/=-]", "_", text)[:96] or "_"


def consumer_check_name(stream: str, durable: str) -> str:
    return f"consumer:{_subject(f'{stream}/{durable}')}"


def consumer_check(
    facts: ConsumerFacts,
    previous: CloudCheck | None,
    *,
    lag_warning: int,
    lag_critical: int,
) -> CloudCheck:
    """Lag (num_pending) against the thresholds, and whether anyone is consuming at all.

    A pull consumer is stopped when no pull request is waiting and its ack floor has not moved,
    now and in the previous snapshot (one sample of ``num_waiting == 0`` is the gap between two
    fetches of a live consumer); a push consumer is stopped when nothing is bound to it. Stopped
    with messages to deliver is CONSUMER_STALLED (critical), with nothing to deliver
    CONSUMER_INACTIVE (warning)."""
    measures = {
        "num_ack_pending": facts.num_ack_pending,
        "num_redelivered": facts.num_redelivered,
        "num_waiting": facts.num_waiting,
        "ack_floor": facts.ack_floor,
    }
    before = previous.measures if previous is not None else {}
    if facts.pull:
        stopped = (
            facts.num_waiting == 0
            and before.get("num_waiting") == 0
            and before.get("ack_floor") == facts.ack_floor
        )
        how = f"no pull request waiting and the ack floor stayed at {facts.ack_floor}"
    else:
        stopped = not facts.push_bound
        how = "no subscriber bound to the push consumer"
    lag = facts.num_pending
    common: dict[str, Any] = {"value": lag, "unit": "messages", "measures": measures}
    if stopped and (lag > 0 or facts.num_ack_pending > 0):
        return _check(
            facts.name,
            Level.CRITICAL,
            "CONSUMER_STALLED",
            detail=f"{facts.stream}/{facts.durable}: {how}, {lag} pending, "
            f"{facts.num_ack_pending} unacknowledged",
            **common,
        )
    if stopped:
        return _check(
            facts.name,
            Level.WARNING,
            "CONSUMER_INACTIVE",
            detail=f"{facts.stream}/{facts.durable}: {how}",
            **common,
        )
    for level, threshold in ((Level.CRITICAL, lag_critical), (Level.WARNING, lag_warning)):
        if lag > threshold:
            return _check(
                facts.name,
                level,
                "CONSUMER_LAG",
                threshold=threshold,
                detail=f"{facts.stream}/{facts.durable}: {lag} messages pending",
                **common,
            )
    return CloudCheck.ok(facts.name, lag, "messages", measures=measures)


def missing_consumer_checks(
    expected: Iterable[str], present: Iterable[tuple[str, str]]
) -> list[CloudCheck]:
    """``STREAM/durable`` entries that do not exist: CONSUMER_MISSING (critical)."""
    have = {f"{stream}/{durable}" for stream, durable in present}
    return [
        _check(
            consumer_check_name(*entry.split("/", 1)),
            Level.CRITICAL,
            "CONSUMER_MISSING",
            detail=f"expected durable consumer {entry} does not exist",
        )
        for entry in sorted(set(expected) - have)
    ]


# -- fast (3): dead letters ---------------------------------------------------------------------


def dead_letter_check_name(subject: str) -> str:
    return f"dead_letters:{_subject(subject.removeprefix(DEAD_LETTER + '.'))}"


def dead_letter_checks(
    counts: Mapping[str, int], previous: CloudSnapshot | None
) -> list[CloudCheck]:
    """Per dead-letter subject: WARNING DEAD_LETTERS when its count grew since the previous fast
    snapshot (value: how many are new). Without a previous snapshot nothing counts as new; a
    subject the previous snapshot did not have is new in full. Expiry (max age) only shrinks."""
    checks = []
    for subject, total in sorted(counts.items()):
        name = dead_letter_check_name(subject)
        before = previous.check(name) if previous is not None else None
        if previous is None:
            new = 0
        elif before is None or "total" not in before.measures:
            new = total
        else:
            new = max(0, total - int(before.measures["total"]))
        measures = {"total": total}
        if new > 0:
            checks.append(
                _check(
                    name,
                    Level.WARNING,
                    "DEAD_LETTERS",
                    value=new,
                    unit="messages",
                    threshold=0,
                    detail=f"{new} new dead letters on {subject} ({total} kept)",
                    measures=measures,
                )
            )
        else:
            checks.append(CloudCheck.ok(name, 0, "messages", measures=measures))
    return checks


# -- fast (4): service heartbeats ---------------------------------------------------------------


def _not_started(
    last: Heartbeat | None,
    now: datetime,
    watching_since: datetime | None,
    grace: timedelta,
) -> str | None:
    """Why a service without a live replica counts as starting (None: it does not): its last
    replica stopped cleanly within ``grace`` (a replacement is on its way), or it has not been
    seen since the collector started, within ``grace`` of that start."""
    if last is not None and last.stopping and now - last.at <= grace:
        return (
            f"its last replica stopped cleanly {(now - last.at).total_seconds():.0f} s ago; "
            "waiting for its replacement"
        )
    if watching_since is None or now - watching_since > grace:
        return None
    if last is None or last.at < watching_since:
        return (
            "no heartbeat yet since the collector started "
            f"{(now - watching_since).total_seconds():.0f} s ago"
        )
    return None


def _replicas_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.items() if n)


def service_checks(
    beats: Sequence[Heartbeat],
    expected: Iterable[str],
    now: datetime,
    *,
    missed: float = 3.0,
    watching_since: datetime | None = None,
    grace_s: float = 0.0,
) -> list[CloudCheck]:
    """One check per expected or seen service. No live replica: SERVICE_DOWN (critical; value =
    seconds since the last beat), except a service nobody expects whose last replica stopped
    cleanly. A live replica that is not ready: SERVICE_NOT_READY (warning). Value: live replicas.

    Starting is not down (SERVICE_STARTING, NORMAL): within ``grace_s``, a service not seen since
    the collector started (``watching_since``) or whose last replica stopped cleanly (being
    replaced), and a replica not ready since its own start. A replica that is not ready while
    a newer one runs is draining (its replacement took over): not a failure either."""
    wanted = set(expected)
    grace = timedelta(seconds=grace_s)
    grouped = freshest_by_service(list(beats))
    checks = []
    for service in sorted(wanted | set(grouped)):
        name = f"service:{_subject(service)}"
        replicas = grouped.get(service, [])
        alive = [b for b in replicas if is_alive(b, now, missed=missed)]
        if not alive:
            last = replicas[0] if replicas else None
            if last is not None and last.stopping and service not in wanted:
                checks.append(CloudCheck.ok(name, 0, "replicas", detail="stopped cleanly"))
                continue
            why = _not_started(last, now, watching_since, grace)
            if why is not None:
                checks.append(
                    _check(
                        name,
                        Level.NORMAL,
                        SERVICE_STARTING,
                        value=0,
                        unit="replicas",
                        detail=f"{service}: {why}",
                    )
                )
                continue
            age = None if last is None else (now - last.at).total_seconds()
            checks.append(
                _check(
                    name,
                    Level.CRITICAL,
                    "SERVICE_DOWN",
                    value=age,
                    unit="s",
                    detail=f"{service}: "
                    + ("no heartbeat ever" if age is None else f"last heartbeat {age:.0f} s ago")
                    + (" (stopped)" if last is not None and last.stopping else ""),
                )
            )
            continue
        ready = [b for b in alive if b.ready]
        warming = [b for b in alive if not b.ready and now - b.started_at <= grace]
        newest = max(b.started_at for b in alive)
        draining = [b for b in alive if not b.ready and b not in warming and b.started_at < newest]
        not_ready = [b for b in alive if not b.ready and b not in warming and b not in draining]
        counts = {"ready": len(ready), "starting": len(warming), "draining": len(draining)}
        measures = {k: n for k, n in counts.items() if n or k == "ready"}
        if not_ready:
            failing = sorted({c for b in not_ready for c, ok in b.checks.items() if not ok})
            checks.append(
                _check(
                    name,
                    Level.WARNING,
                    "SERVICE_NOT_READY",
                    value=len(alive),
                    unit="replicas",
                    detail=f"{service}: {len(not_ready)} of {len(alive)} replicas not ready"
                    + (f" ({', '.join(failing)} failing)" if failing else ""),
                    measures=measures,
                )
            )
        elif not ready:
            checks.append(
                _check(
                    name,
                    Level.NORMAL,
                    SERVICE_STARTING,
                    value=len(alive),
                    unit="replicas",
                    detail=f"{service}: {_replicas_text(counts)}",
                    measures=measures,
                )
            )
        else:
            detail = "" if len(ready) == len(alive) else f"{service}: {_replicas_text(counts)}"
            checks.append(
                CloudCheck.ok(name, len(alive), "replicas", detail=detail, measures=measures)
            )
    return checks


# -- fast (5): storage canary -------------------------------------------------------------------


def storage_check(
    name: str, latency_ms: float | None, error: str | None, *, slow_ms: float
) -> CloudCheck:
    check = f"storage:{name}"
    if error is not None or latency_ms is None:
        return _check(
            check, Level.CRITICAL, "STORAGE_UNREACHABLE", detail=f"{name}: {error or 'no answer'}"
        )
    if latency_ms > slow_ms:
        return _check(
            check,
            Level.WARNING,
            "STORAGE_SLOW",
            value=latency_ms,
            unit="ms",
            threshold=slow_ms,
            detail=f"{name} answered in {latency_ms:.0f} ms",
        )
    return CloudCheck.ok(check, latency_ms, "ms")


# -- fast (6): freshness ------------------------------------------------------------------------


def _stamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_ts(value)
    except ContractError:
        return None


def _factory_id(item: Mapping[str, Any]) -> str:
    return str(item.get("factory_id") or str(item.get("pk", "")).removeprefix("FACTORY#"))


def ingest_lag_s(item: Mapping[str, Any]) -> float | None:
    """Seconds from ingest receiving the last factory_state to LATEST holding it: ``updated_at``
    minus ``factory_state.meta.received_at``. Only while the pipeline is OK or DEGRADED: once a
    factory is stale the refresh rewrites LATEST and ``updated_at`` no longer dates the message."""
    state = item.get("factory_state")
    meta = state.get("meta") if isinstance(state, Mapping) else None
    received = _stamp(meta.get("received_at")) if isinstance(meta, Mapping) else None
    updated = _stamp(item.get("updated_at"))
    pipeline = item.get("pipeline_status")
    status = pipeline.get("status") if isinstance(pipeline, Mapping) else None
    if received is None or updated is None or status not in {"OK", "DEGRADED"}:
        return None
    return max(0.0, (updated - received).total_seconds())


def freshness_checks(
    items: Iterable[Mapping[str, Any]],
    now: datetime,
    *,
    ingest_lag_warning_s: float,
    stalled_after_s: float,
) -> list[CloudCheck]:
    """Per factory: the age of its last factory_state (value) and the ingest->LATEST lag (WARNING
    INGEST_LAG above the threshold). Fleet: PIPELINE_STALLED (critical) when every factory's data
    is older than ``stalled_after_s``: nothing at all is getting through."""
    checks = []
    ages: list[float | None] = []
    for item in items:
        factory = _factory_id(item)
        last = _stamp(item.get("last_factory_state_at"))
        age = None if last is None else (now - last).total_seconds()
        ages.append(age)
        lag = ingest_lag_s(item)
        name = f"freshness:{_subject(factory)}"
        measures = {} if lag is None else {"ingest_lag_s": lag}
        if lag is not None and lag > ingest_lag_warning_s:
            checks.append(
                _check(
                    name,
                    Level.WARNING,
                    "INGEST_LAG",
                    value=age,
                    unit="s",
                    threshold=ingest_lag_warning_s,
                    detail=f"{factory}: LATEST held its last state {lag:.1f} s after ingest "
                    "received it",
                    measures=measures,
                )
            )
        else:
            checks.append(CloudCheck.ok(name, age, "s", measures=measures))
    fresh = [a for a in ages if a is not None and a <= stalled_after_s]
    newest = min((a for a in ages if a is not None), default=None)
    if ages and not fresh:
        checks.append(
            _check(
                "pipeline",
                Level.CRITICAL,
                "PIPELINE_STALLED",
                value=newest,
                unit="s",
                threshold=stalled_after_s,
                detail=f"no factory has data newer than {stalled_after_s:.0f} s "
                f"({len(ages)} factories)",
            )
        )
    else:
        checks.append(
            CloudCheck.ok(
                "pipeline",
                len(fresh),
                "factories",
                detail="" if ages else "no factories in the read model yet",
            )
        )
    return checks


# -- slow (1): foundation drift -----------------------------------------------------------------

# check -> the parts of the foundation description it covers (every part is covered once)
FOUNDATION_PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "bucket_location": (("bucket", "name"), ("bucket", "region")),
    "bucket_versioning": (("bucket", "versioning"),),
    "bucket_lifecycle": (("bucket", "lifecycle"),),
    "bucket_public_access": (("bucket", "public_access_block"),),
    "table_schema": (
        ("table", "name"),
        ("table", "key_schema"),
        ("table", "attributes"),
        ("table", "billing"),
    ),
    "table_fleet_index": (("table", "indexes"),),
    "table_ttl": (("table", "ttl"),),
    "table_pitr": (("table", "pitr"),),
    "table_stream": (("table", "stream"),),
}


def foundation_checks(actual: Mapping[str, Any], expected: Mapping[str, Any]) -> list[CloudCheck]:
    """Bucket and table against the contract: any difference is FOUNDATION_DRIFT (warning) with
    the differences as detail. ``aegis bootstrap`` puts them back."""
    checks = []
    for check, parts in FOUNDATION_PARTS.items():
        found: list[str] = []
        for resource, part in parts:
            have = (actual.get(resource) or {}).get(part)
            found += drift(have, expected[resource][part], f"{resource}.{part}")
        name = f"foundation:{check}"
        if found:
            checks.append(
                _check(
                    name,
                    Level.WARNING,
                    "FOUNDATION_DRIFT",
                    value=len(found),
                    unit="differences",
                    detail="; ".join(found),
                )
            )
        else:
            checks.append(CloudCheck.ok(name))
    return checks


# -- slow (2): today's objects ------------------------------------------------------------------


def hour_closed(hour: datetime, now: datetime, *, grace: timedelta) -> bool:
    """An hour partition that can no longer change (its end plus a grace for late writes passed):
    its count is cached instead of listed again."""
    return hour + timedelta(hours=1) + grace <= now


def object_count_check(family: str, count: int, size_bytes: int, partitions: int) -> CloudCheck:
    return CloudCheck.ok(
        f"objects:{family}",
        count,
        "objects",
        measures={"bytes": size_bytes, "partitions": partitions},
    )


# -- slow (3): HISTORY/GRAPH coverage -----------------------------------------------------------


def newest_graded_window(now: datetime, window: timedelta = GRAPH_WINDOW) -> datetime:
    """The newest completed window the aggregator should have written by ``now``: completed, plus a
    grace of one window (it runs at the next window start and needs time to write)."""
    return floor_to(now, window) - 2 * window


def coverage_check(
    factory: str,
    newest_had_history: bool,
    graph_samples: Mapping[datetime, int],
    now: datetime,
    *,
    graph_expected: bool = True,
    window: timedelta = GRAPH_WINDOW,
    shown: int = GRAPH_WINDOWS_SHOWN,
) -> CloudCheck:
    """Value: how many of the last ``shown`` graded windows have a GRAPH#5M bucket
    (``graph_samples``: bucket start -> the HISTORY samples it counted). WARNING GRAPH_BEHIND
    when the newest graded window had HISTORY but has no bucket. The measure
    ``history_last_hour`` is the samples of the buckets of the last hour: read from the buckets
    (12 small items), never from HISTORY itself, which grows with every message."""
    newest = newest_graded_window(now, window)
    graded = {newest - i * window for i in range(shown)}
    present = graded & set(graph_samples)
    last_hour = sum(n for start, n in graph_samples.items() if now - timedelta(hours=1) <= start)
    measures = {"history_last_hour": last_hour}
    name = f"coverage:{_subject(factory)}"
    if graph_expected and newest_had_history and newest not in present:
        return _check(
            name,
            Level.WARNING,
            "GRAPH_BEHIND",
            value=len(present),
            unit="windows",
            detail=f"{factory}: HISTORY in the window from {newest:%H:%M} UTC but no GRAPH#5M "
            "bucket for it",
            measures=measures,
        )
    return CloudCheck.ok(name, len(present), "windows", measures=measures)


# -- slow (4): CloudWatch -----------------------------------------------------------------------


def cloudwatch_checks(
    throttled: float, system_errors: float, *, errors_critical: float
) -> list[CloudCheck]:
    """DynamoDB over the last 5 minutes: any throttled request is DYNAMODB_THROTTLED (warning);
    system errors are DYNAMODB_SYSTEM_ERRORS, warning, critical above ``errors_critical``."""
    checks = []
    if throttled > 0:
        checks.append(
            _check(
                "cloudwatch:dynamodb_throttled",
                Level.WARNING,
                "DYNAMODB_THROTTLED",
                value=throttled,
                unit="requests",
                threshold=0,
                detail=f"{throttled:.0f} throttled DynamoDB requests in 5 minutes",
            )
        )
    else:
        checks.append(CloudCheck.ok("cloudwatch:dynamodb_throttled", 0, "requests"))
    if system_errors > 0:
        level = Level.CRITICAL if system_errors > errors_critical else Level.WARNING
        checks.append(
            _check(
                "cloudwatch:dynamodb_errors",
                level,
                "DYNAMODB_SYSTEM_ERRORS",
                value=system_errors,
                unit="errors",
                threshold=errors_critical if level is Level.CRITICAL else 0,
                detail=f"{system_errors:.0f} DynamoDB system errors in 5 minutes",
            )
        )
    else:
        checks.append(CloudCheck.ok("cloudwatch:dynamodb_errors", 0, "errors"))
    return checks
