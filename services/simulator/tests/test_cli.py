"""The shell's pure parts and the command's errors (no broker needed)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import structlog.testing
from rich.console import Console
from typer.testing import CliRunner

from aegis_cli.app import app
from aegis_devstack.localservers import free_port
from aegis_simulator.app import DEFAULT_SCENARIOS, SimulatorSettings
from aegis_simulator.cli import summary_table
from aegis_simulator.domain import ScenarioKind
from aegis_simulator.runner import (
    BrokerUnreachable,
    MqttTarget,
    RateLimiter,
    RunOptions,
    Stats,
    run,
)
from aegis_storage.clients import AwsConfig

runner = CliRunner()


def test_mqtt_target_parse() -> None:
    t = MqttTarget.parse("mqtt://user:p%40ss@broker.local:1884")
    assert (t.host, t.port, t.username, t.password) == ("broker.local", 1884, "user", "p@ss")
    assert MqttTarget.parse("mqtt://127.0.0.1").port == 1883
    with pytest.raises(ValueError, match="mqtt://"):
        MqttTarget.parse("http://x")
    # the URL kept for display never holds the password; mqtts:// means TLS on 8883
    assert "p%40ss" not in t.url and "p@ss" not in repr(t)
    tls = MqttTarget.parse("mqtts://broker.local")
    assert tls.port == 8883 and tls.tls_context is not None
    assert MqttTarget.parse("mqtt://127.0.0.1").tls_context is None


def test_mqtt_target_from_settings_prefers_the_identity_settings() -> None:
    s = SimulatorSettings(
        mqtt_url="mqtts://old:pw@broker.local", mqtt_username="factory-a", mqtt_password="s3cret"
    )
    t = MqttTarget.from_settings(s)
    assert (t.host, t.port, t.username, t.password) == ("broker.local", 8883, "factory-a", "s3cret")
    assert t.tls_context is not None and "pw" not in t.url


async def test_rate_limiter_paces_starts() -> None:
    limiter, stop = RateLimiter(200.0), asyncio.Event()
    began = time.monotonic()
    for _ in range(41):
        await limiter.wait(stop)
    assert 0.18 <= time.monotonic() - began < 2.0
    unlimited = RateLimiter(None)
    began = time.monotonic()
    for _ in range(1000):
        await unlimited.wait(stop)
    assert time.monotonic() - began < 0.2


def test_summary_table_lists_sources_rates_and_errors() -> None:
    stats = Stats(started=0.0, finished=10.0)
    stats.sent.update({"factory_state": 50, "infra_state": 20})
    stats.tags.update({"duplicate": 5})
    stats.errors.update({"upload": 2})
    stats.latencies.extend([0.001, 0.002, 0.003])
    console = Console(width=120, record=True)
    console.print(summary_table(stats, RunOptions(factories=["factory-a"], run_id="abc123")))
    text = console.export_text()
    assert "factory_state" in text and "50" in text and "5.00" in text
    assert "total" in text and "70" in text and "7.00" in text
    assert "of which duplicate" in text
    assert "errors: upload" in text and "2" in text
    assert Counter(stats.sent)["image_snapshot"] == 0


def test_unreachable_broker_exits_2_naming_the_url(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"mqtt://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AEGIS_MQTT_URL", url)
    result = runner.invoke(app, ["simulate", "--duration", "1", "--no-images"])
    assert result.exit_code == 2
    assert url in result.stderr and "cannot connect" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scenario", "earthquake"], "unknown scenario"),
        (["--scenario", "fire@factory-z"], "factory-z"),
        (["--factories", "a", "--count", "2"], "not both"),
        (["--qos", "3"], "qos"),
    ],
)
def test_bad_options_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_service_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    default = SimulatorSettings().run_options()
    assert list(default.factories) == ["factory-a", "factory-b", "factory-c"]
    assert [s.kind for s in default.scenarios] == [ScenarioKind.GAS_LEAK]
    assert default.scenarios[0].every_s == 600
    assert DEFAULT_SCENARIOS.startswith("gas_leak@factory-b")
    monkeypatch.setenv("AEGIS_SIMULATOR_SCENARIOS", "off")
    monkeypatch.setenv("AEGIS_SIMULATOR_FACTORIES", "f-1,f-2")
    monkeypatch.setenv("AEGIS_SIMULATOR_SEED", "5")
    options = SimulatorSettings().run_options()
    assert options.scenarios == [] and list(options.factories) == ["f-1", "f-2"]
    assert options.seed == 5


async def test_factories_other_than_the_broker_identity_are_warned_about() -> None:
    # the warning comes before the connection; nothing listens on this port
    target = MqttTarget(url="mqtt://x", host="127.0.0.1", port=free_port(), username="factory-a")
    options = RunOptions(factories=["factory-a", "factory-b"], duration_s=1)
    with structlog.testing.capture_logs() as logs, pytest.raises(BrokerUnreachable):
        await run(
            options,
            mqtt_url=target,
            aws=AwsConfig(endpoint_url="http://127.0.0.1:1"),
            bucket="b",
            stop=asyncio.Event(),
        )
    [warned] = [e for e in logs if e["event"] == "factories_not_this_identity"]
    assert warned["factories"] == ["factory-b"] and warned["username"] == "factory-a"
