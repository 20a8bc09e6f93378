"""The processor's functional core: normalize a device message, assess risk, judge freshness.

Pure and synchronous: no storage, no broker, no clock (``now`` is always a parameter).

Risk score (:func:`score_for`), documented here because dashboards and alerts show it:

* no reason: score 0, level NORMAL;
* otherwise the level is the worst reason's severity, and the score lies in that level's band
  (defaults: WARNING 40-69, CRITICAL 70-100, from ``[score]`` in the rules file):
  ``score = base + (cap - base) * (1 - 0.5 ** (n - 1))`` where
  ``n = (reasons at the level) + 0.5 * (reasons below it)``;
  one reason gives the base, each further reason fills half of the remaining band, so the score
  grows with the number of problems but never leaves its level's band and never exceeds 100.
  Rounded to one decimal.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.keys import Dataset
from aegis_contracts.payloads import (
    DeviceMessage,
    FactoryStateMessage,
    ImageSnapshotMessage,
    InfraStateMessage,
)
from aegis_contracts.state import (
    FactoryState,
    ImageSnapshotRef,
    InfraState,
    Level,
    PipelineState,
    PipelineStatus,
    Reason,
    RecordMeta,
    Risk,
)
from aegis_contracts.times import EventTime
from aegis_processor.rules import Flag, RiskRules, ScoreRules, Threshold

# source type -> the FACTORY LATEST field group it updates, and its processed/ dataset
LATEST_GROUP: dict[SourceType, str] = {
    SourceType.FACTORY_STATE: "factory_state",
    SourceType.INFRA_STATE: "infra_state",
    SourceType.IMAGE_SNAPSHOT: "latest_image_snapshot",
}
DATASET: dict[SourceType, Dataset] = {
    SourceType.FACTORY_STATE: Dataset.FACTORY_STATE,
    SourceType.INFRA_STATE: Dataset.INFRA_STATE,
    SourceType.IMAGE_SNAPSHOT: Dataset.IMAGE_SNAPSHOT,
}

Normalized = FactoryState | InfraState | ImageSnapshotRef


class LatestView(Protocol):
    """What risk and freshness read from FACTORY LATEST (``FactoryLatest`` satisfies it)."""

    @property
    def factory_state(self) -> FactoryState | None: ...

    @property
    def infra_state(self) -> InfraState | None: ...


@dataclass(frozen=True, slots=True)
class StateView:
    """A view of one message's state alone: the risk_score of a single factory_state."""

    factory_state: FactoryState | None = None
    infra_state: InfraState | None = None


# -- normalization ---------------------------------------------------------------------------


def record_meta(message: DeviceMessage, event: RawArchived, event_time: EventTime) -> RecordMeta:
    return RecordMeta(
        message_id=event.message_id,  # the effective id (ingest derives one when missing)
        device_id=message.device_id,
        emitted_at=message.emitted_at,
        event_time=event_time.at,
        received_at=event.received_at,
        raw_key=event.key,
        schema_version=message.schema_version,
        flags=sorted(event_time.flags),
    )


def normalize(message: DeviceMessage, event: RawArchived, event_time: EventTime) -> Normalized:
    """The processed/ record of a validated device message (deterministic: no processing time)."""
    meta = record_meta(message, event, event_time)
    if isinstance(message, FactoryStateMessage):
        ai = message.ai
        return FactoryState(
            meta=meta,
            sensors=dict(message.sensors),
            model_version=ai.model_version if ai else None,
            detections=list(ai.detections) if ai else [],
        )
    if isinstance(message, InfraStateMessage):
        return InfraState(
            meta=meta,
            host=message.host,
            network=message.network,
            cameras=dict(message.cameras),
            pipeline=dict(message.pipeline),
        )
    if isinstance(message, ImageSnapshotMessage):
        return ImageSnapshotRef(
            meta=meta,
            camera_id=message.camera_id,
            filename=message.filename,
            content_type=message.content_type,
            size_bytes=message.size_bytes,
            captured_at=message.captured_at,
            s3_key=message.s3_key,
        )
    raise TypeError(f"not a device message: {type(message).__name__}")  # pragma: no cover


# -- risk ------------------------------------------------------------------------------------


