"""The processor's pure core: normalize, risk_for, score bounds, pipeline status. Table-driven."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aegis_contracts.events import RawArchived
from aegis_contracts.ids import SourceType
from aegis_contracts.items import FactoryLatest
from aegis_contracts.keys import image_snapshot_key, raw_key
from aegis_contracts.payloads import parse_device_message
from aegis_contracts.state import (
    FactoryState,
    ImageSnapshotRef,
    InfraState,
    Level,
    PipelineState,
    Reason,
)
from aegis_contracts.times import EventTime, TimeFlag, resolve_event_time
from aegis_processor import domain
from aegis_processor.rules import RiskRules, ScoreRules, load_rules

T0 = datetime(2026, 11, 30, 10, 0, 0, tzinfo=UTC)
RULES = load_rules()
F = "factory-a"


def _event(source_type: str, mid: str = "msg-00000001", at: datetime = T0) -> RawArchived:
    return RawArchived(
        message_id=mid,
        factory_id=F,
        source_type=SourceType(source_type),
        topic=f"aegis/{F}/{source_type}",
        bucket="b",
        key=raw_key(F, source_type, at, mid),
        received_at=at,
        size_bytes=1,
        qos=1,
    )


def _normalize(source_type: str, body: dict[str, Any], at: datetime = T0) -> Any:
    payload = {
        "message_id": "msg-00000001",
        "factory_id": F,
        "device_id": "edge-1",
        "emitted_at": at.isoformat(),
        "schema_version": "1.0",
        **body,
    }
    message = parse_device_message(source_type, json.dumps(payload).encode(), topic_factory_id=F)
    event = _event(source_type, at=at)
    return domain.normalize(message, event, resolve_event_time(message.emitted_at, at))


def fs(
    sensors: dict[str, float] | None = None, detections: list[Any] | None = None, at: datetime = T0
) -> FactoryState:
    body: dict[str, Any] = {"sensors": sensors or {}}
    if detections is not None:
        body["ai"] = {"model_version": "yolo-8", "detections": detections}
    state = _normalize("factory_state", body, at)
    assert isinstance(state, FactoryState)
    return state


def infra(at: datetime = T0, **body: Any) -> InfraState:
    state = _normalize("infra_state", body, at)
    assert isinstance(state, InfraState)
    return state


def det(label: str, confidence: float, camera: str = "cam-1") -> dict[str, Any]:
    return {"label": label, "confidence": confidence, "camera_id": camera}


def codes(view: domain.LatestView, now: datetime | None = None) -> dict[str, str]:
    return {r.code: r.severity for r in domain.risk_for(view, RULES, now).reasons}


# -- normalize ---------------------------------------------------------------------------------


def test_normalize_factory_state_keeps_unknown_sensors_and_meta() -> None:
    state = fs({"temperature_c": 21.5, "pressure_kpa": 101.3}, [det("fire", 0.2)])
    assert state.sensors == {"temperature_c": 21.5, "pressure_kpa": 101.3}
    assert state.model_version == "yolo-8"
    assert state.detections[0].label == "fire"
    meta = state.meta
    assert (meta.message_id, meta.device_id, meta.schema_version) == (
        "msg-00000001",
        "edge-1",
        "1.0",
    )
    assert meta.event_time == meta.emitted_at == meta.received_at == T0
    assert meta.raw_key.startswith(f"raw/{F}/factory_state/")
    assert meta.flags == []


def test_normalize_is_deterministic() -> None:
    a = fs({"co_ppm": 3}).model_dump_json()
    b = fs({"co_ppm": 3}).model_dump_json()
    assert a == b


def test_normalize_infra_and_image() -> None:
    state = infra(
        host={"cpu_pct": 12},
        network={"loss_pct": 0},
        cameras={"cam-1": "online"},
        pipeline={"detector": "ok"},
    )
    assert state.host.cpu_pct == 12
    assert state.cameras == {"cam-1": "online"}
    assert state.pipeline == {"detector": "ok"}
    image = _normalize(
        "image_snapshot",
        {
            "camera_id": "cam-1",
            "filename": "cam-1-001.jpg",
            "content_type": "image/jpeg",
            "size_bytes": 1000,
            "captured_at": T0.isoformat(),
            "s3_key": image_snapshot_key(F, T0, "cam-1-001.jpg"),
        },
    )
    assert isinstance(image, ImageSnapshotRef)
    assert image.s3_key.startswith("image_snapshot/factory_id=factory-a/")


def test_record_meta_carries_time_flags() -> None:
    message = parse_device_message(
        "factory_state",
        json.dumps(
            {"factory_id": F, "device_id": "d", "emitted_at": T0.isoformat(), "schema_version": "1"}
        ).encode(),
        topic_factory_id=F,
    )
    et = EventTime(T0 - timedelta(hours=1), frozenset({TimeFlag.CLOCK_SKEW}), T0)
    meta = domain.record_meta(message, _event("factory_state"), et)
    assert meta.flags == [TimeFlag.CLOCK_SKEW]
    assert meta.event_time == T0 - timedelta(hours=1)
    assert meta.emitted_at == T0


# -- risk --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sensors", "expected"),
    [
        ({"temperature_c": 22}, {}),
        ({"temperature_c": 41}, {"TEMPERATURE_HIGH": "WARNING"}),
        ({"temperature_c": 55}, {"TEMPERATURE_HIGH": "CRITICAL"}),
        ({"humidity_pct": 85}, {"HUMIDITY_HIGH": "WARNING"}),
        ({"co_ppm": 50}, {"CO_HIGH": "WARNING"}),
        ({"co_ppm": 250}, {"CO_HIGH": "CRITICAL"}),
        ({"smoke_obscuration_pct": 3.5}, {"SMOKE_HIGH": "CRITICAL"}),
        ({"vibration_mm_s": 7.1}, {"VIBRATION_HIGH": "WARNING"}),
        ({"noise_db": 101}, {"NOISE_HIGH": "CRITICAL"}),
        ({"pressure_kpa": 9999, "mystery": 1e9}, {}),  # unknown sensors are not scored
    ],
)
def test_sensor_reasons(sensors: dict[str, float], expected: dict[str, str]) -> None:
    assert codes(domain.StateView(factory_state=fs(sensors))) == expected


def test_sensor_reason_fields() -> None:
    (reason,) = domain.risk_for(domain.StateView(fs({"co_ppm": 250})), RULES, None).reasons
    assert (reason.value, reason.threshold, reason.severity) == (250, 200, "CRITICAL")
    assert "co_ppm 250 ppm >= critical threshold 200 ppm" in reason.detail


@pytest.mark.parametrize(
    ("detections", "expected"),
    [
        ([det("fire", 0.9)], {"FIRE_DETECTED": "CRITICAL"}),
        ([det("fire", 0.5)], {}),  # below min_confidence
        ([det("smoke", 0.61)], {"SMOKE_DETECTED": "CRITICAL"}),
        ([det("person_fall", 0.8)], {"PERSON_FALL_DETECTED": "CRITICAL"}),
        ([det("no_helmet", 0.75)], {"NO_HELMET_DETECTED": "WARNING"}),
        ([det("intrusion", 0.95)], {"INTRUSION_DETECTED": "WARNING"}),
        ([det("forklift", 0.99)], {}),  # a label without a rule
    ],
)
def test_ai_reasons(detections: list[Any], expected: dict[str, str]) -> None:
    assert codes(domain.StateView(factory_state=fs(detections=detections))) == expected


def test_ai_one_reason_per_label_with_the_best_detection() -> None:
    state = fs(detections=[det("fire", 0.7, "cam-1"), det("fire", 0.95, "cam-2")])
    (reason,) = domain.risk_for(domain.StateView(state), RULES, None).reasons
    assert (reason.value, reason.source, reason.threshold) == (0.95, "cam-2", 0.6)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"host": {"cpu_pct": 50, "mem_pct": 50, "disk_pct": 50}}, {}),
        ({"host": {"cpu_pct": 90}}, {"EDGE_CPU_HIGH": "WARNING"}),
        ({"host": {"mem_pct": 97}}, {"EDGE_MEM_HIGH": "CRITICAL"}),
        ({"host": {"disk_pct": 96}}, {"EDGE_DISK_HIGH": "CRITICAL"}),
        ({"network": {"loss_pct": 5}}, {"PACKET_LOSS_HIGH": "WARNING"}),
        ({"cameras": {"cam-1": "offline", "cam-2": "online"}}, {"CAMERA_OFFLINE": "WARNING"}),
        ({"pipeline": {"detector": "down"}}, {"PIPELINE_STAGE_DOWN": "CRITICAL"}),
        ({"pipeline": {"uploader": "degraded"}}, {"PIPELINE_STAGE_DEGRADED": "WARNING"}),
    ],
)
def test_infra_reasons(body: dict[str, Any], expected: dict[str, str]) -> None:
    assert codes(domain.StateView(infra_state=infra(**body))) == expected


def test_camera_offline_is_one_reason_counting_cameras() -> None:
    state = infra(cameras={"cam-2": "offline", "cam-1": "offline"})
    (reason,) = domain.risk_for(domain.StateView(infra_state=state), RULES, None).reasons
    assert reason.value == 2
    assert "cam-1, cam-2" in reason.detail


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        (0, {}),
        (60, {}),
        (61, {"STALE_DATA": "WARNING"}),
        (300, {"STALE_DATA": "WARNING"}),
        (301, {"FACTORY_OFFLINE": "CRITICAL"}),
    ],
)
def test_staleness(age_s: float, expected: dict[str, str]) -> None:
    view = domain.StateView(factory_state=fs({"temperature_c": 20}))
    assert codes(view, T0 + timedelta(seconds=age_s)) == expected


def test_staleness_needs_now_and_a_factory_state() -> None:
    assert codes(domain.StateView(factory_state=fs()), None) == {}
    assert codes(domain.StateView(infra_state=infra()), T0 + timedelta(hours=1)) == {}


def test_combined_risk_orders_worst_first_and_names_rules_version() -> None:
    view = domain.StateView(
        factory_state=fs({"noise_db": 90, "co_ppm": 300}, [det("fire", 0.9)]),
        infra_state=infra(host={"cpu_pct": 90}),
    )
    risk = domain.risk_for(view, RULES, T0)
    assert risk.level is Level.CRITICAL
    assert [r.severity for r in risk.reasons] == ["CRITICAL", "CRITICAL", "WARNING", "WARNING"]
    assert [r.code for r in risk.reasons][:2] == ["CO_HIGH", "FIRE_DETECTED"]
    assert risk.rules_version == RULES.version


def _reasons(*severities: str) -> list[Reason]:
    return [Reason(code=f"R{i}", severity=s, detail="x") for i, s in enumerate(severities)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("severities", "score", "level"),
    [
        ((), 0.0, Level.NORMAL),
        (("WARNING",), 40.0, Level.WARNING),
        (("WARNING", "WARNING"), 54.5, Level.WARNING),
        (("CRITICAL",), 70.0, Level.CRITICAL),
        (("CRITICAL", "CRITICAL"), 85.0, Level.CRITICAL),
        (("CRITICAL", "WARNING"), 78.8, Level.CRITICAL),
    ],
)
def test_score_formula(severities: tuple[str, ...], score: float, level: Level) -> None:
    assert domain.score_for(_reasons(*severities), RULES.score) == (score, level)


@given(st.lists(st.sampled_from(["WARNING", "CRITICAL"]), max_size=200))
def test_score_stays_in_its_level_band(severities: list[str]) -> None:
    rules = ScoreRules()
    score, level = domain.score_for(_reasons(*severities), rules)
    assert 0 <= score <= 100
    if level is Level.CRITICAL:
        assert rules.critical_base <= score <= rules.critical_cap
    elif level is Level.WARNING:
        assert rules.warning_base <= score <= rules.warning_cap
    else:
        assert score == 0


def test_message_risk_ignores_staleness_and_infra() -> None:
    risk = domain.message_risk(fs({"co_ppm": 50}, at=T0 - timedelta(days=3)), RULES)
    assert [r.code for r in risk.reasons] == ["CO_HIGH"]


# -- pipeline status ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fs_age", "infra_body", "infra_age", "status"),
    [
        (None, None, None, PipelineState.NO_DATA),
        (5, None, None, PipelineState.OK),
        (5, {"pipeline": {"detector": "ok"}}, 5, PipelineState.OK),
        (5, {"pipeline": {"detector": "degraded"}}, 5, PipelineState.DEGRADED),
        (5, {"pipeline": {"detector": "down"}}, 5, PipelineState.DEGRADED),
        (5, {"cameras": {"cam-1": "offline"}}, 5, PipelineState.DEGRADED),
        (61, {"pipeline": {"detector": "down"}}, 5, PipelineState.STALE),
        (301, None, None, PipelineState.OFFLINE),
        (None, {}, 30, PipelineState.OK),
        (None, {}, 90, PipelineState.STALE),
        (None, {}, 900, PipelineState.OFFLINE),
    ],
)
def test_pipeline_status(
    fs_age: float | None,
    infra_body: dict[str, Any] | None,
    infra_age: float | None,
    status: PipelineState,
) -> None:
    now = T0 + timedelta(hours=1)
    view = domain.StateView(
        factory_state=fs(at=now - timedelta(seconds=fs_age)) if fs_age is not None else None,
        infra_state=infra(now - timedelta(seconds=infra_age or 0), **infra_body)
        if infra_body is not None
        else None,
    )
    ps = domain.pipeline_status_for(view, now, RULES)
    assert ps.status is status
    assert ps.checked_at == now
    assert ps.factory_state_age_s == fs_age
    assert ps.infra_state_age_s == (infra_age if infra_body is not None else None)
    assert ps.stages == (infra_body or {}).get("pipeline", {})


def test_short_thresholds_from_settings() -> None:
    rules: RiskRules = RULES.with_staleness(2, 5)
    view = domain.StateView(factory_state=fs())
    assert (
        domain.pipeline_status_for(view, T0 + timedelta(seconds=3), rules).status
        is PipelineState.STALE
    )
    assert {r.code for r in domain.risk_for(view, rules, T0 + timedelta(seconds=6)).reasons} == {
        "FACTORY_OFFLINE"
    }


def test_same_assessment_ignores_ages_but_not_news() -> None:
    latest = FactoryLatest(pk=f"FACTORY#{F}", factory_id=F, factory_state=fs({"co_ppm": 1}))
    first = domain.derive(latest, RULES, T0 + timedelta(seconds=1))
    later = domain.derive(latest, RULES, T0 + timedelta(seconds=30))
    stale1 = domain.derive(latest, RULES, T0 + timedelta(seconds=70))
    stale2 = domain.derive(latest, RULES, T0 + timedelta(seconds=90))
    assert domain.same_assessment(first.risk, first.pipeline_status, later, RULES)
    assert domain.same_assessment(stale1.risk, stale1.pipeline_status, stale2, RULES)
    assert not domain.same_assessment(first.risk, first.pipeline_status, stale1, RULES)
    assert not domain.same_assessment(None, None, first, RULES)
