"""What an ``aegis`` command logs goes to stderr, through the services' processor chain: secrets
redacted, stdout left to the result."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from aegis_cli.app import configure_logging
from aegis_cli.exitcodes import USAGE


def test_command_logs_go_to_stderr_with_secrets_redacted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AEGIS_LOG_FORMAT", "json")
    monkeypatch.setenv("AEGIS_LOG_LEVEL", "INFO")
    configure_logging()
    structlog.get_logger("aegis.test").warning(
        "probe", url="nats://operator:pw-123@nats:4222", token="tok-456"
    )
    logging.getLogger("botocore.test").warning("GET https://s3/k?X-Amz-Signature=sig-789 failed")
    out, err = capsys.readouterr()
    assert out == ""
    lines = [json.loads(line) for line in err.splitlines()]
    assert lines[0]["event"] == "probe" and len(lines) == 2
    assert lines[0]["url"] == "nats://operator:**********@nats:4222"
    for secret in ("pw-123", "tok-456", "sig-789"):
        assert secret not in err


def test_a_bad_setting_is_a_usage_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import typer  # noqa: PLC0415

    monkeypatch.setenv("AEGIS_LOG_FORMAT", "yaml")
    with pytest.raises(typer.Exit) as exited:
        configure_logging()
    assert exited.value.exit_code == USAGE
    assert "invalid settings" in capsys.readouterr().err