def _threshold_reason(
    name: str, value: float | None, rule: Threshold, source: str | None = None
) -> Reason | None:
    if value is None:
        return None
    hit = rule.severity_of(value)
    if hit is None:
        return None
    severity, threshold = hit
    op = ">=" if rule.direction == "above" else "<="
    unit = f" {rule.unit}" if rule.unit else ""
    return Reason(
        code=rule.code,
        severity=severity,
        detail=f"{name} {value:g}{unit} {op} {severity.lower()} threshold {threshold:g}{unit}",
        value=value,
        threshold=threshold,
        source=source,
    )


def sensor_reasons(state: FactoryState, rules: RiskRules) -> list[Reason]:
    """Known sensors against their thresholds; unknown sensor names are not scored."""
    reasons = []
    for name, rule in rules.sensors.items():
        # the sensor's name as the source: alerts and reports read it from there
        reason = _threshold_reason(name, state.sensors.get(name), rule, f"sensors.{name}")
        if reason is not None:
            reasons.append(reason)
    return reasons


def ai_reasons(state: FactoryState, rules: RiskRules) -> list[Reason]:
    """One reason per configured label: its most confident detection at or above min_confidence."""
    best: dict[str, tuple[float, str]] = {}
    for det in state.detections:
        rule = rules.ai.get(det.label)
        if rule is None or det.confidence < rule.min_confidence:
            continue
        if det.label not in best or det.confidence > best[det.label][0]:
            best[det.label] = (det.confidence, det.camera_id)
    reasons = []
    for label, (confidence, camera) in best.items():
        rule = rules.ai[label]
        reasons.append(
            Reason(
                code=rule.code,
                severity=rule.severity,
                detail=f"{label} detected by {camera} (confidence {confidence:.2f})",
                value=confidence,
                threshold=rule.min_confidence,
                source=camera[:64],
            )
        )
    return reasons


def _flag_reason(flag: Flag, what: str, names: list[str]) -> Reason | None:
    if not names:
        return None
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    return Reason(
        code=flag.code,
        severity=flag.severity,
        detail=f"{len(names)} {what}: {shown}"[:512],
        value=float(len(names)),
        threshold=1.0,
    )


def infra_reasons(state: InfraState, rules: RiskRules) -> list[Reason]:
    infra = rules.infra
    reasons: list[Reason | None] = []
    host: dict[str, Any] = state.host.model_dump()
    network: dict[str, Any] = state.network.model_dump()
    reasons += [_threshold_reason(n, host.get(n), r, "edge") for n, r in infra.host.items()]
    reasons += [_threshold_reason(n, network.get(n), r, "edge") for n, r in infra.network.items()]
    offline = sorted(c for c, s in state.cameras.items() if s == "offline")
    down = sorted(s for s, v in state.pipeline.items() if v == "down")
    degraded = sorted(s for s, v in state.pipeline.items() if v == "degraded")
    reasons.append(_flag_reason(infra.camera_offline, "camera(s) offline", offline))
    reasons.append(_flag_reason(infra.stage_down, "pipeline stage(s) down", down))
    reasons.append(_flag_reason(infra.stage_degraded, "pipeline stage(s) degraded", degraded))
    return [r for r in reasons if r is not None]


def age_s(event_time: datetime | None, now: datetime) -> float | None:
    """Seconds since ``event_time`` (never negative: tolerated skew is not 'from the future')."""
    if event_time is None:
        return None
    return max(0.0, round((now - event_time).total_seconds(), 3))


def staleness_reason(view: LatestView, rules: RiskRules, now: datetime) -> Reason | None:
    """STALE_DATA / FACTORY_OFFLINE when factory_state is older than the thresholds."""
    fs = view.factory_state
    age = age_s(fs.meta.event_time if fs else None, now)
    if age is None:
        return None
    st = rules.staleness
    if age > st.offline_after_s:
        code, severity, threshold = st.offline_code, st.offline_severity, st.offline_after_s
        detail = f"no factory_state for {age:.0f} s (offline after {threshold:g} s)"
    elif age > st.stale_after_s:
        code, severity, threshold = st.stale_code, st.stale_severity, st.stale_after_s
        detail = f"factory_state is {age:.0f} s old (stale after {threshold:g} s)"
    else:
        return None
    return Reason(
        code=code, severity=severity, detail=detail, value=age, threshold=threshold, source="data"
    )


