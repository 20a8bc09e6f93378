"""Secrets never reach a log line: the redaction rules one by one, then real code paths captured
through ``configure`` (a service's start-up settings dump, a stdlib logger printing a URL with a
token, an exception text)."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
import structlog
from pydantic import SecretStr

from aegis_devstack.testing.storage import Foundation
from aegis_runtime.logging import configure
from aegis_runtime.redact import REDACTED, redact, redact_text, redact_url
from aegis_runtime.service import ServiceApp
from aegis_runtime.settings import AegisSettings

SECRET = "Sup3rS3cretValue"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"mqtts://factory-a:{SECRET}@broker:8883", f"mqtts://factory-a:{REDACTED}@broker:8883"),
        (f"nats://{SECRET}@nats:4222", f"nats://{REDACTED}@nats:4222"),
        (f"redis://:{SECRET}@cache/0", f"redis://:{REDACTED}@cache/0"),
        (
            f"https://hooks.slack.com/services/T0/B0/{SECRET}",
            f"https://hooks.slack.com/services/{REDACTED}",
        ),
        (
            f"hooks.slack.com/services/T0/B0/{SECRET} failed",
            f"hooks.slack.com/services/{REDACTED} failed",
        ),
        (f"GET /api/fleet?token={SECRET} 200", f"GET /api/fleet?token={REDACTED} 200"),
        (f"/sse?x=1&access_token={SECRET}#a", f"/sse?x=1&access_token={REDACTED}#a"),
        (f"?api_key={SECRET}&page=2", f"?api_key={REDACTED}&page=2"),
        (
            f"https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA/x&X-Amz-Signature={SECRET}",
            f"https://b.s3.amazonaws.com/k?X-Amz-Credential={REDACTED}&X-Amz-Signature={REDACTED}",
        ),
        # nothing secret: left alone
        ("mqtt://127.0.0.1:1883", "mqtt://127.0.0.1:1883"),
        ("http://127.0.0.1:8080/api/fleet?window=1h", "http://127.0.0.1:8080/api/fleet?window=1h"),
        ("score=40 level=WARNING", "score=40 level=WARNING"),
        ("", ""),
    ],
)
def test_redact_text(text: str, shown: str) -> None:
    assert redact_text(text) == shown
    assert redact_url(text) == shown


def test_redact_values_by_type_and_key() -> None:
    value: dict[str, Any] = {
        "mqtt_password": SecretStr(SECRET),
        "nested": {"Authorization": f"Bearer {SECRET}", "token": SECRET, "tokens": [SECRET]},
        "slack_webhook_url": f"https://example.com/{SECRET}",
        "password_set": True,  # a flag about a secret is no secret
        "ttl": 7200,
        "items": (SecretStr(SECRET), f"mqtt://u:{SECRET}@h"),
        "factory_id": "factory-a",
    }
    out = redact(value)
    assert SECRET not in json.dumps(out, default=str)
    assert out["password_set"] is True and out["ttl"] == 7200 and out["factory_id"] == "factory-a"
    assert out["nested"]["Authorization"] == REDACTED


def _lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line.strip()]


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_the_start_up_settings_dump_shows_no_secret(fmt: str) -> None:
    """What ServiceApp logs at start (``service_started`` with ``settings``), for settings that
    carry every kind of secret."""
    settings = AegisSettings(
        mqtt_url=f"mqtts://factory-a:{SECRET}@broker:8883",
        mqtt_password=SecretStr(SECRET),
        nats_url=f"nats://{SECRET}@nats:4222",
        slack_webhook_url=SecretStr(f"https://hooks.slack.com/services/T0/B0/{SECRET}"),
        aws_endpoint_url=f"http://key:{SECRET}@127.0.0.1:4566",
    )
    out = io.StringIO()
    configure(fmt, stream=out)
    structlog.get_logger("aegis.service").info(
        "service_started", service="ingest", settings=settings.model_dump(mode="json")
    )
    # and a careless dump of the python objects, SecretStr instances included
    structlog.get_logger("aegis.service").info("settings", **settings.model_dump())
    text = out.getvalue()
    assert "service_started" in text and "broker:8883" in text and "ap-south-1" in text
    assert SECRET not in text


def test_a_stdlib_logger_printing_a_url_with_a_token_is_redacted() -> None:
    out = io.StringIO()
    configure("json", stream=out)
    # httpx, urllib3 and uvicorn log request lines like this one through the stdlib
    logging.getLogger("httpx").info(
        'HTTP Request: %s %s "%s"', "GET", f"http://dash/api/fleet?token={SECRET}", "HTTP/1.1 200"
    )
    (line,) = _lines(out)
    assert SECRET not in line
    assert f"?token={REDACTED}" in json.loads(line)["event"]


def test_exception_texts_are_redacted() -> None:
    out = io.StringIO()
    configure("json", stream=out)
    try:
        _post(f"https://hooks.slack.com/services/T0/B0/{SECRET}")
    except ConnectionError:
        structlog.get_logger().exception("alert_post_failed")
    (line,) = _lines(out)
    assert "ConnectionError: cannot reach https://hooks.slack.com/services/" in line
    assert SECRET not in line


def _post(url: str) -> None:
    raise ConnectionError(f"cannot reach {url}")


@pytest.mark.integration
async def test_a_service_start_up_logs_its_settings_without_secrets(
    nats_url: str, aws_endpoint: str, foundation: Foundation
) -> None:
    """The real ServiceApp start (health server, clients, NATS, heartbeat) and its log lines."""
    settings = AegisSettings(
        service="redaction-test",
        nats_url=nats_url,
        aws_endpoint_url=aws_endpoint,
        bucket=foundation.bucket,
        table=foundation.table,
        mqtt_url=f"mqtts://factory-a:{SECRET}@broker:8883",
        mqtt_password=SecretStr(SECRET),
        slack_webhook_url=SecretStr(f"https://hooks.slack.com/services/T0/B0/{SECRET}"),
    )
    out = io.StringIO()
    configure("json", stream=out)
    app = ServiceApp(settings)
    try:
        await app.start()
        await app.stop()
    finally:
        configure("json")
    lines = [json.loads(line) for line in _lines(out)]
    [started] = [line for line in lines if line["event"] == "service_started"]
    assert started["settings"]["bucket"] == foundation.bucket
    assert started["settings"]["mqtt_url"] == f"mqtts://factory-a:{REDACTED}@broker:8883"
    assert SECRET not in out.getvalue()
