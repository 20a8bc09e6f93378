"""aegis_runtime.envcheck: the AEGIS_* variables no component reads, and deprecated names in use."""

from __future__ import annotations

import pytest
import structlog

from aegis_runtime.envcheck import check_environment, closest, report_environment
from aegis_runtime.settings import AegisSettings
from aegis_runtime.settings_names import DEPRECATED, KNOWN


def test_misspelt_names_are_unknown_with_the_name_they_most_likely_mean() -> None:
    report = check_environment(
        {
            "AEGIS_BUKCET": "b",
            "AEGIS_LOG_LEVL": "DEBUG",
            "AEGIS_PROCESOR_BATCH_SIZE": "4",
            "AEGIS_SOMETHING_ELSE_ENTIRELY": "1",
        }
    )
    assert report.unknown == {
        "AEGIS_BUKCET": "AEGIS_BUCKET",
        "AEGIS_LOG_LEVL": "AEGIS_LOG_LEVEL",
        "AEGIS_PROCESOR_BATCH_SIZE": "AEGIS_PROCESSOR_BATCH_SIZE",
        "AEGIS_SOMETHING_ELSE_ENTIRELY": None,
    }
    assert report.deprecated == {}


def test_any_components_settings_are_known_not_only_this_processes() -> None:
    # a shared settings file: the dashboard's port in the processor's environment is fine
    env = {
        "AEGIS_BUCKET": "b",
        "AEGIS_DASHBOARD_PORT": "8080",
        "AEGIS_PROCESSOR_ACK_WAIT_S": "30",
        "AEGIS_SEAL_GRACE_HOURS": "2",
        "AEGIS_BROKER_ACL_FILE": "/etc/acl",  # an option's variable, not a setting
        "AEGIS_JOB_MAINTENANCE_URL": "https://hooks.example.com/x",  # a job's own
        "AEGIS_TEST_NATS_URL": "nats://127.0.0.1:4222",
        "aegis_region": "eu-west-1",  # read case-insensitively, as pydantic-settings reads it
        "PATH": "/usr/bin",
        "AWS_REGION": "eu-west-1",
    }
    report = check_environment(env)
    assert report.unknown == {}
    assert report.deprecated == {}


def test_deprecated_names_name_their_replacement_and_whether_it_wins() -> None:
    report = check_environment(
        {
            "AEGIS_MQTT_SESSION_EXPIRY_SECONDS": "60",
            "AEGIS_ALERT_STATE_TTL_SECONDS": "60",
            "AEGIS_ALERT_STATE_TTL_S": "120",  # the new name is set too: it wins
            "AEGIS_ACK_WAIT_S": "5",  # one name that three services read: three replacements
        }
    )
    assert report.unknown == {}
    assert report.deprecated == {
        "AEGIS_ACK_WAIT_S": {
            "AEGIS_ALERT_ACK_WAIT_S": "alert-dispatcher",
            "AEGIS_ORCHESTRATOR_ACK_WAIT_S": "orchestrator",
            "AEGIS_PROCESSOR_ACK_WAIT_S": "processor",
        },
        "AEGIS_ALERT_STATE_TTL_SECONDS": {"AEGIS_ALERT_STATE_TTL_S": "every component"},
        "AEGIS_MQTT_SESSION_EXPIRY_SECONDS": {"AEGIS_MQTT_SESSION_EXPIRY_S": "ingest"},
    }
    assert report.overridden == {"AEGIS_ALERT_STATE_TTL_SECONDS"}


def test_closest_suggests_only_near_matches() -> None:
    assert closest("AEGIS_NATS_URLS") == "AEGIS_NATS_URL"
    assert closest("AEGIS_HEALTH_PROT") == "AEGIS_HEALTH_PORT"
    assert closest("AEGIS_FOO") is None


def test_the_report_is_one_warning_for_unknown_names_and_one_per_deprecated_name() -> None:
    env = {
        "AEGIS_BUKCET": "b",
        "AEGIS_NOPE": "1",
        "AEGIS_MQTT_KEEPALIVE_SECONDS": "20",
        "AEGIS_MAX_DELIVER": "3",
        "AEGIS_SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/secret",
    }
    with structlog.testing.capture_logs() as logs:
        report_environment(env)
    by_event: dict[str, list[dict[str, object]]] = {}
    for entry in logs:
        by_event.setdefault(str(entry["event"]), []).append(entry)
    assert set(by_event) == {"unknown_settings", "deprecated_setting"}
    (unknown,) = by_event["unknown_settings"]
    assert unknown["log_level"] == "warning"
    assert unknown["names"] == ["AEGIS_BUKCET", "AEGIS_NOPE"]
    assert unknown["closest"] == {"AEGIS_BUKCET": "AEGIS_BUCKET"}
    deprecated = {str(e["variable"]): e for e in by_event["deprecated_setting"]}
    assert deprecated["AEGIS_MQTT_KEEPALIVE_SECONDS"]["replacement"] == "AEGIS_MQTT_KEEPALIVE_S"
    assert deprecated["AEGIS_MAX_DELIVER"]["replacements"] == {
        "AEGIS_ALERT_MAX_DELIVER": "alert-dispatcher",
        "AEGIS_ORCHESTRATOR_MAX_DELIVER": "orchestrator",
        "AEGIS_PROCESSOR_MAX_DELIVER": "processor",
    }
    assert "secret" not in repr(logs)  # names only, never values


def test_a_clean_environment_logs_nothing() -> None:
    with structlog.testing.capture_logs() as logs:
        report_environment({"AEGIS_BUCKET": "b", "HOME": "/root"})
    assert logs == []


def test_every_shared_setting_is_known_and_no_deprecated_name_is() -> None:
    # the generated list agrees with the settings this package defines (the full check, every
    # component's, is tests/integration/test_configref.py)
    shared = {f"AEGIS_{name.upper()}" for name in AegisSettings.model_fields}
    assert shared <= KNOWN
    assert not set(DEPRECATED) & KNOWN


def test_a_deprecated_alias_still_sets_the_setting_and_the_new_name_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AEGIS_ALERT_STATE_TTL_SECONDS", "60")
    assert AegisSettings().alert_state_ttl_s == 60
    monkeypatch.setenv("AEGIS_ALERT_STATE_TTL_S", "120")
    assert AegisSettings().alert_state_ttl_s == 120
    assert AegisSettings(alert_state_ttl_s=30).alert_state_ttl_s == 30  # by name, in code
