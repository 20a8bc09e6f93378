"""aegis_runtime.logging: one JSON line per event, bound context, stdlib records on the same path."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import structlog

from aegis_runtime.logging import _AegisHandler, bind_message, configure


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h, _AegisHandler)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def _lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_json_line_carries_bound_context_level_and_utc_timestamp() -> None:
    out = io.StringIO()
    configure("json", "INFO", stream=out)
    with bind_message(service="processor", factory_id="f-01", message_id="m-1"):
        structlog.get_logger("aegis.test").info("raw_archived", key="raw/x.json", size=12)

    (line,) = _lines(out)
    assert line["event"] == "raw_archived"
    assert line["level"] == "info"
    assert line["logger"] == "aegis.test"
    assert (line["service"], line["factory_id"], line["message_id"]) == ("processor", "f-01", "m-1")
    assert (line["key"], line["size"]) == ("raw/x.json", 12)
    stamp = datetime.fromisoformat(line["timestamp"])
    assert stamp.utcoffset() is not None
    assert stamp.utcoffset() == UTC.utcoffset(None)
    assert line["timestamp"].endswith("Z")


def test_stdlib_records_go_through_the_same_processors() -> None:
    out = io.StringIO()
    configure("json", "INFO", stream=out)
    with bind_message(service="ingest"):
        logging.getLogger("botocore.hooks").warning(
            "retry %d of %d", 1, 3, extra={"op": "PutObject"}
        )
        logging.getLogger("nats.aio.client").debug("below the level: dropped")

    (line,) = _lines(out)
    assert line["event"] == "retry 1 of 3"
    assert line["level"] == "warning"
    assert line["logger"] == "botocore.hooks"
    assert line["op"] == "PutObject"
    assert line["service"] == "ingest"
    assert "timestamp" in line


def test_exceptions_are_rendered_into_the_json_line() -> None:
    out = io.StringIO()
    configure("json", stream=out)
    try:
        _ = int("boom")
    except ValueError:
        structlog.get_logger().exception("upload_failed")

    (line,) = _lines(out)
    assert line["level"] == "error"
    assert "ValueError: invalid literal for int()" in line["exception"]


def test_level_filters_structlog_events() -> None:
    out = io.StringIO()
    configure("json", "WARNING", stream=out)
    log = structlog.get_logger("aegis.test")
    log.info("not_shown")
    log.warning("shown")
    assert [line["event"] for line in _lines(out)] == ["shown"]


def test_configure_twice_keeps_one_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure("json", stream=first)
    configure("json", stream=second)
    ours = [h for h in logging.getLogger().handlers if isinstance(h, _AegisHandler)]
    assert len(ours) == 1

    structlog.get_logger().info("once")
    assert first.getvalue() == ""
    assert [line["event"] for line in _lines(second)] == ["once"]


def test_console_format_is_not_json() -> None:
    out = io.StringIO()
    configure("console", stream=out)
    structlog.get_logger().info("alert_sent", channel="slack")
    text = out.getvalue()
    assert "alert_sent" in text
    assert "channel" in text
    assert "slack" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_auto_is_json_when_not_a_terminal() -> None:
    out = io.StringIO()  # isatty() is False
    configure("auto", stream=out)
    structlog.get_logger().info("report_written")
    assert _lines(out)[0]["event"] == "report_written"


def test_default_stream_is_stdout_at_write_time(capsys: pytest.CaptureFixture[str]) -> None:
    configure("json")
    structlog.get_logger().info("captured")
    assert json.loads(capsys.readouterr().out)["event"] == "captured"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="log format"):
        configure("xml")
    with pytest.raises(ValueError, match="log level"):
        configure("json", "LOUD")


def test_bind_message_restores_the_context_on_exit() -> None:
    structlog.contextvars.bind_contextvars(service="processor")
    with bind_message(message_id="m-1", factory_id=None):
        assert structlog.contextvars.get_contextvars() == {
            "service": "processor",
            "message_id": "m-1",
        }
        structlog.contextvars.bind_contextvars(factory_id="f-01")  # added by a handler
        with bind_message(message_id="m-2"):
            assert structlog.contextvars.get_contextvars()["message_id"] == "m-2"
        assert structlog.contextvars.get_contextvars()["message_id"] == "m-1"
    assert structlog.contextvars.get_contextvars() == {"service": "processor"}


def test_bind_message_restores_even_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), bind_message(message_id="m-1"):
        raise RuntimeError
    assert structlog.contextvars.get_contextvars() == {}
