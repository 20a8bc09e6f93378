"""Loading and validating the risk rules file."""

from __future__ import annotations

from pathlib import Path

import pytest

from aegis_contracts.payloads import KNOWN_SENSORS
from aegis_processor.rules import RulesError, Threshold, load_rules, parse_rules


def test_packaged_rules_cover_the_contract() -> None:
    rules = load_rules()
    assert set(rules.sensors) == set(KNOWN_SENSORS)
    assert {k: v.severity for k, v in rules.ai.items()} == {
        "fire": "CRITICAL",
        "smoke": "CRITICAL",
        "person_fall": "CRITICAL",
        "no_helmet": "WARNING",
        "intrusion": "WARNING",
    }
    assert set(rules.infra.host) >= {"cpu_pct", "mem_pct", "disk_pct"}
    assert "loss_pct" in rules.infra.network
    assert rules.infra.camera_offline.code == "CAMERA_OFFLINE"
    assert rules.infra.stage_down.severity == "CRITICAL"
    assert rules.infra.stage_degraded.severity == "WARNING"
    st = rules.staleness
    assert (st.stale_code, st.stale_severity, st.stale_after_s) == ("STALE_DATA", "WARNING", 60)
    assert (st.offline_code, st.offline_severity, st.offline_after_s) == (
        "FACTORY_OFFLINE",
        "CRITICAL",
        300,
    )
    for rule in rules.sensors.values():
        assert rule.warning is not None and rule.critical is not None
        assert rule.warning < rule.critical


def test_load_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('version = "x"\n[sensors.co_ppm]\ncode = "CO_HIGH"\ncritical = 100\n')
    rules = load_rules(path)
    assert rules.version == "x"
    assert rules.sensors["co_ppm"].warning is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version = ", "not TOML"),
        ("[sensors.co_ppm]\ncode='CO_HIGH'\nwarning=1", "version"),
        ('version="1"\n[sensors.co_ppm]\ncode="CO_HIGH"', "set warning, critical or both"),
        ('version="1"\n[sensors.co_ppm]\ncode="CO_HIGH"\nwarning=9\ncritical=1', "exceed"),
        ('version="1"\n[sensors.co_ppm]\ncode="co"\nwarning=1', "code"),
        ('version="1"\n[ai.fire]\ncode="FIRE"\nseverity="INFO"\nmin_confidence=0.5', "severity"),
        ('version="1"\n[ai.fire]\ncode="FIRE"\nseverity="CRITICAL"\nmin_confidence=2', "ai.fire"),
        ('version="1"\n[staleness]\nstale_after_s=300\noffline_after_s=60', "offline_after_s"),
        ('version="1"\n[infra.host.gpu_pct]\ncode="GPU"\nwarning=1', "gpu_pct"),
        ('version="1"\nsurprise=1', "surprise"),
        ('version="1"\n[score]\nwarning_cap=80\ncritical_base=70', "warning_cap < critical_base"),
    ],
)
def test_invalid_rules_are_refused_with_the_field(text: str, fragment: str) -> None:
    with pytest.raises(RulesError, match=fragment):
        parse_rules(text)


def test_missing_file_is_a_rules_error(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "absent.toml")


def test_settings_override_staleness() -> None:
    rules = load_rules().with_staleness(2, 5)
    assert (rules.staleness.stale_after_s, rules.staleness.offline_after_s) == (2, 5)
    assert load_rules().with_staleness(None, None).staleness.stale_after_s == 60
    with pytest.raises(ValueError, match="offline_after_s"):
        load_rules().with_staleness(10, 5)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(10, None), (40, ("WARNING", 40.0)), (54.9, ("WARNING", 40.0)), (55, ("CRITICAL", 55.0))],
)
def test_threshold_above(value: float, expected: tuple[str, float] | None) -> None:
    assert Threshold(code="T", warning=40, critical=55).severity_of(value) == expected


def test_threshold_below() -> None:
    rule = Threshold(code="LOW", warning=20, critical=10, direction="below")
    assert rule.severity_of(25) is None
    assert rule.severity_of(15) == ("WARNING", 20)
    assert rule.severity_of(10) == ("CRITICAL", 10)