def score_for(reasons: Iterable[Reason], rules: ScoreRules) -> tuple[float, Level]:
    """Score and level of a set of reasons (the formula is in the module docstring)."""
    levels = [Level(r.severity) for r in reasons]
    if not levels:
        return 0.0, Level.NORMAL
    level = Level.worst(*levels)
    at_level = sum(1 for lv in levels if lv is level)
    below = len(levels) - at_level
    n = at_level + 0.5 * below
    base, cap = (
        (rules.critical_base, rules.critical_cap)
        if level is Level.CRITICAL
        else (rules.warning_base, rules.warning_cap)
    )
    score = base + (cap - base) * (1 - 0.5 ** (n - 1))
    return min(100.0, round(score, 1)), level


def _reason_order(reason: Reason) -> tuple[int, str, str]:
    return (-Level(reason.severity).rank, reason.code, reason.source or "")


def risk_for(view: LatestView, rules: RiskRules, now: datetime | None) -> Risk:
    """The risk of a factory's state: sensors and AI of factory_state, infra health, and (when
    ``now`` is given) the staleness of factory_state. Reasons are sorted worst first."""
    reasons: list[Reason] = []
    if view.factory_state is not None:
        reasons += sensor_reasons(view.factory_state, rules)
        reasons += ai_reasons(view.factory_state, rules)
    if view.infra_state is not None:
        reasons += infra_reasons(view.infra_state, rules)
    if now is not None and (stale := staleness_reason(view, rules, now)) is not None:
        reasons.append(stale)
    reasons.sort(key=_reason_order)
    score, level = score_for(reasons, rules.score)
    return Risk(score=score, level=level, reasons=reasons, rules_version=rules.version)


def message_risk(state: FactoryState, rules: RiskRules) -> Risk:
    """The risk of one factory_state message on its own (the processed/risk_score/ record):
    deterministic, so a redelivery rewrites the same bytes."""
    return risk_for(StateView(factory_state=state), rules, None)


# -- freshness -------------------------------------------------------------------------------


def pipeline_status_for(view: LatestView, now: datetime, rules: RiskRules) -> PipelineStatus:
    """NO_DATA before any state; OFFLINE / STALE by the age of factory_state (of infra_state when
    no factory_state ever came); DEGRADED when a pipeline stage is not ok or a camera is offline;
    else OK."""
    fs, infra = view.factory_state, view.infra_state
    fs_age = age_s(fs.meta.event_time if fs else None, now)
    infra_age = age_s(infra.meta.event_time if infra else None, now)
    stages = dict(sorted(infra.pipeline.items())) if infra else {}
    age = fs_age if fs_age is not None else infra_age
    st = rules.staleness
    if age is None:
        status = PipelineState.NO_DATA
    elif age > st.offline_after_s:
        status = PipelineState.OFFLINE
    elif age > st.stale_after_s:
        status = PipelineState.STALE
    elif infra is not None and (
        any(v != "ok" for v in infra.pipeline.values())
        or any(v == "offline" for v in infra.cameras.values())
    ):
        status = PipelineState.DEGRADED
    else:
        status = PipelineState.OK
    return PipelineStatus(
        status=status,
        checked_at=now,
        factory_state_age_s=fs_age,
        infra_state_age_s=infra_age,
        stages=stages,
    )


@dataclass(frozen=True, slots=True)
class Derived:
    """The fields of LATEST that derive from its groups and the clock."""

    risk: Risk
    pipeline_status: PipelineStatus


def derive(view: LatestView, rules: RiskRules, now: datetime) -> Derived:
    return Derived(risk_for(view, rules, now), pipeline_status_for(view, now, rules))


def _signature(derived: Derived, rules: RiskRules) -> tuple[Any, ...]:
    # what makes two assessments different news: everything but ages and the check time
    time_codes = rules.staleness.codes
    risk = derived.risk
    reasons = tuple(
        (r.code, r.severity, r.source, r.threshold, None if r.code in time_codes else r.value)
        for r in risk.reasons
    )
    ps = derived.pipeline_status
    return (
        risk.level,
        risk.score,
        reasons,
        risk.rules_version,
        ps.status,
        tuple(ps.stages.items()),
    )


def same_assessment(
    stored_risk: Risk | None,
    stored_status: PipelineStatus | None,
    fresh: Derived,
    rules: RiskRules,
) -> bool:
    """True when LATEST already says what ``fresh`` says (ages and check times aside), so the
    write can be skipped."""
    if stored_risk is None or stored_status is None:
        return False
    return _signature(Derived(stored_risk, stored_status), rules) == _signature(fresh, rules)
