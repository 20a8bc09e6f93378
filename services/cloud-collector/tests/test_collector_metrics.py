"""The collector's Prometheus series: one metric name per unit, whatever unit a check uses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from aegis_cloud_collector import domain
from aegis_cloud_collector.collector import TierMetrics
from aegis_contracts.cloud import CloudCheck, CloudSnapshot
from aegis_runtime.metrics import Metrics

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def _units_in_domain() -> set[str]:
    """Every unit the domain's checks are built with (keyword or CloudCheck.ok's third arg)."""
    text = Path(domain.__file__).read_text(encoding="utf-8")
    keyword = set(re.findall(r'unit="([^"]+)"', text))
    positional = set(re.findall(r'CloudCheck\.ok\([^()]*?,[^()]*?,\s*"([^"]+)"\)', text))
    return keyword | positional


def test_every_unit_a_check_uses_has_a_metric() -> None:
    metrics = TierMetrics(Metrics("test"))
    units = _units_in_domain()
    assert {"s", "ms", "messages"} <= units, "the scan of the domain's units found too little"
    assert units <= set(metrics.values), f"no metric for units {units - set(metrics.values)}"


def test_values_land_in_the_metric_of_their_unit_in_base_units() -> None:
    registry = Metrics("test")
    metrics = TierMetrics(registry)
    snapshot = CloudSnapshot.of(
        "fast",
        NOW,
        [
            CloudCheck.ok("storage:s3", 250.0, "ms"),
            CloudCheck.ok("freshness:factory-a", 42.0, "s"),
            CloudCheck.ok("consumer:AEGIS_RAW/processor", 17.0, "messages"),
            CloudCheck.ok("unitless", 3.0),
        ],
    )
    metrics.record(snapshot)

    def sample(name: str, check: str) -> float | None:
        return registry.registry.get_sample_value(f"aegis_{name}", {"tier": "fast", "check": check})

    assert sample("cloud_check_seconds", "storage:s3") == 0.25
    assert sample("cloud_check_seconds", "freshness:factory-a") == 42.0
    assert sample("cloud_check_messages", "consumer:AEGIS_RAW/processor") == 17.0
    assert sample("cloud_check_messages", "storage:s3") is None
    exposed = registry.render().decode()
    assert "cloud_check_value" not in exposed
    assert 'check="unitless"' in exposed  # its status is still there

    metrics.record(CloudSnapshot.of("fast", NOW, [CloudCheck.ok("storage:s3", 10.0, "ms")]))
    assert sample("cloud_check_seconds", "freshness:factory-a") is None  # gone with its check
    assert sample("cloud_check_seconds", "storage:s3") == 0.01
